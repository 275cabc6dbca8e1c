"""The pyinfra route's `--accept-interrupted`: `--data fleet_accept_interrupted=true` converges
from the state a killed converge or rollback left, as `reconcile apply --accept-interrupted`
does; any other value blocks the box with a reason, and the default refuses (the box does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import engine, session
from reconciler.desired.load import load_fleet
from reconciler.desired.pyinfra_data import host_data
from reconciler.plan import Plan

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"


@pytest.fixture
def prepared(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    for name, value in (("_fleet", []), ("_prepared", {}), ("_blocked", {})):
        monkeypatch.setattr(session, name, value)
    made: list[Any] = []

    def prepare(fleet: Any, box: str) -> engine.Prepared:
        prep = engine.Prepared(fleet, box, None, None, Plan(box))  # type: ignore[arg-type]
        made.append(prep)
        return prep

    monkeypatch.setattr(session, "prepare", prepare)
    return made


def _data(**more: Any) -> dict[str, Any]:
    base = {"fleet_root": str(EXAMPLE), "fleet_inventory": "lab"}
    return host_data(load_fleet(EXAMPLE, "lab"), "thor") | base | more


@pytest.mark.parametrize(("given", "accepted"), [(None, False), ("true", True), ("false", False)])
def test_the_flag_reaches_the_converge(prepared: list[Any], given: Any, accepted: bool) -> None:
    data = _data() if given is None else _data(fleet_accept_interrupted=given)
    assert not session.plan("thor", data).blocked
    assert session.prepared("thor").accept_interrupted is accepted


@pytest.mark.parametrize("given", ["yes", 1, 0])  # pyinfra's --data reads `1` as a number
def test_any_other_value_blocks_the_box(prepared: list[Any], given: Any) -> None:
    plan = session.plan("thor", _data(fleet_accept_interrupted=given))
    assert plan.blocked and "fleet_accept_interrupted= must be true or false" in str(
        plan.blocked[0]
    )
    assert prepared == []  # refused before the box is observed
