"""A container someone paused (`docker pause`): its processes frozen, its model still in
memory. `docker unpause` resumes it at once, where the recreate drift used to plan for it
(a `state` entry with the action recreate) would load the lane's model again, for minutes.
Drift says it is paused, with the unpause, and leaves it to the person who paused it.

On the captured lab data (examples/lab-incidents), a container's status edited to `paused`
as the collector writes Docker's State.Status."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reconciler.compare.drift import Action, Kind
from reconciler.plan import actionable
from tests.unit.test_compare_rules import captured, compare, find

__all__ = ["captured"]  # a fixture, used by name


def _paused(service: str) -> Any:
    def edit(raw: dict[str, Any]) -> None:
        container = next(c for c in raw["docker"]["containers"] if c["service"] == service)
        container["status"] = "paused"

    return edit


@pytest.mark.parametrize(
    ("service", "subject"), [("vllm-hand", "lane:vllm-hand"), ("gateway", "gateway")]
)
def test_a_paused_container_is_said_with_its_unpause_and_never_recreated(
    captured: Any, service: str, subject: str
) -> None:
    d = find(compare(captured, "spark", _paused(service)), Kind.STATE, subject, "status")
    name = f"model-gear-{service}"
    assert (d.desired, d.observed, d.action, d.source) == (
        "running (healthy)",
        "paused",
        Action.REPORT,
        name,
    )
    assert d.note is not None and f"`docker unpause {name}`" in d.note
    assert actionable([d]) == ()  # a converge neither recreates it nor waits for it


def test_an_exited_container_is_still_started(captured: Any) -> None:
    """The control: only a pause is left to a person (an exited lane is started, as before)."""

    def exited(raw: dict[str, Any]) -> None:
        container = next(c for c in raw["docker"]["containers"] if c["service"] == "vllm-hand")
        container["status"], container["exit_code"] = "exited", 1

    d = find(compare(captured, "spark", exited), Kind.STATE, "lane:vllm-hand", "status")
    assert (d.observed, d.action) == ("exited", Action.START)


def _gateway(status: str, probes_fail: bool = True) -> Any:
    def edit(raw: dict[str, Any]) -> None:
        container = next(c for c in raw["docker"]["containers"] if c["service"] == "gateway")
        container["status"] = status
        if probes_fail:  # nothing answers on the loopback, as for a gateway not serving
            for name in ("health", "capabilities", "models_noauth"):
                raw["gateway"][name] = {"error": "TimeoutError: timed out"}

    return edit


@pytest.mark.parametrize("status", ["paused", "exited"])
def test_a_gateway_not_serving_is_its_state_entry_not_three_probe_errors(
    captured: Any, status: str
) -> None:
    """Its loopback probes fail for the reason its entry gives: the box is observed, with
    drift (exit 2), not a box with errors (exit 1) that says the same thing three times."""
    result = compare(captured, "spark", _gateway(status))
    assert find(result, Kind.STATE, "gateway", "status").observed == status
    assert [e for e in result.errors if e.where.startswith("gateway")] == []


def test_a_running_gateway_whose_probes_fail_is_still_an_error(captured: Any) -> None:
    """The control: a gateway that runs and does not answer is what the errors are for."""
    result = compare(captured, "spark", _gateway("running"))
    assert len([e for e in result.errors if e.where.endswith("(loopback)")]) == 3


def test_an_entry_about_how_the_gateway_was_made_leaves_the_controllers_errors(
    captured: Any,
) -> None:
    """thor's gateway runs, published for the mesh: the controller's requests that got no
    answer are errors of the box. An entry about how its container was made (here its
    restart policy; mounts, runtime and a pending recreate alike) says nothing about why
    nobody answered, so it no longer hides them; its status or ports still do."""
    from reconciler.compare.box import compare_box
    from reconciler.drift_inputs import expectations
    from reconciler.observe.document import (
        ControllerProbes,
        Observed,
        parse_collected,
        parse_probes,
    )

    fleet, observations = captured
    refused = {"status": None, "error": "connect to 10.77.0.11:8000: Connection refused"}
    probes = parse_probes({"base": "http://10.77.0.11:8000", **dict.fromkeys(
        ("health", "capabilities", "models_noauth"), refused)})  # fmt: skip
    raw = json.loads(json.dumps(observations["thor"].collected))
    raw["render"]["services"]["gateway"]["restart"] = "unless-stopped"
    gateway = next(c for c in raw["docker"]["containers"] if c["service"] == "gateway")
    gateway["restart_policy"] = "no"
    doc = parse_collected(raw, complete=True)
    assert isinstance(doc, Observed) and isinstance(probes, ControllerProbes)
    result = compare_box(expectations(fleet, ["thor"])["thor"], doc, probes)
    assert find(result, Kind.STATE, "gateway", "restart").action is Action.REPORT
    assert len([e for e in result.errors if e.where.endswith("(from the controller)")]) == 3
