"""`reconcile history` output: one line per run (or per run of one box). Pure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reconciler.history.store import BoxInfo, RunInfo

Row = tuple[RunInfo, list[BoxInfo]]


def render_text(
    rows: list[Row],
    box: str | None,
    path: Path,
    since: str | None = None,
    recorded: int | None = None,
) -> str:
    """`since`: the `--since` given (as given), `recorded`: how many runs the store holds,
    whatever the filters: none listed from a store of runs says the filter left them out."""
    # Cells a store holds as a box or a snapshot gave them (a run id read from a snapshot's
    # index, a box name): escaped as reports print box text, so none repaints the terminal.
    from reconciler.report.values import clean

    if not rows:
        of = f" for {box}" if box else ""
        if since is not None and recorded:
            return clean(f"no runs{of} since {since} ({recorded} recorded in {path})") + "\n"
        return clean(f"no runs recorded in {path}{of}") + "\n"
    head = [
        "#",
        "started (UTC)",
        "command",
        "fleet",
        "exit",
        "reached",
        "causes",
        "entries",
        "took",
        "run",
    ]
    table = [head]
    # One store may hold several fleets' runs (another inventory, another repository): each
    # line says whose. The repository only when the lines name more than one.
    roots = {run.root for run, _ in rows if run.root is not None}
    for run, boxes in rows:
        mine = [b for b in boxes if box is None or b.box == box]
        reached = f"{sum(1 for b in mine if b.reachable)}/{len(mine)}"
        if run.command == "audit":
            causes, entries = _audit_cells(run, mine, box)
        elif box is None:
            causes = str(run.summary.get("causes", sum(b.causes for b in mine)))
            entries = str(run.summary.get("drifts", sum(b.entries for b in mine)))
        else:
            causes, entries = str(sum(b.causes for b in mine)), str(sum(b.entries for b in mine))
        errors = sum(b.errors for b in mine)
        table.append(
            [
                clean(cell)
                for cell in (
                    str(run.id),
                    run.started_at.replace("T", " ").rstrip("Z"),
                    run.command + (" (replay)" if run.source == "snapshot" else ""),
                    run.fleet if len(roots) > 1 else run.inventory,
                    str(run.exit_code),
                    reached + (f" ({errors} errors)" if errors else ""),
                    causes,
                    entries,
                    f"{run.duration_s:.1f}s",
                    run.run_id,
                )
            ]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in table
    ]
    note = (
        "causes/entries: drift causes and entries; for audit: the mesh's and the boxes' "
        "verdicts and the findings (the mesh's included)"
    )
    return "\n".join([*lines, "", clean(f"{len(rows)} runs in {path}; {note}")]) + "\n"


def _audit_cells(run: RunInfo, boxes: list[BoxInfo], box: str | None) -> tuple[str, str]:
    """An audit's verdicts and findings: for the run, the mesh's verdict first (a mesh that
    fails with every box ok is a failing audit) and the summary's findings, which count the
    mesh's; for one box's line, that box's."""
    verdicts = ",".join(sorted({b.verdict or "-" for b in boxes}))
    found = sum(b.entries for b in boxes)
    if box is not None:
        return verdicts, str(found)
    mesh = run.summary.get("mesh")
    findings = run.summary.get("findings")
    head = f"mesh {mesh}; " if isinstance(mesh, str) else ""
    whole = findings if isinstance(findings, int) and not isinstance(findings, bool) else found
    return head + verdicts, str(whole)


def render_json(rows: list[Row], box: str | None, path: Path) -> str:
    out: list[dict[str, Any]] = []
    for run, boxes in rows:
        out.append(
            {
                "id": run.id,
                "run_id": run.run_id,
                "command": run.command,
                "source": run.source,
                "started_at": run.started_at,
                "duration_s": round(run.duration_s, 3),
                "inventory": run.inventory,
                "root": run.root,
                "exit_code": run.exit_code,
                "summary": run.summary,
                "boxes": [vars(b) for b in boxes if box is None or b.box == box],
            }
        )
    return json.dumps({"store": str(path), "runs": out}, indent=2) + "\n"
