"""argv against the real lab: a hand-made copy of a lane (`docker run` from its own inspect, as
an operator recreates a container without compose) runs the same argv with the entrypoint cut
after `bash`, because `--entrypoint` takes one word. Drift must say so in ONE report-only entry,
and a copy with one flag inserted must be ONE entry naming the flag, not a shift of every
position. Nothing else about the box may change.

Compose cannot see either copy (the copy carries compose's own labels, config-hash included),
and the lab's reset only recreates lanes whose IMAGE differs, so the test puts the lane back
with a forced compose recreate itself.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import config, deployments, readiness
from lab.incidents import docker_run_argv
from lab.lifecycle import locked
from reconciler.compare.drift import BoxResult, SecretValue
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
BOX, SERVICE = "thor", "vllm-embed"
CONTAINER = f"model-gear-{SERVICE}"
WRAP = "/usr/local/bin/mg-logwrap"


def argv_entries(result: BoxResult) -> set[tuple[Any, ...]]:
    """Every entry of the box (argv ones in full), to compare before and after the copy."""
    assert result.reachable and not result.errors, result.errors
    return {
        (d.kind.value, d.subject, d.path, _shown(d.desired), _shown(d.observed), d.action.value)
        for d in result.drifts
    }


def _shown(value: Any) -> Any:
    return "***" if isinstance(value, SecretValue) else value


def observe() -> BoxResult:
    return run_drift(load_fleet(ROOT, "lab"), [BOX]).report.boxes[0]


def wait_healthy(timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lane = [x for x in readiness.lanes(config.box(BOX)) if x.service == SERVICE]
        if lane and lane[0].state == "running" and lane[0].health == "healthy":
            return
        time.sleep(0.5)
    raise AssertionError(f"{CONTAINER} not healthy after {timeout}s")


@pytest.fixture
def hand_made(
    lab: Any, on_box: Callable[..., Any]
) -> Iterator[Callable[[Callable[[list[str]], list[str]]], dict[str, Any]]]:
    """Replace the lane by a `docker run` copy of its own inspect; `edit` may change the argv
    after the image (the command the copy runs). Afterwards compose recreates the lane."""

    def copy(edit: Callable[[list[str]], list[str]]) -> dict[str, Any]:
        inspect = json.loads(on_box(BOX, f"docker inspect {CONTAINER}").stdout)[0]
        image = inspect["Config"]["Image"]
        argv = docker_run_argv(inspect, image)
        at = argv.index(image) + 1
        argv = [*argv[:at], *edit(argv[at:])]
        on_box(BOX, f"docker rm -f {CONTAINER} >/dev/null && {shlex.join(argv)} >/dev/null")
        wait_healthy()
        copied = json.loads(on_box(BOX, f"docker inspect {CONTAINER}").stdout)[0]["Config"]
        return {"entrypoint": copied["Entrypoint"], "cmd": copied["Cmd"]}

    try:
        yield copy
    finally:
        with locked():
            deployments.force_recreate(config.box(BOX), [SERVICE])
        wait_healthy()


def test_hand_made_copy_with_the_entrypoint_cut_elsewhere_is_one_report_only_entry(
    hand_made: Any,
) -> None:
    before = observe()
    assert not [d for d in before.drifts if d.kind.value == "argv"], "lab not pristine"
    copied = hand_made(lambda cmd: cmd)
    assert copied["entrypoint"] == ["bash"] and copied["cmd"][:2] == [WRAP, "vllm"]
    after = observe()
    assert argv_entries(after) - argv_entries(before) == {
        ("argv", f"lane:{SERVICE}", "entrypoint", ("bash", WRAP), ("bash",), "report-only")
    }
    assert argv_entries(before) - argv_entries(after) == set()

    # The same copy with one flag inserted after the model: one entry naming the flag (the cut
    # is not reported on its own then: the recreate the flag calls for restores it).
    copied = hand_made(lambda cmd: [*cmd[:4], "--enforce-eager", *cmd[4:]])
    assert "--enforce-eager" in copied["cmd"]
    after = observe()
    assert argv_entries(after) - argv_entries(before) == {
        ("argv", f"lane:{SERVICE}", "--enforce-eager", None, True, "recreate")
    }
    assert argv_entries(before) - argv_entries(after) == set()
