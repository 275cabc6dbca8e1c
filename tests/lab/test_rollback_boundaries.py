"""Rollback and apply boundaries in the lab (issue 10, class 6), end to end over SSH on thor:
`reconcile rollback --to` takes only one of that box's snapshots; a snapshot whose metadata
names a file outside the deployment directory, or whose copy of `.env` was truncated, is
refused whole, the refusal recorded in its status (`reconcile snapshots` shows it); a payload
with a bad value leaves the box untouched: no lock, no snapshot, no container changed.

None of these recreates a lane: each is a refusal, checked against the box's bytes and ids.
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
from reconciler.apply.payload import base_payload
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import expectations

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv" / "bin"
BOX = "thor"
CRAFTED = "20000101T000000Z"  # sorts before every real snapshot: never "the latest"


def sh(command: str, *, input: str | None = None) -> str:
    return ssh.run(config.box(BOX), command, input=input).stdout


def reconcile(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLEET_INVENTORY": "lab"}
    return subprocess.run(
        [str(VENV / "reconcile"), "-i", "lab", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def state() -> dict[str, Any]:
    """What a refused rollback or converge must leave as it was: the deployment's files, the
    user's dotfiles, the snapshots, the lock's record and every container's id."""
    lobes = config.box(BOX).home / ".lobes"
    ids = sh("docker ps -aq --no-trunc | sort")
    snaps = sh("ls -1 ~/.lobes/.fleet/snapshots 2>/dev/null || true")
    lock = sh("cat ~/.lobes/.fleet/lock 2>/dev/null || echo no-lock-file")
    files = {p.name: p.read_bytes() for p in lobes.iterdir() if p.is_file()}
    bashrc = (config.box(BOX).home / ".bashrc").read_bytes()
    return {"ids": ids, "snapshots": snaps, "lock": lock, "files": files, "bashrc": bashrc}


@pytest.fixture
def thor(pristine: Callable[[str], None]) -> Iterator[None]:
    """thor, reset at the end; other lab resets kept away meanwhile; crafted snapshots removed."""
    pristine(BOX)
    with labpkg.lifecycle.locked():
        try:
            yield
        finally:
            sh(f"rm -rf ~/.lobes/.fleet/snapshots/{CRAFTED} ~/.lobes/.fleet/snapshots/.bashrc")


def craft_snapshot(files: dict[str, dict[str, Any]], copies: dict[str, bytes]) -> None:
    """A snapshot directory on thor written by hand, as a damaged or hostile one would be."""
    meta = {
        "id": CRAFTED,
        "taken_at": "2000-01-01T00:00:00Z",
        "holder": "crafted",
        "status": "applied",
        "services": [],
        "files": files,
        "containers": {},
    }
    where = f"~/.lobes/.fleet/snapshots/{CRAFTED}"
    sh(f"mkdir -p -m 700 ~/.lobes/.fleet ~/.lobes/.fleet/snapshots {where}")
    sh(f"cat > {where}/meta.json", input=json.dumps(meta))
    for name, data in copies.items():
        sh(f"cat > {where}/{name}", input=data.decode())


def test_rollback_to_what_is_not_a_snapshot_of_the_box_is_refused(lab, thor):
    before = state()
    done = reconcile("rollback", BOX, "--to=../../.ssh")  # more shapes: the unit tests
    assert done.returncode == 1 and "not a snapshot id" in done.stderr, done.stderr
    assert "nothing was sent" in done.stderr
    done = reconcile("rollback", BOX, "--to", "20000101T000001Z")
    assert done.returncode == 1
    assert "no snapshot 20000101T000001Z on this box" in done.stderr, done.stderr
    assert state() == before


def test_a_snapshot_naming_a_file_outside_the_deployment_is_refused_whole(lab, thor):
    env = (config.box(BOX).home / ".lobes" / ".env").read_bytes()
    evil = b"export PWNED=1\n"
    # `../.bashrc` from the deployment dir is the user's own; its "copy" (the snapshot dir's
    # `../.bashrc`) is there with the recorded digest: only the name check stands in the way.
    craft_snapshot(
        {
            ".env": {"sha256": hashlib.sha256(env).hexdigest(), "mode": 0o600},
            "../.bashrc": {"sha256": hashlib.sha256(evil).hexdigest(), "mode": 0o644},
        },
        {".env": env, "../.bashrc": evil},
    )
    before = state()
    done = reconcile("rollback", BOX, "--to", CRAFTED)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "not a plain name inside the deployment directory" in done.stderr
    after = state()
    assert after["bashrc"] == before["bashrc"] and b"PWNED" not in after["bashrc"]
    assert after["files"] == before["files"] and after["ids"] == before["ids"]
    listed = reconcile("snapshots", BOX)
    assert f"{CRAFTED}  rollback-failed" in listed.stdout, listed.stdout
    assert "failed: snapshot" in listed.stdout and "not a plain name" in listed.stdout


def test_a_truncated_copy_of_env_never_replaces_it(lab, thor):
    """The field incident: a copy cut to the 7 bytes `GATEWAY` was put in place of `.env`."""
    lobes = config.box(BOX).home / ".lobes"
    env = (lobes / ".env").read_bytes()
    craft_snapshot(
        {".env": {"sha256": hashlib.sha256(env + b"X=1\n").hexdigest(), "mode": 0o600}},
        {".env": b"GATEWAY"},
    )
    # This rollback takes the box's lock (the others are refused before it), which leaves a
    # released lock: the file, emptied. Start from that state, whatever ran before (no lock
    # file, or a killed run's record), so `state() == before` checks it was released clean.
    # Emptied under the flock, as Lock.release does; fails if a converge still holds it.
    sh(
        "umask 077 && mkdir -p ~/.lobes/.fleet && "
        "flock -n ~/.lobes/.fleet/lock truncate -s 0 ~/.lobes/.fleet/lock"
    )
    before = state()
    done = reconcile("rollback", BOX, "--to", CRAFTED)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "does not match its recorded sha256" in done.stderr
    assert (lobes / ".env").read_bytes() == env
    assert state() == before
    listed = reconcile("snapshots", BOX).stdout
    assert f"{CRAFTED}  rollback-failed" in listed and "recorded sha256" in listed
    assert "GATEWAY_API_KEY=" not in listed


def test_a_payload_with_a_bad_value_leaves_the_box_untouched(lab, thor, monkeypatch):
    """Sent past the controller's own check (as another tool or an older controller might),
    the box program still refuses it before its lock, its snapshot or any container."""
    fleet = load_fleet(ROOT, "lab")
    exp = expectations(fleet, [BOX])[BOX]
    payload = base_payload(exp, fleet.boxes[BOX], "converge", "test (bad payload)")
    payload.update(
        titles=["write .env"],
        fingerprint={"files": {}, "containers": None},
        managed_env={"WORKER_MAX_MODEL_LEN": "1\nEVIL=1"},
        box_secrets={},
        env_keys=["WORKER_MAX_MODEL_LEN"],
        restore=[],
        pulls=[],
        services=["vllm-worker"],
        removes=[],
        images={},
        verify={"port": 8000, "version": "0.0.0", "auth": "keyed", "windows": {}},
        keep=10,
    )
    assert (
        boxcall.call_box(engine._target(fleet, BOX), payload)
        .result["failed"]
        .startswith("refused: managed_env.WORKER_MAX_MODEL_LEN")
    )  # the controller's check: nothing sent
    before = state()
    monkeypatch.setattr(boxcall, "check", lambda payload: None)
    result = boxcall.call_box(engine._target(fleet, BOX), payload).result
    assert result["ok"] is False
    assert result["failed"].startswith("managed_env.WORKER_MAX_MODEL_LEN: an env value"), result
    assert "EVIL" not in json.dumps(result)
    assert state() == before
