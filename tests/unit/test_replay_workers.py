"""A large replay's boxes read and compared by forked workers (reconciler/replay_workers.py):
the same results in the same order as one process gives, the work really spread, and what an
operator sees when a worker dies or the setting is wrong."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler.replay_workers import WORKERS_ENV, WORKERS_FROM, worker_count

ROOT = Path(__file__).resolve().parents[2]


# Every scenario that forks runs in a fresh interpreter: the test process may hold threads
# other tests left (map_boxes then rightly stays in its own process), and a worker that dies
# must not be the test runner.
_PRELUDE = """
import json, multiprocessing, os, sys, threading
from reconciler.replay_workers import map_boxes
names = [f"box-{i}" for i in range(160)]  # 8 chunks of 20 for 2 workers
parent = os.getpid()
"""


def _fresh(scenario: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _PRELUDE + scenario],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _printed(scenario: str) -> Any:
    done = _fresh(scenario)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_workers_give_the_serial_results_in_the_boxes_order() -> None:
    # The first boxes of the first two chunks meet: the worker that took one of them waits
    # until another took the other, so two workers take part however busy the machine is.
    results, parent = _printed(
        """
both = multiprocessing.get_context("fork").Barrier(2, timeout=60)
def job(name):
    if name in ("box-0", "box-20"):
        both.wait()
    return name, len(name) * 7, os.getpid()
print(json.dumps([map_boxes(job, names, 2), parent]))
"""
    )
    names = [f"box-{i}" for i in range(160)]
    assert [(n, v) for n, v, _ in results] == [(n, len(n) * 7) for n in names]
    pids = {pid for _, _, pid in results}
    assert parent not in pids and len(pids) == 2  # two forked workers did all of it


def test_a_job_closes_over_unpicklable_state() -> None:
    # The drift inputs reach the workers by fork, never by pickle: a lock cannot be pickled.
    spread = _printed(
        """
lock = threading.Lock()
table = {name: i for i, name in enumerate(names)}
def job(name):
    with lock:
        return table[name], os.getpid()
print(json.dumps(map_boxes(job, names, 2)))
"""
    )
    assert [value for value, _ in spread] == list(range(160))


def test_one_worker_or_another_thread_means_this_process() -> None:
    alone, with_thread, parent = _printed(
        """
alone = map_boxes(lambda n: os.getpid(), names, 1)
release = threading.Event()
other = threading.Thread(target=release.wait)
other.start()
with_thread = map_boxes(lambda n: os.getpid(), names, 2)
release.set()
other.join()
print(json.dumps([alone, with_thread, parent]))
"""
    )
    # A fork would copy no thread and keep any lock one held: no fork then.
    assert set(alone) == set(with_thread) == {parent}


def test_a_box_error_in_a_worker_is_raised_as_itself() -> None:
    done = _fresh(
        """
def job(name):
    if name == "box-77":
        raise ValueError("box-77 is unreadable")
    return os.getpid()
map_boxes(job, names, 2)
"""
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == "ValueError: box-77 is unreadable"


def test_a_worker_that_dies_ends_the_run_with_an_error_not_a_hang() -> None:
    done = _fresh(
        """
def job(name):
    if name == "box-5":
        os._exit(9)  # as a worker killed for memory would vanish
    return name
map_boxes(job, names, 2)
"""
    )
    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]
    assert (
        last.startswith("ChildProcessError: a replay worker process ended") and WORKERS_ENV in last
    )


def test_workers_end_with_a_replay_that_is_killed(tmp_path: Path) -> None:
    """A replay killed (SIGKILL: out of memory, a timeout) takes its workers with it: orphans
    would live on holding the report's spool (report/spool.py), an unlinked file only their
    exit frees."""
    import signal
    import time

    pids = tmp_path / "pids"
    scenario = f"""
import time
def job(name):
    with open({str(pids)!r}, "a") as out:
        out.write(f"{{os.getpid()}}\\n")
    time.sleep(60)
map_boxes(job, names, 2)
"""
    replay = subprocess.Popen([sys.executable, "-c", _PRELUDE + scenario], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = {int(p) for p in pids.read_text().split()} if pids.exists() else set()
            if len(found) == 2:
                break
            time.sleep(0.05)
        assert len(found) == 2, "both workers started"
        replay.send_signal(signal.SIGKILL)
        replay.wait(30)
        deadline = time.monotonic() + 10
        alive = found
        while alive and time.monotonic() < deadline:
            alive = {pid for pid in found if _alive(pid)}
            time.sleep(0.05)
        assert not alive, f"workers outlived their replay: {sorted(alive)}"
    finally:
        replay.kill()
        for pid in {int(p) for p in pids.read_text().split()} if pids.exists() else ():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by init, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


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


def _replay(root: Path, workers: str, tmp: Path, *more: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        WORKERS_ENV: workers,
        "XDG_CACHE_HOME": str(tmp / "cache"),
        "XDG_STATE_HOME": str(tmp / f"state-{workers}"),
    }
    argv = [sys.executable, "-m", "reconciler", "--root", str(root), "-i", "lab", "drift"]
    argv += ["--from-snapshot", str(root / "snapshot"), "--format", "json", *more]
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
    # A replay that also records its run: the same report, and the same record whether the
    # store read the report's document from its boxes' entries (drift.replay_parts, workers)
    # or was given the boxes' results (one process).
    records = []
    for workers in ("1", "2"):
        history = tmp_path / f"history-{workers}.sqlite3"
        kept = _replay(root, workers, tmp_path, "--history", str(history))
        assert kept.returncode == 2 and history.is_file(), kept.stderr
        assert kept.stdout == spread.stdout.replace(
            _generated(spread.stdout), _generated(kept.stdout)
        )
        records.append(_recorded(history))
    assert records[0] == records[1] and records[0][1], "every entry, recorded alike"
    bad = _replay(root, "zero", tmp_path)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr == f"error: {WORKERS_ENV} must be a whole number from 1 to 256\n"


def test_a_recorded_replay_in_parts_keeps_what_one_process_keeps(tmp_path: Path) -> None:
    """A recorded replay in workers makes each box's rows, counts and packed observation
    beside its comparison (history/kept_parts.py), never reading its report back: the store's
    report document, its rows, its observations and the metrics are those of the same replay in
    one process, which builds the document whole (history/record.drift_record). A file the
    replay refuses (`Infinity`, a key twice) is kept by neither, nor its collector time."""
    sys.path.insert(0, str(ROOT))
    from bench.scale_fleet import build_fleet

    root = tmp_path / "fleet"
    build_fleet(root, WORKERS_FROM + 20)
    snapshot = root / "snapshot"
    odd = snapshot / "spark-1.json"
    odd.write_text(odd.read_text().replace("{", '{"extra": Infinity, ', 1))
    twice = snapshot / "orin-2.json"
    twice.write_text(twice.read_text().replace("{", '{"box": "first", ', 1))
    kept = {}
    for workers in ("1", "2"):
        history, metrics = tmp_path / f"h-{workers}.sqlite3", tmp_path / f"m-{workers}.prom"
        run = _replay(root, workers, tmp_path, "--history", str(history), "--metrics", str(metrics))
        assert run.returncode == 1 and "spark-1" in run.stdout, run.stderr
        with sqlite3.connect(history) as conn:
            (report,) = conn.execute("SELECT report FROM run_reports").fetchone()
            boxes = {row[0] for row in conn.execute("SELECT box FROM observations")}
        document = json.loads(report)
        del document["generated_at"]
        kept[workers] = (document, _recorded(history), _untimed(metrics.read_text()))
        assert not {"spark-1", "orin-2"} & boxes and len(boxes) == WORKERS_FROM + 18
        assert 'box_collect_duration_seconds{box="spark-1"}' not in kept[workers][2]
        assert 'box_collect_duration_seconds{box="thor-1"}' in kept[workers][2]
    assert kept["1"] == kept["2"]


def _untimed(metrics: str) -> str:
    # The metrics less when the run finished and how long it took (each run's own).
    lines = metrics.splitlines()
    return "\n".join(x for x in lines if "timestamp_seconds" not in x and "run_duration" not in x)


def _recorded(history: Path) -> tuple[object, ...]:
    """A store's one run as the history keeps it (rows without their run id, in order), less
    when the report was made."""
    with sqlite3.connect(history) as conn:
        (report,) = conn.execute("SELECT report FROM run_reports").fetchone()
        document = json.loads(report)
        del document["generated_at"]
        tables = [
            sorted(row[1:] for row in conn.execute(f"SELECT * FROM {table}"))
            for table in ("entries", "boxes", "observations")
        ]
    return (document, *tables)


def _generated(report: str) -> str:
    # The one field that differs between two runs: when the report was made.
    line = next(x for x in report.splitlines() if '"generated_at"' in x)
    return line
