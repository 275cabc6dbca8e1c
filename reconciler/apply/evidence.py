"""The evidence record of one converge: drift before, actions, drift after, as JSON.

Secrets are hashed twice over: the collector replaced them by keyed digests on the box, and the
report layer shows only a digest of that digest. Box events carry names, never values.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from reconciler.apply.engine import Outcome
from reconciler.compare.drift import DriftReport
from reconciler.report.json_report import to_document
from reconciler.scrub import scrub_text

EVIDENCE_VERSION = 1


# The box's free-text fields in its events and rollback result: scrubbed before they are kept.
FREE_TEXT = ("failed", "message", "reason")


def _scrubbed(event: dict[str, Any]) -> dict[str, Any]:
    out = {
        k: scrub_text(v) if k in FREE_TEXT and isinstance(v, str) else v for k, v in event.items()
    }
    kept = out.get("kept")
    if isinstance(kept, list):
        # A rollback's kept files: each one's `why` is the box's words too.
        out["kept"] = [
            {**k, "why": scrub_text(k["why"])}
            if isinstance(k, dict) and isinstance(k.get("why"), str)
            else k
            for k in kept
        ]
    return out


def record(out: Outcome, inventory: str, who: str) -> dict[str, Any]:
    return {
        "evidence": "fleet-reconciler/converge",
        "version": EVIDENCE_VERSION,
        "box": out.box,
        "inventory": inventory,
        "holder": who,
        "started_at": out.started_at,
        "finished_at": out.finished_at,
        "outcome": "converged" if out.ok and out.changed else "no-change" if out.ok else "failed",
        "failed": scrub_text(out.failed) if out.failed else None,
        "snapshot": out.snapshot,
        # No answer came while the box may have been changing: what it is now is not known
        # (drift_after is what was seen right after); `snapshot` is the one to roll back to.
        "state_unknown": out.state_unknown,
        "marked_good": out.marked_good,  # a verified converge whose mark-good was refused: false
        "warnings": [scrub_text(w) for w in out.warnings],
        "events_dropped": out.events_dropped,  # read from the box but not kept (bounded)
        "plan": [
            {
                "step": s.kind.value,
                "subject": s.subject,
                "title": s.title(),
                "reasons": list(s.reasons),
            }
            for s in out.plan.steps
        ],
        "blocked": list(out.plan.blocked),
        "actions": [_scrubbed(e) for e in out.events if e.get("event") != "wait"],
        "rollback": _scrubbed(out.rollback) if out.rollback is not None else None,
        "drift_before": _doc(out.drift_before),
        "drift_after": _doc(out.drift_after),
    }


def _doc(report: DriftReport | None) -> dict[str, Any] | None:
    return None if report is None else to_document(report)


def write(directory: Path, out: Outcome, inventory: str, who: str) -> Path:
    """A new record, never over an earlier one: created exclusively (O_EXCL, so two runs in the
    same second each get their own file), 0600 from the start, complete or removed."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = out.started_at.replace("-", "").replace(":", "")
    data = (json.dumps(record(out, inventory, who), indent=1) + "\n").encode("utf-8")
    n = 1
    while True:
        path = directory / (f"{stamp}-{out.box}.json" if n == 1 else f"{stamp}-{out.box}-{n}.json")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            break
        except FileExistsError:
            n += 1
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path
