"""Benchmark the offline engine at fleet scale: `reconcile drift --from-snapshot` over fleets of
10, 100 and 1,000 boxes built from examples/lab-incidents (bench/scale_fleet.py), against the
least any replay must do, in one run.

Two floors read and parse every observation file of the snapshot with `json` (interpreter
start included, as the tool pays it too):
- floor, 1 process: one Python process, the floor the issue names;
- floor, N processes: the same files split over N forked processes, N being the number of
  processes the replay itself reads and compares its boxes on at that fleet size
  (reconciler/replay_workers.py worker_count: 1 below 100 boxes, one per core from there),
  the least the same cores could do.
The cold floor adds the desired-state YAML (one process). Each replay is a separate
`reconcile` process:
- cold: an empty cache directory (XDG_CACHE_HOME), so the YAML is parsed and validated;
- warm: the drift inputs remembered from the previous run (reconciler/drift_inputs.py);
- text, markdown, html: warm, that report instead of JSON;
- recorded: warm, with a new history store and the metrics file.
Every round runs each row once, in an order shuffled anew each round (seeded; the seed is in
the output). Times are the medians of the rounds. Memory is measured for cold, warm and
recorded in runs of their own each round (the sampling would slow a timed run): every
process of the run summed (PSS), and the largest single process (its max RSS, wait4); the
memory verdicts take the maximum over the rounds.
Peak memory linear (the issue's goal) is judged by the boxes, in two series that must both
pass, each on one process structure throughout (both ends of each step, both steps): a step
that starts in one process and ends in forked workers counts the workers' own fixed memory as
growth, and a forked replay's workers each copy (copy-on-write) the pages of the objects they
touch, a per-box cost a replay in one process does not pay, so only like against like shows
whether a box's memory grows with the fleet:
- one process: the smallest, middle and largest sizes, each with the replay in one process
  (at a size whose replay forks workers, 100 boxes and more, the memory runs are made again
  with FLEET_REPLAY_WORKERS=1);
- forked workers: the middle size, a memory-only size between it and the largest
  (--memory-size, default 400 boxes) and the largest, each with the replay's own workers
  (the three must fork as many, else the series is not measured and the verdict
  undetermined). The memory-only size gets the memory runs alone (no timed rows, no row of
  the tables), measured after the timed sizes.
Beside it, as an explanation only: memory against the bytes the replay reads (the
desired-state and snapshot files of the fleet built, measured here) and the JSON report it
writes.
The tables go into BENCHMARKS.md between their own markers; the rest of the file is kept.

    .venv/bin/python bench/scale_bench.py [--runs 3] [--sizes 10,100,1000] [--memory-size 400]
        [--seed S] [--output BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from time import perf_counter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.scale_fleet import build_fleet  # noqa: E402
from reconciler.fast_json import LARGE  # noqa: E402
from reconciler.replay_workers import WORKERS_ENV, WORKERS_FROM, worker_count  # noqa: E402

START, END = "<!-- scale-bench:start -->", "<!-- scale-bench:end -->"
RECONCILE = [sys.executable, "-m", "reconciler"]
FLOOR = (
    "import json, pathlib, sys\n"
    "for p in sorted(pathlib.Path(sys.argv[1]).glob('*.json')):\n"
    "    json.loads(p.read_bytes())\n"
)
# The same files split over N processes (argv[2]), forked as the replay forks its workers:
# this process parses every N-th file from the first, each of N - 1 forked children every N-th
# from its own offset (the files are all about the same size), and the parent waits for them.
FLOOR_SPLIT = (
    "import json, os, pathlib, sys\n"
    "files = sorted(pathlib.Path(sys.argv[1]).glob('*.json'))\n"
    "n = int(sys.argv[2])\n"
    "children = []\n"
    "for offset in range(1, n):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        try:\n"
    "            for p in files[offset::n]:\n"
    "                json.loads(p.read_bytes())\n"
    "        except BaseException:\n"
    "            os._exit(1)\n"
    "        os._exit(0)\n"
    "    children.append(pid)\n"
    "for p in files[0::n]:\n"
    "    json.loads(p.read_bytes())\n"
    "for pid in children:\n"
    "    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:\n"
    "        sys.exit('a floor process failed')\n"
)
# The least a cold replay must parse: the same observation files, and every desired-state file
# (the inventory, group_vars, the facts overlays) as libyaml's events (C, ruamel.yaml.clib)
# built into plain dicts and lists: no line numbers, no scalar types, no checks, no validation.
# That is the fastest YAML parse here (ruamel.yaml's own safe loader, its constructors in
# Python, took ~5x as long at 1,000 boxes: too slow to be a floor; the replay's own located
# parse, desired/yaml_fast.py, is faster than it).
FLOOR_COLD = FLOOR + (
    "from _ruamel_yaml import CParser\n"
    "def value(get, event):\n"
    "    kind = type(event).__name__\n"
    "    if kind == 'ScalarEvent':\n"
    "        return event.value\n"
    "    if kind == 'SequenceStartEvent':\n"
    "        out = []\n"
    "        while type(item := get()).__name__ != 'SequenceEndEvent':\n"
    "            out.append(value(get, item))\n"
    "        return out\n"
    "    out = {}\n"
    "    while type(key := get()).__name__ != 'MappingEndEvent':\n"
    "        out[key.value] = value(get, get())\n"
    "    return out\n"
    "def load(text):\n"
    "    get = CParser(text).get_event\n"
    "    get(), get()  # the stream's and the document's start\n"
    "    return value(get, get())\n"
    "root = pathlib.Path(sys.argv[1]).parent\n"
    "for d in ('inventory', 'group_vars', 'facts'):\n"
    "    for p in sorted((root / d).rglob('*.yaml')):\n"
    "        load(p.read_text())\n"
)

# The timed rows, and the rows whose memory is measured in runs of their own.
TIMED = ("floor", "floor_n", "floor_cold", "cold", "warm", "text", "markdown", "html", "recorded")
MEMORY = ("cold", "warm", "recorded")
LABELS = {"floor": "floor, 1 process", "floor_n": "floor, N processes", "floor_cold": "cold floor"}
# Memory is linear when, in each series of three sizes, a box adds at most this much more in
# the second step than in the first (sampling and allocator noise).
LINEAR_TOLERANCE = 1.1
# The forked-workers series' middle point: a fleet measured for memory only (--memory-size).
MEMORY_SIZE = 400


@dataclass(frozen=True)
class Sample:
    seconds: float
    peak_mb: float  # the largest single process's maximum RSS (itself or a reaped descendant)
    cpu: float = 0.0  # user + system CPU seconds of the child and every descendant it reaped


@dataclass
class Size:
    """One fleet size's measurements, every round kept."""

    workers: int  # the processes the replay reads and compares its boxes on (1: itself)
    rounds: dict[str, list[Sample]] = field(default_factory=dict)  # timed rows
    summed: dict[str, list[float]] = field(default_factory=dict)  # MB, all processes at once
    # The same as `summed`, the replay in one process (FLEET_REPLAY_WORKERS=1): measured at
    # every timed size whose replay forks workers, for the one-process series (one_process_sizes).
    single: dict[str, list[float]] = field(default_factory=dict)
    orders: list[list[str]] = field(default_factory=list)  # each round's order of the rows
    input_bytes: int = 0  # the desired-state and snapshot files the replay reads
    report_bytes: int = 0  # the JSON report a replay writes

    def median(self, row: str) -> Sample:
        samples = self.rounds[row]
        return Sample(
            statistics.median(s.seconds for s in samples),
            statistics.median(s.peak_mb for s in samples),
            statistics.median(s.cpu for s in samples),
        )

    def seconds(self, row: str) -> float:
        return self.median(row).seconds

    def summed_max(self, row: str) -> float:
        """The most every process of `row` held at once, over the rounds (MB)."""
        return max(self.summed[row])

    def largest_max(self, row: str) -> float:
        """The largest single process of `row`, over the rounds (MB)."""
        return max(s.peak_mb for s in self.rounds[row])

    def peak_in(self, row: str, processes: int) -> float:
        """`summed_max(row)` with the replay on `processes` processes: this size's own runs if
        it uses that many, else the runs made with the replay in one process."""
        if processes == self.workers and self.summed.get(row):
            return self.summed_max(row)
        if processes == 1 and self.single.get(row):
            return max(self.single[row])
        raise ValueError(f"no memory measured for {row} with {processes} replay processes")


# The memory-only size of the forked-workers series: its boxes, and its memory runs.
MemoryOnly = tuple[int, Size]


def run_child(
    argv: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,), stdout: Path | None = None
) -> Sample:
    """Wall time, peak RSS and CPU of one child process (its own rusage, via wait4: the CPU of
    the descendants it waited for included, the RSS of the largest of them). Its output goes
    to the file `stdout` if given, else nowhere."""
    started = perf_counter()
    with stdout.open("wb") if stdout else nullcontext(subprocess.DEVNULL) as out:
        child = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.PIPE)
    assert child.stderr is not None
    err = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode not in ok:
        raise SystemExit(f"{argv[:4]} exited {child.returncode}: {err.decode()[-500:]}")
    return Sample(seconds, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime)


def summed_peak_mb(argv: list[str], env: dict[str, str], ok: tuple[int, ...] = (2,)) -> float:
    """The most memory one run held across all its processes at once: the replay's own, its
    forked workers' (reconciler/replay_workers.py) and the children it forks to store its
    caches or history, every descendant alive at the moment: their proportional set sizes
    (PSS: a page the workers share copy-on-write with the replay counts once in all), summed,
    sampled every 20 ms (a peak shorter than that can be missed). A run of its own, beside the
    timed ones, which the sampling would slow."""
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while child.poll() is None:
        pids = [child.pid, *_descendants(child.pid)]
        peak = max(peak, sum(_pss_kib(pid) for pid in pids))
        time.sleep(0.02)
    if child.returncode not in ok:
        raise SystemExit(f"{argv[:4]} exited {child.returncode}")
    return peak / 1024


def _descendants(pid: int) -> list[int]:
    """Every living descendant of `pid`: the children each of its threads forked, and theirs."""
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out  # ended between the listing and the read
    for task in tasks:
        try:
            children = [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
        for child in children:
            out += [child, *_descendants(child)]
    return out


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass  # ended between the listing and the read
    return 0


def replay(root: Path, fmt: str) -> list[str]:
    return [
        *RECONCILE, "--root", str(root), "-i", "lab", "drift",
        "--from-snapshot", str(root / "snapshot"), "--format", fmt,
    ]  # fmt: skip


def input_bytes(root: Path) -> int:
    """The bytes a replay of the fleet at `root` reads: every desired-state file (inventory,
    group_vars, the facts overlays) and every snapshot file (the index and each box's)."""
    return sum(
        p.stat().st_size
        for d in ("inventory", "group_vars", "facts", "snapshot")
        for p in (root / d).rglob("*")
        if p.is_file()
    )


def one_process_sizes(workers: dict[int, int]) -> set[int]:
    """The sizes (of {size: replay processes}) to measure memory at again with the replay in
    one process, for the one-process series: every size whose replay forks workers."""
    return {size for size, processes in workers.items() if processes > 1}


def linearity_steps(sizes: list[int]) -> list[tuple[int, int]]:
    """The one-process series' two steps: smallest to middle, middle to largest."""
    if len(sizes) < 3:
        return []
    return [(sizes[0], sizes[-2]), (sizes[-2], sizes[-1])]


class Fleet:
    """A fleet of `size` boxes built in `work` (bench/scale_fleet.py), its drift inputs
    remembered (the warm replays'), and the replays its rows run."""

    def __init__(self, size: int, work: Path) -> None:
        self.size, self.work = size, work
        self.root = work / f"fleet-{size}"
        build_fleet(self.root, size)
        # The history store of these runs stays in the work directory, not the user's.
        self.base = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(work / "state")}
        self.workers = worker_count(size, self.base)
        self.env_warm = {**self.base, "XDG_CACHE_HOME": str(work / f"cache-warm-{size}")}
        report = work / f"report-{size}.json"
        run_child(replay(self.root, "json"), self.env_warm, ok=(2,), stdout=report)  # remembers
        self.report_bytes = report.stat().st_size
        report.unlink()

    def measured(self) -> Size:
        """An empty Size of this fleet, with what its files and its report weigh."""
        return Size(
            self.workers, input_bytes=input_bytes(self.root), report_bytes=self.report_bytes
        )

    def recorded(self, index: int, what: str) -> list[str]:
        # Warm, and the run recorded: a new history store (each box's observation kept) and
        # the metrics file.
        store = self.work / f"history-{self.size}-{index}-{what}.sqlite3"
        metrics = self.work / "metrics.prom"
        return [*replay(self.root, "json"), "--history", str(store), "--metrics", str(metrics)]

    def cold_env(self, index: int, what: str) -> dict[str, str]:
        # A new and empty cache directory: nothing remembered.
        return {
            **self.base,
            "XDG_CACHE_HOME": str(self.work / f"cache-cold-{self.size}-{index}-{what}"),
        }

    def memory(self, row: str, index: int, what: str = "memory") -> float:
        """The summed peak of one run of the memory row `row` (all processes); what ==
        "memory1": the replay in one process, whatever the fleet's size."""
        one = {WORKERS_ENV: "1"} if what == "memory1" else {}
        if row == "cold":
            return summed_peak_mb(replay(self.root, "json"), {**self.cold_env(index, what), **one})
        if row == "recorded":
            return summed_peak_mb(self.recorded(index, what), {**self.env_warm, **one})
        return summed_peak_mb(replay(self.root, "json"), {**self.env_warm, **one})

    def run(self, got: Size, name: str, index: int) -> None:
        """The memory run `name` ("memory:ROW", or "memory1:ROW": in one process), into `got`."""
        kind, _, row = name.partition(":")
        if kind == "memory1":
            got.single[row].append(self.memory(row, index, "memory1"))
        else:
            got.summed[row].append(self.memory(row, index))

    def memory_runs(self, got: Size) -> list[str]:
        """The names of one round's memory runs: every memory row, and again in one process
        where `got` keeps those."""
        return [*(f"memory:{row}" for row in MEMORY), *(f"memory1:{row}" for row in got.single)]

    def end_round(self, index: int) -> None:
        for leftover in self.work.glob(f"history-{self.size}-{index}-*"):  # ~80 MB at 1,000 boxes
            leftover.unlink()


def measure(size: int, runs: int, work: Path, rng: random.Random, one_process: bool) -> Size:
    """Every row of `size` boxes, `runs` rounds; `one_process`: the memory rows also with the
    replay in one process."""
    fleet = Fleet(size, work)
    got = fleet.measured()
    got.rounds = {row: [] for row in TIMED}
    got.summed = {row: [] for row in MEMORY}
    got.single = {row: [] for row in MEMORY} if one_process else {}
    root, base, env_warm = fleet.root, fleet.base, fleet.env_warm
    snapshot = str(root / "snapshot")

    def timed(row: str, index: int) -> Sample:
        if row == "floor":
            return run_child([sys.executable, "-c", FLOOR, snapshot], base)
        if row == "floor_n":
            return run_child([sys.executable, "-c", FLOOR_SPLIT, snapshot, str(got.workers)], base)
        if row == "floor_cold":
            return run_child([sys.executable, "-c", FLOOR_COLD, snapshot], base)
        if row == "cold":
            return run_child(replay(root, "json"), fleet.cold_env(index, "timed"), ok=(2,))
        if row == "recorded":
            return run_child(fleet.recorded(index, "timed"), env_warm, ok=(2,))
        fmt = "json" if row == "warm" else row  # every other format, warm
        return run_child(replay(root, fmt), env_warm, ok=(2,))

    for index in range(runs):
        order = [*TIMED, *fleet.memory_runs(got)]
        rng.shuffle(order)
        got.orders.append(order)
        for name in order:
            if name in TIMED:
                got.rounds[name].append(timed(name, index))
            else:
                fleet.run(got, name, index)
        fleet.end_round(index)
        times = ", ".join(f"{k} {v[-1].seconds:.2f}s" for k, v in got.rounds.items())
        print(f"{size} boxes, round {index + 1} ({' '.join(order)}): {times}", file=sys.stderr)
    return got


def measure_memory(
    size: int, runs: int, work: Path, rng: random.Random, one_process: bool = False
) -> Size:
    """The memory rows alone of `size` boxes (no timed row), `runs` rounds in a new shuffled
    order each, as measure() makes them; `one_process`: also with the replay in one process."""
    fleet = Fleet(size, work)
    got = fleet.measured()
    got.summed = {row: [] for row in MEMORY}
    got.single = {row: [] for row in MEMORY} if one_process else {}
    for index in range(runs):
        order = fleet.memory_runs(got)
        rng.shuffle(order)
        got.orders.append(order)
        for name in order:
            fleet.run(got, name, index)
        fleet.end_round(index)
        peaks = ", ".join(f"{k} {v[-1]:.0f} MB" for k, v in got.summed.items())
        print(f"{size} boxes (memory only), round {index + 1}: {peaks}", file=sys.stderr)
    return got


def table(
    results: dict[int, Size],
    runs: int,
    seed: int,
    profile: dict[str, float],
    memory_only: MemoryOnly | None = None,
) -> list[str]:
    # What a replay of WORKERS_FROM boxes or more forks here (whatever sizes this run measured).
    workers = worker_count(max(WORKERS_FROM, *results))
    cores = len(os.sched_getaffinity(0))
    per_core = "one per core here" if workers == cores else f"on {cores} cores here"
    lines = [
        START,
        "## Offline engine at scale",
        "",
        f"`bench/scale_bench.py`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f} at the end. Fleets built from "
        "examples/lab-incidents by bench/scale_fleet.py (thor, spark, orin, thor-1, ...); "
        f"median of {runs} rounds, each row a new process, the rows in a new shuffled order "
        f"each round (Python's `random.Random({seed})`). "
        "Two floors parse every observation file of the snapshot with `json`: "
        "**floor, 1 process** is the issue's floor, one Python process; **floor, N processes** "
        "parses the same files split over as many forked processes as the replay reads and "
        "compares its boxes on at that fleet size (the *replay processes* column: "
        f"reconciler/replay_workers.py forks {workers} workers from {WORKERS_FROM} boxes on, "
        f"{per_core}, and none below), the least the same cores could do. "
        "Cold floor: the one-process floor, and every "
        "desired-state file (inventory, group_vars, facts overlays) read as libyaml's events (C) "
        "built into plain dicts and lists (no line numbers, no scalar types), the least a "
        "replay with nothing remembered must parse (in one process: the replay parses its YAML "
        "in its own). Cold: `reconcile drift --from-snapshot "
        "--format json` with an empty cache directory (the YAML parsed and validated); warm: "
        "the drift inputs remembered; text, markdown, html: warm, that report; recorded: "
        "warm, with `--history` (a new store: the run, its entries and each box's observation) "
        "and `--metrics`. CPU: every process's user + system time (forked workers and floor "
        "processes included).",
        "",
        "| boxes | replay processes | floor, 1 process s | floor, N processes s | cold floor s "
        "| cold s | warm s | text s | markdown s | html s | recorded s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size, r in results.items():
        cells = " | ".join(
            f"{r.seconds(k):.2f}"
            for k in ("floor", "floor_n", "floor_cold", "cold", "warm", "text", "markdown", "html")
        )
        lines.append(f"| {size} | {r.workers} | {cells} | {r.seconds('recorded'):.2f} |")
    lines += [
        "",
        "Ratios of those medians (wall time), and CPU time:",
        "",
        "| boxes | cold × floor, 1 process | cold × floor, N processes | cold × cold floor "
        "| warm × floor, 1 process | warm × floor, N processes | floor, 1 process CPU s "
        "| floor, N processes CPU s | cold CPU s | warm CPU s | cold CPU × floor CPU "
        "| warm CPU × floor CPU |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size, r in results.items():
        floor, split, cold, warm = (r.seconds(k) for k in ("floor", "floor_n", "cold", "warm"))
        cpu = {k: r.median(k).cpu for k in ("floor", "floor_n", "cold", "warm")}
        lines.append(
            f"| {size} | {cold / floor:.1f} | {cold / split:.1f} "
            f"| {cold / r.seconds('floor_cold'):.1f} | {warm / floor:.1f} | {warm / split:.1f} "
            f"| {cpu['floor']:.2f} | {cpu['floor_n']:.2f} | {cpu['cold']:.2f} | {cpu['warm']:.2f} "
            f"| {cpu['cold'] / cpu['floor']:.1f} | {cpu['warm'] / cpu['floor']:.1f} |"
        )
    lines += [
        "",
        "Memory, the maximum over the rounds (not the median). *All processes*: the most the "
        "replay, its workers and the children it forks to store its caches or history held at "
        "the same moment (their PSS summed: a page shared copy-on-write counts once), sampled "
        "every 20 ms in a run of its own each round; *largest process*: the largest single "
        "process's maximum RSS (wait4) in the timed runs.",
        "",
        "| boxes | cold, all processes MB | warm, all processes MB | recorded, all processes MB "
        "| cold, largest process MB | warm, largest process MB | recorded, largest process MB |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size, r in results.items():
        summed = " | ".join(f"{r.summed_max(k):.0f}" for k in MEMORY)
        largest = " | ".join(f"{r.largest_max(k):.0f}" for k in MEMORY)
        lines.append(f"| {size} | {summed} | {largest} |")
    lines += one_process_runs(results)
    lines += memory_only_run(memory_only)
    sizes = sorted(results)
    if len(sizes) >= 2:
        small, large = sizes[-2], sizes[-1]
        growth = ", ".join(
            f"{LABELS.get(what, what)} "
            f"{results[large].seconds(what) / results[small].seconds(what):.1f}x"
            for what in TIMED
        )
        lines += ["", f"{large} boxes against {small} ({large / small:g}x the boxes): {growth}."]
    lines += ["", *goals(results, memory_only)]
    lines += ["", *input_view(results)]
    big = results[sizes[-1]]
    per_round = "; ".join(
        f"{row} against the floor, 1 process: "
        + ", ".join(
            f"{a.seconds / b.seconds:.1f}x"
            for a, b in zip(big.rounds[row], big.rounds["floor"], strict=True)
        )
        + "; against the floor, N processes: "
        + ", ".join(
            f"{a.seconds / b.seconds:.1f}x"
            for a, b in zip(big.rounds[row], big.rounds["floor_n"], strict=True)
        )
        for row in ("cold", "warm")
    )
    lines += ["", f"Each round's replay against that round's floors at {sizes[-1]} boxes: "
              f"{per_round}."]  # fmt: skip
    lines += where(max(results), profile)
    lines.append(END)
    return lines


# Where the time goes: the engine's phases timed one after the other in one child process
# (the same functions the CLI calls, in its order), on the largest fleet, in this run.
PHASES = """
import gc, json, os, sys, tempfile, time
from pathlib import Path
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp()  # nothing remembered: the cold path first
root = Path(sys.argv[1]).resolve()
snap = root / "snapshot"
spent = {}
def timed(name, started):
    spent[name] = spent.get(name, 0.0) + time.perf_counter() - started
started = time.perf_counter()
for path in sorted(snap.glob("*.json")):
    json.loads(path.read_bytes())
timed("floor", started)
started = time.perf_counter()
from reconciler import drift_inputs
from reconciler.desired import load as loader
from reconciler.desired.cache import load_fleet_cached
from reconciler.desired.locate import inventory_file
from reconciler.drift_inputs import cached_inputs, remembered_inputs
timed("imports", started)
def phase(owner, name, key, gc_off=False):  # the time spent in owner.name, as the load calls it
    real = getattr(owner, name)
    def timed_call(*args, **kwargs):
        at = time.perf_counter()
        if gc_off:
            gc.disable()
        try:
            return real(*args, **kwargs)
        finally:
            if gc_off:
                gc.enable()
            timed(key, at)
    setattr(owner, name, timed_call)
phase(loader, "load_yaml", "yaml")
phase(loader, "check_box", "checks")
phase(loader, "check_fleet", "checks")
phase(loader.SharedPrefixes, "merge", "merge")
# As a replay's child stores them: no collector passes (desired/fingerprint.py `remember`),
# which here would walk the whole fleet just loaded, again and again, as the pickles allocate.
phase(drift_inputs, "remember", "store_inputs", gc_off=True)
inventory = inventory_file(root, "lab")
started = time.perf_counter()
fleet = load_fleet_cached(root, "lab", keep=False)  # as a drift loads it (cli._drift_inputs)
timed("load", started)
started = time.perf_counter()
remembered_inputs(fleet, inventory)
timed("inputs", started)
del fleet  # a replay holds the drift inputs only (the CLI drops the validated state too)
gc.collect()
started = time.perf_counter()
inputs = cached_inputs(root, inventory)
timed("remembered", started)
from reconciler.compare.box import compare_box
from reconciler.compare.drift import DriftReport
from reconciler.gc_pause import paused_gc
from reconciler.observe.document import load_json, parse_collected, parse_probes
from reconciler.observe.document_c import read_snapshot_file
from reconciler.observe.observe import (
    SNAPSHOT_FILE_LIMIT, _read_limited, _written_as, recorded_digest, snapshot_index,
)
index = snapshot_index(snap)
from reconciler.fast_json import LARGE
in_c = len(inputs.boxes) >= LARGE  # as drift._replay: msgspec reads a large snapshot
results = []
with paused_gc():  # as drift._replay reads and compares
    for name in inputs.boxes:
        started = time.perf_counter()
        data = _read_limited(snap / f"{name}.json")
        unique = _written_as(data, recorded_digest(index, name))
        timed("read", started)
        started = time.perf_counter()
        typed = read_snapshot_file(data) if in_c and unique else None  # as snapshot_observation
        if typed is not None:
            doc, probes = typed.document, parse_probes(typed.controller or {})
        else:
            raw = load_json(data, SNAPSHOT_FILE_LIMIT, keys_unique=unique, in_c=in_c)
            doc = parse_collected(raw["collected"], False, 1)
            probes = parse_probes(raw.get("controller") or {})
            spent["typed_by_document_py"] = spent.get("typed_by_document_py", 0) + 1
        timed("typed", started)
        started = time.perf_counter()
        results.append(compare_box(inputs.expectations[name], doc, probes, None, None))
        timed("compare", started)
report = DriftReport(tuple(results), inputs.inventory_file, "-", "-")
from reconciler.report.json_report import render_json, to_document
started = time.perf_counter()
to_document(report)  # the report's values alone (render_json below builds them again)
timed("document", started)
started = time.perf_counter()
size = len(render_json(report).encode())
timed("json", started)
spent["json_mb"] = size / 1e6
print(json.dumps(spent))
"""


def phases(size: int, work: Path) -> dict[str, float]:
    root = work / f"fleet-{size}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", PHASES, str(root)], env=env, capture_output=True, check=True
    )
    return dict(json.loads(out.stdout))


def where(size: int, p: dict[str, float]) -> list[str]:
    return [
        "",
        f"Where the time goes at {size} boxes (a separate run after the timed rounds, none of "
        "them: the engine's phases one after the other in one process, no workers): parsing "
        "the observation files with `json` "
        f"{p['floor']:.2f} s; importing the loader (pydantic, the models) {p['imports']:.2f} s; "
        f"loading and validating the desired state (cold; a drift does not store it) "
        f"{p['load']:.2f} s, "
        f"of which reading and parsing the YAML {p['yaml']:.2f} s (each file read once, with "
        "its size limit, and hashed for the caches; a plain file read from libyaml's events, "
        f"desired/yaml_fast.py), merging the layers {p['merge']:.2f} s, the fleet's checks "
        f"{p['checks']:.2f} s and the rest (pydantic validating each "
        "box, deriving each box's `.env` for its checks and the drift inputs, the group and "
        "overlay lookups) "
        f"{p['load'] - p['yaml'] - p['merge'] - p['checks']:.2f} s; deriving the "
        f"drift inputs {p['inputs'] - p['store_inputs']:.2f} s and storing them "
        f"{p['store_inputs']:.2f} s (a child's work too in a replay); reading them back "
        f"(warm) {p['remembered']:.2f} s; reading the "
        "snapshot's files (size limit, SHA-256 against the index) "
        f"{p['read']:.2f} s; decoding them into typed documents {p['typed']:.2f} s (from "
        f"{LARGE} boxes on by msgspec straight into the document, observe/document_c.py; "
        f"{p.get('typed_by_document_py', 0):.0f} files left to document.py); comparing "
        f"{p['compare']:.2f} s; the JSON report {p['json']:.2f} s ({p['json_mb']:.0f} MB), of "
        f"which {p['document']:.2f} s building its values and the rest writing them. A replay "
        f"of {WORKERS_FROM} boxes or more runs the per-box steps (reading, decoding, comparing, "
        "each box's part of the JSON report) in its worker processes; the rest stays in the "
        "replay's own process.",
        *NOTE,
    ]


NOTE = [
    "",
    "A warm replay neither loads the desired state nor derives its inputs (it reads the "
    "remembered drift inputs, as a live run's early start does); a cold one pays both. The "
    "text, markdown and html reports are not profiled here: they group the drift by cause, "
    "and their columns against the warm one show what that adds. The desired state itself "
    "grows as N²: "
    "each box's seeds name every other member, so the report does too. Fixed on the way here:"
    " the mesh seeds were derived per member inside every box's env (2 million "
    "`gateway_origin` calls, quadratic), each box's env twice, a rich table per text row, "
    "every box's observation kept until the end (620 MB), a replay unpickling the validated "
    "state and deriving and re-storing its inputs on every run (~2 s at 1,000 boxes), two "
    "Python loops per environment entry in the typed parse, ~40 fnmatch calls per drift in "
    "the JSON report, a generator step per command-line token and a key-by-key diff per "
    "environment in comparing; then the cyclic garbage collector walking every box's objects "
    "(all acyclic, freed by reference count; ~0.2 s: paused while the boxes are read and "
    "compared and while the report is built), json's per-object duplicate-key hook on files "
    "this tool wrote (the index's SHA-256 of each file proves it unchanged: ~0.2 s of hook "
    "for ~0.09 s of hashing), a 16 MB read buffer per file, each lane's `.env` knobs lexed "
    "again for every box (now derived once with the remembered inputs) and a Python pass "
    "per environment entry to find its secrets in the typed parse; then json itself: from "
    f"{LARGE} boxes on, the snapshot files the index vouches for are read and the report is "
    "written by msgspec (C; reconciler/fast_json.py), with json's values, text and faults: "
    "anything msgspec would read or write otherwise goes to json (~0.4 s of json.dumps' "
    "pure-Python indenting and ~0.3 s of json.loads at 1,000 boxes); then, for a cold "
    "replay, ruamel.yaml's pure-Python scanner and parser on each of the 2,006 desired-state "
    "files (~3.9 s: a plain file is now read from libyaml's events, ruamel.yaml.clib, and "
    "only a file that is not plain goes to the located loader, which words every refusal), "
    "a scan of every position per replaced key when merging layers (quadratic) and every "
    "box's shared layers merged again (each prefix now merged once), and the validated state "
    "and drift inputs pickled before the replay could start (now by a forked child while it "
    "runs)."
    " Then the collector's older generations walking the fleet being loaded and the drift "
    "inputs being derived again and again (~0.35 s of a cold replay: only young-generation "
    "passes there now, reconciler/gc_pause.py, and what was built frozen before the replay "
    "forks), each `.env` knob lexed by shlex once per box (now once per distinct value), the "
    "2,006 desired-state files hashed on every warm replay (now checked by their stamps), and"
    " in the text report a rich grid laid out for every value folded below its row (~1.5 s at"
    " 1,000 boxes: now folded line by line by rich's own wrap) and every box of a cause named"
    " on ~60 wrapped lines (now the first 12 and how many more). Then every desired-state "
    "file read and hashed again after a cold load to fingerprint the caches (~0.2 s; now "
    "recorded as the loader reads it, which also keeps an edit made during the load from "
    "being remembered as the state loaded), and in the markdown and html reports each row "
    "naming its boxes through a list's `in` with the boxes' ranks rebuilt for every row "
    "(quadratic) and a regex pass over every code span for backticks (~0.5 s at 1,000 "
    "boxes), and on a cold load each box's `.env` derived twice, for its checks and for the "
    "drift inputs (~0.1 s: now once). Then in the text, markdown and html reports a row per "
    "box for a key whose value is each box's own (the mesh seeds: 9,164 lines of text and "
    "25 MB of markdown at 1,000 boxes; now three values and one row saying how many more, "
    "grouped.rows), and a recorded replay parsing every snapshot file with json and holding "
    "them all until json.dumps wrote each again for the store (4.2 s and 640 MB at 1,000 "
    "boxes: now read by msgspec and packed for the store one box at a time); then a "
    "recorded replay reading its own 33 MB report back whole and reading, masking and "
    "packing every snapshot file again, one after another, while its workers sat idle "
    "(~2.8 s of one process at 1,000 boxes: each worker now makes its boxes' rows, counts "
    "and packed observations beside their comparison, from the bytes it read, "
    "history/kept_parts.py). Then the remembered drift inputs holding each box's mesh seeds "
    "as text, twice (58 MB of their 62 at 1,000 boxes, growing as the square of the fleet; "
    "the child that stores them held it all again, the cold replay's peak: now each box's "
    "seeds are a reference to the mesh's origins, kept once, 9 MB in all). Then what grew "
    "as the square of the fleet in memory (found when the linearity check failed): every box's "
    "JSON entry (33 MB at 1,000 boxes) held by the replay's own process until the document "
    "was written (now written by each worker to a temporary file, report/spool.py, and read "
    "back a chunk at a time as the document is written), the report guard remembering every "
    "distinct value it masked, each box's own seeds among them (8,192 of up to 30 KB: 25 MB "
    "over the workers at 1,000 boxes; now only values up to 1 KB, report/values.py), and in a "
    "recorded replay its drift entries' rows held until the store took them (25 MB; now "
    "spooled too) and its report joined and bound whole for the store (~100 MB of one "
    "process at 1,000 boxes: the text, SQLite's copy, its record; now written into the row "
    "piece by piece, history/store.py). Then a worker's chunk of boxes, which grew with the "
    "fleet as each box's entry did (2 MB of entries a chunk at 1,000 boxes, held three times "
    "on the way to the spool): a chunk is now at most 16 boxes, replay_workers.py. Then "
    "SQLite itself holding that report whole about twice while storing it (66 MB at 1,000 "
    "boxes, the last of a recorded replay's growth as the square of the fleet: the row's "
    "zeroblob made whole, `report` not being the table's last column, then the cast to "
    "TEXT): the store's schema 5 keeps each run's report as UTF-8 bytes in a column of its "
    "own, the table's last, whose zeroblob stays implicit, and the pieces go through "
    "SQLite's page cache (the view `run_reports` reads it as text). Then a cold drift "
    "storing the validated state it never reads back (a drift reads its remembered inputs; "
    "only `audit` reads the state): ~0.4 s of CPU at 1,000 boxes, in a forked child that "
    "copied the pages of everything it pickled while the replay's workers ran, the other "
    "half of the cold peak's swing between runs. `audit` stores it now, on its first run. "
    "Then pickle's `persistent_id` hook storing the drift inputs, a Python call for each of "
    "~900,000 objects to find each box's seeds (~0.1 s of CPU at 1,000 boxes, 0.22-0.33 s "
    "against 0.14-0.17 s: each box's seeds object is now a memo slot its pickle fills first, "
    "drift_inputs.py). Then every replay importing `reconcile diff`'s comparison and the "
    "history's record to learn which inventory it judges its snapshot against (~20 ms of "
    "imports), and the desired state's problem types with dataclasses (~9 ms) to catch a "
    "refusal it seldom meets (now reconciler/snapshot_inventory.py, which imports that type "
    "only once one is raised).",
]


def verdict(ok: bool | None) -> str:
    return "undetermined" if ok is None else "met" if ok else "not met"


def goals(results: dict[int, Size], memory_only: MemoryOnly | None = None) -> list[str]:
    """Issue 12's goals for the largest fleet, as measured in this run (every figure computed
    from the rounds above; the linearity's forked-workers series with the memory-only size)."""
    sizes = sorted(results)
    large = results[sizes[-1]]
    floor, split = large.seconds("floor"), large.seconds("floor_n")
    n = large.workers
    lines = [f"Goals (issue 12), at {sizes[-1]} boxes, this run:"]
    cores = len(os.sched_getaffinity(0))
    for row in ("cold", "warm"):
        mine = large.seconds(row)
        cpu_s = large.median(row).cpu
        cpu = cpu_s / large.median("floor").cpu
        # Wall time can be no less than the CPU spent over the cores that spend it: a verdict
        # that CPU already decides is a matter of CPU, not of using the cores better.
        least = cpu_s / cores
        lines.append(
            f"- {row}, within 2x the floor: against the issue's floor (`json` in 1 process) "
            f"{verdict(mine / floor <= 2)} ({mine / floor:.1f}x); against the same-cores floor "
            f"(`json` split over {n} forked process{'es' if n != 1 else ''}, as the replay "
            f"splits its boxes) {verdict(mine / split <= 2)} ({mine / split:.1f}x). In CPU "
            f"time, against the 1-process floor's: {cpu:.1f}x (all its processes' CPU; not "
            "the issue's measure, which is wall time). The least wall time that CPU allows on "
            f"this machine's {cores} cores, every core busy from start to end: {least:.2f} s "
            f"({cpu_s:.2f} s / {cores}), {least / floor:.1f}x the issue's floor; the run used "
            f"{cpu_s / mine:.1f} of its {cores} cores on average."
        )
    cold_own = large.seconds("cold") / large.seconds("floor_cold")
    lines.append(
        f"- cold against the cold floor (the YAML parsed too, 1 process): "
        f"{verdict(cold_own <= 2)} within 2x ({cold_own:.1f}x)."
    )
    if len(sizes) >= 2:
        small = sizes[-2]
        growth = large.seconds("cold") / results[small].seconds("cold")
        warm_growth = large.seconds("warm") / results[small].seconds("warm")
        lines.append(
            f"- within 12x the time of {small} boxes: {verdict(growth <= 12)} cold "
            f"({growth:.1f}x), {verdict(warm_growth <= 12)} warm ({warm_growth:.1f}x)."
        )
    peaks = {
        f"{row}, {kind}": value
        for row in MEMORY
        for kind, value in (
            ("all processes", large.summed_max(row)),
            ("largest process", large.largest_max(row)),
        )
    }
    worst = max(peaks, key=lambda k: peaks[k])
    lines.append(
        f"- peak memory under 400 MB: {verdict(peaks[worst] < 400)} ({peaks[worst]:.0f} MB, "
        f"{worst}: the most of every memory column above at {sizes[-1]} boxes, the maximum "
        "over the rounds)."
    )
    lines.append(linearity(results, memory_only))
    return lines


@dataclass(frozen=True)
class Step:
    """One step of the linearity check: peak memory at two fleet sizes, both measured with
    the replay on the same number of processes."""

    start: int  # boxes
    end: int
    processes: int  # replay processes at both ends
    start_mb: float
    end_mb: float

    @property
    def per_box(self) -> float:
        """MB each box added over the step."""
        return (self.end_mb - self.start_mb) / (self.end - self.start)

    def text(self) -> str:
        where = "1 replay process" if self.processes == 1 else f"{self.processes} replay processes"
        return (
            f"{self.start} -> {self.end} boxes in {where}: {self.start_mb:.0f} -> "
            f"{self.end_mb:.0f} MB, {self.per_box * 1024:.0f} KB a box"
        )


def _step(ends: list[tuple[int, Size]], row: str, processes: int) -> Step:
    """The step between the two sizes of `ends` for `row`, both with the replay on `processes`
    processes: a ValueError naming the size and the runs missing if one was not measured."""
    peaks = []
    for boxes, measured in ends:
        try:
            peaks.append(measured.peak_in(row, processes))
        except ValueError as error:
            raise ValueError(f"at {boxes} boxes: {error}") from None
    (start, _), (end, _) = ends
    return Step(start, end, processes, *peaks)


def one_process_steps(results: dict[int, Size], row: str) -> list[Step]:
    """The one-process series of `row` (all processes, the maximum over the rounds): smallest
    -> middle -> largest size, each with the replay in one process (`Size.single` where the
    replay forks workers)."""
    return [
        _step([(start, results[start]), (end, results[end])], row, 1)
        for start, end in linearity_steps(sorted(results))
    ]


def forked_sizes(
    results: dict[int, Size], memory_only: MemoryOnly | None
) -> tuple[list[tuple[int, Size]], str]:
    """The forked-workers series' sizes: middle, memory-only, largest, each with the replay's
    own workers. Empty, with why, when they cannot be compared like for like: no memory-only
    run, or the three not forking the same number of workers (or none)."""
    sizes = sorted(results)
    middle, large = sizes[-2], sizes[-1]
    if memory_only is None:
        return [], f"no memory-only run between {middle} and {large} boxes"
    extra, measured = memory_only
    if not middle < extra < large:
        raise ValueError(
            f"the memory-only size ({extra} boxes) is not between {middle} and {large} boxes"
        )
    series = [(middle, results[middle]), (extra, measured), (large, results[large])]
    workers = [r.workers for _, r in series]
    said = ", ".join(f"{n} at {boxes} boxes" for (boxes, _), n in zip(series, workers, strict=True))
    if len(set(workers)) > 1:
        return [], (
            f"the replay's processes differ ({said}): a step's two ends must fork as many "
            "workers, or their fixed memory is taken for growth"
        )
    if workers[0] == 1:
        return [], (
            f"the replay forks no workers at {middle}, {extra} or {large} boxes here (one core "
            f"to run on, or {WORKERS_ENV}=1)"
        )
    return series, ""


def forked_steps(series: list[tuple[int, Size]], row: str) -> list[Step]:
    """The forked-workers series of `row` (of forked_sizes: all on the same processes)."""
    processes = series[0][1].workers
    return [_step(series[i : i + 2], row, processes) for i in range(len(series) - 1)]


def linear(first: Step, second: Step) -> tuple[bool | None, str]:
    """Whether the second step's per-box increment is within LINEAR_TOLERANCE of the first's;
    None when the first shows no growth to measure against. And the ratio, said."""
    if first.per_box <= 0:
        return None, "no growth in the first step to measure against"
    ratio = second.per_box / first.per_box
    return ratio <= LINEAR_TOLERANCE, f"{ratio:.2f}x"


def _judged(steps: dict[str, list[Step]]) -> tuple[bool | None, str]:
    """One series' verdict (met only if every row's is; undetermined if any row's is) and
    each row's: its two steps, their figures and the ratio of their per-box increments."""
    parts, ok = [], []
    for row, (first, second) in steps.items():
        met, ratio = linear(first, second)
        ok.append(met)
        parts.append(f"{row} {verdict(met)} ({first.text()}; {second.text()}: {ratio})")
    return (None if None in ok else all(ok)), "; ".join(parts)


def linearity(results: dict[int, Size], memory_only: MemoryOnly | None = None) -> str:
    """Whether memory grows linearly with the boxes, in both series (one process; forked
    workers, with the memory-only size): the criterion, its figures and verdict, every one
    computed from the measurements."""
    sizes = sorted(results)
    if len(sizes) < 3:
        return (
            "- peak memory linear: not checked (it needs three fleet sizes, this run had "
            f"{len(sizes)})."
        )
    small, middle, large = sizes[0], sizes[-2], sizes[-1]
    series, why_not = forked_sizes(results, memory_only)
    extra = f"{memory_only[0]}" if memory_only else "a memory-only size"
    forking = sorted(
        one_process_sizes({size: results[size].workers for size in (small, middle, large)})
    )
    again = (
        f" (at {' and '.join(map(str, forking))} boxes, whose replay forks workers, the memory "
        f"runs were made again with {WORKERS_ENV}=1)"
        if forking
        else ""
    )
    criterion = (
        "- peak memory linear, the issue's criterion, judged by the boxes (all processes, the "
        "maximum over the rounds) in two series of three fleet sizes, both of which must pass: "
        f"in each, a box adds at most {LINEAR_TOLERANCE:g}x as much memory in the second step "
        f"as in the first, e.g. (peak({large}) - peak({middle})) / {large - middle} <= "
        f"{LINEAR_TOLERANCE:g} x (peak({middle}) - peak({small})) / {middle - small} (a "
        f"constant per-box increment, with {LINEAR_TOLERANCE - 1:.0%} for sampling noise; "
        "memory growing as the square of the boxes would fail it). Each series is measured on "
        "one process structure, the same at both ends of each step and in both steps, so that "
        "neither the workers' own fixed memory (which a step from one process to forked "
        "workers counts as growth) nor the pages each worker copies (copy-on-write) of the "
        "objects it touches (a cost per box that the replay in one process does not pay, "
        "which a forked step compared with a one-process step counts as growth) is mistaken "
        f"for growth: **one process**, {small} -> {middle} -> {large} boxes, each with the "
        f"replay in one process{again}; **forked workers**, {middle} -> {extra} -> {large} "
        "boxes, each with the replay's own workers (the middle one a memory-only run, no row "
        "of the tables above)"
    )
    judged_a, said_a = _judged({row: one_process_steps(results, row) for row in MEMORY})
    if series:
        judged_b, said_b = _judged({row: forked_steps(series, row) for row in MEMORY})
        forked = f"{verdict(judged_b)}: {said_b}"
    else:
        judged_b, forked = None, f"{verdict(None)}, not measured ({why_not})"
    overall = None if None in (judged_a, judged_b) else bool(judged_a and judged_b)
    return (
        f"{criterion}. Verdict: {verdict(overall)}.\n"
        f"  - one process: {verdict(judged_a)}: {said_a}.\n"
        f"  - forked workers: {forked}."
    )


def one_process_runs(results: dict[int, Size]) -> list[str]:
    """The memory runs made again with the replay in one process, if any."""
    measured = [(size, r) for size, r in sorted(results.items()) if r.single]
    if not measured:
        return []
    figures = "; ".join(
        f"at {size} boxes " + ", ".join(f"{row} {max(r.single[row]):.0f} MB" for row in MEMORY)
        for size, r in measured
    )
    return [
        "",
        f"The same memory runs with the replay in one process ({WORKERS_ENV}=1; all "
        "processes, the maximum over the rounds), for the one-process series of the linearity "
        f"check below: {figures}.",
    ]


def memory_only_run(memory_only: MemoryOnly | None) -> list[str]:
    """The memory-only size's figures, if it was measured."""
    if memory_only is None:
        return []
    size, r = memory_only
    figures = ", ".join(f"{row} {r.summed_max(row):.0f} MB" for row in MEMORY)
    workers = f"its own {r.workers} workers" if r.workers > 1 else "no workers forked"
    return [
        "",
        f"For the forked-workers series of the linearity check below (the replay with "
        f"{workers}; all processes, the maximum over the rounds; memory runs only, measured "
        f"after the timed sizes, so no row of the tables), memory-only run at {size} boxes: "
        f"{figures}.",
    ]


def input_view(results: dict[int, Size]) -> list[str]:
    """Memory against what the replay reads and writes: an explanation of the growth beside
    the linearity check (which judges by the boxes), never a verdict."""
    sizes = sorted(results)
    lines = [
        "Memory against the input, an explanation beside the goal, not a substitute for it "
        "(the goal's linearity is judged by the boxes, above). Input: the bytes of every "
        "desired-state file (inventory, group_vars, facts overlays) and every snapshot file "
        "(its index and each box's observation) of the fleet built, the files a cold replay "
        "reads; report: the JSON report a replay writes. Peak memory: all processes, the "
        "maximum over the rounds, in the table in the replay's own number of processes, per "
        "step with the replay in one process at both ends (the linearity's one-process "
        "series: the same process structure at every size).",
        "",
        "| boxes | input MB | input KB a box | report KB a box | cold MB per input MB "
        "| warm MB per input MB | recorded MB per input MB |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in sizes:
        r = results[size]
        mb = r.input_bytes / 2**20
        per = " | ".join(f"{r.summed_max(row) / mb:.2f}" for row in MEMORY)
        lines.append(
            f"| {size} | {mb:.1f} | {r.input_bytes / size / 1024:.1f} "
            f"| {r.report_bytes / size / 1024:.1f} | {per} |"
        )
    steps = []
    for start, end in linearity_steps(sizes):
        a, b = results[start], results[end]
        grown = (b.input_bytes - a.input_bytes) / 2**20
        reported = (b.report_bytes - a.report_bytes) / 2**20
        one = {row: _step([(start, a), (end, b)], row, 1) for row in MEMORY}
        added = {row: step.end_mb - step.start_mb for row, step in one.items()}
        steps.append(
            f"from {start} to {end} boxes (the replay in one process at both ends) the input "
            f"grew {grown:.1f} MB and the report {reported:.1f} MB; peak memory grew "
            + ", ".join(
                f"{row} {added[row]:.0f} MB ({added[row] / grown:.1f} MB a MB of input, "
                f"{added[row] / reported:.1f} a MB of report)"
                for row in MEMORY
            )
        )
    if steps:
        lines += ["", "Per step: " + "; ".join(steps) + "."]
    if len(sizes) > 1:
        small, large = results[sizes[0]], results[sizes[-1]]
        per_input = (large.input_bytes / sizes[-1]) / (small.input_bytes / sizes[0])
        per_report = (large.report_bytes / sizes[-1]) / (small.report_bytes / sizes[0])
        input_says = (
            "grows as the boxes do, so memory per MB of input follows memory per box"
            if per_input <= LINEAR_TOLERANCE
            else "grows faster than the boxes"
        )
        lines += [
            "",
            f"The input per box at {sizes[-1]} boxes is {per_input:.2f}x its size at {sizes[0]}: "
            f"it {input_says}. Each box's snapshot file is its original's observation, whose "
            "seeds name the other two lab boxes (bench/scale_fleet.py; a real fleet's box would "
            "have seen every member), and the inventory names each box once. The report per "
            f"box is {per_report:.2f}x: each box's desired `LOBES_MESH_SEEDS` names every other "
            "member of the fleet (derived from the inventory, not read), and the report writes "
            "it for every box, so what the replay derives and writes for a box grows with the "
            "fleet, and for the fleet as its square. No process holds the report whole: each "
            "worker writes its boxes' entries to a temporary file (report/spool.py, in TMPDIR; "
            "its pages are the kernel's file cache, not any process's memory, so not in these "
            "columns), and the document is written from it a chunk at a time; a recorded "
            "replay's store writes it into its row piece by piece (history/store.py, schema 5: "
            "the pages go through SQLite's page cache).",
        ]
    return lines


def with_section(text: str, section: list[str]) -> str:
    """`text` with its scale-bench section replaced (or appended): nothing else changes."""
    block = "\n".join(section)
    if START in text and END in text:
        before, rest = text.split(START, 1)
        after = rest.split(END, 1)[1]
        return before + block + after
    return text.rstrip("\n") + "\n\n" + block + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument(
        "--memory-size",
        type=int,
        default=MEMORY_SIZE,
        help="boxes of the memory-only fleet between the two largest sizes, the forked-workers "
        f"series' middle point (default {MEMORY_SIZE})",
    )
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument(
        "--seed", type=int, help="seed of each round's shuffled order (default: a random one)"
    )
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    sizes = [int(s) for s in args.sizes.split(",")]
    ordered = sorted(sizes)
    # Checked before anything runs: the forked-workers series needs it between the two largest.
    extra = args.memory_size if len(ordered) >= 3 else None
    if extra is not None and not ordered[-2] < extra < ordered[-1]:
        print(
            f"error: --memory-size {extra}: must be between the two largest of --sizes "
            f"({ordered[-2]} and {ordered[-1]} boxes), the forked-workers series' middle point; "
            "nothing measured",
            file=sys.stderr,
        )
        return 1
    # Measure the tool as installed (scripts/setup.sh compiles it), as drift_bench.py does.
    subprocess.run([sys.executable, "-m", "compileall", "-q", "reconciler"], cwd=ROOT, check=True)
    again = one_process_sizes({size: worker_count(size) for size in sizes})
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as work:
        results = {size: measure(size, args.runs, Path(work), rng, size in again) for size in sizes}
        memory_only = (
            (extra, measure_memory(extra, args.runs, Path(work), rng))
            if extra is not None
            else None
        )
        profile = phases(max(sizes), Path(work))
    section = table(results, args.runs, seed, profile, memory_only)
    output = Path(args.output)
    old = output.read_text(encoding="utf-8") if output.exists() else ""
    output.write_text(with_section(old, section), encoding="utf-8")
    print("\n".join(section))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
