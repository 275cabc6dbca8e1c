"""A large snapshot replay's boxes, read and compared on every core the controller may use.

Replaying a snapshot is CPU work in Python, box by box, each box independent of every other:
its file read and parsed into the typed document, then compared (compare/ does no I/O), then
dropped. At 1,000 boxes that is ~2 s on one core, two thirds of the replay (BENCHMARKS.md,
issue 12), while the other cores idle. Here the boxes are cut into chunks that worker
processes read and compare:
- the workers are forked from the replaying process, so they start with the remembered drift
  inputs in memory (shared copy-on-write; nothing is pickled on the way in) and import nothing;
- each chunk's results come back pickled, in the boxes' order, as the caller's `pack` made
  them in the worker (a JSON replay's: each box's tally and causes, its entries' text put
  aside in the report's spool, report/spool.py), and the caller `take`s them chunk by chunk
  as they arrive: the report is built from them exactly as from results made here;
- `concurrent.futures` runs them: an error in a box's job is raised here as it would be in a
  serial replay; a worker that dies fails the pool (never hangs it), and the run ends with
  that said as its error;
- Ctrl-C (SIGINT, sent to the terminal's whole process group) is this process's alone to
  act on: the workers ignore it, so none dies with a traceback of its own (nor breaks the
  pool, whose manager thread then raised InvalidStateError on the cancelled chunks). Here
  the chunks not started are cancelled, the workers are told to stop (each ends its chunk
  after the box it is on: the pool already counts as running the chunks queued for them),
  and KeyboardInterrupt goes on to the command (exit 130).

Only for replays of `WORKERS_FROM` boxes or more (forking and the pool cost ~20-40 ms), and
only from a process with no other thread (a fork copies no thread, so a lock another thread
holds would stay held in the child). `FLEET_REPLAY_WORKERS=N` sets the number of workers (1:
none); the default is one per CPU this process may run on, at most `MAX_WORKERS`.
"""

from __future__ import annotations

import mmap
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from reconciler.gc_pause import paused_gc

Result = TypeVar("Result")
Packed = TypeVar("Packed")

WORKERS_ENV = "FLEET_REPLAY_WORKERS"
# From this many boxes a replay forks workers: below it, one core is done in ~0.2 s.
WORKERS_FROM = 100
MAX_WORKERS = 8
# Chunks per worker, at least: small enough that the worker with the last chunk does not keep
# the other idle long at the end; a chunk's result is small (each box's tally and causes, its
# entries spooled), so many chunks cost little.
CHUNKS_PER_WORKER = 8
# And at most this many boxes a chunk: a worker holds its chunk's results until it packs them,
# and a box's report entry grows with the fleet (its mesh seeds name every member), so chunks
# that grew with the fleet too held memory growing as its square (2 MB a chunk at 1,000 boxes,
# three copies on the way to the spool). Each chunk now costs a small pickle and a spool write.
MAX_CHUNK = 16
# Boxes a chunk holds when one process does them all: a worker's at most.
SERIAL_CHUNK = MAX_CHUNK


def worker_count(boxes: int, environ: Mapping[str, str] | None = None) -> int:
    """How many processes read and compare `boxes` boxes (1: this one alone)."""
    env = os.environ if environ is None else environ
    chosen = env.get(WORKERS_ENV, "").strip()
    if chosen:
        if not chosen.isascii() or not chosen.isdigit() or not 1 <= int(chosen) <= 256:
            raise ValueError(f"{WORKERS_ENV} must be a whole number from 1 to 256")
        wanted = int(chosen)
    else:
        wanted = min(len(os.sched_getaffinity(0)), MAX_WORKERS)
    return 1 if boxes < WORKERS_FROM else max(1, min(wanted, boxes))


def map_boxes(job: Callable[[str], Result], boxes: Sequence[str], workers: int) -> list[Result]:
    """`[job(box) for box in boxes]`, in that order, with `workers` processes doing it."""
    out: list[Result] = []
    map_chunks(job, boxes, workers, _same, out.extend)
    return out


def map_chunks(
    job: Callable[[str], Result],
    boxes: Sequence[str],
    workers: int,
    pack: Callable[[list[Result]], Packed],
    take: Callable[[Packed], None],
) -> None:
    """`job` of every box, with `workers` processes doing it: the boxes are cut into chunks,
    each chunk's results given to `pack` where they were made (a worker) and what it packs to
    `take` here, chunk by chunk in the boxes' order, as each arrives. So this process need not
    hold every box's result at once (report/spool.py keeps a large report's entries aside)."""
    if workers <= 1 or threading.active_count() > 1:
        # In chunks as the workers' (a chunk's results packed, then taken, before the next
        # is made): one process holds no more of them at once than a worker would.
        with paused_gc():
            for start in range(0, len(boxes), SERIAL_CHUNK):
                take(pack([job(box) for box in boxes[start : start + SERIAL_CHUNK]]))
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    size = max(1, min(MAX_CHUNK, -(-len(boxes) // (workers * CHUNKS_PER_WORKER))))
    chunks = [list(boxes[i : i + size]) for i in range(0, len(boxes), size)]
    context = multiprocessing.get_context("fork")
    # Made before the workers fork, so shared with them: one byte of shared memory (an
    # anonymous MAP_SHARED page: ~40 ns a read, no import; multiprocessing's RawValue imports
    # ctypes, ~1.5 ms), set on Ctrl-C (`_Job.run`)
    _Job.stop = mmap.mmap(-1, 1)
    try:
        # paused_gc: the results unpickled here are millions of acyclic objects, which the
        # collector would walk again and again as they arrive (reconciler/gc_pause.py).
        with (
            paused_gc(),
            ProcessPoolExecutor(
                workers,
                mp_context=context,
                initializer=_Job.take,
                initargs=(job, pack, os.getpid()),
            ) as pool,
        ):
            try:
                with _sigint_held():  # the workers fork here: none takes one before it ignores it
                    results = pool.map(_Job.run, chunks)
                for chunk in results:
                    take(chunk)
            except KeyboardInterrupt:
                _Job.stop[0] = 1  # what they are still doing is thrown away
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    except BrokenProcessPool as exc:
        # A worker killed (out of memory, a signal) or crashed: said as the run's error, as
        # an OSError is (exit 1), never as a traceback.
        raise ChildProcessError(
            "a replay worker process ended before its boxes were compared "
            f"({WORKERS_ENV}=1 replays in one process)"
        ) from exc


def _same(results: list[Result]) -> list[Result]:
    return results


# prctl(2) option: the signal this process gets when the thread that forked it ends.
_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """A worker ends with the replay that forked it. Killed (OOM, SIGKILL, SIGTERM, a timeout),
    the replay never shuts its pool down, and its workers lived on as orphans, each holding the
    report's spool (report/spool.py: an unlinked file, ~30 MB at 1,000 boxes, kept until the
    last holder exits) for as long as they lived. Linux only (prctl); elsewhere as before."""
    import ctypes  # ~1.5 ms, in each worker, after the fork: not on the replay's own path

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the replay ended before the call above: already orphaned
        os._exit(1)


@contextmanager
def _sigint_held() -> Iterator[None]:
    """SIGINT blocked while the workers are forked (they inherit the mask, and unblock it once
    they ignore the signal, `_Job.take`); one that came meanwhile is delivered here after."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class _Job:
    """The job a forked worker runs: given at its start, in memory (a closure over the drift
    inputs), so it is never pickled; each chunk of box names then is."""

    current: Callable[[str], Any] | None = None
    pack: Callable[[list[Any]], Any] | None = None
    stop: mmap.mmap | None = None  # [0] set by map_boxes on Ctrl-C: the rest is not done

    @staticmethod
    def take(job: Callable[[str], Any], pack: Callable[[list[Any]], Any], parent: int) -> None:
        _die_with(parent)
        # Ctrl-C reaches every process of the terminal's group: the replay's own process acts
        # on it (map_boxes), a worker never (its traceback would be printed beside the run's).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        _Job.current, _Job.pack = job, pack

    @staticmethod
    def run(boxes: list[str]) -> Any:
        job, pack = _Job.current, _Job.pack
        assert job is not None and pack is not None, "a worker runs only after taking its job"
        stop = _Job.stop
        assert stop is not None, "made before the workers fork"
        with paused_gc():  # as the serial replay: every box's objects die by reference count
            return pack([job(box) for box in boxes if not stop[0]])
