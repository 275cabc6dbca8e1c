"""A store that cannot be written (a full disk: here a file size limit, RLIMIT_FSIZE, which
makes the store's writes fail as a full disk does, for this one process, unprivileged) is
said as such: `could not be written (...)` with SQLite's own reason. Before, SQLite had
already rolled the failed transaction back, the store's ROLLBACK then failed ("cannot rollback
- no transaction is active"), and that error, hiding the real one, was reported as a damaged
store (`not a usable store`). A recorded run keeps its exit code; `history --keep` exits 1."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.history.store import observations_of, opened
from tests.unit.history_helpers import INCIDENTS, ROOT, SNAPSHOT

# The child lowers its own soft limit (never raised: no privilege needed) and ignores
# SIGXFSZ, so a write past the limit fails with EFBIG instead of killing it.
CHILD = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), hard))
from reconciler import cli
sys.exit(cli.main(sys.argv[2:]))
"""


def limited(limit: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(limit), "--root", str(INCIDENTS), "-i", "lab", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def replayed(db: Path, limit: int) -> subprocess.CompletedProcess[str]:
    return limited(limit, "drift", "--from-snapshot", str(SNAPSHOT), "--history", str(db))


def said_as_a_write_failure(err: str, db: Path) -> None:
    assert f"history: {db} could not be written (" in err, err
    assert "not a usable store" not in err and "rollback" not in err, err


# 20,000: growing the -shm file fails; 40,000: the migrations; 100,000: the run's rows.
@pytest.mark.parametrize("limit", [20_000, 40_000, 100_000])
def test_a_new_store_on_a_full_disk_is_a_write_failure_and_the_run_keeps_its_code(
    tmp_path: Path, limit: int
) -> None:
    db = tmp_path / "h.sqlite3"
    out = replayed(db, limit)
    assert out.returncode == 2, out.stderr  # the replay's drift, as without --history
    assert "warning: the run was not recorded in the history:" in out.stderr
    said_as_a_write_failure(out.stderr, db)
    assert "Traceback" not in out.stderr


def test_a_run_meeting_a_full_disk_leaves_the_stores_runs_as_they_were(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite3"
    assert replayed(db, 1 << 40).returncode == 2  # one run recorded, no limit met
    out = replayed(db, 40_000)  # the next run's pages go past the limit (the file is larger)
    assert out.returncode == 2
    said_as_a_write_failure(out.stderr, db)
    with opened(db, create=False) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
        assert "thor" in observations_of(conn, 1)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_history_keep_on_a_full_disk_is_a_write_failure(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite3"
    for _ in range(3):
        assert replayed(db, 1 << 40).returncode == 2
    out = limited(40_000, "history", "--history", str(db), "--keep", "1")
    assert out.returncode == 1, out.stderr
    said_as_a_write_failure(out.stderr, db)
    with sqlite3.connect(db) as conn:  # nothing removed
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 3
