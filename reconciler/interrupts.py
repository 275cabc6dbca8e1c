"""Ctrl-C for a command: never lost, whatever the main thread was doing when it came.

Python's default SIGINT handler raises KeyboardInterrupt wherever the main thread happens to
be. Where that is a weakref callback, a `__del__` or a garbage-collection callback (importlib's
module-lock callback, during any lazy import), the exception is printed as "Exception ignored
in ..." and dropped: the interrupt is gone, and a run that then waits for its boxes waited out
their whole timeout (60 s by default) before it could end with 130.

So a command runs with `handled()`: its SIGINT handler records the interrupt and raises
KeyboardInterrupt as the default does, and the long waits of the main thread (`get`, `wait`)
wait in slices of SLICE_S and raise KeyboardInterrupt once an interrupt was recorded: one
that was swallowed ends the run within a slice.

Stdlib only, and cheap (`signal` and `threading` are imported by the ssh transport anyway):
this is on the repeated drift path.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from queue import Empty, SimpleQueue
from types import FrameType
from typing import TypeVar

T = TypeVar("T")

# How long a wait sleeps between looks at the record: a swallowed Ctrl-C ends the run within
# this; four wake-ups a second cost nothing next to an ssh client.
SLICE_S = 0.25

_interrupted = False  # set by the handler; clear at each command's start and end (`handled`)


# Where a raise is only printed ("Exception ignored in ...", a traceback on the operator's
# terminal) and dropped: importlib's module-lock callback (a weakref callback, run by any import
# that takes a module lock) and any `__del__`. There the handler only records the interrupt,
# which the sliced waits raise within SLICE_S, with nothing printed.
_DROPPED_AT = {("cb", "<frozen importlib._bootstrap>")}


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _interrupted
    _interrupted = True  # first: the raise below may land where it is ignored
    if frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or (code.co_name, code.co_filename) in _DROPPED_AT:
            return
    raise KeyboardInterrupt


@contextmanager
def handled() -> Iterator[None]:
    """Run a command with the recording handler. The record is the command's: clear at its
    start and at its end (cli.main may run several commands in one process, and a caller may
    observe boxes itself after one was interrupted). The handler is installed only from the
    main thread (no other can) and only over Python's default one: a handler the caller chose
    (SIG_IGN, as a shell gives a job started with `&`; a test's own) is left as it is. The
    default is put back after."""
    global _interrupted
    _interrupted = False
    install = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )
    if install:
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        if install:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        _interrupted = False


def interrupted() -> bool:
    """Whether this command was interrupted (Ctrl-C), raised on or not."""
    return _interrupted


def check() -> None:
    """KeyboardInterrupt if this command was interrupted."""
    if _interrupted:
        raise KeyboardInterrupt


def _main() -> bool:
    # Only the main thread takes signals, and only its waits are sliced: another thread's wait
    # ends when the main thread, interrupted, cancels what it waits for (and a thousand
    # threads waking four times a second would cost a fleet's run real CPU).
    return threading.current_thread() is threading.main_thread()


def get(queue: SimpleQueue[T]) -> T:
    """`queue.get()`; on the main thread in slices, raising KeyboardInterrupt once an
    interrupt was recorded."""
    if not _main():
        return queue.get()
    while True:
        check()
        try:
            return queue.get(timeout=SLICE_S)
        except Empty:
            continue


def wait(event: threading.Event, timeout: float | None = None) -> bool:
    """`event.wait(timeout)`; on the main thread in slices, raising KeyboardInterrupt once an
    interrupt was recorded."""
    if not _main():
        return event.wait(timeout)
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        check()
        left = SLICE_S if end is None else min(SLICE_S, end - time.monotonic())
        if left <= 0:
            return event.is_set()
        if event.wait(left):
            return True
