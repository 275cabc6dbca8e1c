"""The audit as a value: evidence rows, verdicts, the mesh, and the exit code they imply."""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.audit.evidence import BoxEvidence
from reconciler.audit.mesh import MeshEvidence
from reconciler.audit.verdict import Severity, Verdict


@dataclass(frozen=True)
class AuditReport:
    rows: tuple[BoxEvidence, ...]  # inventory order
    verdicts: tuple[Verdict, ...]  # one per row, same order
    mesh: MeshEvidence
    mesh_verdict: Verdict
    inventory: str
    generated_at: str  # ISO 8601 UTC
    run_id: str

    @property
    def exit_code(self) -> int:
        """0 every verdict ok, 2 any finding, 1 a box that could not be audited (worst wins)."""
        if any(not v.audited for v in self.verdicts):
            return 1
        every = (*self.verdicts, self.mesh_verdict)
        return 0 if all(v.verdict == Severity.OK and not v.findings for v in every) else 2

    def verdict_of(self, box: str) -> Verdict:
        return next(v for v in self.verdicts if v.subject == box)

    def row_of(self, box: str) -> BoxEvidence:
        return next(r for r in self.rows if r.box == box)
