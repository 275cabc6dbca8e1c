"""Benchmark `reconcile drift` on the three-box lab against the floor, in one run.

The floor is the least any drift tool must do: one SSH command per box, all boxes in
parallel, running `docker inspect` of the compose project's containers, with the ssh options
the tool's own ssh_argv sets (reconciler/observe/transport.py). The peer is pyinfra's own API
(connect, then run that same command through its SSH connector), given each box's ssh settings
computed before the timing. Every timing is the median of N rounds taken in this one process,
each round running every row once in an order shuffled anew (seeded, the seed in the output),
so the table compares like with like; absolute seconds depend on the machine and its load, the
ratios much less. The issue's goals for three boxes (a repeated run within 3x the warm floor,
a run with new connections within 1.5x the cold floor) are computed from the same rounds.

    .venv/bin/python bench/drift_bench.py [--runs 7] [--seed S] [--output BENCHMARKS.md]
        [--baseline DIR]

Needs the lab up (`python -m lab up`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reconciler.desired.fingerprint import entry_name  # noqa: E402
from reconciler.desired.load import load_fleet  # noqa: E402
from reconciler.desired.pyinfra_data import host_data  # noqa: E402
from reconciler.drift_inputs import targets  # noqa: E402
from reconciler.observe.transport import (  # noqa: E402
    Target,
    control_dir,
    ssh_argv,
    ssh_config_path,
)

INSPECT = "docker inspect $(docker ps -aq --filter label=com.docker.compose.project=lobes)"


@functools.cache
def warm_sockets() -> Path:
    """The warm floor's own masters, never the tool's (closing those must not touch these)."""
    return Path(tempfile.mkdtemp(prefix="fleet-bench-ssh-"))


# The options of ssh_argv that share connections: the floor sets its own.
SHARING = ("ControlMaster", "ControlPath", "ControlPersist")


def floor_ssh(target: Target, warm: bool = False, command: str = INSPECT) -> list[str]:
    """Plain OpenSSH with every option the tool's ssh_argv sets (batch mode, timeouts, the key
    alone with IdentitiesOnly, the pinned known_hosts alone: GlobalKnownHostsFile=/dev/null,
    KnownHostsCommand=none), but the floor's own connection sharing, never the tool's masters.
    Cold: a fresh connection each time, what an operator's loop would do. Warm: through a
    persisted master, as a repeated `reconcile drift` runs (issue 12)."""
    sharing = (
        ["-o", "ControlMaster=auto", "-o",
         f"ControlPath={ssh_config_path(str(warm_sockets()), '/%C')}",
         "-o", "ControlPersist=120"]
        if warm
        else ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
    )  # fmt: skip
    # ssh_argv refuses a user or host ssh could read as an option (`-l` and `--` as there).
    tool = iter(ssh_argv(target, command))
    argv: list[str] = []
    for arg in tool:
        if arg == "--":
            return [*argv, *sharing, arg, *tool]
        if arg == "-o":
            value = next(tool)
            if value.split("=", 1)[0] not in SHARING:
                argv += [arg, value]
        else:
            argv.append(arg)
    raise AssertionError(f"ssh_argv gave no `--`: {argv}")


def floor(warm: bool) -> Callable[[list[Target]], None]:
    def run(all_targets: list[Target]) -> None:
        with ThreadPoolExecutor(len(all_targets)) as pool:
            results = list(
                pool.map(
                    lambda t: subprocess.run(floor_ssh(t, warm), capture_output=True, check=False),
                    all_targets,
                )
            )
        for result in results:
            if result.returncode != 0:
                raise SystemExit(f"floor command failed: {result.stderr.decode()[-300:]}")

    return run


def close_warm_floor() -> None:
    for socket in warm_sockets().iterdir():
        subprocess.run(
            ["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "x"],
            capture_output=True,
            check=False,
        )


def peer_hosts(fleet: Any) -> list[tuple[str, dict[str, Any]]]:
    """Each box's ssh settings as pyinfra's host data (host, user, port, key, the pinned
    known_hosts), as inventory.py gives them to pyinfra: computed before any timing."""
    return [
        (box, {k: v for k, v in host_data(fleet, box).items() if k.startswith("ssh_")})
        for box in fleet.boxes
    ]


def run_pyinfra(hosts: list[tuple[str, dict[str, Any]]]) -> Callable[[list[Target]], None]:
    """pyinfra's API in a separate process (Python's start and importing pyinfra are part of
    what a user pays, as the tool's row pays its own), given the hosts' settings: it neither
    imports nor loads the tool's desired state."""
    spec = json.dumps(hosts)

    def run(_targets: list[Target]) -> None:
        code = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("pyinfra_peer.py")), spec],
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
        if code.returncode != 0:
            raise SystemExit(f"pyinfra peer failed: {code.stderr.decode()[-500:]}")

    return run


def drift_cli(tree: Path = ROOT) -> Callable[[list[Target]], None]:
    """`reconcile drift` of the checkout at `tree`, with that checkout's own virtualenv."""

    def run(_targets: list[Target]) -> None:
        env = {**os.environ, "FLEET_INVENTORY": "lab"}
        result = subprocess.run(
            [str(tree / ".venv/bin/reconcile"), "drift", "--format", "json"],
            cwd=tree,
            capture_output=True,
            check=False,
            env=env,
        )
        if result.returncode not in (0, 2):
            said = result.stderr[-500:].decode("utf-8", "replace")
            raise SystemExit(f"reconcile drift exited {result.returncode}: {said}")

    return run


def close_masters() -> None:
    sockets = control_dir()
    if sockets is None:  # not private: ssh_argv shares no connection either
        return
    for socket in sockets.iterdir():
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


@dataclass(frozen=True)
class Result:
    seconds: float  # median wall time of one run
    cpu: float  # median CPU of the processes it started here (ssh clients, Python)
    walls: tuple[float, ...] = ()  # every round's wall time, in the rounds' order


def medians(
    methods: list[Method], all_targets: list[Target], runs: int, rng: random.Random
) -> list[Result]:
    """Interleaved rounds: every round times each method once, in an order shuffled anew each
    round (`rng`), so a change in the machine's load during the benchmark, or what one row
    leaves behind for the next, touches every method alike."""
    for m in methods:  # warm-up: page cache, the box's render cache, the ssh master
        m.run(all_targets)
    walls: list[list[float]] = [[] for _ in methods]
    cpus: list[list[float]] = [[] for _ in methods]
    for _round in range(runs):
        order = list(range(len(methods)))
        rng.shuffle(order)
        for index in order:
            m = methods[index]
            if m.before:
                m.before()
            cpu_before = _children_cpu()
            started = time.perf_counter()
            m.run(all_targets)
            walls[index].append(time.perf_counter() - started)
            cpus[index].append(_children_cpu() - cpu_before)
    return [
        Result(statistics.median(w), statistics.median(c), tuple(w))
        for w, c in zip(walls, cpus, strict=True)
    ]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def forgetting(tree: Path) -> Callable[[], None]:
    def forget_inputs() -> None:
        """As after an edit of group_vars: no remembered drift inputs, no remembered load."""
        inventory = tree / "inventory" / "lab.yaml"
        for kind in ("drift-inputs", "fleet"):
            entry_name(kind, tree, inventory).with_suffix(".pickle").unlink(missing_ok=True)

    return forget_inputs


REPEATED = "`reconcile drift`, repeated (ssh master up, inputs remembered)"
NEW_CONNECTIONS = "`reconcile drift`, new ssh connections"
AFTER_EDIT = "`reconcile drift` after an edit (loads and validates the YAML)"
DRIFT_ROWS = (
    (REPEATED, None),
    (NEW_CONNECTIONS, "close"),
    (AFTER_EDIT, "forget"),
)
WARM_FLOOR = "floor, warm: the same through persisted ssh masters"


def cold_floor_name(boxes: int) -> str:
    return f"floor: {boxes} parallel OpenSSH `docker inspect`, new connections"


def goal(what: str, limit: float, tool: Result, floor: Result) -> str:
    """One goal of the issue as measured: the ratio of the medians decides; each round's own
    ratio (tool and floor from the same round) says how steady it was."""
    ratio = tool.seconds / floor.seconds
    rounds = [t / f for t, f in zip(tool.walls, floor.walls, strict=True)]
    within = sum(r <= limit for r in rounds)
    spread = (
        f"; each round's own ratio {min(rounds):.2f}x to {max(rounds):.2f}x, within {limit:g}x "
        f"in {within} of {len(rounds)} rounds"
        if rounds
        else ""
    )
    return (
        f"- {what} within {limit:g}x: {'met' if ratio <= limit else 'not met'} "
        f"({ratio:.2f}x the medians{spread})."
    )


def goals(by_name: dict[str, Result], boxes: int) -> list[str]:
    """Issue 12's goals for the three-box lab, computed from this run's rounds."""
    return [
        f"Goals (issue 12), {boxes} boxes, from these rounds:",
        goal(
            "a repeated run against the warm floor",
            3,
            by_name[REPEATED],
            by_name[WARM_FLOOR],
        ),
        goal(
            "a run with new connections against the cold floor",
            1.5,
            by_name[NEW_CONNECTIONS],
            by_name[cold_floor_name(boxes)],
        ),
    ]


def drift_methods(tree: Path, label: str = "") -> list[Method]:
    """The three drift rows for the checkout at `tree` (`label` names another checkout)."""
    out = []
    for name, before in DRIFT_ROWS:
        setup = {"close": close_masters, "forget": forgetting(tree), None: None}[before]
        out.append(Method(f"{name}{label}", drift_cli(tree), setup))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument(
        "--seed", type=int, help="seed of each round's shuffled order (default: a random one)"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of an earlier version (with its own .venv, and .lab linked to this "
        "lab's): its drift rows run in the same rounds, and a section compares the two",
    )
    args = parser.parse_args()
    trees = [ROOT] + ([args.baseline.resolve()] if args.baseline else [])
    for tree in trees:
        # Measure the tool as installed (scripts/setup.sh compiles it): bytecode current even
        # after an edit, whatever PYTHONDONTWRITEBYTECODE says.
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", "reconciler"], cwd=tree, check=True
        )
    fleet = load_fleet(ROOT, "lab")
    all_targets = list(targets(fleet, list(fleet.boxes)).values())
    hosts = peer_hosts(fleet)  # before any timing: the peer is given them
    boxes = len(all_targets)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    methods = [
        Method(cold_floor_name(boxes), floor(warm=False)),
        Method(WARM_FLOOR, floor(warm=True)),
        Method(f"pyinfra {version('pyinfra')} API: connect + the same command", run_pyinfra(hosts)),
        *drift_methods(ROOT),
    ]
    if args.baseline:
        methods += drift_methods(args.baseline.resolve(), BASELINE_LABEL)
    try:
        results = medians(methods, all_targets, args.runs, random.Random(seed))
    finally:
        close_warm_floor()
    cold, warm = results[0].seconds, results[1].seconds
    load = os.getloadavg()[0]
    lines = [
        "# Benchmarks",
        "",
        f"`bench/drift_bench.py`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, on the {boxes}-box lab "
        f"(`python -m lab up`), {os.cpu_count()} cores shared by the controller and all "
        f"{boxes} boxes, load average {load:.1f} at the end. Median of {args.runs} interleaved "
        "rounds (each round runs every row once, in an order shuffled anew each round: "
        f"Python's `random.Random({seed})`); ratios are to the floors "
        "measured in the same rounds: a run that opens new connections against the cold "
        "floor, a run through persisted masters against the warm one. CPU is what the row's "
        "own processes on the controller used (ssh clients, Python), not the boxes' side.",
        "",
        "| what | median s | × floor | × warm floor | controller CPU s |",
        "|---|---:|---:|---:|---:|",
    ]
    ours = [(m, r) for m, r in zip(methods, results, strict=True) if BASELINE_LABEL not in m.name]
    lines += [
        f"| {m.name} | {r.seconds:.3f} | {r.seconds / cold:.2f} | {r.seconds / warm:.2f} "
        f"| {r.cpu:.3f} |"
        for m, r in ours
    ]
    lines += ["", *goals({m.name: r for m, r in ours}, boxes)]
    if args.baseline:
        lines += baseline_section(args.baseline, methods, results, cold)
    lines += explanation({m.name: r for m, r in ours})
    output = Path(args.output)
    text = "\n".join(lines) + "\n"
    if output.exists():  # keep the sections other benchmarks own (bench/scale_bench.py)
        text = kept_sections(output.read_text(encoding="utf-8"), text)
    output.write_text(text, encoding="utf-8")
    print("\n".join(lines))
    return 0


BASELINE_LABEL = " [baseline]"


def baseline_section(
    baseline: Path, methods: list[Method], results: list[Result], cold: float
) -> list[str]:
    """This checkout's drift rows beside the baseline's, from the same interleaved rounds."""
    commit = subprocess.run(
        ["git", "-C", str(baseline), "log", "-1", "--format=%h %s"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    by_name = {m.name: r for m, r in zip(methods, results, strict=True)}
    lines = [
        "",
        "## Against the previous code, in the same rounds",
        "",
        f"The same drift rows of an earlier checkout (`{commit[:72]}`), run in the rounds above "
        "(`--baseline`), so the machine's load touches both alike:",
        "",
        "| row | baseline × floor | this × floor | controller CPU s, baseline → this |",
        "|---|---:|---:|---:|",
    ]
    for name, _ in DRIFT_ROWS:
        this, before = by_name[name], by_name[name + BASELINE_LABEL]
        lines.append(
            f"| {name} | {before.seconds / cold:.2f} | {this.seconds / cold:.2f} "
            f"| {before.cpu:.3f} → {this.cpu:.3f} |"
        )
    return lines


def kept_sections(old: str, new: str) -> str:
    """`new` followed by the other benchmarks' marked sections of `old` (scale_bench.py,
    live_scale_bench.py), those it has."""
    from bench.scale_bench import END, START

    live = ("<!-- live-scale-bench:start -->", "<!-- live-scale-bench:end -->")
    for start, end in ((START, END), live):
        if start in old and end in old:
            section = start + old.split(start, 1)[1].split(end, 1)[0] + end
            new = new.rstrip("\n") + "\n\n" + section + "\n"
    return new


def explanation(by_name: dict[str, Result]) -> list[str]:
    """What each row does and where its time goes; the after-edit run's extra CPU is this
    run's: its row's median controller CPU less the repeated row's (the same rounds)."""
    return [*EXPLANATION, *after_edit(by_name[AFTER_EDIT].cpu - by_name[REPEATED].cpu), ""]


def after_edit(extra_cpu: float) -> list[str]:
    """The after-edit bullet: what loading and validating the YAML cost in this run."""
    cost = (
        f"costs {extra_cpu:.2f} s more controller CPU than a repeated run here (the two rows' "
        "median CPU above)"
        if extra_cpu >= 0
        else f"cost no more controller CPU than a repeated run here (the after-edit row's "
        f"median CPU above is {-extra_cpu:.2f} s less: the rounds' noise)"
    )
    return [
        "- *After an edit*: importing pydantic and ruamel.yaml, parsing the layers with their line",
        f"  numbers and validating them {cost}, spent before the first byte is sent (an",
        "  invalid state must stop the run before any connection). The run after that is a",
        "  repeated run again.",
    ]


EXPLANATION = [
    "",
    "## What each row does",
    "",
    "- **floor**: one `ssh` process a box, all at once, each a new connection running",
    "  `docker inspect` of the compose project's containers: the least any drift tool must do.",
    "  Its ssh options are the tool's own (ssh_argv: BatchMode, the key alone with",
    "  IdentitiesOnly, the pinned known_hosts alone), its connection sharing its own.",
    "  *Warm*: the same commands through persisted ssh masters (ControlPersist), as a",
    "  repeated drift run connects: the floor to compare a repeated run with.",
    "- **pyinfra**: pyinfra's own API in a fresh process (its default paramiko connector):",
    "  connect to the boxes and run that same command (bench/pyinfra_peer.py). It is given",
    "  each box's ssh settings (host, user, port, key, pinned known_hosts), computed before",
    "  the timing: the row is Python's start, importing pyinfra, connecting and the command.",
    "- **`reconcile drift`**: the whole command, JSON report on stdout. On each box one",
    "  collector run reads and hashes `.env` and the compose files, inspects containers and",
    "  images over the Engine API, renders the compose project twice (scrubbed and under the",
    "  login shell) and takes compose's config hash of the deployment's own files (all cached",
    "  on the box by content), traces the login shell's exports, probes the gateway and every",
    "  lane; the controller probes every gateway itself, compares, reports.",
    "  *Repeated*: the usual case, an operator re-checking; *new ssh connections*: the SSH",
    "  masters are closed before each run; *after an edit*: the remembered inputs are dropped",
    "  before each run, so the YAML is parsed and validated as after any change to group_vars.",
    "",
    "## Why it is fast",
    "",
    "- One SSH round trip per box, all boxes at once, over OpenSSH with ControlMaster (the",
    "  transport behind the `@openssh` pyinfra connector); the box program runs as",
    "  `python3 -I -S` and keeps its compiled code in the user's private cache.",
    "- A repeated run starts the collectors and the controller's probes from the remembered",
    "  drift inputs (reconciler/drift_inputs.py) before importing anything heavy, and never",
    "  imports pydantic or ruamel.yaml. Before the spawn it builds only the drift command's",
    "  parser, unpickles the targets and payloads (the expectations later, while the boxes",
    "  work) and takes the packed box program from its cache. No module of the run imports",
    "  dataclasses: its sixty record classes (the document, the comparison, the history's",
    "  rows) are reconciler/records.py's, which compile only an `__init__` each, on first use",
    "  (dataclasses with inspect under it, and sixty classes built by it, were ~24 ms of CPU a",
    "  run). Its mesh-side probes (three keyless GETs a",
    "  gateway, a thread each) go through the collector's HTTP/1.1 reader: importing httpx cost",
    "  40-60 ms of CPU, http.client with the email package ~20 ms. Nothing on the path imports",
    "  concurrent.futures, logging, secrets or the idna codec, and the run ends with",
    "  `os._exit` once its report and files are out (teardown: ~13 ms). The audit's keyed",
    "  requests stay on httpx.",
    "- The lab's 15 containers run health checks every 5 s (each a `runc exec`); that",
    "  background load is shared by every row.",
    "",
    "## Where the rest goes",
    "",
    "- *New ssh connections*: OpenSSH 9.2's default key exchange",
    "  (sntrup761x25519, post-quantum) costs about 0.1 s of CPU per connection on each side",
    "  here (`KexAlgorithms=curve25519-sha256` would cost a tenth). The floor pays it too; the",
    "  drift run pays it while its own Python and the three collectors compete for the same",
    "  two cores. The tool keeps OpenSSH's defaults and amortises them with ControlPersist",
    "  (120 s): a converge or a second drift within that time reuses the connection.",
    "- *On each box*: a collector run reports its own CPU in the observation",
    "  (`timings_ms.cpu`, kept by `--save-snapshot`): about 40 ms a repeated run, ~8 ms of it",
    "  Python's own start-up, ~4 ms the traced login shell. It imports only `os` and C modules",
    "  (HTTP/1.1 on a socket for the Engine API and the probes, json's C scanner, the builtin",
    "  SHA-256, `_ctypes` for the subreaper's prctl: ctypes itself cost ~1.7 ms a run, no",
    "  regular expression), keeps compiled code, renders and file digests in its private",
    "  cache; the source's digest comes with the command line, so cached code runs without",
    "  the shipped source being unpacked and hashed (~1.2 ms). The box's sshd also answers",
    "  the new-connection check (a pre-auth child, ~6 ms), its dockerd the Engine API",
    "  (~7 ms) and its gateway the probes (~5 ms). In the lab the three boxes share the",
    "  controller's two cores; real boxes do not.",
    "- *The controller* (a repeated run): ~45 ms of CPU until the last ssh has started",
    "  (Python's start, the parser, the remembered inputs, three forks); while the boxes work,",
    "  its imports (the comparison, the document, the report) ~12 ms and its probe and pipe",
    "  threads ~20 ms; after the answers, comparing and rendering ~4 ms, and recording the run",
    "  in the history (masking each observation, SQLite) ~20 ms, the largest part left after",
    "  the boxes.",
]  # then after_edit's bullet, computed from the rounds
if __name__ == "__main__":
    sys.exit(main())
