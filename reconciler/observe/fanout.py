"""How many boxes are observed at once, how long one box may take, and the progress line.

Stdlib only: this is on the repeated drift path, which starts its collectors before importing
anything heavy.

Why a limit at all: every box in flight costs the controller an ssh client (a process, three
pipes, the key exchange's CPU), a thread that drains its answer and a socket for the
new-connection check. On a fleet of a thousand boxes, starting them all at once runs the
controller out of file descriptors (the usual soft limit is 1,024) and makes a thousand key
exchanges fight for its cores, so that the first answers arrive no sooner than the last. A box
that waits for a slot starts the moment another box's answer has been read; its own timeout
counts from its own start, so a box that hangs holds one slot for its timeout and delays
nothing else.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import TextIO

from reconciler.observe.transport import CHECK_S, OUTPUT_LIMIT_BYTES, RemoteResult, Running

LIMIT_ENV = "FLEET_MAX_PARALLEL"
TIMEOUT_ENV = "FLEET_BOX_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
# What one box in flight holds open in the controller: the stdin, stdout and stderr pipes of
# its ssh client (stdin closed once the payload is written), the new-connection check's socket,
# the three connections of its gateway probes (observe/probes.py runs them for at most as many
# boxes at once as this limit lets ssh run), and one for a pipe's end while Popen forks.
FDS_PER_BOX = 8
# Kept free for the process itself: the Python runtime, the history store, the report file.
FDS_RESERVED = 64
# ssh clients mostly wait (on the network, on the box's collector); their CPU is the key
# exchange (~0.1 s per new connection here) and a few ms per answer. So the limit is not
# the core count: 32 per core keeps a two-core controller at 64 boxes in flight, which is
# every box of the 50-box lab at once (the comparison against the floor, which starts all of
# them, stays like with like) while a thousand-box fleet queues.
BOXES_PER_CPU = 32
MIN_LIMIT = 4

_configured: dict[str, float] = {}


def default_limit(cpus: int | None = None, open_files: int | None = None) -> int:
    """The controller's own size: BOXES_PER_CPU a core, within its file-descriptor limit."""
    if cpus is None:
        cpus = os.cpu_count() or 1
    if open_files is None:
        open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if open_files == resource.RLIM_INFINITY:
            open_files = 1 << 20
    by_fds = (open_files - FDS_RESERVED) // FDS_PER_BOX
    return max(MIN_LIMIT, min(BOXES_PER_CPU * cpus, by_fds))


def parse_limit(text: str) -> int:
    """`--max-parallel N` / FLEET_MAX_PARALLEL: a whole number of boxes, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"not a whole number of boxes: {text!r}") from None
    if value < 1:
        raise ValueError(f"at least one box at a time, not {value}")
    return value


def parse_timeout(text: str) -> float:
    """`--timeout S` / FLEET_BOX_TIMEOUT: seconds, more than 0 and at most a day."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 86400:
        raise ValueError(f"a timeout is more than 0 s and at most 86400 s, not {text}")
    return value


def configure(max_parallel: int | None = None, timeout: float | None = None) -> None:
    """What this command's line asked for (None: the environment's, then the default); a
    second command in the same process starts from its own options, not the first one's."""
    _configured.clear()
    if max_parallel is not None:
        _configured["max_parallel"] = max_parallel
    if timeout is not None:
        _configured["timeout"] = timeout


def limit() -> int:
    if "max_parallel" in _configured:
        return within_open_files(int(_configured["max_parallel"]))
    if os.environ.get(LIMIT_ENV):
        return within_open_files(parse_limit(os.environ[LIMIT_ENV]))
    return default_limit()


_lowered: set[int] = set()


def within_open_files(asked: int) -> int:
    """An asked limit (`--max-parallel`, $FLEET_MAX_PARALLEL) that this process's open files
    can hold: its soft limit is raised toward the hard one as far as the boxes need (a process
    may; 1,024 is a soft default for select(), which nothing here uses), and past the hard one
    the limit is lowered to what fits, said once on stderr. (Before, a limit the open files
    could not hold had the boxes past what fitted fail one by one with EMFILE.)"""
    needed = FDS_RESERVED + asked * FDS_PER_BOX
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return asked
    wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass  # left as it is: the limit is lowered below instead
    fits = max(1, (soft - FDS_RESERVED) // FDS_PER_BOX)
    if fits >= asked:
        return asked
    if asked not in _lowered:
        _lowered.add(asked)
        print(
            f"reconcile: observing at most {fits} boxes at once, not {asked}: this process may "
            f"open {soft} files and a box in flight holds up to {FDS_PER_BOX} (raise `ulimit -n` "
            "for more)",
            file=sys.stderr,
        )
    return fits


def settings_problem() -> str | None:
    """Why the limit or the timeout this command would use cannot be read (a bad
    $FLEET_MAX_PARALLEL or $FLEET_BOX_TIMEOUT), said before any box is contacted; None when
    both are good."""
    for variable, read in ((LIMIT_ENV, limit), (TIMEOUT_ENV, box_timeout)):
        try:
            read()
        except ValueError as exc:
            return f"${variable}: {exc}"
    return None


def box_timeout() -> float:
    if "timeout" in _configured:
        return _configured["timeout"]
    if os.environ.get(TIMEOUT_ENV):
        return parse_timeout(os.environ[TIMEOUT_ENV])
    return DEFAULT_TIMEOUT_S


# -- slots -----------------------------------------------------------------------------------------
class Slots:
    """At most `size` boxes in flight: the first ones start now, the rest when one is read."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._busy = 0
        self._waiting: deque[Queued] = deque()
        self._closed = False
        self.peak = 0  # the most boxes that were ever in flight at once (for tests, benchmarks)

    def take(self, handle: Queued) -> None:
        with self._lock:
            closed = self._closed
            if not closed and self._busy >= self.size:
                self._waiting.append(handle)
                return
            if not closed:
                self._busy += 1
                self.peak = max(self.peak, self._busy)
        if closed:
            handle.never_started()
        else:
            handle.begin()

    def close(self) -> None:
        """Start no more boxes: the run is cancelled. Without this, cancelling the boxes one by
        one would give each one's slot to the next box in line, opening ssh to every box that
        had not started yet. The boxes in line end at once as never started."""
        with self._lock:
            self._closed = True
            waiting = list(self._waiting)
            self._waiting.clear()  # so give_back passes a slot to nobody
        for handle in waiting:
            handle.never_started()

    def give_back(self) -> None:
        with self._lock:
            nxt = self._waiting.popleft() if self._waiting else None
            if nxt is None:
                self._busy -= 1
            # else the slot passes straight to the next box: _busy stays
        if nxt is not None:
            nxt.begin()

    def drop(self, handle: Queued) -> bool:
        """Take a box that never started out of the queue (its run was cancelled)."""
        with self._lock:
            try:
                self._waiting.remove(handle)
            except ValueError:
                return False
            return True


class Queued(Running):
    """A box's collector run that starts when it gets a slot: a `Running` to everyone who
    waits for it (gather, cancel), so the callers do not know whether it waited in line."""

    def __init__(self, box: str, start: Callable[[], Running], slots: Slots) -> None:
        super().__init__(box, None)
        self._start = start
        self._slots = slots
        self._started = threading.Event()
        self._running: Running | None = None
        self._cancelled = False
        self._done = False
        self._lock = threading.Lock()

    @property
    def line_size(self) -> int:
        """How many boxes of its line run at once (observe._finish_each reads as many)."""
        return self._slots.size

    def begin(self) -> None:
        with self._lock:
            start = None if self._cancelled else self._start
        if start is None:
            self._slots.give_back()
            return
        running = start()
        with self._lock:
            self._running = running
            cancelled = self._cancelled
        self._started.set()
        if cancelled:  # cancel() came while it was starting and found nothing to stop
            running.cancel()
            self._release()

    def never_started(self) -> None:
        """Its run was cancelled (Slots.close) before its turn: it holds no slot, and a
        finish() waiting for its turn returns at once."""
        with self._lock:
            self._cancelled = True
            self._done = True
        self._started.set()

    def finish(self, timeout: float, limit: int = OUTPUT_LIMIT_BYTES) -> RemoteResult:
        """The box's result; `timeout` counts from its own start, not from its wait in line."""
        self._started.wait()
        if self._running is None:  # cancelled before its turn came
            return RemoteResult(self.box, None, "", "", "not started: the run was cancelled")
        try:
            return self._running.finish(timeout, limit)
        finally:
            self._release()

    def refused_anew(self, timeout: float = CHECK_S * 2) -> str | None:
        return None if self._running is None else self._running.refused_anew(timeout)

    def cancel(self) -> None:
        with self._lock:  # with begin(): exactly one of the two stops a box that is starting
            self._cancelled = True
            running = self._running
        if running is not None:
            running.cancel()
            self._release()
        elif self._slots.drop(self):
            self._done = True
            self._started.set()  # a finish() waiting for its turn returns at once

    def _release(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self._slots.give_back()


def close(handles: Iterable[Running]) -> None:
    """No box of `handles` that is still waiting for a slot starts from now on (the run is
    being cancelled: call before cancelling them one by one)."""
    for handle in handles:
        if isinstance(handle, Queued):
            handle._slots.close()


def cancel_all(handles: Iterable[Running]) -> None:
    """Stop every box of `handles` (a run interrupted or failed): none in line starts, and each
    one running has its ssh killed. Never raises, and one box's failure to stop is never a
    reason to leave the next box's ssh running: this runs while an interrupt (Ctrl-C) is on its
    way out, which an exception here would replace."""
    handles = list(handles)
    with contextlib.suppress(Exception):  # stopping the boxes matters more than why it failed
        close(handles)  # first: a cancelled box's slot must start no other box
    for handle in handles:
        with contextlib.suppress(Exception):  # the next box is stopped all the same
            handle.cancel()


# -- progress --------------------------------------------------------------------------------------
class Progress:
    """`31/50 boxes observed` on one line of stderr, rewritten in place: only on a terminal
    (never in a pipe, a log or a report), erased when done. Every count is drawn (a line of
    25 bytes per box): a count held back to save a write could stay wrong for as long as the
    next box takes, a whole timeout when it is the last one."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.stream = sys.stderr if stream is None else stream
        self.shown = False
        self.on = total > 0 and _is_terminal(self.stream)

    def update(self, done: int) -> None:
        if not self.on:
            return
        self.stream.write(f"\r{line(done, self.total)}\x1b[K")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def line(done: int, total: int) -> str:
    return f"{done}/{total} boxes observed"


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False
