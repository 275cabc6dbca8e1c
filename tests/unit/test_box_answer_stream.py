"""What `apply` reads back from a box while it converges: the box program's event stream.

A broken or hostile box can answer anything on that stream. The controller keeps only JSON
objects as events, holds no line past MAX_LINE_CHARS nor more than the end of stderr, and still
finds the result that follows; with no result, the box's failure is said, never a traceback.
The "box" here is a local process speaking on stdout and stderr exactly as sshd relays the box
program's streams.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import boxcall

RESULT = {"event": "result", "ok": True, "snapshot": "20261130T120000Z-abc"}


def answered(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    lines: list[str],
    stderr: str = "",
    on_event: boxcall.OnEvent | None = None,
) -> boxcall.BoxCall:
    """call_box against a box whose program reads the payload, then writes these lines on
    stdout and this text on stderr (copied from files: a line may be larger than argv takes)."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    # surrogateescape: "\udcff" in a line is the byte 0xff on the wire (not UTF-8)
    out.write_bytes("".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape"))
    err.write_bytes(stderr.encode("utf-8", "surrogateescape"))
    program = (
        "import shutil, sys\n"
        "sys.stdin.read()\n"
        f"shutil.copyfileobj(open({str(err)!r}, 'rb'), sys.stderr.buffer)\n"
        f"shutil.copyfileobj(open({str(out)!r}, 'rb'), sys.stdout.buffer)\n"
    )
    monkeypatch.setattr(boxcall, "check", lambda payload: None)
    monkeypatch.setattr(boxcall, "ssh_argv", lambda *a, **k: [sys.executable, "-c", program])
    shown = on_event or SEEN.append
    return boxcall.call_box(None, {"action": "converge"}, shown)  # type: ignore[arg-type]


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
    "not UTF-8": "Welcome \udcff\udcfe (a motd in Latin-1)",
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


def test_an_event_with_a_byte_that_is_not_utf8_is_read_with_a_replacement(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    call = answered(monkeypatch, tmp_path, ['{"event": "note", "message": "\udcff"}'])
    assert call.events == [{"event": "note", "message": "\ufffd"}]
    assert call.result["ok"] is False  # and without a result, the call says so


def test_stderr_that_is_not_utf8_is_read_with_replacements(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    call = answered(monkeypatch, tmp_path, [], stderr="ssh: warning \udcff\ndied\n")
    assert call.stderr == "ssh: warning \ufffd\ndied\n"
    assert call.result["failed"] == "the box program ended without a result: died"


def test_a_progress_display_that_fails_never_ends_the_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The box converges whatever the terminal does: its result is still read."""
    shown: list[dict[str, Any]] = []

    def broken_terminal(event: dict[str, Any]) -> None:
        shown.append(event)
        raise OSError("the terminal went away")

    step = {"event": "step", "step": "write-env", "status": "start"}
    lines = [json.dumps(step), json.dumps(RESULT)]
    call = answered(monkeypatch, tmp_path, lines, on_event=broken_terminal)
    assert call.result == RESULT and call.events == [step, RESULT]
    assert shown == [step]  # shown until the display failed, then no more


@pytest.mark.parametrize("service", ["[/]", "gateway[/bold]", "[link=https://x.example]gw[/link]"])
def test_the_progress_bar_shows_a_boxs_words_as_text_never_as_markup(service: str) -> None:
    from reconciler.apply.progress import Reporter

    state = "[blink]starting[/blink]"
    reporter = Reporter("thor", stream=io.StringIO(), bar=True)
    reporter.on_event(
        {"event": "wait", "service": service, "state": state, "elapsed": 1, "timeout": 60}
    )
    progress = reporter._progress
    assert progress is not None
    (task,) = progress.tasks
    rendered = [progress.columns[i].render(task) for i in (0, 2)]  # type: ignore[union-attr]
    assert [t.plain for t in rendered] == [f"thor: {service}", state]
    assert all(not t.spans for t in rendered)  # no style, no link
    reporter.close()
