"""Benchmark the live fan-out on the scale lab: 3 boxes and every box of it (50 or more), in
one run.

Needs `python -m lab up` and `python -m lab scale up --boxes 50` (lab/scale.py). Both fleet
sizes are boxes of the same scale lab (`reconcile drift thor spark orin` for 3), so the two
rows differ in the number of boxes only. Its boxes' containers are created, never started
(lab/scale.py): no lane probe is made, a lighter workload than a real fleet's, which the
section says (NOT_STARTED). Per size, interleaved rounds (each row once a round,
in an order shuffled anew each round, seeded; the seed is in the output) of:

- floor: N parallel OpenSSH `ssh ... docker inspect` of the box's compose project's
  containers, each a new connection (and, warm, the same through persisted masters), with the
  tool's own ssh options (bench/drift_bench.floor_ssh);
- `reconcile drift` with new connections (every ssh master closed before the run), and
  repeated (masters up, inputs remembered).

Then, outside the rounds: one more drift run recording each collector's own cost (for "where
the time goes"), and once, on every box, `pyinfra inventory.py deploys/mesh.py --dry`: a
converge plan, other work than drift, shown for its time only (no ratio to the drift floor).

Besides wall time, each row records the CPU its processes used on the controller, and the CPU
the whole machine used while it ran (/proc/stat): the boxes share the controller's two cores,
so "machine CPU / wall" says how much of the run was waiting for a core. What a row checks of
its output (the floor's exit codes, the drift's JSON report) is checked after its timing.

The goals for 3 boxes are decided by bench/drift_bench.py's section (the three-box lab); the
same verdicts computed here, on three boxes of the scale lab, are a second measurement.

    .venv/bin/python bench/live_scale_bench.py [--runs 3] [--seed S] [--output BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.drift_bench import (  # noqa: E402
    WARM_FLOOR,
    close_masters,
    close_warm_floor,
    cold_floor_name,
    floor_ssh,
)
from lab.scale import INVENTORY, made  # noqa: E402
from reconciler.desired.load import load_fleet  # noqa: E402
from reconciler.drift_inputs import targets  # noqa: E402
from reconciler.observe.fanout import default_limit  # noqa: E402
from reconciler.observe.transport import Target  # noqa: E402

START, END = "<!-- live-scale-bench:start -->", "<!-- live-scale-bench:end -->"
SMALL = ["thor", "spark", "orin"]
NEW = "`reconcile drift`, new ssh connections"
REPEATED = "`reconcile drift`, repeated (ssh masters up)"


def inspect_command(project: str) -> str:
    return f"docker inspect $(docker ps -aq --filter label=com.docker.compose.project={project})"


@dataclass(frozen=True)
class Row:
    name: str
    run: Callable[[], Any]  # the timed work; what it returns goes to `check`
    before: Callable[[], None] | None = None  # untimed set-up
    check: Callable[[Any], None] | None = None  # untimed: is what `run` gave right?


@dataclass(frozen=True)
class Measured:
    wall: float
    cpu: float  # this row's processes on the controller
    machine: float  # every process on the machine (the boxes included), CPU seconds


def machine_cpu() -> float:
    """CPU seconds the whole machine spent busy so far (user+nice+system+irq+softirq)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(row: Row) -> Measured:
    if row.before:
        row.before()
    cpu, busy, started = children_cpu(), machine_cpu(), time.perf_counter()
    got = row.run()
    wall = time.perf_counter() - started
    measured = Measured(wall, children_cpu() - cpu, machine_cpu() - busy)
    if row.check:
        row.check(got)
    return measured


Completed = subprocess.CompletedProcess[bytes]


def floor(name: str, all_targets: list[Target], warm: bool) -> Row:
    # Each box's own compose project; the argv built before the timing.
    argvs = [floor_ssh(t, warm, inspect_command(f"scale-{t.box}")) for t in all_targets]

    def run() -> list[Completed]:
        with ThreadPoolExecutor(len(argvs)) as pool:
            return list(pool.map(lambda a: subprocess.run(a, capture_output=True), argvs))

    def check(results: list[Completed]) -> None:
        for result in results:
            if result.returncode != 0 or not result.stdout.startswith(b"["):
                raise SystemExit(f"floor command failed: {result.stderr.decode()[-300:]}")

    return Row(name, run, check=check)


def drift(
    name: str, boxes: list[str], state: Path, before: Callable[[], None] | None = None
) -> Row:
    env = {
        **os.environ,
        "FLEET_INVENTORY": str(INVENTORY.relative_to(ROOT)),
        "XDG_STATE_HOME": str(state),  # the bench's own history store
    }

    def run() -> Completed:
        return subprocess.run(
            [str(ROOT / ".venv/bin/reconcile"), "drift", *boxes, "--format", "json"],
            cwd=ROOT,
            capture_output=True,
            check=False,
            env=env,
        )

    def check(result: Completed) -> None:
        try:
            report = json.loads(result.stdout)
        except ValueError:
            raise SystemExit(f"drift gave no report: {result.stderr.decode()[-500:]}") from None
        seen = [b["box"] for b in report["boxes"] if b.get("observation") == "full"]
        if sorted(seen) != sorted(boxes):
            raise SystemExit(f"drift observed {len(seen)} of {len(boxes)} boxes")

    return Row(name, run, before, check)


def collector_costs(boxes: list[str], state: Path) -> tuple[float, float]:
    """One more drift run with new connections, after the rounds and none of them (its time is
    not in the table), recorded in a history store of its own: the
    collectors' own CPU (summed over the boxes) and their median wall time, as each box
    measured itself. Not a --save-snapshot run: that one also asks each box for a render of
    its own .env (for import), a second compose render a plain drift never makes."""
    from reconciler.history.store import last_two, observations_of, opened

    close_masters()
    store = state / "collector-costs.sqlite"
    store.unlink(missing_ok=True)
    env = {**os.environ, "FLEET_INVENTORY": str(INVENTORY.relative_to(ROOT))}
    subprocess.run(
        [str(ROOT / ".venv/bin/reconcile"), "drift", *boxes, "--format", "json",
         "--history", str(store)],
        cwd=ROOT, capture_output=True, check=False, env=env,
    )  # fmt: skip
    with opened(store, create=False) as conn:
        observed = observations_of(conn, last_two(conn)[-1].id)
    cpu, walls = 0.0, []
    for box in boxes:
        timings = observed[box]["collected"]["timings_ms"]
        cpu += timings["cpu"] / 1000
        walls.append(timings["total"] / 1000)
    return cpu, statistics.median(walls)


# A converge plan, not a drift: other work than the floor's, timed once outside the rounds.
PYINFRA_DRY = (
    "`pyinfra inventory.py deploys/mesh.py --dry` (a converge plan: other work than drift; "
    "one run, outside the rounds)"
)


def pyinfra_dry() -> Completed:
    return subprocess.run(
        [str(ROOT / ".venv/bin/pyinfra"), "inventory.py", "deploys/mesh.py", "--dry", "-y"],
        cwd=ROOT,
        capture_output=True,
        check=False,
        env={**os.environ, "FLEET_INVENTORY": str(INVENTORY.relative_to(ROOT))},
    )


def pyinfra_dry_ok(result: Completed) -> None:
    if result.returncode != 0:
        raise SystemExit(f"pyinfra --dry failed: {result.stderr.decode()[-500:]}")


def rounds(rows: list[Row], runs: int, rng: random.Random) -> list[Measured]:
    """Interleaved rounds after one warm-up each, every round in an order shuffled anew
    (`rng`); medians per row."""
    for row in rows:
        timed(row)
    got: list[list[Measured]] = [[] for _ in rows]
    for _round in range(runs):
        order = list(range(len(rows)))
        rng.shuffle(order)
        for index in order:
            got[index].append(timed(rows[index]))
    return [
        Measured(
            statistics.median(m.wall for m in ms),
            statistics.median(m.cpu for m in ms),
            statistics.median(m.machine for m in ms),
        )
        for ms in got
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument(
        "--seed", type=int, help="seed of each round's shuffled order (default: a random one)"
    )
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    fleet_boxes = [b.name for b in made()]
    if len(fleet_boxes) < 50:
        raise SystemExit("needs `python -m lab scale up --boxes 50` first")
    subprocess.run([sys.executable, "-m", "compileall", "-q", "reconciler"], cwd=ROOT, check=True)
    fleet = load_fleet(ROOT, str(INVENTORY.relative_to(ROOT)))
    state = Path(tempfile.mkdtemp(prefix="fleet-live-bench-"))
    table: list[tuple[int, str, Measured]] = []
    try:
        for boxes in (SMALL, fleet_boxes):
            all_targets = list(targets(fleet, boxes).values())
            n = len(boxes)
            rows = [
                floor(cold_floor_name(n), all_targets, warm=False),
                floor(WARM_FLOOR, all_targets, warm=True),
                drift(NEW, boxes, state, close_masters),
                drift(REPEATED, boxes, state),
            ]
            for row, got in zip(rows, rounds(rows, args.runs, rng), strict=True):
                table.append((n, row.name, got))
            close_warm_floor()
        # Before pyinfra: its fact run leaves the boxes' render caches holding another
        # payload's renders, so the drift run right after it renders again.
        costs = collector_costs(fleet_boxes, state)
        dry = Row(PYINFRA_DRY, pyinfra_dry, close_masters, pyinfra_dry_ok)
        table.append((len(fleet_boxes), dry.name, timed(dry)))
    finally:
        close_warm_floor()
        shutil.rmtree(state, ignore_errors=True)
    lines = section(table, args.runs, costs, seed)
    write(Path(args.output), lines)
    print("\n".join(lines))
    return 0


def section(
    table: list[tuple[int, str, Measured]], runs: int, costs: tuple[float, float], seed: int
) -> list[str]:
    by = {(n, name): m for n, name, m in table}
    sizes = sorted({n for n, name, _ in table if name == cold_floor_name(n)})
    small, big = sizes[0], sizes[-1]
    floors = {n: by[(n, cold_floor_name(n))] for n in sizes}
    warm = {n: by[(n, WARM_FLOOR)] for n in sizes}
    load = os.getloadavg()[0]
    limit = default_limit()
    together = (
        f"so all {big} start together, as the floor's"
        if limit >= big
        else f"so at most {limit} of the {big} run at once (the floor starts all {big} together)"
    )
    lines = [
        START,
        "## Live fan-out at scale",
        "",
        f"`bench/live_scale_bench.py`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, on the scale lab "
        f"({big} boxes, `python -m lab scale up`, lab/scale.py), {os.cpu_count()} cores shared "
        f"by the controller, every box's sshd and collector and the lab's engines; load average "
        f"{load:.1f} at the end. {small} boxes are {', '.join(SMALL)} of the same {big}. Median "
        f"of {runs} interleaved rounds after a warm-up, each round every row once in an order "
        f"shuffled anew (Python's `random.Random({seed})`); ratios are to the floors of the same "
        f"size in the same rounds. The fan-out's default limit here is {limit} boxes at once, "
        f"{together}. The floors use the tool's own ssh options (ssh_argv). Controller CPU: the "
        "row's own processes; machine CPU: every process on the machine while the row ran (the "
        "boxes' sshd, collectors, docker CLI and engines included). The pyinfra row is other "
        "work (planning a converge of the mesh deploy, not a drift check), run once after the "
        "rounds: its time only, no ratio to the drift floors.",
        "",
        *NOT_STARTED,
        "",
        "| boxes | what | median s | × floor | × warm floor | controller CPU s | machine CPU s |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for n, name, m in table:
        ratios = (
            "— | —"
            if name == PYINFRA_DRY
            else f"{m.wall / floors[n].wall:.2f} | {m.wall / warm[n].wall:.2f}"
        )
        lines.append(f"| {n} | {name} | {m.wall:.2f} | {ratios} | {m.cpu:.2f} | {m.machine:.2f} |")
    fl, dr = floors[big], by[(big, NEW)]
    collectors_cpu, collector_wall = costs
    left = rest(dr.machine - fl.machine, dr.cpu - fl.cpu, collectors_cpu)
    lines += [
        "",
        f"Goal (issue 12): drift over {big} boxes with new connections within 1.5x the floor "
        f"({big} parallel OpenSSH connections each running `docker inspect`, new connections on "
        f"both sides, the same rounds): {verdict(dr.wall / fl.wall, 1.5)}.",
    ]
    if small != big:
        lines += [
            "",
            f"The {small}-box goals are decided by bench/drift_bench.py's section (the "
            f"three-box lab, its own rounds). A second measurement here, on {', '.join(SMALL)} "
            "of the scale lab, under its load: a repeated run within 3x the warm floor: "
            f"{verdict(by[(small, REPEATED)].wall / warm[small].wall, 3)}; a run with new "
            "connections within 1.5x the cold floor: "
            f"{verdict(by[(small, NEW)].wall / floors[small].wall, 1.5)}.",
        ]
    lines += [
        "",
        f"Where the time goes at {big} boxes: both rows keep the machine's {os.cpu_count()} "
        f"cores busy (machine CPU / wall, the rounds' medians: floor "
        f"{fl.machine / fl.wall:.1f}, drift {dr.machine / dr.wall:.1f}), so wall time follows "
        "the CPU every box's work costs on this one machine. The floor costs "
        f"{fl.machine / big:.2f} CPU s a box (the key exchange on both sides, sshd's session, "
        f"two docker CLI runs); drift costs {dr.machine / big:.2f}: "
        f"{more_or_less(dr.machine - fl.machine)} in all. The controller's own process takes "
        f"{dr.cpu - fl.cpu:.1f} s of it (its ssh clients cost the floor's; the rest is Python: "
        f"{big} answers of ~150 KB parsed into typed documents, compared, reported, recorded in "
        "the history). The collectors' own figures come from a separate drift run with new "
        "connections after the rounds (its history store kept each box's `timings_ms`): they "
        f"took {collectors_cpu:.1f} s in all as they measured themselves (`timings_ms.cpu`, "
        f"median {collector_wall:.2f} s of wall time each: Python's start, the Engine API, the "
        "cached compose renders, the login-shell trace), in place of the floor's two docker "
        f"CLI runs a box (the collector asks the Engine API); {left} "
        "On real boxes each collector runs on the box's own CPU: only the controller's share "
        "would stay on the controller.",
        END,
    ]
    return lines


# What the scale lab's boxes are not (lab/scale.py, its docstring: "The containers are created
# ... but not started"), and so what the rows above do not measure.
NOT_STARTED = [
    "**A lighter workload than a real fleet's.** Every box of the scale lab (the 3-box rows' "
    "too) has its containers created but not started (`docker compose up --no-start`, "
    "lab/scale.py: 5 lanes with health checks every 5 s and a gateway heart-beating every "
    "peer, on every box, would swamp 2 cores, and the gateways could not all publish :8000 "
    "on one engine's address). So no lane or gateway answers: the collector makes no lane "
    "probes there (it probes a vLLM lane only when its container is running, collector.py "
    "`lane_probes`), its gateway probes and the controller's find nothing listening, and "
    "none of these containers runs a health check (the three-box lab's own containers, on the "
    "same engines, do). Drift reports each box's lanes not running and its "
    "gateway unreachable; the observation (every container's inspect over the Engine API, the "
    "compose renders, the files' digests, the login shell's trace), the comparison and the "
    "report do their full work for every box, but the lanes' HTTP answers a running fleet "
    "would send, read and compare are missing from these times.",
]


def verdict(ratio: float, limit: float) -> str:
    return f"{'met' if ratio <= limit else 'not met'} ({ratio:.2f}x)"


def more_or_less(difference: float) -> str:
    """A CPU difference in words ("1.2 CPU s more", "0.3 CPU s less")."""
    return f"{abs(difference):.1f} CPU s {'more' if difference >= 0 else 'less'}"


def rest(more: float, controller: float, collectors: float) -> str:
    """What the two measured shares leave of the drift run's extra machine CPU."""
    left = more - controller - collectors
    if left <= 0:
        return (
            f"the two shares add up to {-left:.1f} s more than the difference: what the "
            "floor's docker CLI runs cost."
        )
    return (
        f"{left:.1f} s are left beyond the two shares: the Engine API work the collectors ask "
        "of the three shared dockerd, and sshd's side of a longer session."
    )


def write(output: Path, lines: list[str]) -> None:
    block = "\n".join(lines)
    text = output.read_text(encoding="utf-8") if output.exists() else ""
    if START in text and END in text:
        before, rest = text.split(START, 1)
        text = before + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    output.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
