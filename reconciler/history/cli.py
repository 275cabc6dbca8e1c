"""`reconcile history` and `reconcile diff`: registered by reconciler/cli.py; everything is
imported when the command runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from reconciler.arg_types import directory

EXIT_OK, EXIT_ERROR, EXIT_CHANGED = 0, 1, 2


def register(subparsers: Any) -> None:
    h = subparsers.add_parser(
        "history",
        help="the recorded drift and audit runs",
        description=(
            "List the recorded runs (oldest first) with how many boxes were reached and how "
            "many causes and entries (drift) or findings (audit) each had; with BOX, that "
            "box's line of each run. --keep/--days change the store's retention (kept in the "
            "store) and apply it now. Exit 0, or 1 for a store that cannot be read."
        ),
    )
    h.set_defaults(handler=_cmd_history)
    h.add_argument("box", nargs="?", metavar="BOX", help="only runs that covered BOX")
    h.add_argument(
        "--since",
        metavar="WHEN",
        help="runs started since: 2026-11-30, 2026-11-30T18:00 (UTC), or an age: 90m, 6h, 7d",
    )
    h.add_argument("--history", metavar="PATH", help="the store (default: the user's state dir)")
    h.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    h.add_argument("--keep", type=_count, metavar="N", help="keep at most N runs (0: any number)")
    h.add_argument("--days", type=_count, metavar="D", help="keep D days of runs (0: any age)")

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
    d.add_argument("--history", metavar="PATH", help="the store (default: the user's state dir)")
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
    from reconciler.history.location import HistoryLocationError, history_path

    try:
        return history_path(args.history, _repo_root(args))
    except HistoryLocationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _cmd_history(args: argparse.Namespace) -> int:
    import sqlite3

    from reconciler.history.since import parse_since
    from reconciler.history.store import HistoryError, boxes_of, opened, runs, set_retention

    try:
        since = parse_since(args.since) if args.since else None
    except ValueError as exc:
        print(f"error: --since {args.since!r}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    path = _store(args)
    if path is None:
        return EXIT_ERROR
    pruning = args.keep is not None or args.days is not None
    if not pruning and not path.is_file():  # nothing recorded yet: an empty history
        print(f"no runs recorded in {path} (no store there yet)")
        return EXIT_OK
    try:
        with opened(path, create=pruning) as conn:
            if pruning:
                removed = set_retention(conn, args.keep, args.days)
                print(f"retention set; {removed} runs removed", file=sys.stderr)
            found = runs(conn, args.box, since)
            rows = [(r, boxes_of(conn, r.id)) for r in found]
    except (HistoryError, sqlite3.Error) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    from reconciler.history.listing import render_json, render_text

    render = render_json if args.format == "json" else render_text
    sys.stdout.write(render(rows, args.box, path))
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
        sides = _run_sides(args)
    if sides is None:
        return EXIT_ERROR
    from reconciler.history.diff import diff_sides

    result = diff_sides(*sides)
    if args.format == "json":
        import json

        sys.stdout.write(json.dumps(to_json(result), indent=2, ensure_ascii=False, default=str))
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(result))
    return EXIT_CHANGED if result.changed else EXIT_OK


def _run_sides(args: argparse.Namespace) -> Any:
    import sqlite3

    from reconciler.history.diff import Side
    from reconciler.history.store import (
        HistoryError,
        entries_of,
        find_run,
        findings_of,
        last_two,
        observations_of,
        opened,
    )

    if len(args.runs) not in (0, 2):
        print("error: give two runs (RUN_A RUN_B), or none for the last two", file=sys.stderr)
        return None
    path = _store(args)
    if path is None:
        return None
    try:
        with opened(path, create=False) as conn:
            if args.runs:
                chosen = [find_run(conn, ref) for ref in args.runs]
                for ref, run in zip(args.runs, chosen, strict=True):
                    if run is None:
                        print(
                            f"error: no single run {ref!r} in {path} (a number or a run id)",
                            file=sys.stderr,
                        )
                        return None
            else:
                chosen = list(last_two(conn))
                if len(chosen) < 2:
                    print(f"error: {path} holds fewer than two runs to compare", file=sys.stderr)
                    return None
            a, b = chosen
            assert a is not None and b is not None
            if a.command != b.command:
                print(
                    f"error: run {a.id} is a {a.command} run and run {b.id} a {b.command} run: "
                    "compare runs of one command",
                    file=sys.stderr,
                )
                return None
            return tuple(
                Side(
                    f"run {r.id} ({r.command} {r.started_at}, {r.run_id})",
                    entries_of(conn, r.id),
                    findings_of(conn, r.id),
                    observations_of(conn, r.id),
                )
                for r in (a, b)
            )
    except (HistoryError, sqlite3.Error) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
