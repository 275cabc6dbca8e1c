"""Each box's drift entry counts over its recorded drift runs, for the HTML page's sparklines.

Read-only and forgiving: no store, or one that cannot be read, is no series (the page then has
no sparkline), never an error: the page is about this run, the history only adds to it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reconciler.history.store import HistoryError, reading

LAST_RUNS = 48  # half a day of a 15-minute timer: enough to see a trend, small on a phone


def drift_counts(
    path: Path | None,
    boxes: Sequence[str],
    last: int = LAST_RUNS,
    *,
    inventory: str | None = None,
    root: str | None = None,
) -> dict[str, list[int]]:
    """Per box, its entry counts in the last `last` drift runs that observed it in full,
    oldest first. A run where the box was not observed, or only in part (dockerd down, a
    gateway probe unanswered: parts.complete), has no count: a gap is not zero drift. A run
    recorded before the fault parts were kept is read by its report's error texts, as
    `reconcile diff` reads it (it was a gap for any error): as a run recorded now, and a
    fault whose text names no part leaves the count as recorded.

    `inventory` and `root`: only the runs of that fleet (as store.last_two pairs runs: that
    inventory, in that repository, or recorded before the repository was kept): another
    fleet's box of the same name is another box. None: every run (a caller that does not
    know its fleet)."""
    if path is None or not path.is_file():
        return {}
    from reconciler.history.parts import complete
    from reconciler.history.store import _has_column, _opt_parts, errors_of

    out: dict[str, list[int]] = {}
    try:
        with reading(path) as conn:
            # A store older than a column (read as it is, never migrated) has it as NULL.
            root_col = "r.root" if _has_column(conn, "runs", "root") else "NULL"
            faults_col = "b.faults" if _has_column(conn, "boxes", "faults") else "NULL"
            where, params = ["b.box = ?", "r.command = 'drift'", "b.observation = 'full'"], []
            if inventory is not None:
                where.append("r.inventory = ?")
                params.append(inventory)
            if root is not None:
                where.append(f"({root_col} = ? OR {root_col} IS NULL)")
                params.append(root)
            query = (
                f"SELECT r.id, b.entries, b.errors, {faults_col} FROM boxes b JOIN runs r"
                f" ON r.id = b.run WHERE {' AND '.join(where)} ORDER BY r.id DESC"
            )
            texts: dict[int, dict[str, list[Any]]] = {}  # per older run: read once
            for box in boxes:
                counts: list[int] = []
                # Stepped lazily: stops at the `last` counts, however many runs are older.
                for run, entries, errors, faults in conn.execute(query, [box, *params]):
                    parts = _opt_parts(faults, "fault parts")
                    said = None
                    if parts is None and errors:  # recorded before the parts were kept
                        if run not in texts:
                            texts[run] = errors_of(conn, run)
                        said = texts[run].get(box)
                    if complete("full", int(errors), parts, said):
                        counts.append(int(entries))
                        if len(counts) >= last:
                            break
                if counts:
                    out[box] = counts[::-1]
    except (HistoryError, sqlite3.Error, OSError, ValueError, TypeError):  # damaged: no series
        return {}
    return out
