"""A rollback and the files a converge created, in the lab, on thor over SSH: the real box
program converges (driven with crafted payloads through boxcall, as `reconcile apply` sends
them), the real `reconcile rollback` undoes it.

- a compose file a converge created is removed by `reconcile rollback --to` its snapshot, and
  by a rollback to an older snapshot (a later converge created it), kept aside in the
  snapshot's `removed/`; the output names it;
- an operator's edit of such a file is kept, and the rollback says so, naming it and why;
- a lane added by a converge (its compose file in the chain, its container created) goes with
  its compose file: the container is removed too, and the containers match the snapshot.

The box is reset afterwards (`pristine`), and `.fleet` is put back as it was: the snapshots and
the lock file these converges made are removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import lab as labpkg
import lab.lifecycle
from lab import config, ssh
from reconciler.apply import boxcall, engine
from reconciler.apply.payload import base_payload, verify_spec
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import expectations

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv" / "bin"
BOX = "thor"
SOURCE = "20000101T000000Z"  # a crafted snapshot holding the copies to restore; sorts first
NEW = "docker-compose.rcf.yml"  # not in thor's chain: a file only
LANE = "docker-compose.rcf-lane.yml"  # put in the chain by the lane test
FILE_V1 = b"# created by a converge (test_rollback_created_files)\nservices: {}\n"


def sh(command: str, *, input: str | None = None) -> str:
    return ssh.run(config.box(BOX), command, input=input).stdout


def lobes() -> Path:
    return config.box(BOX).home / ".lobes"


def reconcile(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLEET_INVENTORY": "lab"}
    return subprocess.run(
        [str(VENV / "reconcile"), "-i", "lab", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip


def listing() -> list[str]:
    return sh("ls -1A ~/.lobes/.fleet/snapshots 2>/dev/null || true").split()


@pytest.fixture
def thor(pristine: Callable[[str], None]) -> Iterator[None]:
    """thor, reset at the end (files, containers); its `.fleet` put back as it was: what was
    there stays, the snapshots, `removed/` copies and lock file of this test go."""
    pristine(BOX)
    fleet = sh("test -e ~/.lobes/.fleet && echo yes || true").strip() == "yes"
    lock = sh("test -e ~/.lobes/.fleet/lock && echo yes || true").strip() == "yes"
    before = set(listing())
    with labpkg.lifecycle.locked():
        try:
            yield
        finally:
            if not fleet:
                sh("rm -rf ~/.lobes/.fleet")
            else:
                for sid in set(listing()) - before:
                    sh(f"rm -rf ~/.lobes/.fleet/snapshots/{sid}")
                if not lock:
                    sh("rm -f ~/.lobes/.fleet/lock")
            sh(f"rm -f ~/.lobes/{NEW} ~/.lobes/{LANE}")


def put_source(copies: dict[str, bytes]) -> None:
    """The stored copies a converge restores from (as a verified converge's snapshot holds
    them), in a crafted snapshot that sorts before every real one."""
    where = f"~/.lobes/.fleet/snapshots/{SOURCE}"
    sh(f"umask 077 && mkdir -p ~/.lobes/.fleet/snapshots/{SOURCE}")
    meta = {"id": SOURCE, "status": "applied", "files": {}, "containers": {}, "services": []}
    sh(f"cat > {where}/meta.json", input=json.dumps(meta))
    for name, data in copies.items():
        sh(f"cat > {where}/{name}", input=data.decode())


def exp() -> Any:
    return expectations(load_fleet(ROOT, "lab"), [BOX])[BOX]


def quiet_payload(who: str, **fields: Any) -> dict[str, Any]:
    """A converge payload for thor that changes nothing, with `fields` over it."""
    fleet = load_fleet(ROOT, "lab")
    payload = base_payload(exp(), fleet.boxes[BOX], "converge", who)
    payload.update(
        titles=["test"],
        fingerprint={"files": {}, "containers": None},
        managed_env={},
        box_secrets={},
        env_keys=[],
        restore=[],
        pulls=[],
        services=[],
        removes=[],
        images={},
        verify=verify_spec(exp()),
        keep=1000,  # never prunes a snapshot another test left
    )
    payload.update(fields)
    return payload


def converge(**fields: Any) -> dict[str, Any]:
    """One converge of thor by the box program, with `fields` over a payload that changes
    nothing; its result (which names its snapshot)."""
    fleet = load_fleet(ROOT, "lab")
    payload = quiet_payload("test (created files)", **fields)
    result: dict[str, Any] = boxcall.call_box(engine._target(fleet, BOX), payload).result
    assert result.get("ok") is True, result
    return result


def pin(name: str, data: bytes) -> list[dict[str, str]]:
    return [{"name": name, "sha256": hashlib.sha256(data).hexdigest()}]


def container_ids() -> dict[str, str]:
    out = sh(
        "docker ps -aq --no-trunc | xargs -r docker inspect --format "
        "'{{index .Config.Labels \"com.docker.compose.service\"}} {{.Id}}'"
    )
    return dict(line.split() for line in out.splitlines() if line.strip())


def test_a_created_compose_file_is_removed_by_a_rollback_to_its_snapshot_and_kept_aside(lab, thor):
    put_source({NEW: FILE_V1})
    env = (lobes() / ".env").read_bytes()
    ids = container_ids()
    made = converge(restore=pin(NEW, FILE_V1))["snapshot"]
    assert (lobes() / NEW).read_bytes() == FILE_V1
    done = reconcile("rollback", BOX, "--to", made)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (lobes() / NEW).exists()
    aside = lobes() / ".fleet" / "snapshots" / made / "removed" / NEW
    assert aside.read_bytes() == FILE_V1  # the removal can be undone by hand
    assert f"rolled back to {made}: removed {NEW}" in done.stdout, done.stdout
    assert (lobes() / ".env").read_bytes() == env and container_ids() == ids


def test_a_rollback_to_an_older_snapshot_removes_what_a_later_converge_created(lab, thor):
    put_source({NEW: FILE_V1})
    env = (lobes() / ".env").read_bytes()
    ids = container_ids()
    older = converge()["snapshot"]  # changes nothing
    converge(restore=pin(NEW, FILE_V1))
    assert (lobes() / NEW).exists()
    done = reconcile("rollback", BOX, "--to", older)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (lobes() / NEW).exists()
    assert f"removed {NEW}" in done.stdout, done.stdout
    assert (lobes() / ".env").read_bytes() == env and container_ids() == ids


def test_an_operator_edit_of_a_created_file_is_kept_and_said(lab, thor):
    put_source({NEW: FILE_V1})
    made = converge(restore=pin(NEW, FILE_V1))["snapshot"]
    edited = FILE_V1 + b"# an operator's note\n"
    sh(f"cat >> ~/.lobes/{NEW}", input="# an operator's note\n")
    done = reconcile("rollback", BOX, "--to", made)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (lobes() / NEW).read_bytes() == edited
    assert f"thor: KEPT {NEW}, not removed: changed since converge {made} wrote it" in done.stderr
    assert "removed" not in done.stdout, done.stdout


def test_a_lane_added_by_a_converge_goes_with_its_compose_file(lab, thor):
    """The converge puts LANE in the chain (COMPOSE_FILE) and starts its service; the
    rollback puts `.env` back, removes LANE and the container compose no longer knows."""
    image = sh(
        "docker image inspect --format '{{index .RepoDigests 0}}' "
        "$(docker inspect --format '{{.Image}}' $(docker ps -q --filter "
        "label=com.docker.compose.service=gateway))"
    ).strip()
    lane = (
        "services:\n  rcf-probe:\n"
        f"    image: {image}\n"
        '    entrypoint: ["sleep", "infinity"]\n'
        "    init: true\n    healthcheck:\n      disable: true\n"
    ).encode()
    put_source({LANE: lane})
    env = (lobes() / ".env").read_bytes()
    chain = next(
        line.split("=", 1)[1]
        for line in env.decode().splitlines()
        if line.startswith("COMPOSE_FILE=")
    )
    lanes = base_payload(exp(), load_fleet(ROOT, "lab").boxes[BOX], "converge", "t")["lane_specs"]
    made = converge(
        lane_specs=[*lanes, {"service": "rcf-probe", "timeout_s": 60, "util": 0.01}],
        managed_env={"COMPOSE_FILE": f"{chain}:{LANE}"},
        env_keys=["COMPOSE_FILE"],
        restore=pin(LANE, lane),
        services=["rcf-probe"],
    )["snapshot"]
    assert "rcf-probe" in container_ids()
    done = reconcile("rollback", BOX, "--to", made)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "containers match the snapshot" in done.stdout
    assert "removed the containers of rcf-probe" in done.stdout
    assert not (lobes() / LANE).exists() and (lobes() / ".env").read_bytes() == env
    assert "rcf-probe" not in container_ids()
