"""Review 6: a `docker compose run` container (compose labels it com.docker.compose.oneoff=True,
its service's own container False: `docker inspect` of the lab's containers) is never taken as
its service's container, nor planned for removal.

1. The worker's only container a one-off (`lobes-vllm-worker-run-…`): it was compared as the
   lane, so the box read in sync (or, the one-off running bash, 19 argv entries); the lane is
   missing (start), the one-off one report-only entry.
2. A one-off of a service the desired state does not know (`lobes-bench-run-…`, exited): it
   was `remove bench`, which the box's converge skips (converge.py `containers` never takes a
   one-off), so the verification failed and the box rolled back on every apply. Report-only.

Replayed from examples/lab-incidents' captured snapshot, copied and edited as the reviewers did.
A snapshot of an earlier collector has no `oneoff`: read as not a one-off, as it compared then.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.payload import converge_payload
from reconciler.compare.drift import Action, BoxResult, Drift, Kind
from reconciler.drift_inputs import expectations
from reconciler.observe.document import Fault, Observed, parse_collected
from reconciler.observe.document_c import read_snapshot_file
from reconciler.plan import Plan, StepKind, plan_box
from tests.unit.conftest import load_box_program
from tests.unit.example_replay import replay_edited

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"
RUN_COPY = "lobes-vllm-worker-run-3f2a1b9c8d7e"
BENCH = "lobes-bench-run-0a1b2c3d4e5f"


def _replay(
    tmp: Path, box: str, edit: Callable[[dict[str, Any]], None]
) -> tuple[BoxResult, Plan, list[str]]:
    """The example replayed with `box`'s collected observation edited: its result, its plan and
    the services the box's converge is told to remove (the payload's `removes`)."""
    fleet, run = replay_edited(tmp, box, edit, [box])
    (result,) = run.report.boxes
    exp = expectations(fleet, [box])[box]
    plan = plan_box(result, exp)
    payload = converge_payload(exp, fleet.boxes[box], plan, run.observations[box].document, "t")
    return result, plan, payload["removes"]


def _container(collected: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in collected["docker"]["containers"] if c["name"] == name]
    return found


def _worker_is_a_run_copy(command: list[str] | None) -> Callable[[dict[str, Any]], None]:
    """thor's worker container replaced by a `docker compose run` of its service (the same
    inspect, renamed and labelled one-off; its command `command` when given)."""

    def edit(collected: dict[str, Any]) -> None:
        worker = _container(collected, "model-gear-vllm-worker")
        worker["name"], worker["oneoff"] = RUN_COPY, True
        if command is not None:
            worker["entrypoint"], worker["cmd"] = None, command

    return edit


def _of(result: BoxResult, subject: str) -> list[Drift]:
    return [d for d in result.drifts if d.subject == subject]


@pytest.mark.parametrize("command", [None, ["bash"]], ids=["as-the-lane", "bash"])
def test_a_run_copy_is_not_the_lane(tmp_path: Path, command: list[str] | None) -> None:
    result, plan, _ = _replay(tmp_path, "thor", _worker_is_a_run_copy(command))
    worker = _of(result, "lane:vllm-worker")
    # The lane has no container: start it. Nothing is compared against the one-off.
    missing = [d for d in worker if d.note == "no container for this service"]
    assert [(d.kind, d.path, d.action) for d in missing] == [
        (Kind.STATE, "container", Action.START)
    ]
    from_copy = [d for d in worker if d.source == RUN_COPY]
    assert [(d.kind, d.path, d.observed, d.action) for d in from_copy] == [
        (Kind.STATE, "container", "running", Action.REPORT)
    ]
    assert from_copy[0].note is not None and f"docker rm -f {RUN_COPY}" in from_copy[0].note
    assert not [d for d in result.drifts if d.kind in (Kind.ARGV, Kind.ENV, Kind.IMAGE)
                and d.subject == "lane:vllm-worker"]  # fmt: skip
    (step,) = [s for s in plan.steps if s.subject == "vllm-worker"]
    assert step.kind is StepKind.RECREATE_LANE and step.reasons == ("container",)


def _bench_left_behind(ports: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """spark holds an exited `docker compose run bench` (a service no desired state knows)."""

    def edit(collected: dict[str, Any]) -> None:
        copy_ = copy.deepcopy(_container(collected, "model-gear-vllm-hand"))
        copy_.update(
            name=BENCH, id="0a1b2c3d4e5f", service="bench", status="exited", health=None,
            exit_code=0, oneoff=True, ports=ports,
        )  # fmt: skip
        collected["docker"]["containers"].append(copy_)

    return edit


@pytest.mark.parametrize("ports", [{}, {"8001/tcp": [{"HostIp": "", "HostPort": "8001"}]}])
def test_a_leftover_run_of_an_unknown_service_is_report_only(
    tmp_path: Path, ports: dict[str, Any]
) -> None:
    result, plan, removes = _replay(tmp_path, "spark", _bench_left_behind(ports))
    bench = _of(result, "lane:bench")
    assert {d.action for d in bench} == {Action.REPORT}
    (state,) = [d for d in bench if d.kind is Kind.STATE]
    assert (state.path, state.observed, state.source) == ("container", "exited", BENCH)
    assert state.note is not None and f"docker rm {BENCH}" in state.note
    assert len(bench) == 1 + len(ports)  # a port it publishes: reported, never blocking
    assert not plan.blocked
    assert not [s for s in plan.steps if s.kind is StepKind.REMOVE or s.subject == "bench"]
    assert removes == []


def test_a_stray_service_container_is_still_removed_beside_its_run_copy(tmp_path: Path) -> None:
    """The service's own container (oneoff False) of an unknown service stays a stray to remove."""

    def edit(collected: dict[str, Any]) -> None:
        _bench_left_behind({})(collected)
        own = copy.deepcopy(_container(collected, BENCH))
        own.update(name="lobes-bench-1", id="1a1b2c3d4e5f", oneoff=False)
        collected["docker"]["containers"].append(own)

    result, _, removes = _replay(tmp_path, "spark", edit)
    actions = {d.source: d.action for d in _of(result, "lane:bench")}
    assert actions == {BENCH: Action.REPORT, "lobes-bench-1": Action.REMOVE}
    assert removes == ["bench"]


# -- the record: the collector writes it, both readers read it, an older snapshot lacks it --------
def _inspect(name: str, oneoff: str | None) -> dict[str, Any]:
    """`docker inspect` of a compose container, its labels as compose 2.40 writes them."""
    labels = {"com.docker.compose.project": "lobes", "com.docker.compose.service": "vllm-worker"}
    if oneoff is not None:
        labels["com.docker.compose.oneoff"] = oneoff
    return {
        "Id": "3f2a1b9c8d7e" + "0" * 52, "Name": "/" + name, "Image": "sha256:" + "a" * 64,
        "Config": {"Labels": labels, "Image": "vllm", "Cmd": ["bash"], "Env": []},
        "State": {"Status": "running"}, "HostConfig": {}, "NetworkSettings": {"Networks": {}},
    }  # fmt: skip


def test_the_collector_records_a_one_off(monkeypatch: pytest.MonkeyPatch) -> None:
    collector = load_box_program("collector_r6_oneoff", "reconciler/observe/remote/collector.py")
    found = [
        _inspect(RUN_COPY, "True"),
        _inspect("lobes-vllm-worker-1", "False"),
        _inspect("by-hand", None),  # `docker run --label com.docker.compose.project=lobes`
    ]
    monkeypatch.setattr(collector, "engine_inspect", lambda run: (found, []))
    run = collector.Run({"directory": "/nonexistent", "secret_patterns": [], "run_key": "k" * 64})
    listed = collector.containers(run)["containers"]
    assert {c["name"]: c["oneoff"] for c in listed} == {
        RUN_COPY: True,
        "lobes-vllm-worker-1": False,
        "by-hand": False,
    }


def _thor() -> dict[str, Any]:
    return json.loads((EXAMPLE / "snapshot" / "thor.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("oneoff", [True, False, None, "absent"])
def test_both_readers_read_it_and_an_older_snapshot_is_no_one_off(oneoff: Any) -> None:
    whole = _thor()
    worker = _container(whole["collected"], "model-gear-vllm-worker")
    assert "oneoff" not in worker  # captured before the collector recorded it
    if oneoff != "absent":
        worker["oneoff"] = oneoff
    want = oneoff is True
    doc = parse_collected(copy.deepcopy(whole["collected"]), complete=True)
    typed = read_snapshot_file(json.dumps(whole).encode())
    assert isinstance(doc, Observed) and typed is not None
    for read in (doc, typed.document):
        (c,) = [c for c in read.containers if c.name == "model-gear-vllm-worker"]
        assert c.oneoff is want


def test_a_one_off_that_is_not_true_or_false_is_refused() -> None:
    collected = _thor()["collected"]
    _container(collected, "model-gear-vllm-worker")["oneoff"] = "True"
    fault = parse_collected(collected, complete=True)
    assert isinstance(fault, Fault) and fault.path is not None
    assert fault.path.endswith(".oneoff") and "true or false" in fault.what
    # document_c refuses it too, leaving it to document.py (and its fault)
    whole = _thor()
    _container(whole["collected"], "model-gear-vllm-worker")["oneoff"] = "True"
    assert read_snapshot_file(json.dumps(whole).encode()) is None
