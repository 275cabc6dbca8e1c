"""`reconcile audit`: desired -> observe (with the audit section) -> prove -> evidence ->
verdicts. Changes nothing on any box; the only requests that reach a model ask for one token.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from pathlib import Path

from reconciler.audit.evidence import BoxEvidence, box_evidence, shared_variables
from reconciler.audit.mesh import lane_port_targets, mesh_evidence, proof_attempts
from reconciler.audit.observe import attach_proofs, gateway_base, observe_audit
from reconciler.audit.report import AuditReport
from reconciler.audit.verdict import box_verdict, mesh_verdict
from reconciler.desired.facts import facts_of
from reconciler.desired.fleet import Fleet
from reconciler.desired.secret_names import adopt_fleet_patterns
from reconciler.observe.document import Fault, FaultKind
from reconciler.observe.observe import BoxObservation, load_snapshot, save_snapshot
from reconciler.observe.payload import new_run_key


def run_audit(
    fleet: Fleet,
    boxes: list[str],
    save_to: Path | None = None,
    from_snapshot: Path | None = None,
    keep: dict[str, BoxObservation] | None = None,
) -> AuditReport:
    """`keep`: filled with the run's observations (what the history records)."""
    # Secret names judged under the fleet's own patterns, as its drift judges them: a replayed
    # box's text (`DB_PW=...` under `*_PW`) was reported, and recorded, in clear.
    adopt_fleet_patterns(p for spec in fleet.boxes.values() for p in spec.secret_patterns)
    run_id = _now("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)
    if from_snapshot is not None:
        index, observations = load_snapshot(from_snapshot)
        run_id = str(index.get("run_id", run_id))
        for name in boxes:
            missing = Fault(FaultKind.NOT_OBSERVED, "not in the snapshot")
            observations.setdefault(name, BoxObservation(name, None, str(missing), fault=missing))
    else:
        observations = observe_audit(fleet, boxes, new_run_key())
        # Phase 2 needs phase 1's postures: which member is open, which keyed.
        shared = shared_variables(fleet.boxes.values())
        first = [box_evidence(fleet.boxes[b], observations[b], shared) for b in boxes]
        specs = {b: fleet.boxes[b] for b in boxes}
        bases = {b: gateway_base(fleet, b) for b in boxes}
        addresses = {b: fleet.connection(b).ssh_hostname for b in boxes}
        attach_proofs(
            observations,
            proof_attempts(specs, first, bases),
            lane_port_targets(first, addresses),
        )
    if save_to is not None:
        meta = {"run_id": run_id, "inventory": fleet.inventory_file, "taken_at": _now()}
        save_snapshot(save_to, {b: observations[b] for b in boxes}, meta, facts_of(fleet))
    if keep is not None:
        keep.update({b: observations[b] for b in boxes})
    return audit_report(fleet, boxes, observations, run_id)


def audit_report(
    fleet: Fleet, boxes: list[str], observations: dict[str, BoxObservation], run_id: str
) -> AuditReport:
    """Pure: observations (live or from a snapshot) -> the report."""
    shared = shared_variables(fleet.boxes.values())  # over the fleet, not the audited subset
    rows: list[BoxEvidence] = [box_evidence(fleet.boxes[b], observations[b], shared) for b in boxes]
    verdicts = tuple(box_verdict(r, [o for o in rows if o.box != r.box]) for r in rows)
    # The mesh is every desired member of the fleet: one a subset run did not audit is named
    # (mesh.not-in-run), never judged ok unseen.
    mesh = mesh_evidence(dict(fleet.boxes), rows)
    return AuditReport(
        rows=tuple(rows),
        verdicts=verdicts,
        mesh=mesh,
        mesh_verdict=mesh_verdict(mesh),
        inventory=fleet.inventory_file,
        generated_at=_now(),
        run_id=run_id,
    )


def _now(fmt: str = "%Y-%m-%dT%H:%M:%SZ") -> str:
    return datetime.now(UTC).strftime(fmt)
