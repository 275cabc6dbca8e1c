"""`reconcile`: the command line. Each command imports only what it uses (import time is part
of every drift run's budget), loads the desired state first, and maps outcomes to exit codes:
0 ok / no drift, 1 invalid input or a box that could not be handled, 2 drift or findings."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from reconciler import __version__, interrupts
from reconciler.arg_types import directory, file_path, not_empty

if TYPE_CHECKING:
    from pathlib import Path

    from reconciler.desired.fleet import Fleet
    from reconciler.drift_inputs import DriftInputs
    from reconciler.observe.early import EarlyStart
    from reconciler.report.json_parts import PartsReport

EXIT_OK, EXIT_ERROR, EXIT_FINDINGS = 0, 1, 2

Handler = Callable[[argparse.Namespace], int]


NAMED = 12  # boxes a one-line summary names; a 1,000-box fleet's line named every one


def named(boxes: list[str]) -> str:
    """The first NAMED boxes, and how many more."""
    shown = ", ".join(boxes[:NAMED])
    return shown if len(boxes) <= NAMED else f"{shown} and {len(boxes) - NAMED} more"


def _cmd_validate(args: argparse.Namespace) -> int:
    fleet = _load(args)
    boxes = named(list(fleet.boxes))
    print(f"ok: {len(fleet.boxes)} boxes ({boxes}) from {fleet.inventory_file} and group_vars/")
    return EXIT_OK


def _cmd_show(args: argparse.Namespace) -> int:
    from reconciler.desired import show

    fleet = _load(args)
    boxes = [args.box] if args.box else list(fleet.boxes)
    unknown = [b for b in boxes if b not in fleet.boxes]
    if unknown:
        print(
            f"error: unknown box {unknown[0]!r} (boxes: {', '.join(fleet.boxes)})", file=sys.stderr
        )
        return EXIT_ERROR
    if args.format == "json":
        # One box: its document; every box: one document holding them all (a document per
        # box one after the other was no JSON).
        text = show.show_json(fleet, args.box) if args.box else show.show_json_boxes(fleet, boxes)
    else:
        text = "\n".join(show.show_text(fleet, b) for b in boxes)
    sys.stdout.write(text)
    return EXIT_OK


def _cmd_schema(args: argparse.Namespace) -> int:
    if args.report:
        from reconciler.report.json_report import drift_report_schema_json

        text = drift_report_schema_json()
    else:
        from reconciler.desired.schema import layer_schema_json

        text = layer_schema_json()
    if args.output:
        from reconciler.output_file import target_problem, written

        problem = target_problem("-o", args.output)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return EXIT_ERROR
        return EXIT_OK if written("-o", args.output, [text]) else EXIT_ERROR
    sys.stdout.write(text)
    return EXIT_OK


def _cmd_drift(args: argparse.Namespace) -> int:
    import shutil
    from pathlib import Path

    from reconciler.history.hooks import finish_drift, prepare
    from reconciler.observe.fanout import configure

    configure(args.max_parallel, args.timeout)  # how many boxes at once, how long one may take
    outs = prepare(args)  # --metrics / the history store: checked before any box is contacted
    if outs is None:
        return EXIT_ERROR
    if args.from_snapshot and not args.save_snapshot:
        args.inventory = _snapshot_inventory(args)
    # A saving run asks the boxes for more than the remembered payloads say (own_render.py).
    early = None if args.from_snapshot or args.save_snapshot else _start_early(args)
    try:
        if early is not None:
            # Started from the remembered inputs: the desired state is neither parsed nor
            # imported in this run at all.
            inputs, boxes = early.inputs, list(early.running)
        else:
            inputs = _drift_inputs(args)
            found = _boxes(inputs.boxes, args.boxes or _snapshot_boxes(args, inputs.boxes))
            if found is None:
                return EXIT_ERROR
            boxes = found
            if args.save_snapshot:
                from reconciler.observe.own_render import for_snapshot

                inputs = for_snapshot(inputs)  # the boxes' own .env rendered too (for import)
            if not args.from_snapshot:  # send the boxes their work before importing ours
                early = _launch(inputs, boxes)
        from reconciler.drift import DriftRun, replay_parts, replays_in_parts, run_drift_on
        from reconciler.history.hooks import preload
        from reconciler.report import render

        if early is not None:
            preload(outs)  # the boxes are working: import what comes after their answers
        try:
            if _json_replay(args) and replays_in_parts(len(boxes)):
                recorded = outs.history is not None or outs.metrics is not None
                directory = Path(args.from_snapshot)
                stored = outs.history is not None  # the entries' rows: for the store alone
                run: DriftRun | PartsReport = replay_parts(
                    inputs, boxes, directory, recorded, stored
                )
            else:
                run = run_drift_on(
                    inputs,
                    boxes,
                    **snapshot_dirs(args),
                    early=early,
                    keep_observations=False,  # the report is all this command prints
                )
        except (OSError, ValueError) as exc:  # an unreadable snapshot, an unwritable directory
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_ERROR
    finally:
        if early is not None:
            early.cancel()  # no-op for collectors already finished
    on_terminal = args.output is None and sys.stdout.isatty()
    color = on_terminal and args.format == "text"
    width = shutil.get_terminal_size().columns if on_terminal else 100
    pieces: Iterable[str]
    if not isinstance(run, DriftRun):  # a large replay's JSON, its parts made by its workers
        from reconciler.report.json_parts import render_json_parts

        pieces, code = render_json_parts(run), run.exit_code
    elif args.format == "html":  # its own module: jinja2 is imported for this format only
        from reconciler.report.html import drift_page

        page = drift_page(run.report, inputs, outs.history, outs.root)
        pieces, code = [page], run.report.exit_code
    else:
        pieces = [render(run.report, args.format, color=color, width=max(80, width))]
        code = run.report.exit_code
    if args.output:
        from reconciler.output_file import written

        if not written("-o", args.output, pieces):
            return EXIT_ERROR
    else:
        sys.stdout.writelines(pieces)
    # Metrics, history: after it (a report kept as its parts brought its boxes' shares).
    return finish_drift(outs, args, run, code, None if isinstance(run, DriftRun) else pieces)


def snapshot_dirs(args: argparse.Namespace) -> dict[str, Path | None]:
    """`--save-snapshot` and `--from-snapshot` as a run takes them (`save_to`, `from_snapshot`)."""
    from pathlib import Path

    return {
        "save_to": Path(args.save_snapshot) if args.save_snapshot else None,
        "from_snapshot": Path(args.from_snapshot) if args.from_snapshot else None,
    }


def _json_replay(args: argparse.Namespace) -> bool:
    """Whether this run replays a snapshot into its JSON report (no snapshot saved): its boxes'
    results are then needed only as their entries, and the metrics and history read the
    report's document from that JSON (history/hooks.finish_drift)."""
    plain_replay = args.from_snapshot and not args.save_snapshot
    return bool(plain_replay and args.format == "json")


def _start_early(args: argparse.Namespace) -> EarlyStart | None:
    """Send the boxes their collectors before importing anything heavy, if the remembered
    drift inputs still hold (reconciler/drift_inputs.py)."""
    from pathlib import Path

    from reconciler.desired.locate import inventory_file, root_or_none
    from reconciler.observe.early import start
    from reconciler.observe.payload import new_run_key

    root = Path(os.path.realpath(args.root)) if args.root else root_or_none()
    if root is None:
        return None
    return start(root, inventory_file(root, args.inventory), args.boxes or None, new_run_key())


def _launch(inputs: DriftInputs, boxes: list[str]) -> EarlyStart:
    from reconciler.observe.early import launch
    from reconciler.observe.payload import new_run_key

    return launch(inputs, boxes, new_run_key())


def _drift_inputs(args: argparse.Namespace) -> DriftInputs:
    """The desired state loaded and validated (or its remembered valid load), flattened for a
    drift run, and remembered for the next one."""
    from reconciler.desired.locate import inventory_file
    from reconciler.drift_inputs import remembered_inputs

    replay = _replay_inputs(args)
    if replay is not None:
        return replay
    if args.from_snapshot:
        from reconciler.desired.fingerprint import store_behind

        store_behind()  # a replay's workers are busy meanwhile; main() waits for the stores
    # Not kept: a drift remembers what it reads back, the inputs derived below. Only `audit`
    # reads the validated state back, and pickling it (~7 MB, ~0.4 s of CPU at 1,000 boxes,
    # and a forked child copying the pages of all it pickles while a replay's workers run)
    # is that command's own cost, paid on its first run.
    fleet = _load(args, cached=True, keep=False)
    if _snapshot_facts(args) is not None:
        from reconciler.drift_inputs import drift_inputs

        return drift_inputs(fleet)  # the snapshot's facts: not the inputs of a live run
    return remembered_inputs(fleet, inventory_file(fleet.root, args.inventory))


def _snapshot_inventory(args: argparse.Namespace) -> str | None:
    """The inventory a replay judges its snapshot against: `-i` (or FLEET_INVENTORY) when
    chosen, said when it is not the one the snapshot's index names; else the index's, as
    `reconcile diff --from-snapshot` judges it (history/snapshots.py). Replayed against the
    default `hosts`, a lab snapshot read every box as observed elsewhere than desired. An
    index that cannot be read leaves the choice as it is: the replay says what is wrong."""
    from pathlib import Path

    from reconciler.observe.observe import snapshot_index
    from reconciler.snapshot_inventory import judged_inventory

    try:
        index = snapshot_index(Path(args.from_snapshot))
    except (OSError, ValueError):
        return args.inventory
    return judged_inventory(args, args.from_snapshot, index.get("inventory"))


def _replay_inputs(args: argparse.Namespace) -> DriftInputs | None:
    """A replay (--from-snapshot, judged against the repository's own facts) of byte-identical
    desired-state files takes the remembered drift inputs, as a live run's early start does:
    at 1,000 boxes that skips unpickling the validated state (~0.4 s), deriving the inputs
    from it again (~0.7 s) and re-storing them (~0.7 s). None: load as before."""
    saving = getattr(args, "save_snapshot", None)  # `diff --from-snapshot` has no such option
    if not args.from_snapshot or saving or _snapshot_facts(args) is not None:
        return None
    from pathlib import Path

    from reconciler.desired.locate import inventory_file, root_or_none
    from reconciler.drift_inputs import cached_inputs

    root = Path(os.path.realpath(args.root)) if args.root else root_or_none()
    return None if root is None else cached_inputs(root, inventory_file(root, args.inventory))


def _boxes(known: Sequence[str], wanted: list[str]) -> list[str] | None:
    unknown = [b for b in wanted if b not in known]
    if unknown:
        print(f"error: unknown box {unknown[0]!r} (boxes: {', '.join(known)})", file=sys.stderr)
        return None
    return once(wanted) or list(known)


def once(boxes: Sequence[str]) -> list[str]:
    """`boxes` with each named once, in the order first named: `drift thor thor` is one box.
    A box observed twice was counted twice and its second row broke the history's record."""
    return list(dict.fromkeys(boxes))


def _cmd_import(args: argparse.Namespace) -> int:
    from reconciler.importer.run import run_import  # heavy (ruamel, pydantic): import only

    return run_import(args)


def _cmd_lab(args: argparse.Namespace) -> int:
    try:
        from lab.cli import main as lab_main
    except ImportError as exc:  # the lab ships with the repository, not with the wheel
        print(f"error: the lab package is not importable here ({exc})", file=sys.stderr)
        return EXIT_ERROR
    return int(lab_main(args.lab_args) or 0)


def _load(args: argparse.Namespace, *, cached: bool = False, keep: bool = True) -> Fleet:
    """The validated desired state. `cached`: reuse the last valid load of byte-identical
    inputs (desired/cache.py); read-only commands take it, `validate` and `apply` never do.
    `keep`: a cached load remembers a state it loaded from the files."""
    from reconciler.gc_pause import collecting

    with collecting():  # ruamel.yaml's and pydantic's garbage: not all of it is acyclic
        return _load_state(args, cached=cached, keep=keep)


def _load_state(args: argparse.Namespace, *, cached: bool, keep: bool) -> Fleet:
    from pathlib import Path

    root = Path(os.path.realpath(args.root)) if args.root else None
    facts = _snapshot_facts(args)
    if facts is not None:  # judged against the snapshot's own facts; never kept in the cache
        from reconciler.desired.load import load_fleet

        return load_fleet(root, args.inventory, facts=facts)
    if cached:
        from reconciler.desired.cache import load_fleet_cached

        return load_fleet_cached(root, args.inventory, keep=keep)
    from reconciler.desired.load import load_fleet

    return load_fleet(root, args.inventory)


def _snapshot_facts(args: argparse.Namespace) -> Path | None:
    """The facts a `--from-snapshot DIR` carries (reconciler/desired/facts.py), if any."""
    if not getattr(args, "from_snapshot", None):
        return None
    from pathlib import Path

    from reconciler.desired.facts import snapshot_facts

    return snapshot_facts(Path(args.from_snapshot))


def _snapshot_boxes(args: argparse.Namespace, known: Sequence[str]) -> list[str]:
    """Without BOX arguments a replay judges the boxes its snapshot holds (a scenario saved for
    one box is not three boxes' error); [] (every box) if the snapshot names none we know.
    The inventory's boxes it does not hold (added since it was saved, or left out of it) are
    not judged, and said on stderr: the report's "N of M boxes" counts only those judged. A
    box named on the command line that it does not hold is not observed (exit 1)."""
    if not getattr(args, "from_snapshot", None):
        return []
    from pathlib import Path

    from reconciler.observe.observe import snapshot_index

    try:
        saved = set(snapshot_index(Path(args.from_snapshot))["boxes"])
    except (OSError, ValueError):
        return []  # the run itself reports what is wrong with the snapshot
    judged = [b for b in known if b in saved]
    lacking = [b for b in known if b not in saved]
    if judged and lacking:
        print(
            f"note: the snapshot holds {len(judged)} of the inventory's {len(known)} boxes; "
            f"not in it, not judged: {named(lacking)} (name a box to have it reported "
            "not observed)",
            file=sys.stderr,
        )
    return judged


class _Parser(argparse.ArgumentParser):
    """argparse's parser, with a usage error exiting 1 (bad input) where argparse exits 2:
    this tool's 2 says drift (or a finding), and a script reading `$?` must not take a typo
    for drift. Each command's parser is of this class too (add_subparsers makes them so)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line; with `command`, only that command's part of it (`main`: argparse
    builds a parser per command, ~10 ms of every run's CPU for the thirteen it does not use)."""
    parser = _Parser(
        prog="reconcile",
        description=(
            "Desired state, drift and audits for a lobes mesh. The desired state is "
            "inventory/<name>.yaml + group_vars/*.yaml; nothing changes unless a command says so."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "-i",
        "--inventory",
        metavar="NAME|PATH",
        type=not_empty,  # `-i "$INV"` with INV unset must not mean hosts, the real mesh
        help="inventory to use: hosts (default), lab, or a path; env FLEET_INVENTORY",
    )
    parser.add_argument(
        "--root",
        metavar="DIR",
        type=directory,  # `--root ""` must not mean "found from cwd"
        help="fleet repository root (default: found from cwd; env FLEET_ROOT)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for names, register in _COMMANDS:
        if command is None or command in names:
            register(sub)
    return parser


def _adder(sub: Any) -> Callable[[str, Handler, str, str], argparse.ArgumentParser]:
    def add(
        name: str, handler: Handler, help_text: str, description: str
    ) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=description)
        p.set_defaults(handler=handler)
        return p

    return add


def _register_validate(sub: Any) -> None:
    _adder(sub)(
        "validate",
        _cmd_validate,
        "check inventory and group_vars; exit 0 valid, 1 invalid",
        "Load and validate the whole desired state. Every problem is printed as "
        "FILE:LINE:COL: KEY.PATH: MESSAGE on stderr; exit 0 if valid, 1 otherwise.",
    )


def _register_show(sub: Any) -> None:
    show_p = _adder(sub)(
        "show",
        _cmd_show,
        "print a box's merged desired state and its managed .env",
        "Print the merged desired state of BOX (or every box), each value annotated with the "
        "group_vars file and line that set it, then the .env keys a converge would write. "
        "Secrets are always ***, also one a value carries inline (under the built-in names "
        "and every box's secret_patterns, as drift judges them).",
    )
    show_p.add_argument("box", nargs="?", metavar="BOX", help="thor, spark, orin (default: all)")
    show_p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="output format; json: BOX's document, or without BOX one document "
        '{"boxes": {BOX: its document, ...}} in inventory order',
    )


def _register_schema(sub: Any) -> None:
    schema_p = _adder(sub)(
        "schema",
        _cmd_schema,
        "print the JSON Schema of a group_vars file",
        "Print the JSON Schema that every group_vars/*.yaml layer follows (all keys optional, "
        "since layers are partial), for editor completion. schema/desired-state.schema.json is "
        "this output, committed.",
    )
    schema_p.add_argument(
        "-o", "--output", metavar="FILE", type=file_path, help="write to FILE instead of stdout"
    )
    schema_p.add_argument(
        "--report",
        action="store_true",
        help="the JSON Schema of `reconcile drift --format json` instead "
        "(schema/drift-report.schema.json)",
    )


def _register_drift(sub: Any) -> None:
    from reconciler.history import hooks
    from reconciler.observe import fanout_cli

    drift_p = _adder(sub)(
        "drift",
        _cmd_drift,
        "observe the boxes and report drift from the desired state (changes nothing)",
        "Observe each box once over SSH (docker inspect, .env, compose renders scrubbed and under "
        "the deploy user's login shell, gateway probes) and report every difference from the "
        "desired state, with what apply would do. Secrets are hashed on the box and shown as "
        "***. Exit 0 no drift, 2 drift, 1 invalid desired state or a box not observed.",
    )
    drift_p.add_argument("boxes", nargs="*", metavar="BOX", help="boxes to check (default: all)")
    drift_p.add_argument(
        "--format",
        choices=("text", "json", "markdown", "html"),
        default="text",
        help="report format (html: one self-contained page, docs/html-report.md)",
    )
    drift_p.add_argument(
        "-o", "--output", metavar="FILE", type=file_path, help="write the report to FILE"
    )
    drift_p.add_argument(
        "--save-snapshot",
        type=directory,
        metavar="DIR",
        help="also write the observations (secrets hashed)",
    )
    drift_p.add_argument(
        "--from-snapshot",
        type=directory,
        metavar="DIR",
        help="compare saved observations instead of connecting (offline)",
    )
    fanout_cli.add_arguments(drift_p)  # --max-parallel, --timeout
    hooks.add_arguments(drift_p)  # --metrics, --history


def _register_audit(sub: Any) -> None:
    from reconciler.audit import cli as audit_cli

    audit_cli.register(sub)


def _register_history(sub: Any) -> None:
    from reconciler.history import cli as history_cli

    history_cli.register(sub)  # history, diff


def _register_apply(sub: Any) -> None:
    from reconciler.apply import cli as apply_cli

    apply_cli.register(sub, _load)  # apply, rollback, snapshots


def _register_import(sub: Any) -> None:
    import_p = _adder(sub)(
        "import",
        _cmd_import,
        "adopt running boxes into a new fleet repository that drifts zero",
        "Observe the boxes (or read --from-snapshot DIR) and write a fleet repository at "
        "--output: the inventory copied, group_vars/ generated (shared values in all.yaml, then "
        "groups, then boxes), each value commented with where it was found; secrets become "
        "references. Exit 0 written, 2 written with findings, 1 refused or invalid (also when "
        "--partial wrote the valid boxes and left out one that failed).",
    )
    import_p.add_argument("boxes", nargs="*", metavar="BOX", help="boxes to adopt (default: all)")
    import_p.add_argument(
        "--from-snapshot", type=directory, metavar="DIR", help="adopt saved observations"
    )
    import_p.add_argument(
        "--output", required=True, metavar="NEWROOT", type=file_path, help="new repository"
    )
    import_p.add_argument("--force", action="store_true", help="replace an existing NEWROOT")
    import_p.add_argument(
        "--partial",
        action="store_true",
        help="write the valid boxes and leave out each that fails (nothing written for it; "
        "the files say so); exit 1",
    )


def _register_lab(sub: Any) -> None:
    lab_p = _adder(sub)(
        "lab",
        _cmd_lab,
        "the local three-box lab: up, down, status, ssh BOX",
        "Manage the local lab mesh (network namespaces with their own sshd and dockerd, a "
        "registry, real lobes deployments). Same as `python -m lab ...`.",
    )
    lab_p.add_argument(
        "lab_args", nargs=argparse.REMAINDER, metavar="ARGS", help="up | down | status | ssh BOX"
    )


# Every command, in the order `reconcile --help` lists them, with the function that adds it
# (some add more than one).
_COMMANDS: tuple[tuple[tuple[str, ...], Callable[[Any], None]], ...] = (
    (("validate",), _register_validate),
    (("show",), _register_show),
    (("schema",), _register_schema),
    (("drift",), _register_drift),
    (("audit",), _register_audit),
    (("history", "diff"), _register_history),
    (("apply", "rollback", "snapshots"), _register_apply),
    (("import",), _register_import),
    (("lab",), _register_lab),
)
# The top-level options that take a value, as argparse reads them (a long one also by any
# unambiguous prefix: `--inv lab`).
_VALUED_OPTIONS = ("-i", "--inventory", "--root")


def command_named(argv: Sequence[str]) -> str | None:
    """The command `argv` runs, read the way argparse reads it (the first positional word
    after the top-level options and their values); None when that is not plainly one command
    (help, --version, a typo, an option this does not know): then the whole parser is built,
    and argparse says what it says about it."""
    names = {name for group, _ in _COMMANDS for name in group}
    words = iter(argv)
    for word in words:
        if not word.startswith("-") or word == "-":
            return word if word in names else None
        option, attached, _ = word.partition("=")
        long_valued = option.startswith("--") and any(
            o.startswith(option) for o in _VALUED_OPTIONS if o.startswith("--")
        )
        if (long_valued and attached) or (word.startswith("-i") and word != "-i"):
            continue  # the value is in the same word: `--root=DIR`, `-ilab`, `-i=lab`
        if (long_valued and len(option) > 2) or word == "-i":
            next(words, None)  # the option's value, whatever it looks like
            continue
        return None  # help, --version, or an option argparse will explain
    return None


def main(argv: Sequence[str] | None = None) -> int:
    # A live drift lasts about a second and makes next to no cyclic garbage, but the cyclic
    # collector's ~50 passes over what the imports and the boxes' answers allocate cost ~10 ms
    # of its ~200 ms of CPU. So the collector is off until the command is known, and stays off
    # for a drift, live or replayed; loading the desired state turns it on again meanwhile
    # (_load). A replay's boxes are acyclic too (reconciler/gc_pause.py): with the collector
    # back on after them, its first pass walked every box's result, ~0.07 s at 1,000 boxes.
    collecting = gc.isenabled()
    gc.disable()
    try:
        parser = build_parser(command_named(sys.argv[1:] if argv is None else argv))
        args = parser.parse_args(argv)
        if getattr(args, "boxes", None):  # drift, audit, apply, import: BOX... taken once
            args.boxes = once(args.boxes)  # here, before any early start reads them
        if collecting and args.handler is not _cmd_drift:
            gc.enable()  # every other command
        # Ctrl-C recorded as well as raised: one that lands where Python ignores exceptions
        # (a weakref callback inside a lazy import) still ends the run's waits (interrupts.py).
        with interrupts.handled():
            code = _run(args)
        if argv is None and args.handler is _cmd_drift:
            _end_now(code)
        return code
    finally:
        _stores_done()
        if collecting:
            gc.enable()
        if argv is None:
            # Run as the program, which ends now: the objects left are the OS's to take back
            # whole, not the exit-time collection's to walk one by one (~9 ms of a drift run).
            # Every file this program writes is closed by then (`with`, write_text).
            gc.freeze()


def _end_now(code: int) -> NoReturn:
    """End the program here, as `drift` is done: its report is printed, its files are written
    and closed (`with`, write_text, the metrics' and history's own), its ssh clients waited
    for, and it registers no exit hook. What the interpreter would still do is take every
    module apart one by one (~13 ms of a repeated run's CPU), so the OS takes the process back
    whole instead, once what is buffered for stdout and stderr is out."""
    _stores_done()
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except OSError as exc:  # _run flushed already; should any be left and fail, it is said
        code = _output_failed(exc)
    except ValueError:  # a closed stream: nothing left to write to
        pass
    with contextlib.suppress(OSError, ValueError, AttributeError):  # stderr: nowhere to say it
        sys.stderr.flush()
    os._exit(code)


def _stores_done() -> None:
    """Wait for the caches a forked child is still writing (desired/fingerprint.py)."""
    fingerprint = sys.modules.get("reconciler.desired.fingerprint")
    if fingerprint is not None:
        fingerprint.stored()


def _run(args: argparse.Namespace) -> int:
    if sys.stdout is None:  # `reconcile show >&-`
        # Refused before anything runs: a file this run opened would take descriptor 1, and
        # a child (ssh, docker) that inherits its stdout would write into that file.
        _say("error: writing the output: standard output is closed")
        return EXIT_ERROR
    out = _Output(sys.stdout)
    sys.stdout = out  # the same stream; its errors remembered
    try:
        code = int(args.handler(args))
        out.flush()  # what is buffered is written now, while a failure can still be said
        return code
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        # A BrokenPipeError is taken for stdout's wherever it was raised, as it always was
        # (`reconcile show | head`: the reader left); any other only if writing stdout raised it.
        if isinstance(exc, BrokenPipeError) or out.raised(exc):
            return _output_failed(exc)
        return _reported(exc)
    except Exception as exc:
        return _reported(exc)
    finally:
        sys.stdout = out.stream


class _Output:
    """sys.stdout while a command runs: the stream itself, with an OSError raised writing it
    remembered, so that a failed output (`>/dev/full`, a reader gone, a descriptor open for
    reading only) is told from any other OSError (a file, a socket), which is raised on."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.errors: list[OSError] = []

    def write(self, text: str) -> Any:  # the stream's answer, whatever it is (a count)
        return self._through(self.stream.write, text)

    def writelines(self, lines: Any) -> None:
        self._through(self.stream.writelines, lines)

    def flush(self) -> None:
        self._through(self.stream.flush)

    def _through(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except OSError as exc:
            self.errors.append(exc)
            raise

    def raised(self, exc: BaseException) -> bool:
        """Whether `exc`, or one it was raised from or during, is an error of this stream."""
        seen: BaseException | None = exc
        while seen is not None:
            if any(seen is e for e in self.errors):
                return True
            seen = seen.__cause__ or seen.__context__
        return False

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ...: the stream's
        return getattr(self.stream, name)


def _output_failed(exc: OSError) -> int:
    """EXIT_ERROR for an error writing stdout, said on stderr (not for a reader that left:
    `reconcile show | head`). What is still buffered goes to /dev/null: flushed at exit, it
    failed again, with a traceback and exit code 120."""
    if not isinstance(exc, BrokenPipeError):
        _say(f"error: writing the output: {exc.strerror or exc}")
    stream = sys.stdout.stream if isinstance(sys.stdout, _Output) else sys.stdout
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no descriptor (a test's)
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)
    return EXIT_ERROR


def _say(line: str) -> None:
    """`line` on stderr, if there is one to say it on (`print(file=None)` means stdout)."""
    if sys.stderr is not None:
        with contextlib.suppress(OSError, ValueError):
            print(line, file=sys.stderr)


def _reported(exc: Exception) -> int:
    """EXIT_ERROR, said on stderr, for the errors a command reports as such; anything else is
    raised on. Their classes are imported here, when one happened: a run that ends well
    never imports the desired state's problem types."""
    from reconciler.desired.problems import DesiredStateError
    from reconciler.observe.controller_secrets import MissingControllerSecret

    if isinstance(exc, MissingControllerSecret):  # raised before any box is contacted
        for line in str(exc).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return EXIT_ERROR
    if isinstance(exc, DesiredStateError):
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        count = len(exc.problems)
        print(f"invalid desired state: {count} problem{'s' if count != 1 else ''}", file=sys.stderr)
        return EXIT_ERROR
    raise exc


if __name__ == "__main__":
    sys.exit(main())
