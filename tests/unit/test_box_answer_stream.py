"""What `apply` reads back from a box while it converges: the box program's event stream.

A broken or hostile box can answer anything on that stream. The controller keeps only JSON
objects as events, holds no line past MAX_LINE_CHARS nor more than the end of stderr, and still
finds the result that follows; with no result, the box's failure is said, never a traceback.
The "box" here is a local process speaking on stdout and stderr exactly as sshd relays the box
program's streams.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import boxcall

RESULT = {"event": "result", "ok": True, "snapshot": "20261130T120000Z-abc"}


def answered(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, lines: list[str], stderr: str = ""
) -> boxcall.BoxCall:
    """call_box against a box whose program reads the payload, then writes these lines on
    stdout and this text on stderr (copied from files: a line may be larger than argv takes)."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    out.write_text("".join(line + "\n" for line in lines))
    err.write_text(stderr)
    program = (
        "import shutil, sys\n"
        "sys.stdin.read()\n"
        f"shutil.copyfileobj(open({str(err)!r}), sys.stderr)\n"
        f"shutil.copyfileobj(open({str(out)!r}), sys.stdout)\n"
    )
    monkeypatch.setattr(boxcall, "check", lambda payload: None)
    monkeypatch.setattr(boxcall, "ssh_argv", lambda *a, **k: [sys.executable, "-c", program])
    return boxcall.call_box(None, {"action": "converge"}, SEEN.append)  # type: ignore[arg-type]


SEEN: list[dict[str, Any]] = []  # every event the progress line was shown


@pytest.fixture(autouse=True)
def _nothing_seen_yet() -> None:
    SEEN.clear()


NOT_EVENTS = {
    "a number": "5",
    "a list": "[1, 2]",
    "a string": '"result"',
    "null": "null",
    "nested past json's depth": "[" * 100_000 + "]" * 100_000,
    "an object nested past json's depth": '{"event": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "text": "Welcome to Ubuntu (a motd)",
}


@pytest.mark.parametrize("case", sorted(NOT_EVENTS))
def test_a_line_that_is_not_an_event_is_passed_over_and_the_result_still_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, case: str
) -> None:
    step = {"event": "step", "step": "write-env", "status": "start"}
    call = answered(monkeypatch, tmp_path, [json.dumps(step), NOT_EVENTS[case], json.dumps(RESULT)])
    assert call.result == RESULT
    assert call.events == [step, RESULT] == SEEN


def test_a_line_past_the_limit_is_never_held_and_the_result_after_it_is_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    huge = '{"event": "note", "message": "' + "x" * (3 * boxcall.MAX_LINE_CHARS) + '"}'
    call = answered(monkeypatch, tmp_path, [huge, json.dumps(RESULT)])
    assert call.result == RESULT
    assert call.events == [RESULT]


def test_a_line_at_the_limit_is_still_an_event(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    note = {"event": "note", "message": ""}
    pad = boxcall.MAX_LINE_CHARS - len(json.dumps(note)) - 1  # the newline counts too
    note["message"] = "x" * pad
    call = answered(monkeypatch, tmp_path, [json.dumps(note), json.dumps(RESULT)])
    assert len(json.dumps(note)) + 1 == boxcall.MAX_LINE_CHARS
    assert call.events == [note, RESULT]


def test_without_a_result_the_failure_is_the_last_line_of_a_bounded_stderr(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    noise = "y" * (5 * boxcall.MAX_STDERR_CHARS) + "\nTraceback: the program died\n"
    call = answered(monkeypatch, tmp_path, list(NOT_EVENTS.values()), stderr=noise)
    assert call.events == []
    assert len(call.stderr) == boxcall.MAX_STDERR_CHARS
    assert call.stderr.endswith("Traceback: the program died\n")
    assert call.result["ok"] is False
    assert call.result["failed"] == (
        "the box program ended without a result: Traceback: the program died"
    )


def test_the_events_kept_are_bounded_and_the_result_after_them_is_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(boxcall, "MAX_EVENTS", 50)
    wait = json.dumps({"event": "wait", "service": "vllm-hand", "state": "starting"})
    call = answered(monkeypatch, tmp_path, [wait] * 200 + [json.dumps(RESULT)])
    assert call.result == RESULT
    assert len(call.events) == 50
    assert len(SEEN) == 201 and SEEN[-1] == RESULT  # the progress line saw every one
