"""A large replay's boxes read and compared by forked workers (reconciler/replay_workers.py):
the same results in the same order as one process gives, the work really spread, and what an
operator sees when a worker dies or the setting is wrong."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from reconciler.replay_workers import WORKERS_ENV, WORKERS_FROM, map_boxes, worker_count

ROOT = Path(__file__).resolve().parents[2]


def _names(count: int) -> list[str]:
    return [f"box-{i}" for i in range(count)]


def test_workers_give_the_serial_results_in_the_boxes_order() -> None:
    boxes = _names(160)  # 8 chunks of 20 for 2 workers
    parent = os.getpid()
    # The first boxes of the first two chunks meet: the worker that took one of them waits
    # until another took the other, so two workers take part however busy the machine is.
    both = multiprocessing.get_context("fork").Barrier(2, timeout=60)

    def job(name: str) -> tuple[str, int, int]:
        if name in ("box-0", "box-20"):
            both.wait()
        return name, len(name) * 7, os.getpid()

    spread = map_boxes(job, boxes, 2)
    assert [(n, v) for n, v, _ in spread] == [(n, len(n) * 7) for n in boxes]
    pids = {pid for _, _, pid in spread}
    assert parent not in pids and len(pids) == 2  # two forked workers did all of it


def test_a_job_closes_over_unpicklable_state() -> None:
    # The drift inputs reach the workers by fork, never by pickle: a lock cannot be pickled.
    lock = threading.Lock()
    table = {name: i for i, name in enumerate(_names(120))}

    def job(name: str) -> int:
        assert lock is not None
        return table[name]

    assert map_boxes(job, list(table), 2) == list(range(120))


def test_one_worker_or_another_thread_means_this_process() -> None:
    parent = os.getpid()
    assert {pid for pid in map_boxes(lambda n: os.getpid(), _names(120), 1)} == {parent}
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:  # a fork would copy no thread and keep any lock it held: no fork then
        assert {pid for pid in map_boxes(lambda n: os.getpid(), _names(120), 2)} == {parent}
    finally:
        release.set()
        other.join()


def test_a_box_error_in_a_worker_is_raised_as_itself() -> None:
    def job(name: str) -> str:
        if name == "box-77":
            raise ValueError("box-77 is unreadable")
        return name

    with pytest.raises(ValueError, match="box-77 is unreadable"):
        map_boxes(job, _names(120), 2)


def test_a_worker_that_dies_ends_the_run_with_an_error_not_a_hang() -> None:
    def job(name: str) -> str:
        if name == "box-5":
            os._exit(9)  # as a worker killed for memory would vanish
        return name

    with pytest.raises(ChildProcessError, match=WORKERS_ENV):
        map_boxes(job, _names(120), 2)


def test_worker_count() -> None:
    cpus = len(os.sched_getaffinity(0))
    assert worker_count(WORKERS_FROM - 1, {}) == 1
    assert worker_count(WORKERS_FROM, {}) == min(cpus, 8)
    assert worker_count(1000, {WORKERS_ENV: "3"}) == 3
    assert worker_count(1000, {WORKERS_ENV: "1"}) == 1
    assert worker_count(WORKERS_FROM - 1, {WORKERS_ENV: "4"}) == 1
    for bad in ("0", "-2", "two", "1e3", "300", "٣"):
        with pytest.raises(ValueError, match=WORKERS_ENV):
            worker_count(1000, {WORKERS_ENV: bad})


def _replay(root: Path, workers: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        WORKERS_ENV: workers,
        "XDG_CACHE_HOME": str(tmp / "cache"),
        "XDG_STATE_HOME": str(tmp / f"state-{workers}"),
    }
    argv = [sys.executable, "-m", "reconciler", "--root", str(root), "-i", "lab", "drift"]
    argv += ["--from-snapshot", str(root / "snapshot"), "--format", "json"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT, check=False)


def test_a_replay_reports_the_same_with_workers_as_without(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.scale_fleet import build_fleet

    root = tmp_path / "fleet"
    build_fleet(root, WORKERS_FROM + 20)
    alone, spread = _replay(root, "1", tmp_path), _replay(root, "2", tmp_path)
    assert alone.returncode == spread.returncode == 2, alone.stderr + spread.stderr
    assert '"boxes"' in alone.stdout and spread.stdout == alone.stdout.replace(
        _generated(alone.stdout), _generated(spread.stdout)
    )
    bad = _replay(root, "zero", tmp_path)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr == f"error: {WORKERS_ENV} must be a whole number from 1 to 256\n"


def _generated(report: str) -> str:
    # The one field that differs between two runs: when the report was made.
    line = next(x for x in report.splitlines() if '"generated_at"' in x)
    return line
