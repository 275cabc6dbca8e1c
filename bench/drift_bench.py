"""Benchmark `reconcile drift` on the three-box lab against the floor, in one run.

The floor is the least any drift tool must do: one SSH command per box, all boxes in
parallel, running `docker inspect` of the compose project's containers. The peer is pyinfra's
own API (connect, then run that same command through its SSH connector). Every timing is the
median of N runs taken in this one process, so the table compares like with like; absolute
seconds depend on the machine and its load, the ratios much less.

    .venv/bin/python bench/drift_bench.py [--runs 7] [--output BENCHMARKS.md]

Needs the lab up (`python -m lab up`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reconciler.desired.load import load_fleet  # noqa: E402
from reconciler.drift_inputs import targets  # noqa: E402
from reconciler.observe.transport import Target, control_dir  # noqa: E402

INSPECT = "docker inspect $(docker ps -aq --filter label=com.docker.compose.project=lobes)"


def floor_ssh(target: Target) -> list[str]:
    """Plain OpenSSH, a fresh connection each time: what an operator's loop would do."""
    return [
        "ssh", "-p", str(target.port), "-i", str(target.key_file), "-o", "BatchMode=yes",
        "-o", f"UserKnownHostsFile={target.known_hosts}", "-o", "StrictHostKeyChecking=yes",
        "-o", "ControlMaster=no", "-o", "ControlPath=none",
        f"{target.user}@{target.hostname}", INSPECT,
    ]  # fmt: skip


def run_floor(all_targets: list[Target]) -> None:
    with ThreadPoolExecutor(len(all_targets)) as pool:
        results = list(
            pool.map(
                lambda t: subprocess.run(floor_ssh(t), capture_output=True, check=False),
                all_targets,
            )
        )
    for result in results:
        if result.returncode != 0:
            raise SystemExit(f"floor command failed: {result.stderr.decode()[-300:]}")


def run_pyinfra(_targets: list[Target]) -> None:
    # A separate process: the import cost of pyinfra is part of what a user pays.
    code = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("pyinfra_peer.py"))],
        cwd=ROOT,
        capture_output=True,
        check=False,
        env={**os.environ, "FLEET_INVENTORY": "lab"},
    )
    if code.returncode != 0:
        raise SystemExit(f"pyinfra peer failed: {code.stderr.decode()[-500:]}")


def drift_cli(extra_env: dict[str, str] | None = None) -> Callable[[list[Target]], None]:
    def run(_targets: list[Target]) -> None:
        env = {**os.environ, "FLEET_INVENTORY": "lab", **(extra_env or {})}
        result = subprocess.run(
            [str(ROOT / ".venv/bin/reconcile"), "drift", "--format", "json"],
            cwd=ROOT,
            capture_output=True,
            check=False,
            env=env,
        )
        if result.returncode not in (0, 2):
            raise SystemExit(f"reconcile drift exited {result.returncode}: {result.stderr[-500:]}")

    return run


def close_masters() -> None:
    for socket in control_dir().iterdir():
        subprocess.run(
            ["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "x"],
            capture_output=True,
            check=False,
        )


@dataclass(frozen=True)
class Method:
    name: str
    run: Callable[[list[Target]], None]
    before: Callable[[], None] | None = None  # untimed set-up before each timed run


def medians(methods: list[Method], all_targets: list[Target], runs: int) -> list[float]:
    """Interleaved rounds: every round times each method once, in a rotating order, so a
    change in the machine's load during the benchmark touches every method alike."""
    for m in methods:  # warm-up: page cache, the box's render cache, the ssh master
        m.run(all_targets)
    samples: list[list[float]] = [[] for _ in methods]
    for round_no in range(runs):
        shift = round_no % len(methods)
        for index in [*range(shift, len(methods)), *range(shift)]:
            m = methods[index]
            if m.before:
                m.before()
            started = time.perf_counter()
            m.run(all_targets)
            samples[index].append(time.perf_counter() - started)
    return [statistics.median(s) for s in samples]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args()
    # Measure the tool as installed (scripts/setup.sh compiles it): bytecode current even
    # after an edit, whatever PYTHONDONTWRITEBYTECODE says.
    subprocess.run([sys.executable, "-m", "compileall", "-q", "reconciler"], cwd=ROOT, check=True)
    fleet = load_fleet(ROOT, "lab")
    all_targets = list(targets(fleet, list(fleet.boxes)).values())
    n = args.runs
    methods = [
        Method("floor: 3 parallel OpenSSH `docker inspect`", run_floor),
        Method("pyinfra 3.10 API: connect + the same command", run_pyinfra),
        Method("reconcile drift, warm (ssh master, caches)", drift_cli()),
        Method("reconcile drift, new ssh connections", drift_cli(), close_masters),
    ]
    rows = list(zip([m.name for m in methods], medians(methods, all_targets, n), strict=True))
    floor = rows[0][1]
    load = os.getloadavg()[0]
    lines = [
        "# Benchmarks",
        "",
        f"`bench/drift_bench.py`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, the three-box lab, "
        f"median of {args.runs} interleaved runs each, load average {load:.1f} at the end, "
        f"{os.cpu_count()} cores. Ratios are to the floor measured in the same run.",
        "",
        "| what | median s | × floor |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {seconds:.3f} | {seconds / floor:.2f} |" for name, seconds in rows]
    lines += [
        "",
        "The floor inspects containers and nothing else. `reconcile drift` also reads and hashes",
        "`.env` and the compose files, renders the compose project twice (scrubbed and under the",
        "login shell; cached on the box by content), traces the login shell, probes each gateway",
        "from the box and from the controller and each lane, loads and validates the desired",
        "state, compares and renders the report.",
        "",
    ]
    Path(args.output).write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
