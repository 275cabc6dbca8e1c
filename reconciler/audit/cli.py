"""`reconcile audit`: registered by reconciler/cli.py; everything heavy is imported when the
command runs, never when the parser is built (the CLI's import time is part of every run)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from reconciler.arg_types import directory, file_path

FORMATS = ("text", "json", "markdown", "html")
EXIT_ERROR = 1


def register(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "audit",
        help="who can call what on the mesh, and why (changes nothing)",
        description=(
            "Audit each box's inbound auth and the mesh: the desired posture, what .env "
            "declares, what the running gateway carries and where it came from (.env or the "
            "deploy user's login shell, file:line), the login shell's secret exports, probes "
            "without credentials from the box and from the controller, keyed access with the "
            "right key (sent on the box), what is published on the host, and key reuse; then "
            "the mesh: members, mixed postures proven live through an open member (weakest "
            "link), differing mesh keys. No key value is ever printed. Exit 0 every verdict "
            "ok, 2 any finding, 1 a box that could not be audited (or invalid desired state)."
        ),
    )
    p.set_defaults(handler=_cmd_audit)
    p.add_argument("boxes", nargs="*", metavar="BOX", help="boxes to audit (default: all)")
    p.add_argument("--format", choices=FORMATS, default="text", help="report format")
    p.add_argument(
        "-o", "--output", metavar="FILE", type=file_path, help="write the report to FILE"
    )
    p.add_argument(
        "--save-snapshot",
        type=directory,
        metavar="DIR",
        help="also write the observations (secrets hashed)",
    )
    p.add_argument(
        "--from-snapshot",
        type=directory,
        metavar="DIR",
        help="judge saved observations (offline, no probes)",
    )
    __import__("reconciler.history.hooks", fromlist=["x"]).add_arguments(p)  # --metrics, ...
    __import__("reconciler.observe.fanout_cli", fromlist=["x"]).add_arguments(p)
    return p


def _cmd_audit(args: argparse.Namespace) -> int:
    import shutil

    from reconciler.audit.run import run_audit
    from reconciler.cli import _boxes, _load, _snapshot_boxes, snapshot_dirs
    from reconciler.history.hooks import finish_audit, prepare
    from reconciler.observe.fanout import configure

    configure(args.max_parallel, args.timeout)  # as drift: boxes at once, one box's time
    outs = prepare(args)  # --metrics / the history store: checked before any box is contacted
    if outs is None:
        return EXIT_ERROR
    observed: dict[str, Any] = {}  # the run's observations, for the history
    fleet = _load(args, cached=True)
    boxes = _boxes(list(fleet.boxes), args.boxes or _snapshot_boxes(args, list(fleet.boxes)))
    if boxes is None:
        return EXIT_ERROR
    try:
        report = run_audit(
            fleet,
            boxes,
            **snapshot_dirs(args),
            keep=observed,
        )
    except (OSError, ValueError) as exc:  # an unreadable snapshot, an unwritable directory,
        for line in str(exc).splitlines():  # a controller variable not set (one per line)
            print(f"error: {line}", file=sys.stderr)
        return EXIT_ERROR
    on_terminal = args.output is None and sys.stdout.isatty()
    width = shutil.get_terminal_size().columns if on_terminal else 100
    if args.format == "html":  # its own module: jinja2 is imported for this format only
        from reconciler.audit.report_html import audit_page

        text = audit_page(report, fleet, outs.history, outs.root)
    else:
        text = render(report, args.format, color=on_terminal, width=max(80, width))
    if args.output:
        from reconciler.output_file import written

        if not written("-o", args.output, [text]):
            return EXIT_ERROR
    else:
        sys.stdout.write(text)
    return finish_audit(outs, args, report, observed, report.exit_code)  # after the report


def render(report: Any, fmt: str, color: bool = False, width: int = 100) -> str:
    if fmt == "json":
        from reconciler.audit.report_json import render_json

        return render_json(report)
    if fmt == "markdown":
        from reconciler.audit.report_md import render_markdown

        return render_markdown(report)
    from reconciler.audit.report_text import render_text

    return render_text(report, color=color, width=width)
