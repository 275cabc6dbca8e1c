"""The box-side converge (reconciler/apply/remote/converge.py) after a review, driven whole
against a temp home and a fake docker engine (converge_harness):

- a new snapshot id sorts after every existing one (clock stepped back, the same second), and
  prune never deletes this run's snapshot nor the only copy its restore list needs, and runs
  only once the work (or its rollback) is over;
- once a snapshot is taken every result names it: a status that cannot be written after the
  work (or a rollback) completed is a warning, never a failure;
- a key listed twice in env_keys is refused before anything runs;
- a rollback counts a container missing or extra as unequal, and lists only what it recreated;
- a listing holding the lock for a moment does not refuse a converge;
- SIGTERM / SIGINT fail a converge where it is, so it rolls back (SIGHUP stays ignored).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import load_box_program
from tests.unit.converge_harness import (
    Engine,
    converge_payload,
    meta,
    run_events,
    snapshot_dirs,
)
from tests.unit.converge_helpers import deployment

converge = load_box_program("box_converge_review_fixes", "reconciler/apply/remote/converge.py")


@pytest.fixture
def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return deployment(tmp_path, monkeypatch, "FOO=1\n") / ".lobes"


def engine(monkeypatch: pytest.MonkeyPatch, deploy: Path, *services: str) -> Engine:
    return Engine(monkeypatch, converge, deploy, services or ("vllm-worker", "gateway"))


def gateway_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(converge, "gateway_problems", lambda box, deadline=None: ["down"])


def result(p: dict[str, Any]) -> dict[str, Any]:
    _, events = run_events(converge, p)
    assert events[-1]["event"] == "result"
    return events[-1]


# -- 1. snapshot ids and prune ---------------------------------------------------------------------
def test_a_snapshot_taken_with_the_clock_behind_sorts_last_and_a_failing_converge_rolls_back(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine(monkeypatch, deploy)
    root = deploy / ".fleet" / "snapshots"
    for sid in ("20991231T235958Z", "20991231T235959Z"):  # taken while the clock ran ahead
        taken = result(converge_payload())["snapshot"]
        os.rename(root / taken, root / sid)
    gateway_fails(monkeypatch)
    r = result(converge_payload(managed_env={"FOO": "9"}, keep=2))
    assert r["snapshot"] == "20991231T235959Z-2"
    assert r["rollback"]["ok"] is True
    assert (deploy / ".env").read_text() == "FOO=2\n"
    assert snapshot_dirs(deploy) == ["20991231T235959Z", "20991231T235959Z-2"]


def test_ten_converges_within_one_second_keep_the_newest_and_roll_back_to_it(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine(monkeypatch, deploy)
    frozen = converge.time.gmtime()
    monkeypatch.setattr(converge.time, "gmtime", lambda *a: frozen)
    for i in range(1, 11):
        result(converge_payload(managed_env={"FOO": str(i)}, keep=2))
    base = converge.time.strftime("%Y%m%dT%H%M%SZ", frozen)
    assert converge.list_snapshots(converge.Box(converge_payload())) == [
        f"{base}-9",
        f"{base}-10",
    ]
    gateway_fails(monkeypatch)
    r = result(converge_payload(managed_env={"FOO": "11"}, keep=2))
    assert r["snapshot"] == f"{base}-11" and r["rollback"]["ok"] is True
    assert (deploy / ".env").read_text() == "FOO=10\n"


def test_prune_never_deletes_the_snapshot_it_is_told_to_protect(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine(monkeypatch, deploy)
    root = deploy / ".fleet" / "snapshots"
    for sid in ("20300101T000000Z", "20300101T000001Z", "20200101T000000Z"):
        (root / sid).mkdir(parents=True)
    box = converge.Box(converge_payload())
    converge.prune(box, 1, protect={"20200101T000000Z"})
    assert snapshot_dirs(deploy) == ["20200101T000000Z", "20300101T000001Z"]


# -- 5. prune after the restore; the copy a restore needs is kept ---------------------------------
def test_prune_runs_after_the_restore_that_needs_an_old_copy_and_keeps_that_copy(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine(monkeypatch, deploy)
    sha = hashlib.sha256((deploy / "docker-compose.yml").read_bytes()).hexdigest()
    first = result(converge_payload(managed_env={"FOO": "2"}, keep=2))["snapshot"]
    (deploy / "docker-compose.yml").write_text("services: {v: 2}\n")
    result(converge_payload(managed_env={"FOO": "3"}, keep=2))
    restore = [{"name": "docker-compose.yml", "sha256": sha}]
    r = result(converge_payload(managed_env={"FOO": "3"}, keep=2, restore=restore))
    assert r["ok"], r
    assert hashlib.sha256((deploy / "docker-compose.yml").read_bytes()).hexdigest() == sha
    assert first in snapshot_dirs(deploy)  # the only other copy of the pin
    assert r["snapshot"] in snapshot_dirs(deploy)


# -- 3. a status that cannot be written is a warning -----------------------------------------------
def test_an_applied_status_that_cannot_be_written_keeps_ok_and_the_snapshot_id(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine(monkeypatch, deploy)
    real = converge.set_status

    def full(box: Any, sid: str, status: str, **more: Any) -> None:
        if status == "applied":
            raise OSError(errno.ENOSPC, "No space left on device", "meta.json")
        real(box, sid, status, **more)

    monkeypatch.setattr(converge, "set_status", full)
    code, events = run_events(converge, converge_payload(managed_env={"FOO": "2"}))
    announced = [e["id"] for e in events if e["event"] == "snapshot"]
    assert code == 0 and events[-1]["ok"] is True
    assert events[-1]["snapshot"] == announced[0]
    assert any("could not record its status applied" in e.get("message", "") for e in events)


def test_a_completed_rollback_whose_status_cannot_be_written_is_reported_done(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine(monkeypatch, deploy)
    sid = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    real = converge.set_status

    def full(box: Any, sid: str, status: str, **more: Any) -> None:
        if status == "rolled-back":
            raise OSError(errno.ENOSPC, "No space left on device", "meta.json")
        real(box, sid, status, **more)

    monkeypatch.setattr(converge, "set_status", full)
    r = result(converge_payload("rollback", snapshot=sid))
    assert r["ok"] is True and r["snapshot"] == sid
    assert (deploy / ".env").read_text() == "FOO=1\n"


# -- 8. env_keys listed twice ----------------------------------------------------------------------
def test_a_key_listed_twice_in_env_keys_is_refused_before_anything(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine(monkeypatch, deploy)
    p = converge_payload(managed_env={"NEW": "v"}, env_keys=["NEW", "NEW"])
    with pytest.raises(converge.Failed, match=r"env_keys\[1\]: NEW is listed twice"):
        converge.validate_payload(p)
    r = result(p)
    assert r["ok"] is False and "listed twice" in r["failed"]
    assert (deploy / ".env").read_text() == "FOO=1\n"
    assert not (deploy / ".fleet").exists()


# -- 2. a rollback's config_equal counts missing and extra containers -----------------------------
def test_a_rollback_reports_a_container_missing_since_the_snapshot_as_unequal(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = engine(monkeypatch, deploy, "vllm-worker", "extra", "gateway")
    sid = result(converge_payload(managed_env={"FOO": "1"}))["snapshot"]
    eng.c.pop("extra")  # removed by hand since the snapshot
    r = result(converge_payload("rollback", snapshot=sid))
    assert r["config_equal"] is False and r["unequal"] == ["extra"]


def test_an_operator_rollback_removes_a_container_the_converge_created_and_recreates_none(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = engine(monkeypatch, deploy)
    sid = result(converge_payload(managed_env={"FOO": "1"}, services=["extra"]))["snapshot"]
    assert "extra" in eng.c
    r = result(converge_payload("rollback", snapshot=sid))
    assert r["ok"] is True
    # Recorded as made by the converge (its snapshot's `made`), absent at the snapshot: gone.
    assert r["removed_containers"] == ["extra"] and "extra" not in eng.c
    assert r["config_equal"] is True and r["unequal"] == []
    assert r["recreated"] == []  # it had no container in the snapshot: nothing recreated
    assert meta(deploy, sid)["rollback"]["recreated"] == []


def test_a_rollback_that_restores_everything_stays_config_equal(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine(monkeypatch, deploy)
    gateway_fails(monkeypatch)
    r = result(converge_payload(managed_env={"FOO": "2"}, services=["gateway"]))
    assert r["rollback"]["ok"] is True and r["rollback"]["config_equal"] is True
    assert r["rollback"]["unequal"] == []


# -- 7. a listing's moment under the lock ----------------------------------------------------------
def _hold_lock(deploy: Path, how: int, seconds: float | None) -> int:
    fd = os.open(deploy / ".fleet" / "lock", os.O_RDWR)
    fcntl.flock(fd, how | fcntl.LOCK_NB)
    if seconds is not None:
        threading.Timer(seconds, os.close, (fd,)).start()
    return fd


def test_a_lock_held_for_a_moment_by_a_listing_does_not_refuse_a_converge(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine(monkeypatch, deploy)
    result(converge_payload())  # .fleet/lock exists
    _hold_lock(deploy, fcntl.LOCK_SH, 0.3)
    r = result(converge_payload("mark-good"))
    assert r["ok"] is True, r


def test_a_lock_still_held_after_the_wait_is_refused_as_locked(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine(monkeypatch, deploy)
    result(converge_payload())
    fd = _hold_lock(deploy, fcntl.LOCK_EX, None)
    try:
        r = result(converge_payload(managed_env={"FOO": "3"}))
        listed = result(converge_payload("snapshots"))
    finally:
        os.close(fd)
    assert r["ok"] is False and r["failed"].startswith("locked: another converge")
    assert (deploy / ".env").read_text() == "FOO=2\n"
    assert listed["ok"] is True and listed["lock"] is not None


# -- 4. SIGTERM / SIGINT roll back -----------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_mid_converge_rolls_back_and_a_stop_during_the_rollback_is_ignored(
    deploy: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sig: signal.Signals
) -> None:
    engine(monkeypatch, deploy)
    out = tmp_path / "events"
    pid = os.fork()
    if pid == 0:  # the box program, stopped mid-recreate (and again in its rollback's)
        code = 99
        try:
            monkeypatch.setattr(converge, "recreate", lambda *a: os.kill(os.getpid(), sig))
            code, events = run_events(converge, converge_payload(managed_env={"FOO": "2"}))
            out.write_text(json.dumps(events))
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 1
    r = json.loads(out.read_text())[-1]
    assert r["ok"] is False and r["failed"] == f"stopped by {signal.Signals(sig).name}"
    assert r["rollback"]["ok"] is True
    assert (deploy / ".env").read_text() == "FOO=1\n"
    assert meta(deploy, r["snapshot"])["status"] == "rolled-back"


def test_main_ignores_sighup_and_gives_back_the_stop_handlers(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine(monkeypatch, deploy)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    hup = signal.getsignal(signal.SIGHUP)
    try:
        assert result(converge_payload())["ok"] is True
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    finally:
        signal.signal(signal.SIGHUP, hup)


def test_a_rollback_to_an_older_snapshot_marks_every_later_converge_undone(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rolling back to the first of three applied converges undoes the two after it: their
    snapshots say so, instead of staying `applied` as though their changes were on the box."""
    engine(monkeypatch, deploy)
    sids = [result(converge_payload(managed_env={"FOO": v}))["snapshot"] for v in "234"]
    assert [meta(deploy, s)["status"] for s in sids] == ["applied"] * 3
    r = result(converge_payload("rollback", snapshot=sids[0]))
    assert r["ok"] is True, r
    assert (deploy / ".env").read_text() == "FOO=1\n"
    assert [meta(deploy, s)["status"] for s in sids] == ["rolled-back"] * 3
    assert meta(deploy, sids[2])["reason"] == f"undone by the rollback to {sids[0]}"
    # A rollback to a later one puts the first converge's change back, and says so
    assert result(converge_payload("rollback", snapshot=sids[1]))["ok"] is True
    assert (deploy / ".env").read_text() == "FOO=2\n"
    assert meta(deploy, sids[0])["status"] == "applied"
    assert meta(deploy, sids[0])["reason"] == f"redone by the rollback to {sids[1]}"


def test_a_rollback_to_a_later_snapshot_redoes_the_converges_an_earlier_rollback_undid(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Back to s1 (undoing s1..s3), then to s3: the box is as s3 found it, s1's and s2's
    changes in it, so they are `applied` again (and kept from pruning as the newest applied);
    a converge undone before the snapshot rolled back to was taken stays undone."""
    engine(monkeypatch, deploy)
    s = [result(converge_payload(managed_env={"FOO": v}))["snapshot"] for v in "2345"]
    assert result(converge_payload("rollback", snapshot=s[1]))["ok"] is True
    assert (deploy / ".env").read_text() == "FOO=2\n"
    assert [meta(deploy, x)["status"] for x in s] == ["applied"] + ["rolled-back"] * 3
    assert result(converge_payload("rollback", snapshot=s[3]))["ok"] is True
    assert (deploy / ".env").read_text() == "FOO=4\n"
    assert [meta(deploy, x)["status"] for x in s] == ["applied"] * 3 + ["rolled-back"]
    assert meta(deploy, s[2])["reason"] == f"redone by the rollback to {s[3]}"
    assert converge.newest_applied(converge.Box(converge_payload("snapshots")), s) == s[2]
    # Undone before the next snapshot was taken: not redone by a rollback to that one.
    assert result(converge_payload("rollback", snapshot=s[1]))["ok"] is True
    s4 = result(converge_payload(managed_env={"FOO": "9"}))["snapshot"]
    assert result(converge_payload("rollback", snapshot=s4))["ok"] is True
    assert (deploy / ".env").read_text() == "FOO=2\n"
    assert [meta(deploy, x)["status"] for x in s] == ["applied"] + ["rolled-back"] * 3
