"""`reconcile history` and `reconcile diff`: registered by reconciler/cli.py; everything is
imported when the command runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.arg_types import directory, file_path, not_empty

if TYPE_CHECKING:
    import sqlite3

    from reconciler.history.diff import Side
    from reconciler.history.store import RunInfo

EXIT_OK, EXIT_ERROR, EXIT_CHANGED = 0, 1, 2


def register(subparsers: Any) -> None:
    h = subparsers.add_parser(
        "history",
        help="the recorded drift and audit runs",
        description=(
            "List the recorded runs (oldest first) with how many boxes were reached and how "
            "many causes and entries (drift) or findings (audit) each had; with BOX, that "
            "box's line of each run. --keep/--days/--max-mb change the store's retention (kept "
            "in the store) and apply it now. Exit 0, or 1 for a store that cannot be read."
        ),
    )
    h.set_defaults(handler=_cmd_history)
    h.add_argument("box", nargs="?", metavar="BOX", help="only runs that covered BOX")
    h.add_argument(
        "--since",
        metavar="WHEN",
        type=not_empty,  # `--since ""` (an unset variable) is not "every run"
        help="runs started since: 2026-11-30, 2026-11-30T18:00 (UTC), or an age: 90m, 6h, 7d",
    )
    h.add_argument(
        "--history",
        metavar="PATH",
        type=file_path,
        help="the store (default: the user's state dir)",
    )
    h.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    h.add_argument("--keep", type=_count, metavar="N", help="keep at most N runs (0: any number)")
    h.add_argument("--days", type=_count, metavar="D", help="keep D days of runs (0: any age)")
    h.add_argument(
        "--max-mb",
        type=_count,
        metavar="M",
        help="keep the newest runs that together hold at most M MB (default 2048; 0: any size)",
    )

    d = subparsers.add_parser(
        "diff",
        help="what changed between two recorded runs, or two saved snapshots",
        description=(
            "Which drift entries appeared, cleared or read otherwise between RUN_A and RUN_B "
            "(default: the last two runs of the latest run's command; a run is its number in "
            "`reconcile history` or its run id), which audit findings appeared or cleared, and "
            "every observed value that changed, drift or not (a container recreated, another "
            "image, a gateway restarted, a new login-shell export). Secrets are never printed: "
            "digests are masked before comparing. --from-snapshot DIR_A DIR_B compares two "
            "saved snapshots (their drift against the desired state when it can be loaded). "
            "Exit 0 nothing changed, 2 something did, 1 bad input."
        ),
    )
    d.set_defaults(handler=_cmd_diff)
    d.add_argument("runs", nargs="*", metavar="RUN", help="RUN_A RUN_B (default: the last two)")
    d.add_argument(
        "--from-snapshot",
        nargs=2,
        type=directory,
        metavar=("DIR_A", "DIR_B"),
        help="compare two saved snapshots (--save-snapshot) instead of recorded runs",
    )
    d.add_argument(
        "--history",
        metavar="PATH",
        type=file_path,
        help="the store (default: the user's state dir)",
    )
    d.add_argument("--format", choices=("text", "json"), default="text", help="output format")


def _count(text: str) -> int:
    # Kept in the store: SQLite holds no integer past 2**63-1 (binding one is an OverflowError).
    from reconciler.history.store import MAX_INTEGER

    if not (text.isascii() and text.isdigit()) or int(text) > MAX_INTEGER:
        raise argparse.ArgumentTypeError(
            f"expected a whole number from 0 to {MAX_INTEGER}, got {text!r}"
        )
    return int(text)


def _store(args: argparse.Namespace) -> Path | None:
    from reconciler.history.hooks import _repo_root
    from reconciler.history.location import HistoryLocationError, default_path, history_path

    try:
        return history_path(args.history, _repo_root(args))
    except HistoryLocationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    except OSError as exc:  # a directory on the way this user cannot search
        print(f"error: {_unusable(Path(args.history or default_path()), exc)}", file=sys.stderr)
        return None


def _unusable(path: Path, exc: OSError) -> str:
    """A store path the file system refuses, said as store.opened says it (the reason
    scrubbed as every exception text the reconciler prints)."""
    from reconciler.history.store import _not_usable

    return str(_not_usable(exc, path))


def _cmd_history(args: argparse.Namespace) -> int:
    import sqlite3

    from reconciler.history.since import parse_since
    from reconciler.history.store import (
        HistoryError,
        boxes_of,
        opened,
        reading,
        runs,
        set_retention,
    )

    try:
        since = parse_since(args.since) if args.since is not None else None
    except ValueError as exc:
        print(f"error: --since {args.since!r}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    path = _store(args)
    if path is None:
        return EXIT_ERROR
    pruning = args.keep is not None or args.days is not None or args.max_mb is not None
    try:
        missing = not pruning and not path.is_file()
    except OSError as exc:  # not permitted to look
        print(f"error: {_unusable(path, exc)}", file=sys.stderr)
        return EXIT_ERROR
    if missing:  # nothing recorded yet: an empty history
        if args.format == "json":  # what a script reads on a fresh machine: still JSON
            from reconciler.history.listing import render_json

            sys.stdout.write(render_json([], args.box, path))
            print(f"no runs recorded in {path} (no store there yet)", file=sys.stderr)
        else:
            print(f"no runs recorded in {path} (no store there yet)")
        return EXIT_OK
    try:
        # OSError: store.opened says the file system's refusals (its directory cannot be
        # created) as HistoryError; the store's own refusals are sqlite3's.
        with opened(path, create=True) if pruning else reading(path) as conn:
            if pruning:
                removed = set_retention(conn, args.keep, args.days, args.max_mb)
                print(f"retention set; {removed} runs removed", file=sys.stderr)
                # The listing reads one snapshot, as reading() does: another run's retention
                # may delete a run between the runs and their boxes.
                conn.execute("BEGIN")
            found = runs(conn, args.box, since)
            rows = [(r, boxes_of(conn, r.id)) for r in found]
            # None since WHEN from a store of runs: said as such, not as an empty store.
            recorded = len(runs(conn)) if not rows and since is not None else None
    except (HistoryError, sqlite3.Error) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    from reconciler.history.listing import render_json, render_text

    if args.format == "json":
        sys.stdout.write(render_json(rows, args.box, path))
    else:
        sys.stdout.write(render_text(rows, args.box, path, args.since, recorded))
    return EXIT_OK


def _cmd_diff(args: argparse.Namespace) -> int:
    from reconciler.history.diff import render_text, to_json

    if args.from_snapshot:
        if args.runs:
            print("error: give runs or --from-snapshot DIR_A DIR_B, not both", file=sys.stderr)
            return EXIT_ERROR
        from reconciler.history.snapshots import snapshot_sides

        sides = snapshot_sides(args, *args.from_snapshot)
    else:
        _adopt_fleet_patterns(args)
        sides = _run_sides(args)
    if sides is None:
        return EXIT_ERROR
    from reconciler.history.diff import diff_sides

    try:
        result = diff_sides(*sides)
    except RecursionError:  # what observed.py's depth bound leaves: deepdiff's own frames
        print(
            "error: diff: an observation is nested too deeply to compare (a damaged or "
            "crafted store or snapshot)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    if args.format == "json":
        import json

        sys.stdout.write(json.dumps(to_json(result), indent=2, ensure_ascii=False, default=str))
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(result))
    return EXIT_CHANGED if result.changed else EXIT_OK


def _adopt_fleet_patterns(args: argparse.Namespace) -> None:
    """Judge secret names under the fleet's own `secret_patterns`, as its drift runs did (a
    diff of snapshots does it by replaying them): a value a run recorded before its pattern
    was added (`*_PW`), or that an older reconciler stored, was printed in clear. Outside a
    fleet repository, or with a desired state that does not load, the built-in names only,
    said on stderr."""
    from reconciler import cli
    from reconciler.desired.problems import DesiredStateError
    from reconciler.desired.secret_names import adopt_fleet_patterns

    here = argparse.Namespace(**{**vars(args), "from_snapshot": None, "boxes": []})
    try:
        adopt_fleet_patterns(cli._drift_inputs(here).secret_patterns)
    except (DesiredStateError, OSError, ValueError) as exc:
        count = len(exc.problems) if isinstance(exc, DesiredStateError) else 0
        what = f"{count} problem{'s' if count != 1 else ''}" if count else exc
        print(
            f"note: the fleet's secret_patterns are not known (the desired state did not load: "
            f"{what}): values are masked under the built-in secret names only",
            file=sys.stderr,
        )


def _run_sides(args: argparse.Namespace) -> tuple[Side, Side] | None:
    import sqlite3

    from reconciler.history.store import HistoryError, reading

    if len(args.runs) not in (0, 2):
        print("error: give two runs (RUN_A RUN_B), or none for the last two", file=sys.stderr)
        return None
    path = _store(args)
    if path is None:
        return None
    try:
        with reading(path) as conn:
            chosen = _chosen(conn, args.runs, path)
            if chosen is None:
                return None
            a, b = chosen
            problem = _unlike(a, b)
            if problem:
                print(f"error: {problem}", file=sys.stderr)
                return None
            return _side(conn, a), _side(conn, b)
    except (HistoryError, sqlite3.Error) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _chosen(
    conn: sqlite3.Connection, refs: list[str], path: Path
) -> tuple[RunInfo, RunInfo] | None:
    """The two runs named, or the last two of one command and fleet; None (said) if none."""
    from reconciler.history.store import find_runs, last_two, runs

    if not refs:
        pair = last_two(conn)
        if len(pair) < 2:
            print(_no_pair(path, pair, len(runs(conn))), file=sys.stderr)
            return None
        return pair[0], pair[1]
    found = []
    for ref in refs:
        named = find_runs(conn, ref)
        if len(named) != 1:
            print(_not_one(ref, named, path), file=sys.stderr)
            return None
        found.append(named[0])
    return found[0], found[1]


def _not_one(ref: str, named: list[RunInfo], path: Path) -> str:
    """Why `ref` names no single run: none, or several (replays of one snapshot share its
    run id: which one is meant is for the person to say, by its number)."""
    if not named:
        return f"error: no single run {ref!r} in {path} (a number or a run id)"
    numbers = ", ".join(str(r.id) for r in named)
    why = (
        "replays of one snapshot share its run id"
        if len({r.run_id for r in named}) == 1
        else "it begins each one's run id"
    )
    return (
        f"error: {ref!r} names {len(named)} runs in {path} (runs {numbers}; {why}): "
        "name each run by its number"
    )


def _no_pair(path: Path, chosen: list[RunInfo], recorded: int) -> str:
    if recorded < 2:
        return f"error: {path} holds fewer than two runs to compare"
    latest = chosen[0]
    return (
        f"error: {path} holds no {latest.command} run of {latest.fleet} before run "
        f"{latest.id} to compare it with; name two runs (reconcile history lists them)"
    )


def _unlike(a: RunInfo, b: RunInfo) -> str | None:
    """Why two runs cannot be compared: one run named twice (by its number and its run id, or
    a typo: "nothing changed" would read as a verdict on two runs), another command, or
    another fleet (two repositories' inventory/lab.yaml would diff into every entry
    appearing)."""
    if a.id == b.id:
        return f"both references name run {a.id}: name two runs (reconcile history lists them)"
    if a.command != b.command:
        return (
            f"run {a.id} is a {a.command} run and run {b.id} a {b.command} run: "
            "compare runs of one command"
        )
    if not a.same_fleet(b):
        return f"run {a.id} judged {a.fleet} and run {b.id} {b.fleet}: compare runs of one fleet"
    return None


def _side(conn: sqlite3.Connection, run: RunInfo) -> Side:
    """A stored run as the diff reads it, with how each of its boxes was observed."""
    from reconciler.history.diff import Side
    from reconciler.history.parts import GATEWAY_PROBE, known, probes_of
    from reconciler.history.store import (
        boxes_of,
        entries_of,
        errors_of,
        findings_of,
        observations_of,
    )

    boxes = boxes_of(conn, run.id)
    faults: dict[str, tuple[str, ...] | None] = {}
    probes: dict[str, frozenset[str] | None] = {}
    if run.command == "drift":  # an audit's faults hide no finding (it has no entries)
        # A run recorded before the parts were kept: read from its report's error texts; so
        # are whose gateway probes faulted (the box's or the controller's).
        old = any(b.faults is None and b.errors for b in boxes)
        probed = any(GATEWAY_PROBE in (b.faults or ()) for b in boxes)
        texts = errors_of(conn, run.id) if old or probed else {}
        faults = {b.box: known(b.errors, b.faults, texts.get(b.box)) for b in boxes}
        probes = probes_of(faults, texts)
    return Side(
        f"run {run.id} ({run.command} {run.started_at}, {run.run_id})",
        entries_of(conn, run.id),
        findings_of(conn, run.id),
        observations_of(conn, run.id),
        boxes={b.box: b.observation for b in boxes},
        name=f"run {run.id}",
        faults=faults,
        probes=probes,
    )
