"""Each box's drift entry counts over its recorded drift runs, for the HTML page's sparklines.

Read-only and forgiving: no store, or one that cannot be read, is no series (the page then has
no sparkline), never an error: the page is about this run, the history only adds to it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from reconciler.history.store import HistoryError, reading

LAST_RUNS = 48  # half a day of a 15-minute timer: enough to see a trend, small on a phone


def drift_counts(
    path: Path | None, boxes: Sequence[str], last: int = LAST_RUNS
) -> dict[str, list[int]]:
    """Per box, its entry counts in the last `last` drift runs that observed it, oldest first
    (a run where the box was not observed has no count: a gap is not zero drift)."""
    if path is None or not path.is_file():
        return {}
    out: dict[str, list[int]] = {}
    try:
        with reading(path) as conn:
            for box in boxes:
                rows = conn.execute(
                    "SELECT b.entries FROM boxes b JOIN runs r ON r.id = b.run"
                    " WHERE b.box = ? AND r.command = 'drift' AND b.observation != 'none'"
                    " ORDER BY r.id DESC LIMIT ?",
                    (box, last),
                ).fetchall()
                if rows:
                    out[box] = [int(r[0]) for r in reversed(rows)]
    except (HistoryError, sqlite3.Error, OSError, ValueError, TypeError):  # damaged: no series
        return {}
    return out
