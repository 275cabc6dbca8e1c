"""The SQLite store: opened in WAL mode (a reader never blocks the run that writes), migrated
to the current schema version on open, one transaction per recorded run, retention applied in
the same transaction.

Retention keeps at most `keep_runs` runs (default 1000: ten days of a 15-minute timer's drift
and audit), none older than `keep_days` (default 30), and the newest runs that together keep at
most `keep_mb` MB (default 2048: a three-box run keeps ~90 KB, a 1,000-box one ~77 MB, so a
large fleet's store would otherwise grow to tens of GB before the count or the age limit
removed anything); `reconcile history --keep N --days D --max-mb M` changes them for the store
(kept in its settings table), 0 meaning no limit of that kind. The run just recorded is never
removed by the size limit, even alone past it; runs recorded before the store measured them
(schema version 3) are not counted by it. Freed pages are reused by the next runs: the
file stays about as large as the limit plus one run.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sqlite3
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from reconciler.history.location import prepare, restrict
from reconciler.history.migrations import MIGRATIONS, TABLES, VERSION, is_sqlite_internal
from reconciler.history.record import EntryRow, FindingRow, ReportText, RunRecord
from reconciler.records import record_class

DEFAULT_KEEP_RUNS = 1000
DEFAULT_KEEP_DAYS = 30
DEFAULT_KEEP_MB = 2048
MB = 1_000_000
BUSY_TIMEOUT_S = 10.0  # another run writing at the same moment: wait for it, then write
MAX_INTEGER = 2**63 - 1  # SQLite's largest integer: a larger Python int cannot be bound


class HistoryError(Exception):
    """The store cannot be used (damaged, newer than this code, not a database)."""


class _Damaged(ValueError):
    """A value this store wrote that no longer reads back as it was written (the file was
    damaged, or edited by hand): `opened` says so as the store's HistoryError, with its path.
    `what`: which value; `expected`: what the store wrote there; `why`: anything more."""

    def __init__(self, what: str, expected: str = "JSON", why: str = "") -> None:
        more = f" ({why})" if why else ""
        super().__init__(f"{what} is not the {expected} it stored{more}")


def _stored_json(text: str | bytes, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError, TypeError):
        raise _Damaged(what) from None


@record_class()
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
    root: str | None = None  # the fleet repository; None for a run recorded before it was kept

    def same_fleet(self, other: RunInfo) -> bool:
        """Runs of one fleet: its inventory, in one repository (when both say which)."""
        roots = (self.root, other.root)
        return self.inventory == other.inventory and (None in roots or roots[0] == roots[1])

    @property
    def fleet(self) -> str:
        return self.inventory + (f" in {self.root}" if self.root else "")


@record_class()
class BoxInfo:
    """One box of a stored run, as the history's readers get it."""

    box: str
    reachable: bool
    observation: str
    entries: int
    causes: int
    errors: int
    verdict: str | None
    faults: tuple[str, ...] | None = None  # its fault parts; None: not recorded (parts.py)


def reading(path: Path) -> AbstractContextManager[sqlite3.Connection]:
    """The store at `path` for a command that only reads it (`history`, `diff`, the drift
    page's trend): opened read-only, never migrated nor changed in any way; a missing store is
    refused, an empty database reads as a store with no run.

    Everything it reads is one snapshot of the store: a read transaction is held from the
    open to the close. A reader reads a run in several statements (its boxes, entries,
    findings, observations), and a run recorded meanwhile by another process applies the
    retention, which may delete the very run being read: `diff` would then compare half a
    run. In WAL mode the reader still never blocks that writer (it writes on, into the -wal),
    and an immutable open (a read-only location) has no writer to see."""
    return opened(path, create=False, readonly=True)


@contextmanager
def opened(
    path: Path, *, create: bool = True, readonly: bool = False
) -> Iterator[sqlite3.Connection]:
    """The store at `path` to write (a run being recorded, `history --keep`): created when
    new or empty (`create=False` refuses a missing one), WAL mode, migrated, 0600.
    `readonly`: see `reading`. Both refuse a database that is not a store of this tool
    (another application's tables), leaving it as it was."""
    try:
        if not create and not path.is_file():
            raise HistoryError(f"history: no store at {path} (no run recorded there yet)")
        conn = _connect(path, readonly)
    except sqlite3.OperationalError as exc:  # a new store's file that cannot be created
        raise _failed(exc, path, readonly) from None
    except OSError as exc:  # its directory: not one (a file on the way), not permitted
        raise _not_usable(exc, path) from None
    try:
        try:
            if readonly:  # one snapshot from here to the close (`reading`); deferred: no lock
                conn.execute("BEGIN")  # until the first read, and never a write lock
            _refuse_newer(conn, path)  # before any pragma or table check changes or judges it
            tables = _ours(conn, path)
            if not readonly:
                _make_writable(conn, path)
            elif "runs" not in tables:  # an empty file, or a store no run was recorded in
                conn.close()
                conn = _empty_store()  # in memory, written by nobody else: no snapshot to hold
            elif _version(conn) > VERSION:
                raise _newer(path, _version(conn))
            yield conn
        except sqlite3.ProgrammingError:
            raise  # this code's own mistake, not the store's
        except sqlite3.OperationalError as exc:
            raise _failed(exc, path, readonly) from None
        except sqlite3.DatabaseError as exc:
            # Also while in use: a table without the columns this schema has, a page that
            # no longer reads. The store's error, naming it.
            raise HistoryError(f"history: {path} is not a usable store ({exc})") from None
        except _Damaged as exc:
            raise HistoryError(f"history: {path} is damaged: {exc}") from None
    finally:
        conn.close()


def _not_usable(exc: OSError, path: Path) -> HistoryError:
    """The file system's refusal (creating the store's directory, a file where a directory
    must be, making the files private): said with the store's path and the reason, scrubbed
    as every exception text the reconciler prints (scrub.reason: the errno's words)."""
    from reconciler.scrub import reason

    # The path refused, when another (its directory, a file on the way to it): errno's way.
    where = f"{exc.filename}: " if exc.filename and str(exc.filename) != str(path) else ""
    return HistoryError(f"history: {path} cannot be used: {where}{reason(exc)}")


def _failed(exc: sqlite3.OperationalError, path: Path, readonly: bool) -> HistoryError:
    """What SQLite's refusal means for the store, said with its path."""
    if _read_only_location(exc, path):
        if readonly:  # a -wal file beside it (_reader)
            return HistoryError(
                f"history: {path} is in a read-only location, with a -wal file beside it "
                f"that SQLite cannot read there ({exc}): copy the store and its -wal file "
                "to a place you can write, and read the copy"
            )
        return HistoryError(f"history: {path} could not be written: a read-only location ({exc})")
    if _write_failed(exc):  # the disk's fault, not the store's
        return HistoryError(
            f"history: {path} could not be written ({exc}, {exc.sqlite_errorname}: a full "
            "disk or a file size limit?); what it held is unchanged"
        )
    if _busy(exc):  # contention, not damage: another run held the store past the timeout
        return HistoryError(
            f"history: {path} is busy: another run held it for more than "
            f"{BUSY_TIMEOUT_S:.0f} s ({exc}); the store is as it was"
        )
    return HistoryError(f"history: {path} is not a usable store ({exc})")


def _connect(path: Path, readonly: bool) -> sqlite3.Connection:
    """A writer's connection (the file and its directory created 0600/0700 when missing), or
    a reader's: `mode=ro`, which can change nothing in the file (no WAL switch, no table)."""
    old = os.umask(0o077)  # the database and its -wal/-shm files: 0600 from the start
    try:
        if readonly:
            return _reader(path)
        prepare(path)
        return sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    finally:
        os.umask(old)


def _reader(path: Path) -> sqlite3.Connection:
    """A reader's connection. A store in WAL mode is read with its -shm file beside it, which
    SQLite creates when missing: in a read-only location (a read-only mount, a directory the
    user cannot write) it cannot, and the store would not read at all. There, with no -wal
    file, no run is writing it (a writer would have to create its -wal there) and nothing
    waits in a -wal to be read: the file alone is the store, read as immutable (no -shm, no
    lock). With a -wal file, the store cannot be read there (`_read_only_location`)."""
    uri = f"{path.absolute().as_uri()}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opens the file
    except sqlite3.Error as exc:
        if _read_only_location(exc, path) and not os.path.lexists(f"{path}-wal"):
            conn.close()
            uri += "&immutable=1"
            return sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        # Any other fault: the store's first query meets it again, and `opened` says it.
    return conn


def _read_only_location(exc: sqlite3.Error, path: Path) -> bool:
    """SQLite could not open or write a file of the store (the database, its -wal or -shm),
    and the store's directory cannot be written by this user."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    refused = name.startswith(("SQLITE_CANTOPEN", "SQLITE_READONLY"))
    return refused and not os.access(path.absolute().parent, os.W_OK)


def _tables(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {str(name) for (name,) in rows if not is_sqlite_internal(str(name))}


def _refuse_newer(conn: sqlite3.Connection, path: Path) -> None:
    """A store a newer reconciler wrote is refused before anything touches it: a writer's
    WAL switch rewrites the file's header, and its tables (a newer version's own, beyond
    these) would read as another application's. A newer store holds every table of this
    version (migrations only add: migrations.py); a database without them is judged by
    _ours, whatever a table of its own called schema_version says."""
    tables = _tables(conn)
    if tables >= TABLES:
        version = _version(conn)
        if version > VERSION:
            raise _newer(path, version)


def _ours(conn: sqlite3.Connection, path: Path) -> set[str]:
    """The database's tables, when it is empty or a store of this tool (its tables are among
    the store's, schema_version with them); else the HistoryError that says whose it is not.
    SQLite's own tables (`sqlite_stat1`, `sqlite_stat4` after ANALYZE or PRAGMA optimize,
    `sqlite_sequence`) are no application's: not counted."""
    tables = _tables(conn)
    if tables and ("schema_version" not in tables or not tables <= TABLES):
        others = ", ".join(sorted(tables - TABLES)) or "no schema_version"
        raise HistoryError(
            f"history: {path} is not a history store of this tool (its tables: {others}); "
            "it was left as it is: choose another path with --history"
        )
    return tables


def _make_writable(conn: sqlite3.Connection, path: Path) -> None:
    """WAL mode, migrated to this schema, private: only for a store of this tool (_ours)."""
    conn.execute("PRAGMA foreign_keys = ON")
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    if str(mode).lower() != "wal":  # once, when the store is new: a store stays in WAL mode
        mode = _switched_to_wal(conn)
    if str(mode).lower() != "wal":
        raise HistoryError(f"history: {path} cannot use WAL mode ({mode})")
    conn.execute("PRAGMA synchronous = NORMAL")  # WAL: durable at checkpoints, fast
    _migrate(conn, path)
    try:
        restrict(path)
    except OSError as exc:  # a store of another user's, a file system without modes
        raise _not_usable(exc, path) from None


def _switched_to_wal(conn: sqlite3.Connection) -> str:
    """`PRAGMA journal_mode = WAL`, retried while another run holds the database: SQLite
    answers this pragma "database is locked" at once, without the busy timeout the other
    statements wait for, so a timer's run meeting a manual one lost its record."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


# SQLite's answers to a write the file system refused: ENOSPC is SQLITE_FULL, any other
# errno (EFBIG past a file size limit, EDQUOT, EIO) an SQLITE_IOERR of the step that wrote.
_WRITE_FAILURES = frozenset(
    {
        "SQLITE_FULL",
        "SQLITE_IOERR_WRITE",
        "SQLITE_IOERR_FSYNC",
        "SQLITE_IOERR_DIR_FSYNC",
        "SQLITE_IOERR_TRUNCATE",
        "SQLITE_IOERR_SHMSIZE",  # growing the -shm file
    }
)


def _write_failed(exc: sqlite3.OperationalError) -> bool:
    return getattr(exc, "sqlite_errorname", None) in _WRITE_FAILURES


def _busy(exc: sqlite3.OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


def _empty_store() -> sqlite3.Connection:
    """What a reader reads in an empty database: a store with no run (in memory: the file
    is not written)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    _migrate(conn, Path(":memory:"))
    return conn


def _newer(path: Path, version: int) -> HistoryError:
    return HistoryError(
        f"history: {path} is at schema version {version}, newer than this reconciler "
        f"knows ({VERSION}); upgrade, or choose another store with --history"
    )


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    current = _version(conn)
    if current > VERSION:
        raise _newer(path, current)
    for number in range(current + 1, VERSION + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-read under the write lock: another process may have migrated meanwhile.
            done = _version(conn)
            if done < number:
                for statement in _statements(MIGRATIONS[number - 1]):
                    conn.execute(statement)
                # One row, the store's version (not one per migration): what a person or a
                # check reading the table sees is the version, nothing to take the max of.
                conn.execute("DELETE FROM schema_version")
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (number,))
            conn.execute("COMMIT")
        except BaseException:
            _rolled_back(conn)
            raise


def _rolled_back(conn: sqlite3.Connection) -> None:
    """The failed transaction rolled back, unless SQLite already did (a full disk, an I/O
    error: it rolls back on its own), when a ROLLBACK would fail and its error ("no
    transaction is active") would hide the real one."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _version(conn: sqlite3.Connection) -> int:
    # max() of a hand-edited 'abc' is that text (SQLite sorts text after numbers), of '9e999'
    # an infinite REAL: neither is a version, and the store is then not ours to migrate.
    found = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
    return 0 if found is None else _whole(found, "the schema version")


def _statements(script: str) -> list[str]:
    # executescript() would COMMIT the migration's transaction first: run each statement.
    lines = [line.split("--", 1)[0] for line in script.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def record(conn: sqlite3.Connection, run: RunRecord) -> int:
    """One run, in one transaction, then retention; its row id."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        summary = json.dumps(run.summary, sort_keys=True)
        report: str | _Reserved
        utf8 = _utf8(conn)
        if not utf8:
            # Bytes cast to TEXT are read in the database's encoding: a store made UTF-16
            # takes the report as text, bound whole, in `report` (migrations.py, 5).
            report = run.report.text() if isinstance(run.report, ReportText) else _dumped(run)
        elif isinstance(run.report, ReportText):
            report = _reserved(run.report)
        else:
            report = _Reserved.of(_dumped(run))
        observations = [
            (box, doc if isinstance(doc, Packed) else pack(doc))
            for box, doc in run.observations.items()
        ]
        cur = conn.execute(
            "INSERT INTO runs (run_id, command, source, started_at, started, duration_s,"
            " inventory, exit_code, summary, report, root, report_utf8)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,"
            + ("NULL" if isinstance(report, str) else "zeroblob(?)")  # its bytes, written after
            + ")",
            (
                run.run_id,
                run.command,
                run.source,
                run.started_at,
                run.started,
                run.duration_s,
                run.inventory,
                run.exit_code,
                summary,
                report if isinstance(report, str) else "",
                run.root,
                *(() if isinstance(report, str) else (report.size,)),
            ),
        )
        rid = int(cur.lastrowid or 0)
        if isinstance(report, _Reserved):
            _write_report(conn, rid, report)
        conn.executemany(
            "INSERT INTO boxes (run, box, reachable, observation, entries, causes, errors,"
            " verdict, faults) VALUES (?,?,?,?,?,?,?,?,?)",
            [
                (
                    rid,
                    b.box,
                    b.reachable,
                    b.observation,
                    b.entries,
                    b.causes,
                    b.errors,
                    b.verdict,
                    None if b.faults is None else json.dumps(list(b.faults)),
                )
                for b in run.boxes
            ],
        )
        # Read once, row by row (a large replay's from its spool, a chunk in memory at a time),
        # their size counted on the way.
        entries = _EntryRows(rid, run.entries)
        conn.executemany("INSERT INTO entries VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", entries)
        conn.executemany(
            "INSERT INTO findings VALUES (?,?,?,?,?)",
            [(rid, f.box, f.code, f.severity, f.message) for f in run.findings],
        )
        conn.executemany(
            "INSERT INTO observations VALUES (?,?,?)",
            [(rid, box, packed) for box, packed in observations],
        )
        size = _size(run, summary, report, observations, entries.chars)
        conn.execute("INSERT INTO run_sizes VALUES (?, ?)", (rid, size))
        _apply_retention(conn, time.time())
        conn.execute("COMMIT")
    except BaseException:
        _rolled_back(conn)
        raise
    return rid


@record_class()
class _Reserved:
    """A report to write into its row's `report_utf8` (migrations.py, 5): its pieces, the
    bytes they take as UTF-8 and their characters."""

    pieces: Iterable[str]  # re-iterable: read once to measure, once to write
    size: int
    chars: int

    def __len__(self) -> int:  # what _size counts of a report: its characters
        return self.chars

    @classmethod
    def of(cls, text: str) -> _Reserved:
        return _reserved(ReportText([text]))


def _dumped(run: RunRecord) -> str:
    return json.dumps(run.report, ensure_ascii=False)


def _reserved(report: ReportText) -> _Reserved:
    """The room `report` takes, its pieces read once (a piece that is not UTF-8, a lone
    surrogate, raises UnicodeEncodeError here, as binding it whole did)."""
    size = chars = 0
    for piece in report.pieces:
        chars += len(piece)
        size += len(piece) if piece.isascii() else len(piece.encode("utf-8"))
    return _Reserved(report.pieces, size, chars)


def _utf8(conn: sqlite3.Connection) -> bool:
    return str(conn.execute("PRAGMA encoding").fetchone()[0]).upper() == "UTF-8"


def _write_report(conn: sqlite3.Connection, rid: int, report: _Reserved) -> None:
    """A report written piece by piece into the room its row holds for it (a zeroblob in
    `report_utf8`, the last column: its zeros stay implicit in the record, migrations.py, 5),
    never joined nor bound whole, so SQLite never holds it whole either: its pages go through
    the page cache. Bound whole, a 1,000-box replay's 33 MB report was held three times over
    (the joined text, SQLite's copy, its record); written into `report`, which is not the last
    column, about twice (its zeroblob made whole, then the cast to TEXT): the part of a
    recorded replay's peak that grew as the square of the fleet (issue 12)."""
    with conn.blobopen("runs", "report_utf8", rid) as blob:
        for piece in report.pieces:
            blob.write(piece.encode("utf-8"))


class _EntryRows:
    """A run's entries as the rows of the `entries` table, one at a time, and (once read) the
    characters of their texts."""

    def __init__(self, rid: int, entries: Iterable[EntryRow]) -> None:
        self.rid, self.entries, self.chars = rid, entries, 0

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        rid = self.rid
        for e in self.entries:
            self.chars += len(e.desired) + len(e.observed) + len(e.subject) + len(e.path)
            yield (
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


def _size(
    run: RunRecord, summary: str, report: str | _Reserved, observations: list[Any], entries: int
) -> int:
    """What the run keeps: characters of its texts, bytes of its packed observations (the
    size limit, keep_mb, counts it; migrations.py, 3). `entries`: the entries' characters."""
    findings = sum(len(f.message) for f in run.findings)
    packed = sum(len(data) for _, data in observations)
    return len(report) + len(summary) + entries + findings + packed


class Packed(bytes):
    """An observation already in the form the store keeps (`pack`): stored as it is."""


def pack(doc: Any, plain: bool = False) -> Packed:
    """A box's observation as the store keeps it: every clear secret masked (masking.stored:
    the store never holds a secret value, whatever snapshot a replay read), then compact JSON,
    zlib level 1 (a third of the JSON's size at a fraction of the default level's time).

    `plain`: a value msgspec read from JSON text (a large replay's snapshot files,
    fast_json.decode_written), plain JSON by construction (no NaN, no lone surrogate, ints
    within 64 bits): msgspec (C) writes it back, where json.dumps took ~1 ms a box, as JSON
    that json reads to the same value."""
    from reconciler.history.masking import stored

    doc = stored(doc, history=True)  # the controller's digests of desired secrets masked too
    if plain:
        from msgspec import json as c_json

        data = c_json.encode(doc)
    else:
        data = json.dumps(doc, separators=(",", ":")).encode()
    return Packed(zlib.compress(data, 1))


def _unpack(blob: Any, what: str) -> Any:
    """An observation as `pack` stored it. Unpacked up to the largest snapshot file: a few MB
    of zlib can unpack to gigabytes (a crafted or damaged blob), which no observation is."""
    from reconciler.observe.observe import SNAPSHOT_FILE_LIMIT as cap

    if not isinstance(blob, bytes):
        raise _Damaged(what)
    unpacker = zlib.decompressobj()
    try:
        data = unpacker.decompress(blob, cap + 1)
    except zlib.error:
        raise _Damaged(what) from None
    if len(data) > cap:
        raise _Damaged(what, why=f"it unpacks to more than {cap} bytes")
    if not unpacker.eof:  # cut short (zlib.decompress said so; this object only stops)
        raise _Damaged(what)
    return _stored_json(data, what)


# -- retention ---------------------------------------------------------------------------------


def retention(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """(keep_runs, keep_days, keep_mb) of this store; 0 = no limit of that kind."""
    return (
        _setting(conn, "keep_runs", DEFAULT_KEEP_RUNS),
        _setting(conn, "keep_days", DEFAULT_KEEP_DAYS),
        _setting(conn, "keep_mb", DEFAULT_KEEP_MB),
    )


def _setting(conn: sqlite3.Connection, name: str, default: int) -> int:
    row = conn.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
    return default if row is None else _whole(row[0], f"the {name} setting")


def set_retention(
    conn: sqlite3.Connection,
    keep_runs: int | None,
    keep_days: int | None,
    keep_mb: int | None = None,
) -> int:
    """Change the limits (None: unchanged) and apply them now; how many runs were removed."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        limits = (("keep_runs", keep_runs), ("keep_days", keep_days), ("keep_mb", keep_mb))
        for name, value in limits:
            if value is not None:
                conn.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (name, value))
        removed = _apply_retention(conn, time.time())
        conn.execute("COMMIT")
    except BaseException:
        _rolled_back(conn)
        raise
    return removed


def _apply_retention(conn: sqlite3.Connection, now: float) -> int:
    keep_runs, keep_days, keep_mb = retention(conn)
    removed = 0
    if keep_days > 0:
        cutoff = now - keep_days * 86400
        removed += conn.execute("DELETE FROM runs WHERE started < ?", (cutoff,)).rowcount
    # Counted first (from the index on `started`, ~0.1 ms), then the oldest runs past the
    # count removed from the start of the table: a store at its count (every run of a store
    # kept for long) removes one run a run recorded. Keeping the newest by NOT IN walked every
    # run's row (~1-3 ms of each recorded run: rows holding their reports span many pages).
    if keep_runs > 0:
        (count,) = conn.execute("SELECT count(*) FROM runs").fetchone()
        if count > keep_runs:
            removed += conn.execute(
                "DELETE FROM runs WHERE id IN (SELECT id FROM runs ORDER BY id LIMIT ?)",
                (count - keep_runs,),
            ).rowcount
    if keep_mb > 0:
        # The newest runs whose sizes add up to the limit stay; the newest run always does
        # (a run alone past the limit is still the last one recorded). Read from run_sizes
        # alone: a few bytes a run, never the runs' rows with their reports.
        removed += conn.execute(
            "DELETE FROM runs WHERE id < (SELECT max(run) FROM run_sizes) AND id IN (SELECT run"
            " FROM (SELECT run, sum(size) OVER (ORDER BY run DESC) AS kept FROM run_sizes)"
            " WHERE kept > ?)",
            (min(keep_mb * MB, MAX_INTEGER),),
        ).rowcount
    return removed


# -- reading -----------------------------------------------------------------------------------
# Each row is read once into its record, each column checked: SQLite keeps whatever a column is
# given (text in an INTEGER column, a BLOB anywhere), and a value of another type than the
# store wrote is its damage, said here with which value it is, not a TypeError wherever the
# record is used later (a listing's format code, json.dumps of a BLOB).

_Check = Callable[[Any, str], Any]  # (the value, how the store's error names it) -> the value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _Damaged(what, "text")
    return value


def _whole(value: Any, what: str) -> int:
    # An INTEGER column keeps text it cannot convert ('abc'), and '9e999' as an infinite REAL.
    if type(value) is not int or value < 0:
        raise _Damaged(what, "whole number")
    return value


def _flag(value: Any, what: str) -> bool:
    if type(value) is not int or value not in (0, 1):  # the store writes a bool as 0 or 1
        raise _Damaged(what, "0 or 1")
    return bool(value)


def _opt_flag(value: Any, what: str) -> bool | None:
    return None if value is None else _flag(value, what)


def _opt_text(value: Any, what: str) -> str | None:
    return None if value is None else _text(value, what)


def _opt_parts(value: Any, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    found = _stored_json(_text(value, what), what)
    if not isinstance(found, list) or not all(isinstance(p, str) for p in found):
        raise _Damaged(what, "JSON list of names")
    return tuple(found)


def _seconds(value: Any, what: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise _Damaged(what, "number of seconds")
    return float(value)


def _json_text(value: Any, what: str) -> str:
    """JSON kept as its text (an entry's value), read back once here: a diff shows it later."""
    text = _text(value, what)
    _stored_json(text, what)
    return text


def _json_object(value: Any, what: str) -> dict[str, Any]:
    found = _stored_json(_text(value, what), what)
    if not isinstance(found, dict):
        raise _Damaged(what, "JSON object")
    return found


def _read(
    row: Sequence[Any], columns: Sequence[tuple[str, str, _Check]], name: Callable[[str], str]
) -> list[Any]:
    """`row`'s values, each checked; `name(word)`: how the error names the column's value."""
    return [check(v, name(word)) for v, (_, word, check) in zip(row, columns, strict=True)]


def _its(owner: str) -> Callable[[str], str]:
    return lambda word: f"{owner} (its {word})"


def _select(columns: Sequence[tuple[str, str, _Check]]) -> str:
    return ", ".join(column for column, _, _ in columns)


_RUN = (
    ("id", "number", _whole),
    ("run_id", "run id", _text),
    ("command", "command", _text),
    ("source", "source", _text),
    ("started_at", "start time", _text),
    ("duration_s", "duration", _seconds),
    ("inventory", "inventory", _text),
    ("exit_code", "exit code", _whole),
    ("summary", "summary", _json_object),
    ("root", "repository", _opt_text),
)


def _has_column(conn: sqlite3.Connection, table: str, column: str) -> bool:
    """An older store (read, never migrated, by a reader) lacks the columns later migrations
    added: schema 1 `runs.root`, schema 3 and before `boxes.faults`. Their values then read
    as not recorded (NULL)."""
    rows = conn.execute(f"PRAGMA table_info({table})").fetchall()
    return any(row[1] == column for row in rows)


def _has_root(conn: sqlite3.Connection) -> bool:
    return _has_column(conn, "runs", "root")


def _columns(conn: sqlite3.Connection, table: str, added: str, spec: Sequence[Any]) -> str:
    """`spec`'s columns to select, `added` as NULL in a store older than it."""
    present = _has_column(conn, table, added)
    return ", ".join(c if present or c != added else "NULL" for c, _, _ in spec)


def _run_columns(conn: sqlite3.Connection) -> str:
    return _columns(conn, "runs", "root", _RUN)


def _run_info(row: Sequence[Any]) -> RunInfo:
    return RunInfo(*_read(row, _RUN, lambda word: f"run {row[0]}'s {word}"))


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
    rows = conn.execute(f"SELECT {_run_columns(conn)} FROM runs{clause} ORDER BY id", params)
    return [_run_info(r) for r in rows.fetchall()]


def find_run(conn: sqlite3.Connection, ref: str) -> RunInfo | None:
    """A run by its number in `reconcile history`, or by its run id (or a unique prefix);
    None when no run, or more than one, answers to it (find_runs says which)."""
    found = find_runs(conn, ref)
    return found[0] if len(found) == 1 else None


def find_runs(conn: sqlite3.Connection, ref: str) -> list[RunInfo]:
    """The runs `ref` names, oldest first: the run of that number, else those of that run id,
    else those whose run id it begins. More than one is ambiguous: replays of one snapshot
    share the snapshot's run id, and the newest of them is not the one meant more than any."""
    # Digits SQLite cannot hold (or non-ASCII ones, which int() may refuse) are no run number:
    # such a reference is looked up as a run id only.
    columns = _run_columns(conn)
    if ref.isascii() and ref.isdigit() and len(ref) < 20 and int(ref) <= MAX_INTEGER:
        row = conn.execute(f"SELECT {columns} FROM runs WHERE id = ?", (int(ref),))
        found = row.fetchone()
        if found is not None:
            return [_run_info(found)]
    rows = conn.execute(
        f"SELECT {columns} FROM runs WHERE run_id = ? OR run_id LIKE ? ESCAPE '\\' ORDER BY id",
        (ref, ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"),
    ).fetchall()
    exact = [r for r in rows if r[1] == ref]
    return [_run_info(r) for r in (exact or rows)]


def last_two(conn: sqlite3.Connection) -> list[RunInfo]:
    """The latest run and the one before it of the same command and fleet (oldest first): the
    same inventory, in the same repository. A run recorded before the repository was kept
    (root NULL) is taken for the same fleet when no run names that repository: the first diff
    after an upgrade still has a pair. Only the latest when there is no such run."""
    columns = _run_columns(conn)
    row = conn.execute(f"SELECT {columns} FROM runs ORDER BY id DESC LIMIT 1").fetchone()
    if row is None:
        return []
    latest = _run_info(row)
    root = "root" if _has_root(conn) else "NULL"
    before = conn.execute(
        f"SELECT {columns} FROM runs WHERE command = ? AND inventory = ? AND id < ?"
        f" AND ({root} IS ? OR {root} IS NULL) ORDER BY ({root} IS ?) DESC, id DESC LIMIT 1",
        (latest.command, latest.inventory, latest.id, latest.root, latest.root),
    ).fetchone()
    return [_run_info(before), latest] if before is not None else [latest]


_BOX = (
    ("box", "name", _text),
    ("reachable", "reachable flag", _flag),
    ("observation", "observation", _text),
    ("entries", "entry count", _whole),
    ("causes", "cause count", _whole),
    ("errors", "error count", _whole),
    ("verdict", "verdict", _opt_text),
    ("faults", "fault parts", _opt_parts),
)


def boxes_of(conn: sqlite3.Connection, run: int) -> list[BoxInfo]:
    columns = _columns(conn, "boxes", "faults", _BOX)
    rows = conn.execute(f"SELECT {columns} FROM boxes WHERE run = ? ORDER BY rowid", (run,))
    return [
        BoxInfo(*_read(r, _BOX, _its(f"run {run}'s box {_box_name(r[0], n)}")))
        for n, r in enumerate(rows.fetchall(), 1)
    ]


def errors_of(conn: sqlite3.Connection, run: int) -> dict[str, list[Any]]:
    """Each box's errors as the run's stored report keeps them (`boxes[].errors`: each fault's
    text, which begins with where it is: parts.part_of), for the boxes with any. What a run
    recorded before `boxes.faults` (schema 4) still says of which parts a fault left unseen.
    A report that cannot be read gives none (its boxes' parts are then not known, and said).

    Only the boxes' names and errors are decoded (msgspec, typed: the rest of the report is
    skipped; a 10 MB report in 4 ms, where json.loads takes 35 ms to read it all)."""
    from msgspec import MsgspecError
    from msgspec import json as c_json

    row = conn.execute(f"SELECT {_report_column(conn)} FROM runs WHERE id = ?", (run,)).fetchone()
    if row is None or not isinstance(row[0], str | bytes):
        return {}
    try:
        report = c_json.decode(row[0], type=_report_errors())
    except (MsgspecError, ValueError, RecursionError):
        return {}
    return {b.box: b.errors for b in report.boxes if b.errors}


def _report_column(conn: sqlite3.Connection) -> str:
    """A run's report, wherever its schema put it: `report_utf8` (bytes) from schema 5 on,
    else `report` (text; a store older than 5, read unmigrated, has only that)."""
    if _has_column(conn, "runs", "report_utf8"):
        return "coalesce(report_utf8, report)"
    return "report"


@functools.cache
def _report_errors() -> Any:
    """The part of a drift report's document `errors_of` reads (built once, when first read:
    the store is imported by every recorded run, msgspec only by the readers that need it)."""
    from msgspec import defstruct

    box = defstruct("Box", [("box", str), ("errors", list[Any], [])])
    return defstruct("Report", [("boxes", list[box], [])])  # type: ignore[valid-type]


def _box_name(box: Any, number: int) -> str:
    return repr(box) if isinstance(box, str) else str(number)  # its name, while it has one


_ENTRY = (
    ("box", "box", _text),
    ("kind", "kind", _text),
    ("subject", "subject", _text),
    ("path", "path", _text),
    ("cause", "cause", _text),
    ("symptom", "symptom flag", _flag),
    ("action", "action", _text),
    ("desired", "desired value", _json_text),
    ("observed", "observed value", _json_text),
    ("secret", "secret flag", _flag),
    ("changed", "changed flag", _opt_flag),
)


def entries_of(conn: sqlite3.Connection, run: int) -> list[EntryRow]:
    rows = conn.execute(
        f"SELECT {_select(_ENTRY)} FROM entries WHERE run = ? ORDER BY rowid", (run,)
    )
    return [
        EntryRow(*_read(r, _ENTRY, _its(f"run {run}'s entry {n}")))
        for n, r in enumerate(rows.fetchall(), 1)
    ]


_FINDING = (
    ("box", "box", _text),
    ("code", "code", _text),
    ("severity", "severity", _text),
    ("message", "message", _text),
)


def findings_of(conn: sqlite3.Connection, run: int) -> list[FindingRow]:
    rows = conn.execute(
        f"SELECT {_select(_FINDING)} FROM findings WHERE run = ? ORDER BY rowid", (run,)
    )
    return [
        FindingRow(*_read(r, _FINDING, _its(f"run {run}'s finding {n}")))
        for n, r in enumerate(rows.fetchall(), 1)
    ]


def observations_of(conn: sqlite3.Connection, run: int) -> dict[str, Any]:
    rows = conn.execute("SELECT box, document FROM observations WHERE run = ? ORDER BY box", (run,))
    found: dict[str, Any] = {}
    for n, (box, blob) in enumerate(rows.fetchall(), 1):
        name = _text(box, f"run {run}'s observation {n} (its box name)")
        found[name] = _unpack(blob, f"run {run}'s observation of {name!r}")
    return found
