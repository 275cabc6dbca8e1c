"""A store in a read-only location (a read-only mount, a directory the user cannot write) is
read by `reconcile history` and `reconcile diff`: a store in WAL mode needs its -shm file,
which SQLite cannot create there, so before it was refused as `not a usable store (unable to
open database file)`. With no -wal file beside it no run is writing it (a writer would have to
create one there), so the file alone is read (SQLite's `immutable`). With a -wal file (and no
-shm) it cannot be read there: said as a read-only location, not as damage. A run recorded
there is a write failure in a read-only location.

The location is made read-only for the reconciler's process only: for root (whom no mode
stops) by a read-only bind mount in a private mount namespace (`unshare -m`: nothing outside
the child sees it, and it ends with the child); for any other user by the directory's mode."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.history_helpers import INCIDENTS, ROOT, SNAPSHOT

MOUNT_RO = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'


@pytest.fixture
def location(tmp_path: Path) -> Iterator[Path]:
    """A directory the children of `in_read_only` cannot write."""
    directory = tmp_path / "ro"
    directory.mkdir()
    if os.geteuid() == 0:
        write = ["sh", "-c", '! touch "$0/x"', str(directory)]  # must fail: read-only
        probe = subprocess.run(
            ["unshare", "-m", "sh", "-c", MOUNT_RO, str(directory), *write],
            capture_output=True,
            check=False,
        )
        if probe.returncode != 0 or (directory / "x").exists():
            pytest.skip("no private read-only bind mount here (unshare -m, mount)")
    yield directory
    directory.chmod(0o700)


def reconcile_in(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`reconcile ARGS` in a process for which `directory` is read-only."""
    command = [sys.executable, "-m", "reconciler", "--root", str(INCIDENTS), "-i", "lab", *args]
    if os.geteuid() == 0:
        command = ["unshare", "-m", "sh", "-c", MOUNT_RO, str(directory), *command]
    else:
        directory.chmod(0o555)
    try:
        return subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
        )
    finally:
        directory.chmod(0o700)


def recorded(db: Path, runs: int = 2) -> None:
    """`runs` replays recorded in `db`, written where it may be written."""
    for _ in range(runs):
        replay = ["drift", "--from-snapshot", str(SNAPSHOT), "--history", str(db)]
        out = subprocess.run(
            [sys.executable, "-m", "reconciler", "--root", str(INCIDENTS), "-i", "lab", *replay],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert out.returncode == 2 and not out.stderr, out.stderr
    assert not Path(f"{db}-wal").exists()  # the last writer checkpointed and removed it


def test_history_and_diff_read_a_store_in_a_read_only_location(location: Path) -> None:
    db = location / "h.sqlite3"
    recorded(db)
    out = reconcile_in(location, "history", "--history", str(db))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1].startswith(f"2 runs in {db}")
    out = reconcile_in(location, "diff", "--history", str(db))
    assert (out.returncode, out.stdout.splitlines()[-1]) == (0, "diff: nothing changed"), out
    assert sorted(p.name for p in location.iterdir()) == ["h.sqlite3"]  # nothing written


def test_a_store_with_a_wal_file_in_a_read_only_location_is_said_as_such(
    location: Path,
) -> None:
    db = location / "h.sqlite3"
    recorded(db)
    # A writer that ended without its checkpoint (killed): its -wal stays, with a change.
    writer = (
        "import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "c.execute('PRAGMA wal_autocheckpoint = 0'); "
        "c.execute(\"INSERT OR REPLACE INTO settings VALUES ('keep_runs', 500)\"); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", writer, str(db)], check=True)
    Path(f"{db}-shm").unlink()
    assert Path(f"{db}-wal").stat().st_size > 0
    out = reconcile_in(location, "history", "--history", str(db))
    assert out.returncode == 1
    assert f"history: {db} is in a read-only location, with a -wal file beside it" in out.stderr
    assert "not a usable store" not in out.stderr
    with sqlite3.connect(db) as conn:  # where it can be written, the -wal's change reads
        assert conn.execute("SELECT value FROM settings WHERE name = 'keep_runs'").fetchone()
    conn.close()


def test_a_run_recorded_in_a_read_only_location_is_a_write_failure(location: Path) -> None:
    db = location / "h.sqlite3"
    recorded(db, runs=1)
    for store in (db, location / "new.sqlite3"):
        out = reconcile_in(
            location, "drift", "--from-snapshot", str(SNAPSHOT), "--history", str(store)
        )
        assert out.returncode == 2  # the replay's own code
        assert f"history: {store} could not be written: a read-only location (" in out.stderr
    out = reconcile_in(location, "history", "--history", str(db), "--keep", "1")
    assert out.returncode == 1
    assert f"history: {db} could not be written: a read-only location (" in out.stderr
