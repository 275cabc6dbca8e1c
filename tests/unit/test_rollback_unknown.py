"""`reconcile rollback BOX` whose connection drops after the box program spoke says STATE
UNKNOWN and what to do next, as an apply does: the program outlives the connection (it ignores
SIGHUP) and may still be restoring under its lock. A box that never answered is a plain failure.

SSH is a local process speaking as sshd relays the box program (test_apply_review_fixes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from reconciler.apply import boxcall
from reconciler.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"
STEP = json.dumps({"event": "step", "step": "restore", "subject": ".env", "status": "start"})


def _box_runs(monkeypatch: pytest.MonkeyPatch, program: str) -> None:
    monkeypatch.setattr(
        boxcall,
        "ssh_argv",
        lambda *a, **k: [sys.executable, "-c", "import sys\nsys.stdin.read()\n" + program],
    )


def _rollback(capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["--root", str(EXAMPLE), "-i", "lab", "rollback", "thor"])
    said = capsys.readouterr()
    return code, said.out + said.err


def test_a_rollback_whose_connection_drops_mid_way_says_the_state_is_unknown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _box_runs(
        monkeypatch,
        f"print({STEP!r}, flush=True)\n"
        "sys.stderr.write('Connection to 10.77.0.11 closed by remote host.\\n')\n"
        "sys.exit(255)\n",
    )
    code, said = _rollback(capsys)
    assert code == 1
    assert "thor: rollback failed: unreachable: Connection to 10.77.0.11 closed" in said
    assert "closed by remote host.; STATE UNKNOWN: the box may still be rolling back" in said
    assert "`reconcile snapshots thor` shows no lock" in said
    assert "Traceback" not in said


def test_a_rollback_that_never_reached_the_box_is_a_plain_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _box_runs(monkeypatch, "sys.stderr.write('ssh: connect: refused\\n')\nsys.exit(255)\n")
    code, said = _rollback(capsys)
    assert code == 1
    assert "thor: rollback failed:" in said and "STATE UNKNOWN" not in said


def test_a_rollback_whose_connection_drops_before_any_event_says_the_state_is_unknown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The payload was taken, then the session closed before the first event: the program may
    be restoring all the same (boxcall.BoxCall.may_have_run), so never a plain failure."""
    _box_runs(
        monkeypatch,
        "sys.stderr.write('Connection to 10.77.0.11 closed by remote host.\\n')\nsys.exit(255)\n",
    )
    code, said = _rollback(capsys)
    assert code == 1
    assert "STATE UNKNOWN: the box may still be rolling back" in said
