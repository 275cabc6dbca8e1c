"""Review 3 of the converge in the lab, on thor through `reconcile apply` (the real box
program, the real collector and docker):

- a `.env` that is a symlink leading out of the deployment directory is refused by the box
  program under its lock, naming where the link leads, with nothing changed (the stray the
  plan removes still runs, no snapshot is taken);
- a stray container of the compose project is stopped by the converge and kept, stopped,
  until the controller verified the converge (the collector sees it `exited`; the
  verification passes over it) and marks it good, which removes it: before, the converge
  removed it at its end, so a rollback after a failed verification could not bring it back.

The apply also converges the pristine lab thor's own drift (its `.env`, the gateway); the
stray is stopped before the gateway's recreate. The stray and the snapshots of this test go
afterwards, and thor is reset.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import lab as labpkg
import lab.lifecycle
from lab import config, ssh

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv" / "bin"
BOX = "thor"
STRAY = "r3-stray"  # a service of the project the desired state does not know
NAME = "lobes-r3-stray-1"


def sh(command: str) -> str:
    return ssh.run(config.box(BOX), command).stdout


def reconcile(*args: str, evidence: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLEET_INVENTORY": "lab"}
    return subprocess.run(
        [str(VENV / "reconcile"), "-i", "lab", *args, "--evidence", str(evidence)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def snapshots() -> set[str]:
    return set(sh("ls -1A ~/.lobes/.fleet/snapshots 2>/dev/null || true").split())


def stray_state() -> str:
    """The stray's `id status`, or "" when it is gone."""
    return sh(
        f"docker ps -aq --no-trunc --filter name=^{NAME}$ | "
        "xargs -r docker inspect --format '{{.Id}} {{.State.Status}}'"
    ).strip()


@pytest.fixture
def thor(pristine: Callable[[str], None]) -> Iterator[None]:
    """thor, pristine, with a stray of the project running; afterwards the stray, the
    snapshots and lock file of this test gone, `.env` a file again, thor reset."""
    pristine(BOX)
    lock = sh("test -e ~/.lobes/.fleet/lock && echo yes || true").strip() == "yes"
    before = snapshots()
    with labpkg.lifecycle.locked():
        image = sh(
            "docker inspect --format '{{.Config.Image}}' $(docker ps -q "
            "--filter label=com.docker.compose.service=gateway "
            "--filter label=com.docker.compose.project=lobes)"
        ).strip()
        assert image, "thor runs no gateway"
        sh(
            f"docker run -d --init --name {NAME} --label com.docker.compose.project=lobes "
            f"--label com.docker.compose.service={STRAY} --entrypoint sleep {image} infinity"
        )
        try:
            yield
        finally:
            sh(f"docker rm -f {NAME} >/dev/null 2>&1 || true")
            sh("[ -L ~/.lobes/.env ] && cp --remove-destination ~/r3-env ~/.lobes/.env || true")
            sh("rm -f ~/r3-env")
            for sid in snapshots() - before:
                sh(f"rm -rf ~/.lobes/.fleet/snapshots/{sid}")
            if not lock:
                sh("rm -f ~/.lobes/.fleet/lock")


def test_a_linked_env_is_refused_and_a_stray_goes_only_at_mark_good(
    lab: object, thor: None, tmp_path: Path
) -> None:
    running = stray_state()
    assert running.endswith(" running"), running
    before = snapshots()
    # `.env` moved out of the deployment directory and linked back: the same bytes, so the
    # observation sees the same drift (the stray), and the converge meets the link.
    sh("mv ~/.lobes/.env ~/r3-env && ln -s ../r3-env ~/.lobes/.env")
    refused = reconcile("apply", BOX, "--yes", evidence=tmp_path)
    said = refused.stdout + refused.stderr
    assert refused.returncode == 1, said
    assert (
        "~/.lobes/.env is a symlink leading outside the deployment directory ~/.lobes "
        "(to ../r3-env)" in said
    ), said
    assert stray_state() == running and snapshots() == before
    assert sh("readlink ~/.lobes/.env").strip() == "../r3-env"

    sh("rm ~/.lobes/.env && mv ~/r3-env ~/.lobes/.env")
    done = reconcile("apply", BOX, "--yes", evidence=tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert stray_state() == "", said  # removed, by the mark-good
    (record,) = [p for p in tmp_path.iterdir() if json.loads(p.read_text())["outcome"] != "failed"]
    kept = json.loads(record.read_text())
    assert kept["marked_good"] is True and kept["rollback"] is None
    events = kept["actions"]
    steps = [(e.get("step"), e.get("status")) for e in events if e.get("subject") == STRAY]
    # Stopped by the converge, removed only by the mark-good after the verification.
    assert steps == [("remove", "start"), ("remove", "stopped"), ("remove", "start"),
                     ("remove", "done")], steps  # fmt: skip
    # The verification passed over the stopped stray (the progress lines say so), and the box
    # observed again after the mark-good shows it gone.
    assert f"verified: no drift left (the stopped {STRAY} go at mark-good)" in said, said
    assert STRAY in json.dumps(kept["drift_before"]) and STRAY not in json.dumps(
        kept["drift_after"]
    )
