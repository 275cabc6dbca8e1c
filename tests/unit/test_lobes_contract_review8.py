"""What lobes' gateway can advertise, judged on the captured lab (review 8, lobes contracts):
- lobes 0.91's compose template never passes HAND_MAX_MODEL_LEN to the gateway, so it
  advertises the hand role's own window whatever the lane serves: drift planned a gateway
  recreate that could not change it, and the converge's check of the lane's window after it
  failed and rolled back on every apply. It is said report-only, and never checked;
- a lane off its desired window (a hand-edited compose file) was blamed on the gateway, which
  advertised the desired window: a needless gateway recreate. Said report-only; the lane's
  own entries fix it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from reconciler.apply.payload import verify_spec
from reconciler.compare.drift import Action, Kind
from reconciler.compare.gateway import contract_drifts, told_windows
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import expectations
from reconciler.observe.document import Observed, parse_collected
from reconciler.observe.observe import load_snapshot
from reconciler.records import replace
from tests.unit.test_compare_rules import EXAMPLE, compare, find


@pytest.fixture(scope="module")
def captured() -> tuple[Any, dict[str, Any]]:
    _, observations = load_snapshot(EXAMPLE / "snapshot")
    return load_fleet(EXAMPLE, "lab"), observations


def _doc(captured: Any, box: str) -> Observed:
    _, observations = captured
    doc = parse_collected(copy.deepcopy(observations[box].collected), complete=True)
    assert isinstance(doc, Observed)
    return doc


def test_the_gateway_is_told_every_window_but_the_hand_lanes(captured: Any) -> None:
    told = told_windows(_doc(captured, "spark"))
    assert told is not None
    assert {"cortex", "embedder", "reranker"} <= told  # spark's lanes the template passes
    assert "hand" not in told  # spark runs a hand lane: its window is never passed


def test_a_hand_context_the_gateway_cannot_advertise_is_said_never_planned(captured: Any) -> None:
    fleet, _ = captured
    exp = expectations(fleet, ["spark"])["spark"]
    hand = exp.contract["hand"]
    exp = replace(exp, contract={**exp.contract, "hand": replace(hand, context=16384)})
    doc = _doc(captured, "spark")
    caps = doc.gateway.capabilities
    assert caps is not None and caps.roles["hand"].context != 16384
    windows = {lane.role: lane.max_model_len for lane in exp.lanes.values()}
    drifts = list(
        contract_drifts(exp, doc.gateway.health, caps, windows, doc.lanes, told_windows(doc))
    )
    (hand_drift,) = [d for d in drifts if d.path == "capabilities.hand.context"]
    assert hand_drift.action is Action.REPORT
    assert (hand_drift.desired, hand_drift.observed) == (16384, caps.roles["hand"].context)
    assert "passes no HAND_MAX_MODEL_LEN to the gateway" in (hand_drift.note or "")
    # Told every window (an older render, or none): judged as before, a gateway recreate.
    told_all = list(contract_drifts(exp, doc.gateway.health, caps, windows, doc.lanes, None))
    (planned,) = [d for d in told_all if d.path == "capabilities.hand.context"]
    assert planned.action is Action.RECREATE_GATEWAY


def test_the_converge_checks_no_window_the_gateway_is_not_told(captured: Any) -> None:
    fleet, _ = captured
    exp = expectations(fleet, ["spark"])["spark"]
    doc = _doc(captured, "spark")
    assert "hand" in {lane.role for lane in exp.lanes.values()}
    assert "hand" not in verify_spec(exp, doc)["windows"]
    assert "cortex" in verify_spec(exp, doc)["windows"]
    assert "hand" in verify_spec(exp)["windows"]  # nothing observed: every lane's, as before


def test_a_lane_off_its_window_is_not_blamed_on_the_gateway(captured: Any) -> None:
    d = find(compare(captured, "spark"), Kind.CONTRACT, "gateway", "capabilities.cortex.context")
    assert (d.desired, d.observed) == (131072, 262144)
    assert d.action is Action.REPORT  # was recreate-gateway: its 262144 is the desired window
    assert "not its desired 262144" in (d.note or "")
