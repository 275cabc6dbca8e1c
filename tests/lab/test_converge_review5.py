"""Review 5 of the converge in the lab, on thor, the real box program against the real
docker compose (what the unit tests' fake engine takes for granted):

- a `docker compose run` copy of a lane left behind, exited (compose labels it
  `com.docker.compose.oneoff=True` and `docker ps` lists it after the lane recreated since),
  is not taken for the lane: the converge's boot watched it and failed "stopped while
  booting" though the lane was healthy, and its rollback failed the same way;
- a rollback brings a lane that was stopped at the snapshot back stopped: `docker compose up
  --no-start --force-recreate` replaces the running container by one created, not started.

The copy, the snapshots and the lock of this test go afterwards, and thor is reset.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import lab as labpkg
import lab.lifecycle
from lab import config, ssh
from reconciler.apply import boxcall, engine
from reconciler.apply.payload import base_payload
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import expectations

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
BOX = "thor"
LANE = "vllm-rerank"
CONTAINER = "model-gear-vllm-rerank"  # its container_name on thor


def sh(command: str) -> str:
    return ssh.run(config.box(BOX), command).stdout


def state(name: str) -> str:
    return sh(f"docker inspect --format '{{{{.State.Status}}}}' {name}").strip()


@pytest.fixture
def thor(pristine: Callable[[str], None]) -> Iterator[None]:
    """thor with a `compose run` copy of the lane left behind, exited; afterwards the copy
    gone, the snapshots and the lock of this test (all of `.fleet` when it made it) gone, thor
    reset."""
    pristine(BOX)
    had_fleet = sh("test -e ~/.lobes/.fleet && echo yes || true").strip() == "yes"
    before = set(sh("ls -1A ~/.lobes/.fleet/snapshots 2>/dev/null || true").split())
    with labpkg.lifecycle.locked():
        try:
            sh(f"cd ~/.lobes && docker compose run -d --no-deps --entrypoint true {LANE}")
            yield
        finally:
            sh(
                "docker ps -aq --filter label=com.docker.compose.oneoff=True "
                f"--filter label=com.docker.compose.service={LANE} | xargs -r docker rm -f"
            )
            if not had_fleet:
                sh("rm -rf ~/.lobes/.fleet")
            else:
                now = set(sh("ls -1A ~/.lobes/.fleet/snapshots 2>/dev/null || true").split())
                for sid in now - before:
                    sh(f"rm -rf ~/.lobes/.fleet/snapshots/{sid}")


def payload(action: str, **more: Any) -> dict[str, Any]:
    fleet = load_fleet(ROOT, "lab")
    p = base_payload(expectations(fleet, [BOX])[BOX], fleet.boxes[BOX], action, "test (r5)")
    if action == "converge":
        p.update(
            titles=[f"start {LANE}"],
            fingerprint={"files": {}, "containers": None},
            managed_env={},
            box_secrets={},
            env_keys=[],
            restore=[],
            pulls=[],
            services=[LANE],
            removes=[],
            images={},
            verify={"port": 8000, "version": "0.0.0", "auth": "keyed", "windows": {}},
            keep=10,
        )
    return p | more


def call(p: dict[str, Any]) -> dict[str, Any]:
    fleet = load_fleet(ROOT, "lab")
    result: dict[str, Any] = boxcall.call_box(engine._target(fleet, BOX), p).result
    return result


def test_a_compose_run_copy_is_not_the_lane_and_a_stopped_lane_is_rolled_back_stopped(
    lab: Any, thor: None
) -> None:
    copies = sh(
        "docker ps -aq --filter label=com.docker.compose.oneoff=True "
        f"--filter label=com.docker.compose.service={LANE}"
    ).split()
    assert len(copies) == 1, copies
    deadline = time.monotonic() + 20
    while state(copies[0]) != "exited" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert state(copies[0]) == "exited"
    sh(f"docker stop {CONTAINER}")  # the operator stopped the lane; a plan starts it
    done = call(payload("converge"))
    assert done["ok"] is True, done  # was: "vllm-rerank stopped while booting (exited/-...)"
    assert state(CONTAINER) == "running"
    back = call(payload("rollback", snapshot=done["snapshot"], reason="test (r5)"))
    assert back["ok"] is True and back["not_started"] == [LANE], back
    assert back["config_equal"] is True, back
    assert state(CONTAINER) == "created"  # as at the snapshot: not running
    assert state(copies[0]) == "exited"  # the copy never touched
