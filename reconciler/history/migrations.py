"""The store's schema, as numbered migrations: a store at version N runs N+1.. in order, each
in the transaction that records it, so a store is always at exactly one version.

Append a migration; never edit one that shipped (stores in the field are at its version).
"""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: runs, their boxes, drift entries, audit findings, observations.
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,          -- the report's run id
        command TEXT NOT NULL,         -- drift | audit
        source TEXT NOT NULL,          -- live | snapshot (a replay of saved observations)
        started_at TEXT NOT NULL,      -- ISO 8601 UTC
        started REAL NOT NULL,         -- the same, as epoch seconds (--since, retention)
        duration_s REAL NOT NULL,
        inventory TEXT NOT NULL,
        exit_code INTEGER NOT NULL,
        summary TEXT NOT NULL,         -- JSON: the report's summary
        report TEXT NOT NULL           -- JSON: the report document (secrets as digests)
    );
    CREATE INDEX runs_started ON runs (started);
    CREATE TABLE boxes (
        run INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        box TEXT NOT NULL,
        reachable INTEGER NOT NULL,
        observation TEXT NOT NULL,     -- full | partial | none
        entries INTEGER NOT NULL,      -- drift entries, or audit findings
        causes INTEGER NOT NULL,
        errors INTEGER NOT NULL,
        verdict TEXT,                  -- audit: ok | warn | fail
        PRIMARY KEY (run, box)
    );
    CREATE INDEX boxes_box ON boxes (box, run);
    CREATE TABLE entries (
        run INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        box TEXT NOT NULL,
        kind TEXT NOT NULL,
        subject TEXT NOT NULL,
        path TEXT NOT NULL,
        cause TEXT NOT NULL,
        symptom INTEGER NOT NULL,
        action TEXT NOT NULL,
        desired TEXT NOT NULL,         -- JSON; a secret is "***" (digests are per run)
        observed TEXT NOT NULL,
        secret INTEGER NOT NULL,
        changed INTEGER                -- a secret: does the box's differ from the desired one
    );
    CREATE INDEX entries_run ON entries (run);
    CREATE TABLE findings (
        run INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        box TEXT NOT NULL,             -- a box, or "(mesh)"
        code TEXT NOT NULL,
        severity TEXT NOT NULL,
        message TEXT NOT NULL
    );
    CREATE INDEX findings_run ON findings (run);
    CREATE TABLE observations (
        run INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        box TEXT NOT NULL,
        document BLOB NOT NULL,        -- zlib(JSON): a snapshot's box file, secrets hashed
        PRIMARY KEY (run, box)
    );
    CREATE TABLE settings (
        name TEXT PRIMARY KEY,         -- keep_runs | keep_days (| keep_mb, version 3)
        value INTEGER NOT NULL
    );
    """,
    # 2: the fleet repository a run judged (its root directory): two repositories may both
    # have inventory/lab.yaml, and `reconcile diff` compares runs of one fleet. NULL for the
    # runs recorded before (their fleet is known only by the inventory's path).
    """
    ALTER TABLE runs ADD COLUMN root TEXT;
    """,
    # 3: what each run keeps, in characters of its texts and bytes of its packed observations,
    # for the store's size limit (keep_mb): a table of its own, so that the limit reads a few
    # bytes a run, not each run's row and the report stored in it. Runs recorded before are
    # not measured (that would read and rewrite every report, gigabytes of a large fleet's
    # store, under the write lock): the size limit does not count them, the count and age
    # limits still remove them.
    """
    CREATE TABLE run_sizes (
        run INTEGER PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
        size INTEGER NOT NULL
    );
    """,
    # 4: which parts of each box a drift run could not observe (the parts of its faults:
    # docker, gateway-probe, ...; history/parts.py), so that `reconcile diff` says the
    # entries under them were not compared rather than cleared, and a trend or a metric does
    # not read a box whose dockerd was down as in sync. A JSON array; NULL for an audit's box
    # and for the runs recorded before (a box with errors then: which parts, not known).
    """
    ALTER TABLE boxes ADD COLUMN faults TEXT;
    """,
    # 5: each run's report document as UTF-8 JSON bytes in a column of its own, the table's
    # last (`report` is then ''; the view `run_reports` reads either as TEXT). A zeroblob at
    # the end of a record stays implicit, so a large replay's report (33 MB at 1,000 boxes,
    # growing as the square of the fleet: issue 12) is written into its row piece by piece
    # (blob I/O) without SQLite ever holding it whole; `report`, not the last column, had its
    # zeroblob made whole and then its cast to TEXT. So `report_utf8` must stay the last
    # column of `runs`: add no column to `runs` after it. A store made UTF-16 keeps writing
    # `report` (bytes cast to TEXT read in the database's encoding).
    """
    ALTER TABLE runs ADD COLUMN report_utf8 BLOB;
    CREATE VIEW run_reports AS SELECT id AS run,
        CASE WHEN report_utf8 IS NULL THEN report ELSE CAST(report_utf8 AS TEXT) END AS report
        FROM runs;
    """,
)

VERSION = len(MIGRATIONS)
# The tables a store of this tool holds (any version): a database with others is not one.
# SQLite's own (`sqlite_*`: statistics ANALYZE or PRAGMA optimize writes) are not counted.
TABLES = frozenset(
    {
        "schema_version",
        "runs",
        "boxes",
        "entries",
        "findings",
        "observations",
        "settings",
        "run_sizes",
    }
)


def is_sqlite_internal(table: str) -> bool:
    """A table SQLite itself keeps (`sqlite_stat1`, `sqlite_stat4`, `sqlite_sequence`): the
    name `sqlite_` is reserved to SQLite, no application can create one."""
    return table.lower().startswith("sqlite_")
