"""A rollback that completes on a full disk, where its status cannot be written (meta.json is
rewritten whole), marks its snapshot with an empty file instead (converge.py
ROLLED_BACK_MARK: an inode, no data block), read as `rolled-back`. Left `running`, the next
converge, once the disk had room, refused the box as half converged, and the rollback it
named had nothing left to undo. Every status written later drops the mark first; without
even the mark, the refusal stands and the rollback's note says what to run."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import load_box_program
from tests.unit.converge_harness import (
    Engine,
    converge_payload,
    killed_rollback,
    meta,
    run_events,
    snapshot_dirs,
)
from tests.unit.converge_helpers import deployment

converge = load_box_program("box_review6_full_disk", "reconciler/apply/remote/converge.py")


@pytest.fixture
def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(converge, "_STDOUT_OK", [True])
    return deployment(tmp_path, monkeypatch, "FOO=1\n") / ".lobes"


def full_from(monkeypatch: pytest.MonkeyPatch, first: Any, sticky: bool = True) -> Any:
    """Every atomic_write of data fails with ENOSPC from the first whose path `first` accepts
    on (not `sticky`: only those); an empty file, which needs no data block, is still made.
    The real atomic_write, to put back once there is room."""
    real = converge.atomic_write
    full = [False]

    def write(path: str, data: bytes, mode: int, owner: Any = converge.KEEP) -> None:
        if data and (full[0] or first(path)):
            full[0] = sticky
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data, mode, owner)

    monkeypatch.setattr(converge, "atomic_write", write)
    return real


def listed(sid: str) -> Any:
    _, events = run_events(converge, converge_payload("snapshots"))
    return {s["id"]: s["status"] for s in events[-1]["snapshots"]}[sid]


def failed_on_a_full_disk(deploy: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Any]:
    """A converge whose .env write fails on a full disk, rolled back by itself; the disk then
    has room again. Its snapshot, and its result."""
    real = full_from(monkeypatch, lambda path: path == str(deploy / ".env"))
    _, events = run_events(converge, converge_payload(services=["vllm-worker"]))
    monkeypatch.setattr(converge, "atomic_write", real)  # room again
    sid = snapshot_dirs(deploy)[-1]
    return sid, events


def test_a_rollback_done_on_a_full_disk_does_not_refuse_the_next_converge(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    sid, events = failed_on_a_full_disk(deploy, monkeypatch)
    done = events[-1]
    assert done["ok"] is False and done["rollback"]["ok"] is True
    notes = [e["message"] for e in events if e["event"] == "note"]
    assert meta(deploy, sid)["status"] == "running"  # the status itself was never written
    code, after = run_events(converge, converge_payload(services=["vllm-worker"]))
    assert code == 0 and after[-1]["ok"] is True, after[-1]
    assert "interrupted" not in after[-1]
    assert (deploy / ".env").read_text() == "FOO=2\n"
    assert listed(sid) == "rolled-back"
    assert f"snapshot {sid}: could not record its status rolled-back (a full disk?); " in (
        "\n".join(notes)
    )


def test_a_status_written_since_drops_the_mark(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollback to it run again and killed after it said so: half restored, refused."""
    Engine(monkeypatch, converge, deploy)
    sid, _ = failed_on_a_full_disk(deploy, monkeypatch)
    mark = deploy / ".fleet" / "snapshots" / sid / converge.ROLLED_BACK_MARK
    assert mark.is_file()
    killed_rollback(converge, monkeypatch, sid)
    assert not mark.exists() and meta(deploy, sid)["status"] == "rolling-back"
    code, events = run_events(converge, converge_payload(services=["vllm-worker"]))
    assert code == 1 and events[-1]["interrupted"]["kind"] == "rollback"
    _, events = run_events(converge, converge_payload("rollback", snapshot=sid))
    assert events[-1]["ok"] is True and meta(deploy, sid)["status"] == "rolled-back"


def test_without_even_the_mark_the_refusal_stands_and_the_note_says_what_to_run(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    monkeypatch.setattr(converge, "mark_rolled_back", lambda box, sid: False)
    sid, events = failed_on_a_full_disk(deploy, monkeypatch)
    notes = [e["message"] for e in events if e["event"] == "note"]
    assert (
        f"snapshot {sid}: could not record its status rolled-back: the next converge refuses "
        "the box as interrupted until it is; once the disk has room, run this rollback again, "
        "or converge with --accept-interrupted" in notes
    ), notes
    code, events = run_events(converge, converge_payload(services=["vllm-worker"]))
    assert code == 1 and events[-1]["interrupted"]["snapshot"] == sid


def test_mark_good_refuses_a_converge_rolled_back_on_a_full_disk(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Applied, then the operator's rollback with no room for a larger meta.json: left
    `applied`, mark-good then kept the restored files as the verified known-good."""
    Engine(monkeypatch, converge, deploy)
    _, events = run_events(converge, converge_payload(services=["vllm-worker"]))
    sid = events[-1]["snapshot"]
    real = full_from(monkeypatch, lambda path: path.endswith("meta.json"), False)
    _, events = run_events(converge, converge_payload("rollback", snapshot=sid))
    monkeypatch.setattr(converge, "atomic_write", real)
    assert events[-1]["ok"] is True and (deploy / ".env").read_text() == "FOO=1\n"
    assert meta(deploy, sid)["status"] == "applied"  # the status itself was never written
    _, events = run_events(converge, converge_payload("mark-good", snapshot=sid))
    assert events[-1]["ok"] is False, events[-1]
    assert f"snapshot {sid} is rolled-back, not applied" in events[-1]["failed"]
    assert not (deploy / ".fleet" / "known-good").exists()
    assert listed(sid) == "rolled-back"


def test_a_killed_converge_the_rollback_undid_on_a_full_disk_refuses_no_more(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rollback to an older snapshot undoes a later killed converge too (the chain)."""
    Engine(monkeypatch, converge, deploy)
    older = run_events(converge, converge_payload())[1][-1]["snapshot"]
    killed = run_events(converge, converge_payload(managed_env={"FOO": "3"}))[1][-1]["snapshot"]
    path = deploy / ".fleet" / "snapshots" / killed / "meta.json"
    path.write_text(path.read_text().replace('"status": "applied"', '"status": "running"'))
    assert meta(deploy, killed)["status"] == "running"  # as a SIGKILL leaves it
    real = full_from(monkeypatch, lambda path: path.endswith("meta.json"), False)
    _, events = run_events(converge, converge_payload("rollback", snapshot=older))
    monkeypatch.setattr(converge, "atomic_write", real)
    assert events[-1]["ok"] is True and (deploy / ".env").read_text() == "FOO=1\n"
    code, events = run_events(converge, converge_payload(managed_env={"FOO": "4"}))
    assert code == 0 and events[-1]["ok"] is True, events[-1]
    assert listed(older) == "rolled-back" and listed(killed) == "rolled-back"
