"""A Ctrl-C that Python swallows must still end the run (reconciler/interrupts.py).

Found under load: SIGINT landed while the main thread ran importlib's weakref callback (a lazy
import while the boxes worked), where a raised exception is printed as "Exception ignored in"
and dropped. The run then waited in observe._finish_each for its hanging boxes' whole
--timeout instead of ending with 130. Here the swallow is made deterministic: the weakref
callback raises the signal itself (signal.raise_signal runs the Python handler at once, inside
the callback), and the waits that follow must end within a slice, not at the box's timeout.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from queue import SimpleQueue
from typing import Any

import pytest

from reconciler import cli, interrupts
from reconciler.observe import observe
from reconciler.observe.probes import ProbeRun
from reconciler.observe.transport import OUTPUT_LIMIT_BYTES, RemoteResult, Running
from tests.unit.test_review3_caches import interrupted_replay

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 8.0  # what the hanging box may take: the waits below must end long before it
PROMPT_S = 3.0  # a slice is 0.25 s; the rest is room for a loaded machine


class Hanging(Running):
    """A box whose ssh never answers (until cancelled, or its timeout)."""

    def __init__(self, box: str) -> None:
        super().__init__(box, None)
        self.stop = threading.Event()

    def finish(self, timeout: float, limit: int = OUTPUT_LIMIT_BYTES) -> RemoteResult:
        self.stop.wait(timeout)
        return RemoteResult(self.box, None, "", "", f"no answer within {timeout:g} s")

    def cancel(self) -> None:
        self.stop.set()


class _Thing:
    pass


def swallow_ctrl_c() -> list[type[BaseException] | None]:
    """SIGINT handled inside a weakref callback, as in importlib's module-lock callback: the
    KeyboardInterrupt goes to sys.unraisablehook (here: recorded) and the caller goes on.
    The kinds of exception swallowed, in order."""
    swallowed: list[Any] = []
    hook, sys.unraisablehook = sys.unraisablehook, swallowed.append
    try:
        thing = _Thing()
        ref = weakref.ref(thing, lambda _: signal.raise_signal(signal.SIGINT))
        del thing  # the callback runs here; its KeyboardInterrupt is ignored
        assert ref() is None
    finally:
        sys.unraisablehook = hook
    return [u.exc_type for u in swallowed]


@pytest.fixture
def hanging() -> Iterator[Hanging]:
    box = Hanging("thor")
    yield box
    box.cancel()  # its thread ends with the test


def test_a_swallowed_ctrl_c_ends_the_wait_for_a_box_that_never_answers(
    hanging: Hanging,
) -> None:
    with interrupts.handled():
        assert swallow_ctrl_c() == [KeyboardInterrupt]  # the interrupt really was lost
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            observe._finish_each({"thor": hanging}, TIMEOUT_S)  # before: the box's 8 s
        waited = time.monotonic() - started
    assert waited < PROMPT_S, waited
    assert not hanging.stop.is_set()  # ended by the interrupt, not by the box


def test_a_swallowed_ctrl_c_ends_the_wait_for_gateway_probes_that_hang() -> None:
    release = threading.Event()

    def probe(bases: dict[str, str], budget: float | None) -> dict[str, dict[str, Any]]:
        release.wait(TIMEOUT_S)
        return {box: {"base": base} for box, base in bases.items()}

    run = ProbeRun(probe, {"thor": "http://127.0.0.2:1"}, TIMEOUT_S, 4)
    try:
        with interrupts.handled():
            assert swallow_ctrl_c() == [KeyboardInterrupt]
            started = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                run.result(TIMEOUT_S)  # gather's wait for the probes (and the audit's)
            waited = time.monotonic() - started
    finally:
        release.set()
    assert waited < PROMPT_S, waited


def test_a_command_interrupted_through_a_swallowed_ctrl_c_exits_130(
    monkeypatch: pytest.MonkeyPatch, hanging: Hanging
) -> None:
    """Through cli.main, as a command runs: exit 130, the default handler back after."""

    def command(args: Any) -> int:
        swallow_ctrl_c()
        observe._finish_each({"thor": hanging}, TIMEOUT_S)
        return cli.EXIT_OK

    monkeypatch.setattr(cli, "_cmd_validate", command)
    started = time.monotonic()
    code = cli.main(["validate"])
    assert (code, time.monotonic() - started < PROMPT_S) == (130, True)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not interrupts.interrupted()  # the next command starts clear


def test_a_handler_the_caller_chose_is_left_alone_and_the_record_is_per_command() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts.handled():
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    with interrupts.handled():
        assert swallow_ctrl_c() == [KeyboardInterrupt]
        assert interrupts.interrupted()
    with interrupts.handled():  # the next command: its waits are not ended by the last one's
        queue: SimpleQueue[str] = SimpleQueue()
        queue.put("thor")
        assert interrupts.get(queue) == "thor"


def test_only_the_main_threads_waits_end_on_the_record() -> None:
    """Another thread's wait (a queued box's turn) is ended by the main thread cancelling what
    it waits for, never by a KeyboardInterrupt of its own."""
    outcome: list[object] = []
    with interrupts.handled():
        swallow_ctrl_c()
        event = threading.Event()

        def waiter() -> None:
            try:
                outcome.append(interrupts.wait(event, 0.6))
            except BaseException as exc:
                outcome.append(type(exc))

        thread = threading.Thread(target=waiter)
        thread.start()
        thread.join(5)
    assert outcome == [False]


def test_ctrl_c_during_a_replay_with_workers_under_the_commands_handler(tmp_path: Path) -> None:
    """A replay's workers are forked from a process running the command's handler: they still
    ignore Ctrl-C (replay_workers._Job.take), and the replay ends with 130 and no traceback."""
    interrupted_replay(tmp_path, handled=True)


class _Finalized:
    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)


def _importlibs_callback() -> Any:
    """A weakref callback named and placed as importlib's module-lock callback (`cb` in
    <frozen importlib._bootstrap>), which every import taking a module lock runs."""
    namespace: dict[str, Any] = {"signal": signal}
    source = "def cb(ref):\n    signal.raise_signal(signal.SIGINT)\n"
    exec(compile(source, "<frozen importlib._bootstrap>", "exec"), namespace)
    return namespace["cb"]


@pytest.mark.parametrize("where", ["importlib's module-lock callback", "a __del__"])
def test_where_a_raise_would_be_printed_and_dropped_it_is_only_recorded(
    hanging: Hanging, where: str
) -> None:
    """Ctrl-C landing in importlib's module-lock callback (a lazy import while the boxes work)
    printed "Exception ignored in ... KeyboardInterrupt" and a traceback on the operator's
    terminal (tests/unit/test_review9_fanout.py saw it under load). There the handler only
    records it, and the run still ends within a slice."""
    swallowed: list[Any] = []
    hook, sys.unraisablehook = sys.unraisablehook, swallowed.append
    try:
        with interrupts.handled():
            if where == "a __del__":
                thing: Any = _Finalized()
                del thing
            else:
                thing = _Thing()
                ref = weakref.ref(thing, _importlibs_callback())
                del thing
                assert ref() is None
            assert swallowed == []  # before: [KeyboardInterrupt], printed as ignored
            assert interrupts.interrupted()
            started = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                observe._finish_each({"thor": hanging}, TIMEOUT_S)
            assert time.monotonic() - started < PROMPT_S
    finally:
        sys.unraisablehook = hook
