"""The history store on captured lab data: drift and audit replays recorded through the CLI
(--history under tmp_path), its schema and WAL mode, permissions, where it may live, retention,
migrations, and that it holds no secret in clear."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reconciler.history import store
from reconciler.history.location import default_path, history_path
from reconciler.history.migrations import VERSION
from reconciler.history.since import parse_since
from tests.unit.history_helpers import (
    AUDIT_FIXTURES,
    INCIDENTS,
    ROOT,
    SNAPSHOT,
    as_version,
    reconcile,
    stored_reports,
)

HMAC = re.compile(r"hmac:[0-9a-f]{64}")


def drift_replay(capsys: pytest.CaptureFixture[str], db: Path, *more: str) -> int:
    code, _, err = reconcile(
        capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--history", str(db), *more
    )
    assert "warning" not in err, err
    return code


def test_a_replay_is_recorded_with_its_summary_entries_and_observations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "state" / "h.sqlite3"
    code, report, _ = reconcile(
        capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--format", "json", "--history", str(db)
    )
    assert code == 2
    doc = json.loads(report)
    with store.opened(db, create=False) as conn:
        (run,) = store.runs(conn)
        assert (run.command, run.source, run.exit_code) == ("drift", "snapshot", 2)
        assert run.summary == doc["summary"]
        entries = store.entries_of(conn, run.id)
        assert len(entries) == doc["summary"]["drifts"]
        assert {e.cause for e in entries} == {d["cause"] for b in doc["boxes"] for d in b["drifts"]}
        boxes = store.boxes_of(conn, run.id)
        assert [b.box for b in boxes] == ["thor", "spark", "orin"]
        assert sum(b.entries for b in boxes) == len(entries)
        observed = store.observations_of(conn, run.id)
        saved = json.loads((SNAPSHOT / "thor.json").read_text())
        assert observed["thor"] == saved  # the snapshot's box file, as it was saved
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        version = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
    assert (mode, version) == ("wal", VERSION)
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


def test_a_large_replay_records_each_file_as_json_reads_it_and_its_collector_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """From fast_json.LARGE boxes on, a replay reads its files with msgspec and packs each for
    the store as it reads it (history/hooks.py): what the store gives back is still
    `json.loads` of each file. A file the replay refuses (`Infinity`, a key repeated) is not
    recorded, nor its collector time."""
    sys.path.insert(0, str(ROOT))
    from bench.scale_fleet import build_fleet
    from reconciler.fast_json import LARGE

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "fleet"
    build_fleet(root, LARGE)
    snapshot = root / "snapshot"
    odd = snapshot / "spark-1.json"
    odd.write_text(odd.read_text().replace("{", '{"extra": Infinity, ', 1))
    twice = snapshot / "orin-2.json"
    twice.write_text(twice.read_text().replace("{", '{"box": "first", ', 1))
    db, metrics = tmp_path / "h.sqlite3", tmp_path / "m.prom"
    argv = ["drift", "--from-snapshot", str(snapshot), "--history", str(db)]
    code, report, err = reconcile(capsys, *argv, "--metrics", str(metrics), root=root)
    # spark-1's and orin-2's files are no collector's answers (json reads them, the replay
    # refuses them): those boxes are not observed (exit 1), and neither their files nor their
    # times are recorded (test_observe_review_fixes.py: only what the replay took).
    assert code == 1 and "spark-1: not observed" in report, err
    refused = ("spark-1", "orin-2")
    files = sorted(p for p in snapshot.glob("*.json") if p.stem not in ("index", *refused))
    assert len(files) == LARGE - 2
    with store.opened(db, create=False) as conn:
        (run,) = store.runs(conn)
        observed = store.observations_of(conn, run.id)
    assert observed.keys() == {p.stem for p in files}
    for path in files:
        assert observed[path.stem] == json.loads(path.read_text()), path.name
    # Every observed box's collector time is in the metrics, as the file says it.
    timed = re.compile(r'^fleet_drift_box_collect_duration_seconds\{box="([^"]+)"\} (\S+)$', re.M)
    seconds = {box: float(value) for box, value in timed.findall(metrics.read_text())}
    assert not set(refused) & set(seconds)
    for path in files:
        total = json.loads(path.read_text())["collected"]["timings_ms"]["total"]
        assert seconds[path.stem] == total / 1000


def test_secrets_are_entries_as_stars_and_changed_never_a_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    drift_replay(capsys, db)
    with store.opened(db, create=False) as conn:
        (run,) = store.runs(conn)
        entries = store.entries_of(conn, run.id)
    secret = [e for e in entries if e.secret]
    assert secret, "the incidents hold secret entries (GATEWAY_API_KEY armed from the shell)"
    for e in secret:
        assert "***" in e.desired + e.observed or "null" in e.desired + e.observed
        assert e.changed is not None
    assert not any(HMAC.search(e.desired + e.observed) for e in entries)
    assert not any('"digest"' in e.desired + e.observed for e in entries)


def test_the_history_command_lists_runs_per_box_and_since(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    drift_replay(capsys, db)
    code, _, _ = reconcile(
        capsys,
        "audit",
        "--from-snapshot",
        str(AUDIT_FIXTURES / "key_armed_from_login_shell"),
        "--history",
        str(db),
        root=ROOT,
    )
    assert code == 2
    code, out, _ = reconcile(capsys, "history", "--history", str(db))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["#", "started", "(UTC)"]
    drift_line, audit_line = lines[1].split(), lines[2].split()
    assert drift_line[0] == "1" and "drift" in drift_line and "3/3" in drift_line
    assert "10" in drift_line and "54" in drift_line  # causes, entries (examples README)
    assert audit_line[0] == "2" and "audit" in audit_line and "fail" in audit_line
    code, out, _ = reconcile(capsys, "history", "spark", "--history", str(db), "--format", "json")
    runs = json.loads(out)["runs"]
    assert [r["command"] for r in runs] == ["drift"]  # the audit scenario is thor's alone
    assert [b["box"] for b in runs[0]["boxes"]] == ["spark"]
    code, out, _ = reconcile(capsys, "history", "thor", "--history", str(db), "--format", "json")
    assert [r["command"] for r in json.loads(out)["runs"]] == ["drift", "audit"]
    code, out, _ = reconcile(capsys, "history", "--history", str(db), "--since", "1h")
    assert "2 runs" in out
    code, out, _ = reconcile(capsys, "history", "--history", str(db), "--since", "2100-01-01")
    assert out.startswith("no runs since 2100-01-01 (2 recorded in ")  # not "no runs recorded"


def test_a_live_store_is_never_inside_the_fleet_repository(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inside = INCIDENTS / "history.sqlite3"
    code, out, err = reconcile(
        capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--history", str(inside)
    )
    assert code == 1 and out == ""
    assert "inside the fleet repository" in err
    assert not inside.exists()
    with pytest.raises(ValueError, match="inside the fleet repository"):
        history_path(str(tmp_path / "repo" / "x.db"), tmp_path / "repo")
    assert history_path(str(tmp_path / "x.db"), tmp_path / "repo") == tmp_path / "x.db"


def test_a_store_under_a_file_is_refused_before_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Guard: a --history path under a file was refused only after every box was replayed
    (or observed), as a warning, exit 2; it is a bad option, said first, exit 1."""
    blocker = tmp_path / "plain-file"
    blocker.write_text("not a directory\n")
    target = blocker / "sub" / "history.sqlite3"
    report = tmp_path / "report.json"
    code, out, err = reconcile(
        capsys,
        "drift",
        "--from-snapshot",
        str(SNAPSHOT),
        "--history",
        str(target),
        "--format",
        "json",
        "-o",
        str(report),
    )
    assert code == 1 and out == ""
    assert f"{blocker} is not a directory" in err
    assert not report.exists()  # nothing replayed
    assert blocker.read_text() == "not a directory\n"
    # A missing directory is still made by the store (prepare), so it is no error here.
    assert history_path(str(tmp_path / "new" / "h.db"), None) == tmp_path / "new" / "h.db"


def test_the_default_is_the_users_state_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", "/srv/state")
    assert default_path() == Path("/srv/state/fleet-reconciler/history.sqlite3")
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")  # the XDG spec: ignore it
    monkeypatch.setenv("HOME", "/home/op")
    assert default_path() == Path("/home/op/.local/state/fleet-reconciler/history.sqlite3")


def test_a_replay_without_history_path_and_no_history_record_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    reconcile(capsys, "drift", "--from-snapshot", str(SNAPSHOT))
    assert not (tmp_path / "state").exists()  # a replay is not a new observation
    db = tmp_path / "h.sqlite3"
    with pytest.raises(SystemExit):  # one or the other (review 8: it silently recorded nothing)
        drift_replay(capsys, db, "--no-history")
    assert not db.exists()


def test_retention_by_count_and_by_age(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "h.sqlite3"
    for _ in range(4):
        drift_replay(capsys, db)
    code, _, err = reconcile(capsys, "history", "--history", str(db), "--keep", "2")
    assert code == 0 and "2 runs removed" in err
    with store.opened(db, create=False) as conn:
        assert [r.id for r in store.runs(conn)] == [3, 4]
        # what the removed runs held went with them (foreign keys, ON DELETE CASCADE)
        left = conn.execute("SELECT DISTINCT run FROM entries ORDER BY run").fetchall()
        assert left == [(3,), (4,)]
        conn.execute("UPDATE runs SET started = started - 40 * 86400 WHERE id = 3")
    drift_replay(capsys, db)  # recording applies the store's retention (keep 2, 30 days)
    with store.opened(db, create=False) as conn:
        assert [r.id for r in store.runs(conn)] == [4, 5]
        assert store.retention(conn) == (2, store.DEFAULT_KEEP_DAYS, store.DEFAULT_KEEP_MB)


def test_retention_by_count_keeps_exactly_that_many_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """At the count the store keeps nothing is removed; one run past it removes the oldest
    (the count is read before the runs are: _apply_retention)."""
    db = tmp_path / "h.sqlite3"
    drift_replay(capsys, db)
    code, _, _ = reconcile(capsys, "history", "--history", str(db), "--keep", "3")
    assert code == 0
    for _ in range(2):
        drift_replay(capsys, db)
    with store.opened(db, create=False) as conn:
        assert [r.id for r in store.runs(conn)] == [1, 2, 3]
    drift_replay(capsys, db)
    with store.opened(db, create=False) as conn:
        assert [r.id for r in store.runs(conn)] == [2, 3, 4]


def test_retention_by_size_keeps_the_newest_runs_within_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store keeps the newest runs whose sizes add up to at most --max-mb; what a removed
    run held goes with it, and the run just recorded stays even alone past the limit (a
    1,000-box replay keeps ~77 MB: without the limit, 1,000 of them would be ~77 GB)."""
    db = tmp_path / "h.sqlite3"
    for _ in range(3):
        drift_replay(capsys, db)
    with store.opened(db, create=False) as conn:
        sizes = [r for (r,) in conn.execute("SELECT size FROM run_sizes ORDER BY run")]
        measured = conn.execute(
            "SELECT length(r.report) + length(summary) + (SELECT sum(length(document)) FROM "
            "observations WHERE run = 1) + (SELECT sum(length(desired) + length(observed) + "
            "length(subject) + length(path)) FROM entries WHERE run = 1) FROM runs JOIN "
            "run_reports AS r ON r.run = runs.id WHERE id = 1"
        ).fetchone()[0]
    # Each run measured as it was recorded: what a query of its rows measures.
    assert sizes[0] == measured and all(size > 10_000 for size in sizes)
    with store.opened(db, create=False) as conn:
        # Runs as large as a big fleet's (the fixture's are ~70 KB, the limit counts MB).
        conn.execute("UPDATE run_sizes SET size = 490000")
    # Room for the newest two runs and not three: the oldest goes, with its rows.
    code, _, err = reconcile(capsys, "history", "--history", str(db), "--max-mb", "1")
    assert code == 0 and "1 runs removed" in err
    with store.opened(db, create=False) as conn:
        assert [r.id for r in store.runs(conn)] == [2, 3]
        left = conn.execute("SELECT DISTINCT run FROM observations ORDER BY run").fetchall()
        assert left == [(2,), (3,)]
        assert store.retention(conn)[2] == 1
    drift_replay(capsys, db)  # recording applies it: run 4 (~70 KB) pushes run 2 out
    with store.opened(db, create=False) as conn:
        assert [r.id for r in store.runs(conn)] == [3, 4]
        conn.execute("UPDATE run_sizes SET size = 5000000 WHERE run = 4")  # alone past it
    code, _, err = reconcile(capsys, "history", "--history", str(db), "--max-mb", "1")
    with store.opened(db, create=False) as conn:
        assert [r.id for r in store.runs(conn)] == [4], "the newest run always stays"
    code, _, err = reconcile(capsys, "history", "--history", str(db), "--max-mb", "0")
    for _ in range(2):
        drift_replay(capsys, db)
    with store.opened(db, create=False) as conn:  # 0: no limit of that kind
        assert [r.id for r in store.runs(conn)] == [4, 5, 6]


def test_a_version_2_store_gains_sizes_without_its_runs_being_rewritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Migration 3 adds the sizes' own table and measures no run recorded before (that would
    read and rewrite every stored report under the write lock): the size limit never removes
    those runs (the count and age limits do), and counts every run recorded since."""
    db = tmp_path / "h.sqlite3"
    for _ in range(2):
        drift_replay(capsys, db)
    as_version(db, 2)
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT OR REPLACE INTO settings VALUES ('keep_mb', 1)")
    conn.close()
    reports = _reports(db)
    for _ in range(2):
        drift_replay(capsys, db)  # migrates, then records under a 1 MB limit
    with store.opened(db, create=False) as conn:
        (version,) = conn.execute("SELECT version FROM schema_version").fetchone()
        measured = [r for (r,) in conn.execute("SELECT run FROM run_sizes ORDER BY run")]
        assert [r.id for r in store.runs(conn)] == [1, 2, 3, 4]
        conn.execute("UPDATE run_sizes SET size = 900000")  # as large as a big fleet's
    assert version == VERSION == 5 and measured == [3, 4]
    assert _reports(db)[:2] == reports, "the runs recorded before are as they were"
    drift_replay(capsys, db)  # run 5 (~70 KB) and run 4 (0.9 MB) pass 1 MB: run 3 goes
    with store.opened(db, create=False) as conn:
        assert [r.id for r in store.runs(conn)] == [1, 2, 4, 5]


def _reports(db: Path) -> list[str]:
    return stored_reports(db)


def test_a_store_from_a_newer_reconciler_is_refused_not_touched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    drift_replay(capsys, db)
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO schema_version VALUES (?)", (VERSION + 1,))
    conn.close()
    code, out, err = reconcile(capsys, "history", "--history", str(db))
    assert (code, out) == (1, "") and "newer than this reconciler" in err
    code, out, err = reconcile(
        capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--history", str(db)
    )
    # Known before the run: refused first (review 8: after it, a warning and exit 2).
    assert (code, out) == (1, "") and "newer than this reconciler" in err


def test_an_old_store_is_migrated_on_open(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite3"
    with sqlite3.connect(db) as conn:  # a store as an older reconciler left it: no tables
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.close()
    with store.opened(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"runs", "boxes", "entries", "findings", "observations", "settings"} <= tables


def test_a_file_that_is_not_a_store_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    db.write_bytes(b"not a database at all" * 100)
    code, _, err = reconcile(capsys, "history", "--history", str(db))
    assert code == 1 and "not a usable store" in err
    code, out, _ = reconcile(capsys, "history", "--history", str(tmp_path / "none.db"))
    assert (code, out.startswith("no runs recorded")) == (0, True)
    assert not (tmp_path / "none.db").exists()  # listing creates no store


# A value the store wrote that no longer reads back (bit rot, a hand edit), or one of another
# type than it wrote (SQLite keeps whatever a column is given): the command says which, naming
# the store, exits 1 and writes nothing; the drift page, which only adds a trend, goes without.
DAMAGE = {
    "a run's summary": (
        "UPDATE runs SET summary = '{\"causes\": ' WHERE id = 1",
        ["history"],
        "run 1's summary is not the JSON it stored",
    ),
    "an observation": (
        "UPDATE observations SET document = X'00ff' WHERE run = 2 AND box = 'thor'",
        ["diff"],
        "run 2's observation of 'thor' is not the JSON it stored",
    ),
    "an entry's value": (
        "UPDATE entries SET desired = '[' || desired WHERE rowid = (SELECT min(rowid)"
        " FROM entries WHERE run = 1 AND secret = 0)",
        ["diff", "1", "2"],
        "run 1's entry 1 (its desired value) is not the JSON it stored",
    ),
    "a retention setting that is text": (
        "INSERT INTO settings VALUES ('keep_runs', 'abc')",
        ["history", "--days", "5"],
        "the keep_runs setting is not the whole number it stored",
    ),
    "a retention setting past any integer": (
        "INSERT INTO settings VALUES ('keep_days', '9e999')",  # INTEGER affinity: an inf REAL
        ["history", "--keep", "5"],
        "the keep_days setting is not the whole number it stored",
    ),
    "a schema version that is text": (
        "UPDATE schema_version SET version = 'abc'",
        ["history"],
        "the schema version is not the whole number it stored",
    ),
    "a schema version past any integer": (
        "UPDATE schema_version SET version = '9e999'",
        ["diff"],
        "the schema version is not the whole number it stored",
    ),
    "a run's duration": (
        "UPDATE runs SET duration_s = 'x' WHERE id = 1",
        ["history"],
        "run 1's duration is not the number of seconds it stored",
    ),
    "a run's duration, listed as JSON": (
        "UPDATE runs SET duration_s = 'x' WHERE id = 2",
        ["history", "--format", "json"],
        "run 2's duration is not the number of seconds it stored",
    ),
    "a run's summary of another shape": (
        "UPDATE runs SET summary = '[1,2]' WHERE id = 2",
        ["history"],
        "run 2's summary is not the JSON object it stored",
    ),
    "a box's count": (
        "UPDATE boxes SET entries = 'x' WHERE run = 1 AND box = 'thor'",
        ["history", "thor"],
        "run 1's box 'thor' (its entry count) is not the whole number it stored",
    ),
    "a run's start time as a BLOB": (
        "UPDATE runs SET started_at = X'ff' WHERE id = 1",
        ["history"],
        "run 1's start time is not the text it stored",
    ),
    "a run id as a BLOB": (
        "UPDATE runs SET run_id = X'00ff' WHERE id = 2",
        ["history", "--format", "json"],
        "run 2's run id is not the text it stored",
    ),
}


def dump(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_value_in_the_store_is_said_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    damage, command, what = DAMAGE[case]
    db = tmp_path / "h.sqlite3"
    drift_replay(capsys, db)
    drift_replay(capsys, db)
    with sqlite3.connect(db) as conn:
        assert conn.execute(damage).rowcount == 1
    conn.close()
    before = dump(db)
    code, out, err = reconcile(capsys, *command, "--history", str(db))
    assert (code, out) == (1, "")
    assert err == f"error: history: {db} is damaged: {what}\n"
    assert dump(db) == before  # --keep/--days too: their change is rolled back


@pytest.mark.parametrize(
    "damage",
    [
        "INSERT INTO settings VALUES ('keep_runs', 'abc')",
        "INSERT INTO settings VALUES ('keep_days', '9e999')",
        "UPDATE schema_version SET version = 'abc'",
    ],
)
def test_a_run_recorded_into_a_damaged_store_is_a_warning_and_not_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    db = tmp_path / "h.sqlite3"
    drift_replay(capsys, db)
    with sqlite3.connect(db) as conn:
        conn.execute(damage)
    conn.close()
    before = dump(db)
    code, out, err = reconcile(
        capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--history", str(db)
    )
    if "schema_version" in damage:  # a reader meets it too: refused before the run
        assert (code, out) == (1, "")
        assert err.startswith(f"error: history: {db} is")
    else:  # only the record meets it: the report's exit code, the store's trouble a warning
        assert code == 2
        assert err.startswith(f"warning: the run was not recorded in the history: history: {db} is")
    assert "is damaged: " in err and "Traceback" not in err
    assert dump(db) == before


def test_an_observation_that_unpacks_past_any_snapshot_file_is_damaged_not_unpacked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A few hundred KB of zlib can unpack to gigabytes: an observation is unpacked up to the
    largest snapshot file, no further (tracemalloc: Python's peak stays near that bound)."""
    import tracemalloc
    import zlib

    from reconciler.observe.observe import SNAPSHOT_FILE_LIMIT

    db = tmp_path / "h.sqlite3"
    drift_replay(capsys, db)
    drift_replay(capsys, db)
    packer, block = zlib.compressobj(1), b" " * (1 << 20)
    bomb = b"".join(packer.compress(block) for _ in range(8 * SNAPSHOT_FILE_LIMIT >> 20))
    bomb += packer.flush()  # 128 MiB of spaces, in about 1 MB
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE observations SET document = ? WHERE run = 2 AND box = 'thor'", (bomb,))
    conn.close()
    del bomb
    tracemalloc.start()
    try:
        code, out, err = reconcile(capsys, "diff", "1", "2", "--history", str(db))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * SNAPSHOT_FILE_LIMIT  # unpacked whole, it was 8 times that and more
    assert (code, out) == (1, "")
    assert err == (
        f"error: history: {db} is damaged: run 2's observation of 'thor' is not the JSON it "
        f"stored (it unpacks to more than {SNAPSHOT_FILE_LIMIT} bytes)\n"
    )


def test_a_store_whose_tables_are_not_this_schemas_is_said_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    with sqlite3.connect(db) as conn:  # at this version, with a runs table of its own
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO schema_version VALUES (?)", (VERSION,))
        conn.execute("CREATE TABLE runs (started TEXT, what TEXT)")
    conn.close()
    code, out, err = reconcile(capsys, "history", "--history", str(db))
    assert (code, out) == (1, "")
    assert err == f"error: history: {db} is not a usable store (no such column: id)\n"


def test_a_retention_too_large_for_the_store_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    drift_replay(capsys, db)
    huge = "99999999999999999999999"
    for option in ("--keep", "--days"):
        with pytest.raises(SystemExit) as exited:
            reconcile(capsys, "history", "--history", str(db), option, huge)
        assert exited.value.code == 1  # a usage error
        err = capsys.readouterr().err
        assert f"expected a whole number from 0 to {2**63 - 1}, got '{huge}'" in err
    code, _, err = reconcile(capsys, "history", "--history", str(db), "--keep", str(2**63 - 1))
    assert (code, err) == (0, "retention set; 0 runs removed\n")  # the largest is kept


@pytest.mark.parametrize("ref", ["99999999999999999999999", "\u00b2"])  # past SQLite; a "digit"
def test_a_run_number_that_is_no_run_number_is_no_single_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ref: str
) -> None:
    db = tmp_path / "h.sqlite3"
    drift_replay(capsys, db)
    drift_replay(capsys, db)
    code, out, err = reconcile(capsys, "diff", ref, "1", "--history", str(db))
    assert (code, out) == (1, "")
    assert err == f"error: no single run {ref!r} in {db} (a number or a run id)\n"


def test_the_drift_page_goes_without_its_trend_when_the_store_is_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    drift_replay(capsys, db)
    drift_replay(capsys, db)
    page = reconcile(capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--format", "html",
                     "--history", str(db))  # fmt: skip
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE boxes SET entries = 'many' WHERE box = 'thor'")
    code, out, err = reconcile(capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--format",
                               "html", "--history", str(db))  # fmt: skip
    assert (code, "Traceback" in err) == (page[0], False)
    assert out.startswith("<!DOCTYPE html>") and "<svg" in page[1] and "<svg" not in out


def test_since_accepts_dates_and_ages_and_says_what_it_wanted() -> None:
    assert parse_since("90m", now=10_000.0) == 10_000.0 - 5400
    assert parse_since("2d", now=200_000.0) == 200_000.0 - 172_800
    assert parse_since("1970-01-02") == 86400.0
    assert parse_since("1970-01-01T01:00Z") == 3600.0
    with pytest.raises(ValueError, match="an age"):
        parse_since("yesterday")


def test_the_store_is_private_even_under_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        db = tmp_path / "new" / "h.sqlite3"
        with store.opened(db):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700


def test_a_run_without_history_or_metrics_imports_neither(tmp_path: Path) -> None:
    """The repeated drift's budget: sqlite3, deepdiff and prometheus_client are imported only
    by a run that records or writes metrics, and then after its report is printed."""
    code = (
        "import sys\n"
        "from reconciler import cli\n"
        f"cli.main(['--root', {str(INCIDENTS)!r}, '-i', 'lab', 'drift', '--from-snapshot',\n"
        f"          {str(SNAPSHOT)!r}, '--no-history'])\n"
        "heavy = ('sqlite3', 'deepdiff', 'prometheus_client')\n"
        "print(sorted(m for m in heavy if m in sys.modules), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
    assert "drift:" in done.stdout  # the report was printed


def test_a_reader_in_a_transaction_does_not_block_a_run_being_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """WAL: a dashboard or `reconcile history` reading the store never holds a run up."""
    db = tmp_path / "h.sqlite3"
    drift_replay(capsys, db)
    reader = sqlite3.connect(db, timeout=0.1, isolation_level=None)
    try:
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM runs").fetchone() == (1,)
        started = time.monotonic()
        drift_replay(capsys, db)  # recorded while the reader's snapshot is open
        assert time.monotonic() - started < store.BUSY_TIMEOUT_S / 2
        assert reader.execute("SELECT count(*) FROM runs").fetchone() == (1,)  # its snapshot
        reader.execute("COMMIT")
        assert reader.execute("SELECT count(*) FROM runs").fetchone() == (2,)
    finally:
        reader.close()


def _pieces_run(report: object) -> object:
    from reconciler.history.record import RunRecord

    summary = {"exit_code": 0}
    return RunRecord("r", "drift", "snapshot", "t", time.time(), 0.1, "lab", 0, summary, report, ())


def test_a_report_given_in_pieces_is_stored_as_the_text_they_make(tmp_path: Path) -> None:
    """A large replay's report is written into its row piece by piece (never joined, nor bound
    whole: issue 12), as the UTF-8 bytes of the same text a document given whole makes; the
    view run_reports reads either as TEXT (what sqlite3 and json_extract read), its size
    counted in characters as before."""
    from reconciler.history.record import ReportText

    pieces = ['{"boxes": [', '"é ✓ \u2028"', ", 1" * 50_000, "]}"]
    path = tmp_path / "h.sqlite3"
    with store.opened(path) as conn:
        store.record(conn, _pieces_run(ReportText(pieces)))  # type: ignore[arg-type]
        store.record(conn, _pieces_run({"boxes": ["é ✓ \u2028"]}))  # type: ignore[arg-type]
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT typeof(report), report, json_extract(report, '$.boxes[0]'), size"
            " FROM run_reports JOIN run_sizes USING (run) ORDER BY run"
        ).fetchall()
        kept = conn.execute("SELECT report, typeof(report_utf8) FROM runs ORDER BY id").fetchall()
    whole = "".join(pieces)
    assert rows[0][:3] == ("text", whole, "é ✓ \u2028")
    assert rows[1][0] == "text" and rows[1][2] == "é ✓ \u2028"
    assert kept == [("", "blob")] * 2
    # The size counts characters (a text's), the same for a report given whole.
    assert rows[0][3] - rows[1][3] == len(whole) - len(
        json.dumps({"boxes": ["é ✓ \u2028"]}, ensure_ascii=False)
    )


_HOLDS = """
import resource, sys, time
from pathlib import Path
from reconciler.history import store
from reconciler.history.record import ReportText, RunRecord

piece = "x" * (1 << 20)  # 64 pieces of one string: the report itself takes 1 MB here
pieces = ['{"boxes": ["', *([piece] * 64), '"]}']
report, summary = ReportText(pieces), {"exit_code": 0}
run = RunRecord("r", "drift", "snapshot", "t", time.time(), 0.1, "lab", 0, summary, report, ())
with store.opened(Path(sys.argv[1])) as conn:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    store.record(conn, run)
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    (size,) = conn.execute("SELECT length(report_utf8) FROM runs").fetchone()
print(grew // 1024, size)
"""


def test_a_report_in_pieces_is_never_held_whole_while_it_is_stored(tmp_path: Path) -> None:
    """A 64 MB report given in pieces (a large replay's, issue 12) is stored with the process's
    peak memory growing by a fraction of it: neither the reconciler nor SQLite holds it whole
    (bound whole, or written into `report` and cast, the peak grew by about twice its size)."""
    done = subprocess.run(
        [sys.executable, "-c", _HOLDS, str(tmp_path / "h.sqlite3")],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    grew_mb, size = map(int, done.stdout.split())
    assert size == 64 * (1 << 20) + len('{"boxes": [""]}')
    assert grew_mb < 16, f"storing a 64 MB report grew the peak by {grew_mb} MB"


def test_the_report_bytes_are_the_last_column_of_runs(tmp_path: Path) -> None:
    """Only a zeroblob at a record's end stays implicit: were a column added after
    `report_utf8`, SQLite would make each report's room whole in memory before its pieces are
    written (migrations.py, 5)."""
    with store.opened(tmp_path / "h.sqlite3") as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(runs)")]
    assert columns[-1] == "report_utf8"


def test_a_report_piece_that_is_not_utf8_records_nothing(tmp_path: Path) -> None:
    from reconciler.history.record import ReportText

    path = tmp_path / "h.sqlite3"
    with store.opened(path) as conn:
        with pytest.raises(UnicodeEncodeError):
            store.record(conn, _pieces_run(ReportText(["{", '"\ud800"', "}"])))  # type: ignore[arg-type]
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_a_report_in_pieces_into_a_utf16_store_is_the_same_text(tmp_path: Path) -> None:
    """A store made UTF-16 (an existing empty database the tool adopts): the pieces are bound
    as one text, since their UTF-8 bytes cast to TEXT would be read as UTF-16."""
    from reconciler.history.record import ReportText

    path = tmp_path / "h.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA encoding = 'UTF-16le'")
        conn.execute("CREATE TABLE t (x)")
        conn.execute("DROP TABLE t")
    pieces = ['{"boxes": [', '"é ✓"', "]}"]
    with store.opened(path) as conn:
        store.record(conn, _pieces_run(ReportText(pieces)))  # type: ignore[arg-type]
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA encoding").fetchone() == ("UTF-16le",)
        assert conn.execute("SELECT report, report_utf8 FROM runs").fetchone() == (
            "".join(pieces),
            None,
        )
        assert conn.execute("SELECT report FROM run_reports").fetchone() == ("".join(pieces),)
