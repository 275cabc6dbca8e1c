"""Review 6: a container still booting (health `starting`, a lane loading its model in a start
period of up to ~780 s) was drift with action recreate, so the plan recreated it and started
the load over, on every apply during a boot. It is one report-only `state` entry now; an
unhealthy one is still recreated.

Replayed from examples/lab-incidents' captured snapshot, copied and edited in tmp_path.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reconciler.compare.drift import Action, Drift, Kind
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from reconciler.drift_inputs import expectations
from reconciler.plan import Plan, plan_box

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"


def _replay(tmp: Path, name: str, health: str, restarts: int = 0) -> tuple[list[Drift], Plan]:
    """thor replayed with container `name` running at `health`: its `status` entries, its plan."""
    root = tmp / "fleet"
    shutil.copytree(EXAMPLE, root)
    snap = root / "snapshot" / "thor.json"
    doc = json.loads(snap.read_text(encoding="utf-8"))
    (found,) = [c for c in doc["collected"]["docker"]["containers"] if c["name"] == name]
    found["health"], found["restart_count"] = health, restarts
    snap.write_text(json.dumps(doc), encoding="utf-8")
    fleet = load_fleet(root, "lab")
    (result,) = run_drift(fleet, ["thor"], from_snapshot=root / "snapshot").report.boxes
    plan = plan_box(result, expectations(fleet, ["thor"])["thor"])
    return [d for d in result.drifts if (d.kind, d.path) == (Kind.STATE, "status")], plan


def _reasons(plan: Plan, service: str) -> tuple[str, ...]:
    return tuple(r for s in plan.steps if s.subject == service for r in s.reasons)


@pytest.mark.parametrize(
    ("name", "service", "subject"),
    [
        ("model-gear-vllm-worker", "vllm-worker", "lane:vllm-worker"),
        ("model-gear-gateway", "gateway", "gateway"),
    ],
)
def test_a_booting_container_is_reported_not_recreated(
    tmp_path: Path, name: str, service: str, subject: str
) -> None:
    (entry,), plan = _replay(tmp_path, name, "starting")
    assert (entry.subject, entry.desired, entry.observed, entry.source) == (
        subject,
        "running (healthy)",
        "running (starting)",
        name,
    )
    assert entry.action is Action.REPORT
    assert entry.note is not None and entry.note.startswith("booting")
    assert entry in plan.report_only
    # the lane (gateway) is recreated for its other drift in the example, never for its status
    assert "status" not in _reasons(plan, service)


def test_restarts_while_booting_are_said(tmp_path: Path) -> None:
    (entry,), _ = _replay(tmp_path, "model-gear-vllm-worker", "starting", restarts=3)
    assert entry.action is Action.REPORT
    assert entry.note is not None and entry.note.startswith("restarted 3 times; booting")


def test_an_unhealthy_lane_is_still_recreated(tmp_path: Path) -> None:
    (entry,), plan = _replay(tmp_path, "model-gear-vllm-worker", "unhealthy")
    assert (entry.observed, entry.action) == ("running (unhealthy)", Action.RECREATE)
    assert "status" in _reasons(plan, "vllm-worker")
