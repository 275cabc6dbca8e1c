"""`reconcile history` output: one line per run (or per run of one box). Pure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reconciler.history.store import BoxInfo, RunInfo

Row = tuple[RunInfo, list[BoxInfo]]


def render_text(rows: list[Row], box: str | None, path: Path) -> str:
    # Cells a store holds as a box or a snapshot gave them (a run id read from a snapshot's
    # index, a box name): escaped as reports print box text, so none repaints the terminal.
    from reconciler.report.values import clean

    if not rows:
        return clean(f"no runs recorded in {path}{f' for {box}' if box else ''}") + "\n"
    head = ["#", "started (UTC)", "command", "exit", "reached", "causes", "entries", "took", "run"]
    table = [head]
    for run, boxes in rows:
        mine = [b for b in boxes if box is None or b.box == box]
        reached = f"{sum(1 for b in mine if b.reachable)}/{len(mine)}"
        if run.command == "audit":
            verdicts = ",".join(sorted({b.verdict or "-" for b in mine}))
            causes, entries = verdicts, str(sum(b.entries for b in mine))
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
    note = "causes/entries: drift causes and entries; for audit: the verdicts and findings"
    return "\n".join([*lines, "", clean(f"{len(rows)} runs in {path}; {note}")]) + "\n"


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
