"""The SQLite store: opened in WAL mode (a reader never blocks the run that writes), migrated
to the current schema version on open, one transaction per recorded run, retention applied in
the same transaction.

Retention keeps at most `keep_runs` runs (default 1000: ten days of a 15-minute timer's drift
and audit) and none older than `keep_days` (default 30); `reconcile history --keep N --days D`
changes both for the store (kept in its settings table), 0 meaning no limit of that kind.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.history.location import prepare, restrict
from reconciler.history.migrations import MIGRATIONS, VERSION
from reconciler.history.record import EntryRow, FindingRow, RunRecord

DEFAULT_KEEP_RUNS = 1000
DEFAULT_KEEP_DAYS = 30
BUSY_TIMEOUT_S = 10.0  # another run writing at the same moment: wait for it, then write


class HistoryError(Exception):
    """The store cannot be used (damaged, newer than this code, not a database)."""


class _Damaged(ValueError):
    """A value this store wrote that no longer reads back as it was written (the file was
    damaged, or edited by hand): `opened` says so as the store's HistoryError, with its path."""


def _stored_json(text: str | bytes, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError, TypeError):
        raise _Damaged(what) from None


@dataclass(frozen=True)
class RunInfo:
    """One run, as `reconcile history` lists it."""

    id: int
    run_id: str
    command: str
    source: str
    started_at: str
    duration_s: float
    inventory: str
    exit_code: int
    summary: dict[str, Any]


@dataclass(frozen=True)
class BoxInfo:
    """One box of a stored run, as the history's readers get it."""

    box: str
    reachable: bool
    observation: str
    entries: int
    causes: int
    errors: int
    verdict: str | None


@contextmanager
def opened(path: Path, *, create: bool = True) -> Iterator[sqlite3.Connection]:
    """The store at `path`, migrated; `create=False` refuses a missing store (a reader)."""
    if not create and not path.is_file():
        raise HistoryError(f"history: no store at {path} (no run recorded there yet)")
    prepare(path)
    old = os.umask(0o077)  # the database and its -wal/-shm files: 0600 from the start
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    finally:
        os.umask(old)
    try:
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise HistoryError(f"history: {path} cannot use WAL mode ({mode})")
            conn.execute("PRAGMA synchronous = NORMAL")  # WAL: durable at checkpoints, fast
            _migrate(conn, path)
        except sqlite3.DatabaseError as exc:
            raise HistoryError(f"history: {path} is not a usable store ({exc})") from None
        restrict(path)
        try:
            yield conn
        except _Damaged as exc:
            raise HistoryError(
                f"history: {path} is damaged: {exc} is not the JSON it stored"
            ) from None
    finally:
        conn.close()


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    current = int(row[0] or 0)
    if current > VERSION:
        raise HistoryError(
            f"history: {path} is at schema version {current}, newer than this reconciler "
            f"knows ({VERSION}); upgrade, or choose another store with --history"
        )
    for number in range(current + 1, VERSION + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-read under the write lock: another process may have migrated meanwhile.
            done = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] or 0
            if done < number:
                for statement in _statements(MIGRATIONS[number - 1]):
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (number,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


def _statements(script: str) -> list[str]:
    # executescript() would COMMIT the migration's transaction first: run each statement.
    lines = [line.split("--", 1)[0] for line in script.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def record(conn: sqlite3.Connection, run: RunRecord) -> int:
    """One run, in one transaction, then retention; its row id."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        cur = conn.execute(
            "INSERT INTO runs (run_id, command, source, started_at, started, duration_s,"
            " inventory, exit_code, summary, report) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                run.run_id,
                run.command,
                run.source,
                run.started_at,
                run.started,
                run.duration_s,
                run.inventory,
                run.exit_code,
                json.dumps(run.summary, sort_keys=True),
                json.dumps(run.report, ensure_ascii=False),
            ),
        )
        rid = int(cur.lastrowid or 0)
        conn.executemany(
            "INSERT INTO boxes VALUES (?,?,?,?,?,?,?,?)",
            [
                (rid, b.box, b.reachable, b.observation, b.entries, b.causes, b.errors, b.verdict)
                for b in run.boxes
            ],
        )
        conn.executemany(
            "INSERT INTO entries VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [
                (
                    rid,
                    e.box,
                    e.kind,
                    e.subject,
                    e.path,
                    e.cause,
                    e.symptom,
                    e.action,
                    e.desired,
                    e.observed,
                    e.secret,
                    e.changed,
                )
                for e in run.entries
            ],
        )
        conn.executemany(
            "INSERT INTO findings VALUES (?,?,?,?,?)",
            [(rid, f.box, f.code, f.severity, f.message) for f in run.findings],
        )
        conn.executemany(
            "INSERT INTO observations VALUES (?,?,?)",
            [
                (rid, box, doc if isinstance(doc, Packed) else pack(doc))
                for box, doc in run.observations.items()
            ],
        )
        _apply_retention(conn, time.time())
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return rid


class Packed(bytes):
    """An observation already in the form the store keeps (`pack`): stored as it is."""


def pack(doc: Any, plain: bool = False) -> Packed:
    """A box's observation as the store keeps it: compact JSON, zlib level 1 (a third of the
    JSON's size at a fraction of the default level's time).

    `plain`: a value msgspec read from JSON text (a large replay's snapshot files,
    fast_json.decode_written), plain JSON by construction (no NaN, no lone surrogate, ints
    within 64 bits): msgspec (C) writes it back, where json.dumps took ~1 ms a box, as JSON
    that json reads to the same value."""
    if plain:
        from msgspec import json as c_json

        data = c_json.encode(doc)
    else:
        data = json.dumps(doc, separators=(",", ":")).encode()
    return Packed(zlib.compress(data, 1))


def _unpack(blob: bytes, what: str) -> Any:
    try:
        data = zlib.decompress(blob)
    except (zlib.error, TypeError):
        raise _Damaged(what) from None
    return _stored_json(data, what)


# -- retention ---------------------------------------------------------------------------------


def retention(conn: sqlite3.Connection) -> tuple[int, int]:
    """(keep_runs, keep_days) of this store; 0 = no limit of that kind."""
    values = dict(conn.execute("SELECT name, value FROM settings").fetchall())
    return (
        int(values.get("keep_runs", DEFAULT_KEEP_RUNS)),
        int(values.get("keep_days", DEFAULT_KEEP_DAYS)),
    )


def set_retention(conn: sqlite3.Connection, keep_runs: int | None, keep_days: int | None) -> int:
    """Change the limits (None: unchanged) and apply them now; how many runs were removed."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for name, value in (("keep_runs", keep_runs), ("keep_days", keep_days)):
            if value is not None:
                conn.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (name, value))
        removed = _apply_retention(conn, time.time())
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return removed


def _apply_retention(conn: sqlite3.Connection, now: float) -> int:
    keep_runs, keep_days = retention(conn)
    removed = 0
    if keep_days > 0:
        cutoff = now - keep_days * 86400
        removed += conn.execute("DELETE FROM runs WHERE started < ?", (cutoff,)).rowcount
    if keep_runs > 0:
        removed += conn.execute(
            "DELETE FROM runs WHERE id NOT IN (SELECT id FROM runs ORDER BY id DESC LIMIT ?)",
            (keep_runs,),
        ).rowcount
    return removed


# -- reading -----------------------------------------------------------------------------------

_RUN_COLUMNS = "id, run_id, command, source, started_at, duration_s, inventory, exit_code, summary"


def _run_info(row: tuple[Any, ...]) -> RunInfo:
    id_, run_id, command, source, started_at, duration_s, inventory, exit_code, summary = row
    return RunInfo(
        id_,
        run_id,
        command,
        source,
        started_at,
        duration_s,
        inventory,
        exit_code,
        _stored_json(summary, f"run {id_}'s summary"),
    )


def runs(
    conn: sqlite3.Connection, box: str | None = None, since: float | None = None
) -> list[RunInfo]:
    """Runs oldest first; `box`: only runs that covered it; `since`: started at or after."""
    where: list[str] = []
    params: list[Any] = []
    if box is not None:
        where.append("id IN (SELECT run FROM boxes WHERE box = ?)")
        params.append(box)
    if since is not None:
        where.append("started >= ?")
        params.append(since)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    rows = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs{clause} ORDER BY id", params)
    return [_run_info(r) for r in rows.fetchall()]


def find_run(conn: sqlite3.Connection, ref: str) -> RunInfo | None:
    """A run by its number in `reconcile history`, or by its run id (or a unique prefix)."""
    if ref.isdigit():
        row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (int(ref),))
        found = row.fetchone()
        if found is not None:
            return _run_info(found)
    rows = conn.execute(
        f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ? OR run_id LIKE ? ESCAPE '\\'"
        " ORDER BY id DESC",
        (ref, ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"),
    ).fetchall()
    exact = [r for r in rows if r[1] == ref]
    if exact:
        return _run_info(exact[0])
    return _run_info(rows[0]) if len(rows) == 1 else None


def last_two(conn: sqlite3.Connection) -> list[RunInfo]:
    """The latest run and the one before it of the same command (oldest first)."""
    latest = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY id DESC LIMIT 1").fetchone()
    if latest is None:
        return []
    before = conn.execute(
        f"SELECT {_RUN_COLUMNS} FROM runs WHERE command = ? AND id < ? ORDER BY id DESC LIMIT 1",
        (latest[2], latest[0]),
    ).fetchone()
    return [_run_info(r) for r in (before, latest) if r is not None]


def boxes_of(conn: sqlite3.Connection, run: int) -> list[BoxInfo]:
    rows = conn.execute(
        "SELECT box, reachable, observation, entries, causes, errors, verdict FROM boxes"
        " WHERE run = ? ORDER BY rowid",
        (run,),
    )
    return [BoxInfo(r[0], bool(r[1]), *r[2:]) for r in rows.fetchall()]


def entries_of(conn: sqlite3.Connection, run: int) -> list[EntryRow]:
    rows = conn.execute(
        "SELECT box, kind, subject, path, cause, symptom, action, desired, observed, secret,"
        " changed FROM entries WHERE run = ? ORDER BY rowid",
        (run,),
    )
    found = [
        EntryRow(
            r[0], r[1], r[2], r[3], r[4], bool(r[5]), r[6], r[7], r[8], bool(r[9]), _opt_bool(r[10])
        )
        for r in rows.fetchall()
    ]
    for number, e in enumerate(found, 1):  # read back once here: a diff shows them later
        _stored_json(e.desired, f"run {run}'s entry {number} (its desired value)")
        _stored_json(e.observed, f"run {run}'s entry {number} (its observed value)")
    return found


def findings_of(conn: sqlite3.Connection, run: int) -> list[FindingRow]:
    rows = conn.execute(
        "SELECT box, code, severity, message FROM findings WHERE run = ? ORDER BY rowid", (run,)
    )
    return [FindingRow(*r) for r in rows.fetchall()]


def observations_of(conn: sqlite3.Connection, run: int) -> dict[str, Any]:
    rows = conn.execute("SELECT box, document FROM observations WHERE run = ? ORDER BY box", (run,))
    return {
        box: _unpack(blob, f"run {run}'s observation of {box!r}") for box, blob in rows.fetchall()
    }


def _opt_bool(value: Any) -> bool | None:
    return None if value is None else bool(value)
