"""Two runs recording into one store at the same moment (a drift timer and an operator): the
second waits for the first, and a store held too long is said to be busy, never damaged."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from reconciler.history import store
from tests.unit.history_helpers import SNAPSHOT, reconcile, replay


def _held(db: Path, seconds: float) -> threading.Thread:
    """Another writer holding the store's write lock for `seconds` (BEGIN IMMEDIATE)."""
    ready = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        ready.set()
        time.sleep(seconds)
        conn.execute("COMMIT")
        conn.close()

    thread = threading.Thread(target=hold)
    thread.start()
    ready.wait()
    return thread


def _runs(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])
    finally:
        conn.close()


def test_a_run_waits_for_another_writer_and_is_recorded(capsys: Any, tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)  # the store exists, in WAL mode
    holder = _held(db, 1.0)
    try:
        replay(capsys, db, SNAPSHOT)  # asserts no warning: the run was recorded
    finally:
        holder.join()
    assert _runs(db) == 2


def test_a_new_store_switched_to_wal_waits_too(capsys: Any, tmp_path: Path) -> None:
    """A store another run is creating (still in rollback-journal mode, its write lock held):
    the WAL switch waits with the rest instead of failing at once."""
    db = tmp_path / "h.sqlite3"
    sqlite3.connect(db).close()  # an empty file: a new store
    holder = _held(db, 1.0)
    try:
        replay(capsys, db, SNAPSHOT)
    finally:
        holder.join()
    assert _runs(db) == 1


def test_a_store_held_too_long_is_busy_not_damaged(
    capsys: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    monkeypatch.setattr(store, "BUSY_TIMEOUT_S", 0.2)
    holder = _held(db, 1.5)
    try:
        code, _, err = reconcile(
            capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--history", str(db)
        )
    finally:
        holder.join()
    assert code == 2  # the drift itself is reported whatever the store does
    assert "is busy: another run held it" in err and "not a usable store" not in err
    assert _runs(db) == 1
