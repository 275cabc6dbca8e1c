"""Review 2 of apply, in the lab, on thor over real SSH (the box program driven through boxcall
with crafted payloads, as `reconcile apply` sends them):

- a connection whose controller side is gone right after the payload was delivered (an ssh
  wrapper that hands over the payload, then closes the output it reads): the box program
  stops before changing anything (or rolls back what it changed), and the call is one whose
  state is unknown, never "unreachable, nothing changed";
- a converge that fails before recreating anything (a pull that cannot work, right after a
  `.env` write that changes a variable the gateway reads) restarts no container in its
  rollback: every container keeps its id.

The box is reset afterwards, and `.fleet` put back as it was (test_rollback_created_files'
`thor` fixture).
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import boxcall, engine
from reconciler.desired.load import load_fleet
from tests.lab.test_rollback_created_files import (  # noqa: F401 (the fixture `thor`)
    BOX,
    ROOT,
    container_ids,
    listing,
    lobes,
    quiet_payload,
    sh,
    thor,
)

pytestmark = pytest.mark.lab

PROBE = "RCF2_PROBE"  # a key no service reads: written to .env by the converge
MISSING = "10.77.0.1:5000/lobes/rcf2-missing@sha256:" + "0" * 64

# ssh, except that once the payload is handed over, the output it writes to is closed: the
# controller's side of the connection is gone before the box program's first event arrives.
WRAPPER = textwrap.dedent(
    """
    import os, subprocess, sys
    payload = sys.stdin.buffer.read()
    r, w = os.pipe()
    ssh = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=w)
    os.close(w)
    ssh.stdin.write(payload)
    ssh.stdin.close()
    os.close(r)
    code = ssh.wait()
    sys.stderr.write("Connection to thor closed by remote host.\\n")
    sys.exit(255)
    """
)


def payload(**fields: Any) -> dict[str, Any]:
    return quiet_payload("test (review 2)", **fields)


def call(p: dict[str, Any]) -> boxcall.BoxCall:
    return boxcall.call_box(engine._target(load_fleet(ROOT, "lab"), BOX), p)


def meta_of(sid: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(sh(f"cat ~/.lobes/.fleet/snapshots/{sid}/meta.json"))
    return result


@pytest.mark.usefixtures("lab", "thor")
def test_a_converge_whose_controller_is_gone_after_the_payload_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper = tmp_path / "ssh_drops_output.py"
    wrapper.write_text(WRAPPER)
    real = boxcall.ssh_argv
    monkeypatch.setattr(
        boxcall,
        "ssh_argv",
        lambda *a, **k: [sys.executable, str(wrapper), *real(*a, **k)],
    )
    env = (lobes() / ".env").read_bytes()
    ids = container_ids()
    before = set(listing())
    done = call(
        payload(managed_env={PROBE: "1"}, env_keys=[PROBE], services=["gateway"]),
    )
    assert not done.answered and done.heard == 0  # not a word came back
    assert done.may_have_run  # STATE UNKNOWN for the engine, never "nothing changed"
    # The box program has ended (its lock is free) and left the box as it was.
    sh("flock -w 120 ~/.lobes/.fleet/lock true")
    assert (lobes() / ".env").read_bytes() == env
    assert container_ids() == ids
    for sid in set(listing()) - before:  # a snapshot taken before it saw the loss
        recorded = meta_of(sid)
        assert recorded["status"] == "rolled-back", recorded
        assert "connection is gone" in recorded["reason"], recorded


@pytest.mark.usefixtures("lab", "thor")
def test_a_converge_failing_before_any_recreate_restarts_nothing_in_its_rollback() -> None:
    env = (lobes() / ".env").read_bytes()
    ids = container_ids()
    current = next(
        line.split("=", 1)[1]
        for line in env.decode().splitlines()
        if line.startswith("GATEWAY_READ_TIMEOUT=")
    )
    changed = str(int(current) + 1)  # the gateway reads it: compose's render changes
    result = call(
        payload(
            managed_env={"GATEWAY_READ_TIMEOUT": changed},
            env_keys=["GATEWAY_READ_TIMEOUT"],
            pulls=[MISSING],
        )
    ).result
    assert result["ok"] is False and "pull" in result["failed"], result
    rolled = result["rollback"]
    assert rolled["ok"] is True and rolled["files"] == [".env"], rolled
    assert rolled["recreated"] == [] and rolled["config_equal"] is True, rolled
    assert (lobes() / ".env").read_bytes() == env
    assert container_ids() == ids  # no container was restarted
