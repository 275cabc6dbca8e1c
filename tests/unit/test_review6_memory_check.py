"""The `host` memory check judges what a converge would boot, given what already runs
(reconciler/compare/envfile.py `compare_host`), on captured real data: examples/lab-incidents,
with thor's /proc/meminfo set to the real Jetson AGX Thor's (122.8 GiB unified, lobes.md) and
its containers edited where a case needs another state.

A lane running healthy holds its `--gpu-memory-utilization` x MemTotal, and a converge stops it
before it boots it again (converge.py `recreate`), so a converged box is in sync however little
of its unified memory the lanes leave free; the check fires where a boot would find too little
(lobes.md incident 5: a lane that cannot boot because memory is short).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.box import compare_box
from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import Action, Drift, Kind
from reconciler.compare.envfile import compare_host
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import expectations
from reconciler.observe.document import Observed, parse_collected
from reconciler.observe.observe import load_snapshot

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"
GIB = 1024 * 1024  # KiB
THOR_TOTAL = 128_765_132  # KiB: 122.8 GiB
THOR_AVAILABLE = 43_448_794  # KiB: 41.4 GiB, what its lanes (0.45 + 3 x 0.06) leave free


@pytest.fixture(scope="module")
def captured() -> tuple[dict[str, BoxExpectation], dict[str, Any]]:
    fleet = load_fleet(EXAMPLE, "lab")
    _, observations = load_snapshot(EXAMPLE / "snapshot")
    return expectations(fleet, ["thor"]), observations


Edit = Callable[[dict[str, Any]], None]


def thor(captured: Any, available: int = THOR_AVAILABLE, edit: Edit | None = None) -> Observed:
    """thor's captured answer with the real box's memory (`available` KiB free), edited."""
    _, observations = captured
    raw = copy.deepcopy(observations["thor"].collected)
    raw["meminfo"]["MemTotal_kib"] = THOR_TOTAL
    raw["meminfo"]["MemAvailable_kib"] = available
    if edit is not None:
        edit(raw)
    doc = parse_collected(raw, complete=True)
    assert isinstance(doc, Observed), doc
    return doc


def host(drifts: tuple[Drift, ...]) -> list[Drift]:
    return [d for d in drifts if d.kind is Kind.HOST]


def container(raw: dict[str, Any], service: str) -> dict[str, Any]:
    return next(c for c in raw["docker"]["containers"] if c["service"] == service)


def without(*services: str) -> Edit:
    def edit(raw: dict[str, Any]) -> None:
        kept = [c for c in raw["docker"]["containers"] if c["service"] not in services]
        raw["docker"]["containers"] = kept

    return edit


def compared(captured: Any, doc: Observed) -> tuple[Drift, ...]:
    exps, observations = captured
    return compare_box(exps["thor"], doc, observations["thor"].probes).drifts


def test_a_converged_real_thor_is_not_short_of_memory(captured: Any) -> None:
    """The review's repro (t15): every lane running healthy with its util, 41.4 GiB of 122.8
    free. At most 0.37 x MemTotal can ever be free there: asking 0.45 x MemTotal + the floor
    of MemAvailable flagged every healthy box."""
    doc = thor(captured)
    assert host(compared(captured, doc)) == []
    # Nothing else drifting: no lane would boot, whatever little is free.
    exps, _ = captured
    assert list(compare_host(exps["thor"], thor(captured, 1 * GIB), drifts=())) == []


@pytest.mark.parametrize("state", ["missing", "exited", "unhealthy"])
def test_a_lane_that_must_boot_into_too_little_memory_is_the_incident(
    captured: Any, state: str
) -> None:
    def edit(raw: dict[str, Any]) -> None:
        if state == "missing":
            without("vllm-worker")(raw)
        else:
            c = container(raw, "vllm-worker")
            c["status"], c["health"] = ("exited", None) if state == "exited" else ("running", state)
            if state == "exited":
                c["exit_code"] = 1

    (d,) = host(compared(captured, thor(captured, edit=edit)))
    assert (d.subject, d.path, d.action) == ("host", "MemAvailable", Action.DROP_CACHES)
    assert (d.desired, d.observed) == (">= 59.3 GiB", "41.4 GiB")  # 0.45 x 122.8 + 4
    assert d.note == "booting vllm-worker needs 0.45 x MemTotal + 4 GiB"


def test_a_running_lane_recreated_gives_back_what_it_holds(captured: Any) -> None:
    """The worker runs at 0.3 and the state wants 0.45: its recreate needs only the difference
    (and the floor) on top of what is free, since its stop frees its 0.3 first."""

    def smaller(raw: dict[str, Any]) -> None:
        c = container(raw, "vllm-worker")
        c["cmd"] = [
            "--gpu-memory-utilization=0.3" if str(w).startswith("--gpu-memory-util") else w
            for w in c["cmd"]
        ]

    drifts = compared(captured, thor(captured, 15 * GIB, smaller))
    assert any(d.subject == "lane:vllm-worker" and d.action is Action.RECREATE for d in drifts)
    (d,) = host(drifts)
    assert (d.desired, d.observed) == (">= 22.4 GiB", "15.0 GiB")  # 0.15 x 122.8 + 4
    assert d.note == (
        "booting vllm-worker needs 0.45 x MemTotal + 4 GiB; it runs holding 0.3 x MemTotal, "
        "which stopping it frees first"
    )
    # With 25 GiB free that boot fits: in sync as far as memory goes.
    assert host(compared(captured, thor(captured, 25 * GIB, smaller))) == []


def test_only_the_lanes_the_drift_boots_are_judged(captured: Any) -> None:
    """With the box's other drifts known, a lane running healthy that no drift recreates asks
    for nothing; one a drift recreates asks for the floor beyond what it holds."""
    exps, _ = captured
    doc = thor(captured, 1 * GIB)
    recreate = Drift("thor", Kind.ENV, "lane:vllm-worker", "X", "1", None, Action.RECREATE)
    elsewhere = Drift("thor", Kind.ENV, "gateway", "X", "1", None, Action.RECREATE_GATEWAY)
    assert list(compare_host(exps["thor"], doc, drifts=[elsewhere])) == []
    (d,) = compare_host(exps["thor"], doc, drifts=[elsewhere, recreate])
    assert (d.desired, d.observed) == (">= 4.0 GiB", "1.0 GiB")
    assert d.note is not None and d.note.startswith("booting vllm-worker needs 0.45 x MemTotal")


def test_lanes_booting_one_after_another_add_up(captured: Any) -> None:
    """embed and the worker both missing: embed boots first (the plan's order) and takes its
    share of what the worker then finds. Each alone fits in 60 GiB, both do not."""
    doc = thor(captured, 60 * GIB, without("vllm-embed", "vllm-worker"))
    (d,) = host(compared(captured, doc))
    assert (d.desired, d.observed) == (">= 66.6 GiB", "60.0 GiB")  # 0.06 + 0.45 of 122.8, + 4
    assert d.note == (
        "booting vllm-worker needs 0.45 x MemTotal + 4 GiB; lanes booted before it take "
        "7.4 GiB of what is free"
    )


def test_a_lane_still_booting_is_not_asked_for_its_share_again(captured: Any) -> None:
    """The worker running `starting` (loading its model): it is taking its share as it was
    seen, so what is free already lacks part of it; no boot of it is to come unless a drift
    recreates it, and then nothing it holds is known to come back."""

    def starting(raw: dict[str, Any]) -> None:
        container(raw, "vllm-worker")["health"] = "starting"

    exps, _ = captured
    doc = thor(captured, edit=starting)
    assert list(compare_host(exps["thor"], doc)) == []
    assert list(compare_host(exps["thor"], doc, drifts=())) == []
    recreate = Drift("thor", Kind.STATE, "lane:vllm-worker", "status", "x", "y", Action.RECREATE)
    (d,) = compare_host(exps["thor"], doc, drifts=[recreate])
    assert (d.desired, d.observed) == (">= 59.3 GiB", "41.4 GiB")
    assert d.note == "booting vllm-worker needs 0.45 x MemTotal + 4 GiB"
