"""Review 8 of the issue-12 benchmarks (bench/): what their generated text says is computed
from what they measured, and the fleet generator never writes over a directory it did not make.

1. scale_bench's "peak memory linear" compared a one-process step (10 -> 100 boxes) with a
   step of two forked workers at both ends (100 -> 1000): still two process structures, as
   each worker copies (copy-on-write) the pages of the objects it touches, a per-box cost one
   process does not pay. Now two like-for-like series must both pass: one process at 10, 100
   and 1000 boxes (FLEET_REPLAY_WORKERS=1 where the replay forks), and the replay's own
   workers at 100, a memory-only 400 and 1000. The figures below were measured for these tests
   (memory runs only, three rounds).
2. live_scale_bench's header says the scale boxes' containers are created, not started, so no
   lane probe is made there (lab/scale.py; the collector probes only a running lane).
3. drift_bench's after-edit cost is the after-edit row's CPU less the repeated row's, not
   "about 0.3 s".
4. scale_fleet refuses a directory it did not build, and clears what it built before.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench import drift_bench, live_scale_bench, scale_bench, scale_fleet
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift_on
from reconciler.drift_inputs import drift_inputs
from tests.unit.conftest import load_box_program

ROOT = Path(__file__).resolve().parents[2]


# -- 1. scale_bench: linearity in two like-for-like series, and memory against the input --------
def _size(
    workers: int,
    summed: dict[str, float],
    single: dict[str, float] | None = None,
    input_bytes: int = 0,
    report_bytes: int = 0,
) -> scale_bench.Size:
    got = scale_bench.Size(workers)
    got.summed = {row: [mb - 1, mb] for row, mb in summed.items()}  # the maximum counts
    got.single = {row: [mb] for row, mb in (single or {}).items()}
    got.input_bytes, got.report_bytes = input_bytes, report_bytes
    return got


# Measured here with scale_bench.measure_memory (MB, all processes, the maximum over three
# rounds, to 0.1 MB; replay processes as worker_count gives them on 2 cores).
MEASURED = {
    10: _size(1, {"cold": 32.2, "warm": 14.6, "recorded": 22.1}, None, 1_488_589, 98_266),
    100: _size(
        2,
        {"cold": 53.4, "warm": 32.4, "recorded": 40.4},
        {"cold": 45.6, "warm": 18.9, "recorded": 33.9},
        14_780_277,
        1_168_159,
    ),
    1000: _size(
        2,
        {"cold": 228.2, "warm": 50.8, "recorded": 148.2},
        {"cold": 236.6, "warm": 31.0, "recorded": 164.4},
        147_753_782,
        33_692_134,
    ),
}
# The memory-only size of the same run: the replay's own workers only.
EXTRA = (400, _size(2, {"cold": 112.3, "warm": 37.8, "recorded": 64.0}, None, 59_097_845))


def _series(text: str) -> dict[str, str]:
    """Each series' line of the linearity bullet, by its name."""
    lines = [line.removeprefix("  - ") for line in text.splitlines()[1:]]
    return {line.split(":", 1)[0]: line.split(":", 1)[1] for line in lines}


def test_linearity_judges_two_like_for_like_series() -> None:
    text = scale_bench.linearity(MEASURED, EXTRA)
    assert text.splitlines()[0].endswith("Verdict: not met."), text
    one, forked = _series(text)["one process"], _series(text)["forked workers"]
    # One process at every size: cold 152 KB a box, then 217 KB.
    assert one.startswith(
        " not met: cold not met (10 -> 100 boxes in 1 replay process: 32 -> 46 MB, 152 KB a "
        "box; 100 -> 1000 boxes in 1 replay process: 46 -> 237 MB, 217 KB a box: 1.43x); "
        "warm met ("
    ), one
    assert ": 0.28x); recorded not met (" in one and one.endswith(": 1.11x).")
    # The replay's own two workers at 100, 400 (memory only) and 1000 boxes.
    assert forked.startswith(
        " not met: cold met (100 -> 400 boxes in 2 replay processes: 53 -> 112 MB, 201 KB a "
        "box; 400 -> 1000 boxes in 2 replay processes: 112 -> 228 MB, 198 KB a box: 0.98x); "
        "warm not met ("
    ), forked
    assert ": 1.20x); recorded not met (" in forked and forked.endswith(": 1.78x).")
    first = text.splitlines()[0]
    assert "the issue's criterion, judged by the boxes" in first
    assert "**one process**, 10 -> 100 -> 1000 boxes" in first
    assert (
        "at 100 and 1000 boxes, whose replay forks workers, the memory runs were made again "
        "with FLEET_REPLAY_WORKERS=1"
    ) in first
    assert "**forked workers**, 100 -> 400 -> 1000 boxes" in first
    assert "the pages each worker copies (copy-on-write)" in first


def _linear(
    kb: float, one: float = 0, forked: float = 0, copies: float = 0
) -> dict[int, scale_bench.Size]:
    """Every size's memory `kb` KB a box over a fixed part (the workers' more), plus `one` (in
    one process) or `forked` (in the workers) times the square of the boxes, in MB / 1e6;
    `copies`: KB a box more in the workers (their copy-on-write copies, a constant)."""

    def at(n: int, square: float, fixed: float, more: float = 0) -> dict[str, float]:
        return {
            row: fixed + k + n * (kb + more) / 1024 + square * n * n / 1e6
            for k, row in enumerate(scale_bench.MEMORY)
        }

    return {
        10: _size(1, at(10, one, 20)),
        100: _size(2, at(100, forked, 30, copies), at(100, one, 20)),
        400: _size(2, at(400, forked, 30, copies), None),
        1000: _size(2, at(1000, forked, 30, copies), at(1000, one, 20)),
    }


def _judge(sizes: dict[int, scale_bench.Size]) -> str:
    timed = {n: sizes[n] for n in (10, 100, 1000)}
    return scale_bench.linearity(timed, (400, sizes[400]))


def test_a_constant_increment_is_met_in_both_series() -> None:
    text = _judge(_linear(200))  # 200 KB a box everywhere
    assert text.splitlines()[0].endswith("Verdict: met."), text
    series = _series(text)
    assert series["one process"].startswith(
        " met: cold met (10 -> 100 boxes in 1 replay process: 22 -> 40 MB, 200 KB a box; "
        "100 -> 1000 boxes in 1 replay process: 40 -> 215 MB, 200 KB a box: 1.00x)"
    ), text
    assert series["forked workers"].startswith(
        " met: cold met (100 -> 400 boxes in 2 replay processes: 50 -> 108 MB, 200 KB a box; "
        "400 -> 1000 boxes in 2 replay processes: 108 -> 225 MB, 200 KB a box: 1.00x)"
    ), text


def test_the_workers_per_box_copies_are_not_taken_for_growth() -> None:
    """150 KB a box in one process, 200 in the workers, each constant: linear in both series
    (a step from one process to the workers' figures, compared with a one-process step, would
    read as 1.33x)."""
    text = _judge(_linear(150, copies=50))
    assert text.splitlines()[0].endswith("Verdict: met."), text
    series = _series(text)
    assert ", 150 KB a box: 1.00x)" in series["one process"], text
    assert ", 200 KB a box: 1.00x)" in series["forked workers"], text


def test_growth_as_the_square_of_the_boxes_fails_both_series() -> None:
    text = _judge(_linear(0, one=200, forked=200))
    assert text.splitlines()[0].endswith("Verdict: not met."), text
    series = _series(text)
    assert series["one process"].startswith(" not met: cold not met (") and ": 10.00x)" in text
    assert series["forked workers"].startswith(" not met: cold not met (") and ": 2.80x)" in text


@pytest.mark.parametrize(
    ("one", "forked", "failing"),
    [(200, 0, "one process"), (0, 200, "forked workers")],
)
def test_one_series_growing_fails_the_verdict(one: float, forked: float, failing: str) -> None:
    """A series whose one step is fine and whose other grows fails the verdict, whichever it
    is, while the other series is met."""
    text = _judge(_linear(100, one=one, forked=forked))
    assert text.splitlines()[0].endswith("Verdict: not met."), text
    series = _series(text)
    assert series[failing].startswith(" not met: cold not met ("), text
    (passing,) = set(series) - {failing}
    assert series[passing].startswith(" met: cold met ("), text


def test_a_missing_measurement_is_named() -> None:
    assert scale_bench.one_process_sizes({10: 1, 100: 2, 1000: 2}) == {100, 1000}
    assert scale_bench.one_process_sizes({10: 2, 100: 2, 1000: 2}) == {10, 100, 1000}
    assert scale_bench.one_process_sizes({10: 1, 50: 1, 99: 1}) == set()
    missing = dict(MEASURED)
    missing[1000] = _size(2, {"cold": 228.2, "warm": 50.8, "recorded": 148.2})  # no FLEET_...=1
    with pytest.raises(
        ValueError, match=r"^at 1000 boxes: no memory measured for cold with 1 replay processes$"
    ):
        scale_bench.linearity(missing, EXTRA)
    short = (400, _size(2, {"cold": 112.3, "warm": 37.8}))  # no recorded run
    with pytest.raises(
        ValueError, match=r"^at 400 boxes: no memory measured for recorded with 2 replay processes$"
    ):
        scale_bench.linearity(MEASURED, short)


def test_a_forked_series_not_like_for_like_is_not_measured() -> None:
    three = (400, _size(3, {"cold": 112.3, "warm": 37.8, "recorded": 64.0}))
    text = scale_bench.linearity(MEASURED, three)
    assert text.splitlines()[0].endswith("Verdict: undetermined."), text
    assert _series(text)["forked workers"] == (
        " undetermined, not measured (the replay's processes differ (2 at 100 boxes, 3 at 400 "
        "boxes, 2 at 1000 boxes): a step's two ends must fork as many workers, or their fixed "
        "memory is taken for growth)."
    )
    assert _series(text)["one process"].startswith(" not met: cold not met (")  # still said
    absent = scale_bench.linearity(MEASURED, None)
    assert absent.splitlines()[0].endswith("Verdict: undetermined.")
    assert "not measured (no memory-only run between 100 and 1000 boxes)" in absent


def test_a_memory_size_outside_the_largest_step_is_refused(tmp_path: Path) -> None:
    output = tmp_path / "B.md"
    result = subprocess.run(
        [sys.executable, "bench/scale_bench.py", "--sizes", "10,100,1000", "--memory-size", "50",
         "--output", str(output)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (
        "error: --memory-size 50: must be between the two largest of --sizes (100 and 1000 "
        "boxes), the forked-workers series' middle point; nothing measured\n"
    )
    assert not output.exists()


def test_the_memory_only_size_gets_memory_rounds_alone(tmp_path: Path) -> None:
    got = scale_bench.measure_memory(3, 2, tmp_path, random.Random(1))
    assert got.workers == 1 and got.rounds == {} and got.single == {}
    assert sorted(got.summed) == sorted(scale_bench.MEMORY)
    assert all(len(peaks) == 2 and min(peaks) > 5 for peaks in got.summed.values()), got.summed
    assert [sorted(order) for order in got.orders] == [
        sorted(f"memory:{row}" for row in scale_bench.MEMORY)
    ] * 2
    assert got.input_bytes == scale_bench.input_bytes(tmp_path / "fleet-3")
    assert got.report_bytes > 0 and not list(tmp_path.glob("history-*"))
    lines = scale_bench.memory_only_run((3, got))
    assert lines[-1].endswith(
        "memory-only run at 3 boxes: "
        + ", ".join(f"{row} {max(got.summed[row]):.0f} MB" for row in scale_bench.MEMORY)
        + "."
    )


def test_memory_against_the_input_is_an_explanation_computed_from_the_fleet() -> None:
    lines = scale_bench.input_view(MEASURED)
    text = "\n".join(lines)
    assert "an explanation beside the goal, not a substitute for it" in text
    assert "judged by the boxes" in text and "met" not in text.replace("measured", "")
    # 10 boxes: 1.42 MB of input (145.4 KB a box), 9.6 KB of report a box, cold 32.2 / 1.42.
    assert "| 10 | 1.4 | 145.4 | 9.6 | 22.68 | 10.28 | 15.57 |" in lines
    assert "| 1000 | 140.9 | 144.3 | 32.9 | 1.62 | 0.36 | 1.05 |" in lines
    # Each step in one process at both ends: from 100 to 1000 boxes cold 45.6 -> 236.6 MB.
    assert (
        "from 100 to 1000 boxes (the replay in one process at both ends) the input grew "
        "126.8 MB and the report 31.0 MB; peak memory grew cold 191 MB (1.5 MB a MB of input, "
        "6.2 a MB of report), warm 12 MB"
    ) in text
    assert "from 10 to 100 boxes (the replay in one process at both ends)" in text
    assert "is 0.99x its size at 10: it grows as the boxes do" in text
    assert "The report per box is 3.43x" in text
    # An input that grows faster than the boxes is said so.
    grown = dict(MEASURED)
    one = {"cold": 236.6, "warm": 31.0, "recorded": 164.4}
    grown[1000] = _size(2, {"cold": 228.2, "warm": 50.8, "recorded": 148.2}, one, 300_000_000, 1)
    assert "grows faster than the boxes" in "\n".join(scale_bench.input_view(grown))


def test_the_input_is_measured_from_the_fleet_built(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    scale_fleet.build_fleet(root, 4)
    files = [
        p
        for d in ("inventory", "group_vars", "facts", "snapshot")
        for p in (root / d).rglob("*")
        if p.is_file()
    ]
    assert len(files) == 1 + 4 + 4 + 1 + 4 + 1 + 4  # inventory, layers, boxes, images, index
    assert scale_bench.input_bytes(root) == sum(p.stat().st_size for p in files)


# -- 2. live_scale_bench: the scale boxes' containers are not started ----------------------------
def _measured(wall: float) -> live_scale_bench.Measured:
    return live_scale_bench.Measured(wall, wall / 2, wall * 2)


def test_the_live_header_says_the_scale_boxes_run_no_lanes() -> None:
    table = []
    for n in (3, 50):
        table += [
            (n, drift_bench.cold_floor_name(n), _measured(0.3 * n)),
            (n, drift_bench.WARM_FLOOR, _measured(0.1 * n)),
            (n, live_scale_bench.NEW, _measured(0.35 * n)),
            (n, live_scale_bench.REPEATED, _measured(0.2 * n)),
        ]
    lines = live_scale_bench.section(table, 3, (4.0, 0.5), 7)
    header = "\n".join(
        lines[
            : lines.index(
                "| boxes | what | median s | × floor | × warm floor "
                "| controller CPU s | machine CPU s |"
            )
        ]
    )
    assert "has its containers created but not started (`docker compose up --no-start`" in header
    assert "lab/scale.py" in header and "the 3-box rows' too" in header
    assert "the collector makes no lane probes there" in header
    assert "A lighter workload than a real fleet's" in header


def test_the_collector_probes_no_lane_that_is_not_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the header says, in the collector: a created lane gets no probe, a running one does."""
    collector = load_box_program("collector_review8", "reconciler/observe/remote/collector.py")
    asked: list[list[Any]] = []
    monkeypatch.setattr(collector, "parallel_get", lambda requests, _t: asked.append(requests))

    run = SimpleNamespace(p={})  # the payload's defaults (probe_timeout_s)
    lane = {"service": "vllm-middle", "ips": ["172.30.0.5"]}
    collector.lane_probes(run, [{**lane, "status": "created"}])
    collector.lane_probes(run, [{**lane, "status": "running"}])
    assert asked == [[], [("vllm-middle", "http://172.30.0.5:8000/v1/models")]]


# -- 3. drift_bench: the after-edit cost from the rows' CPU --------------------------------------
def _rows(repeated_cpu: float, edited_cpu: float) -> dict[str, drift_bench.Result]:
    return {
        drift_bench.REPEATED: drift_bench.Result(0.5, repeated_cpu),
        drift_bench.NEW_CONNECTIONS: drift_bench.Result(0.9, 0.6),
        drift_bench.AFTER_EDIT: drift_bench.Result(0.7, edited_cpu),
    }


def test_the_after_edit_cost_is_the_rows_difference() -> None:
    text = "\n".join(drift_bench.explanation(_rows(0.25, 0.36)))
    assert "validating them costs 0.11 s more controller CPU than a repeated run here" in text
    assert "about 0.3 s" not in text
    other = "\n".join(drift_bench.explanation(_rows(0.25, 0.55)))
    assert "costs 0.30 s more controller CPU" in other
    noise = "\n".join(drift_bench.explanation(_rows(0.30, 0.28)))
    assert (
        "cost no more controller CPU than a repeated run here" in noise and "0.02 s less" in noise
    )


# -- 4. scale_fleet: a directory it did not build is refused ---------------------------------------
def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_a_smaller_fleet_over_a_larger_one_leaves_none_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "fleet"
    scale_fleet.build_fleet(root, 6)
    scale_fleet.build_fleet(root, 3)
    left = sorted(_tree(root))
    assert not [p for p in left if "-1" in p], left  # thor-1, spark-1, orin-1: all gone
    fresh = tmp_path / "fresh"
    scale_fleet.build_fleet(fresh, 3)
    assert _tree(root) == _tree(fresh)  # exactly what a build into a new directory writes
    inputs = drift_inputs(load_fleet(root, "lab"))
    run = run_drift_on(inputs, list(inputs.boxes), from_snapshot=root / "snapshot")
    assert sorted(r.box for r in run.report.boxes) == ["orin", "spark", "thor"]


def test_a_directory_it_did_not_build_is_refused_untouched(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "inventory").mkdir(parents=True)
    (repo / "inventory" / "lab.yaml").write_text("boxes: {thor: {}}\n")
    before = _tree(repo)
    result = subprocess.run(
        [sys.executable, "bench/scale_fleet.py", str(repo), "3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (
        f"error: {repo}: not empty and not a fleet bench/scale_fleet.py built (no "
        ".scale-fleet.json): refusing to write into it, nothing touched; give a new or empty "
        "directory\n"
    )
    assert _tree(repo) == before and sorted(p.name for p in repo.iterdir()) == ["inventory"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert scale_fleet.build_fleet(empty, 3) == ["thor", "spark", "orin"]


@pytest.mark.parametrize("listed", ["../outside.txt", "/etc/hostname", 7, "link/x"])
def test_a_marker_naming_files_outside_is_refused(tmp_path: Path, listed: Any) -> None:
    root, outside = tmp_path / "fleet", tmp_path / "outside.txt"
    outside.write_text("keep")
    scale_fleet.build_fleet(root, 3)
    (root / "link").symlink_to(tmp_path)
    marker = root / scale_fleet.MARKER
    data = json.loads(marker.read_text())
    data["files"].append(listed)
    marker.write_text(json.dumps(data))
    before = _tree(root)
    with pytest.raises(scale_fleet.FleetDirError, match="not a list of files"):
        scale_fleet.build_fleet(root, 3)
    assert _tree(root) == before and outside.read_text() == "keep"


def test_a_bad_count_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "bench/scale_fleet.py", str(tmp_path / "f"), "ten"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr == "error: N must be a whole number of boxes, at least 1, not 'ten'\n"
    assert not (tmp_path / "f").exists()


def test_the_goals_say_the_least_wall_time_the_cpu_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay that keeps every core busy cannot be faster than its CPU over the cores: the
    goal line says that bound against the floor, from the same rounds' medians."""
    monkeypatch.setattr(scale_bench.os, "sched_getaffinity", lambda pid: {0, 1})
    size = _size(2, {"cold": 228.2, "warm": 50.8, "recorded": 148.2})
    timed = {"floor": (0.65, 0.65), "floor_n": (0.44, 0.84), "floor_cold": (0.86, 0.86)}
    timed |= {"cold": (2.66, 4.07), "warm": (1.75, 3.29), "recorded": (3.93, 6.0)}
    size.rounds = {row: [scale_bench.Sample(s, 50.0, c)] for row, (s, c) in timed.items()}
    lines = scale_bench.goals({1000: size})
    cold = next(line for line in lines if line.startswith("- cold, within 2x"))
    warm = next(line for line in lines if line.startswith("- warm, within 2x"))
    assert "2 cores, every core busy from start to end: 2.04 s (4.07 s / 2), 3.1x" in cold
    assert "the run used 1.5 of its 2 cores on average" in cold
    assert "1.65 s (3.29 s / 2), 2.5x the issue's floor; the run used 1.9 of its 2" in warm
