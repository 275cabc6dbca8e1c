"""`reconcile import`, review 5 (defect 2): one gateway whose `GET /capabilities` gave no answer
(a 503 while it starts, a timeout) refused the whole import, `--partial` or not, and the error
blamed the other boxes (`group_vars/orin.yaml:..: contract.worker.proxied_to: thor does not
host 'worker' (no contract.worker.context)`), the box's own note never printed.

Now the box's served roles get `contract.<role>.context` from the lane's window (the only value
the loader accepts), commented so, and a `proxied_to` naming a member whose adopted state
serves no such role is dropped with a note: the import validates, and what it leaves for the
other boxes is what it left before.

Captured data: examples/lab-incidents (orin and spark proxy `worker` to thor).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.drift import Drift
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from tests.unit.test_import_hostile import (
    INCIDENTS,
    Collected,
    edit_box,
    layer,
    run_import,
)

NO_ANSWER = {
    "503": {"ms": 10, "status": 503, "body": {"detail": "starting"}},
    "timeout": {"ms": 3001, "status": None, "error": "timed out"},
}


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """A copy of examples/lab-incidents (its snapshot inside), to edit."""
    root = tmp_path / "fleet"
    shutil.copytree(INCIDENTS, root)
    return root


def drift_of(root: Path, snapshot: Path) -> list[Drift]:
    state = load_fleet(root, "lab")
    return list(run_drift(state, list(state.boxes), from_snapshot=snapshot).report.drifts)


def others(drifts: list[Drift]) -> list[Drift]:
    return [d for d in drifts if d.box != "thor"]


def comment(mapping: Any, key: str) -> str:
    tokens = mapping.ca.items.get(key) or []
    return "".join(t.value for t in tokens if t is not None and hasattr(t, "value")).strip()


@pytest.mark.parametrize("answer", sorted(NO_ANSWER))
def test_a_gateway_that_gave_no_capabilities_blocks_no_import(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], answer: str
) -> None:
    before = tmp_path / "before"
    code, text = run_import(capsys, fleet, "--output", str(before))
    assert code == 2, text
    expected = others(drift_of(before, fleet / "snapshot"))

    def silent(collected: Collected) -> None:
        collected["gateway"]["capabilities"] = NO_ANSWER[answer]

    edit_box(fleet / "snapshot", "thor", silent)
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text  # written; thor's silence is found, not fatal
    assert "does not validate" not in text
    adopted = load_fleet(out, "lab")
    thor = adopted.boxes["thor"]
    # The one context the loader accepts for a served role: its lane's window.
    assert thor.contract["worker"].context == thor.lanes["worker"].max_model_len
    contract = layer(out, "thor")["contract"]
    assert comment(contract["worker"], "context") == (
        "# the lane's window; GET /capabilities gave no answer"
    )
    assert "thor: GET /capabilities gave no answer" in text
    # The others proxy worker to thor as before, and their drift is what it was.
    assert adopted.boxes["orin"].contract["worker"].proxied_to == "thor"
    assert adopted.boxes["spark"].contract["worker"].proxied_to == "thor"
    assert others(drift_of(out, fleet / "snapshot")) == expected


def test_a_proxy_to_a_member_that_serves_no_such_role_is_dropped_with_a_note(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """thor declares worker infeasible: orin's and spark's gateways still list it proxied to
    thor. Adopted, the loader refuses (`thor does not host 'worker'`) and with it every box."""

    def infeasible(collected: Collected) -> None:
        collected["gateway"]["capabilities"]["body"]["worker"]["feasible"] = False

    edit_box(fleet / "snapshot", "thor", infeasible)
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    adopted = load_fleet(out, "lab")
    assert adopted.boxes["thor"].contract["worker"].feasible is False
    assert "worker" not in adopted.boxes["orin"].contract
    assert "worker" not in adopted.boxes["spark"].contract
    for box in ("orin", "spark"):
        assert (
            f"{box}: contract worker: proxied to thor, whose adopted state serves no worker "
            "(no contract.worker.context): not adopted"
        ) in text
