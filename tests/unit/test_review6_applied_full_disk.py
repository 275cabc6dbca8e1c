"""A converge that completes and verifies on a full disk, where its status `applied` cannot be
written (meta.json is rewritten whole), marks its snapshot with an empty `applied.mark`
instead (converge.py record_final, MARKED), read as `applied`. Left `running`, the next
converge refused the box as half converged, and the remedy it named (a rollback) would undo a
converge that was done. Every status written later drops the mark first; without even the
mark, the refusal stands and the note says what to run."""

from __future__ import annotations

import errno
import json
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
)
from tests.unit.converge_helpers import deployment

converge = load_box_program("box_review6_applied_full_disk", "reconciler/apply/remote/converge.py")


class Killed(BaseException):
    """What SIGKILL does to a converge: nothing of it runs after (no except, no status)."""


@pytest.fixture
def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(converge, "_STDOUT_OK", [True])
    return deployment(tmp_path, monkeypatch, "FOO=1\n") / ".lobes"


def notes(events: list[dict[str, Any]]) -> list[str]:
    return [e["message"] for e in events if e["event"] == "note"]


def listed(sid: str) -> Any:
    _, events = run_events(converge, converge_payload("snapshots"))
    return {s["id"]: s["status"] for s in events[-1]["snapshots"]}[sid]


def applied_on_a_full_disk(monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[dict[str, Any]]]:
    """A converge that completes, its `applied` status write failing with ENOSPC (the disk
    filled up during it); the disk then has room again. Its snapshot, and its events."""
    real = converge.atomic_write

    def write(path: str, data: bytes, mode: int, owner: Any = converge.KEEP) -> None:
        if path.endswith("meta.json") and json.loads(data or b"{}").get("status") == "applied":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data, mode, owner)

    monkeypatch.setattr(converge, "atomic_write", write)
    _, events = run_events(converge, converge_payload(services=["vllm-worker"]))
    monkeypatch.setattr(converge, "atomic_write", real)  # room again
    assert events[-1]["ok"] is True, events[-1]
    return events[-1]["snapshot"], events


def test_a_converge_applied_on_a_full_disk_does_not_refuse_the_next_converge(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    sid, events = applied_on_a_full_disk(monkeypatch)
    assert meta(deploy, sid)["status"] == "running"  # the status itself was never written
    assert (deploy / ".fleet" / "snapshots" / sid / "applied.mark").is_file()
    assert (
        f"snapshot {sid}: could not record its status applied (a full disk?); marked it so "
        "(applied.mark): the next converge goes on" in notes(events)
    ), notes(events)
    assert listed(sid) == "applied"
    code, after = run_events(converge, converge_payload(services=["vllm-worker"]))
    assert code == 0 and after[-1]["ok"] is True, after[-1]
    assert "interrupted" not in after[-1]


def test_mark_good_verifies_it_and_drops_the_mark(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's verification then mark-good: accepted as applied, recorded verified."""
    Engine(monkeypatch, converge, deploy)
    sid, _ = applied_on_a_full_disk(monkeypatch)
    _, events = run_events(converge, converge_payload("mark-good", snapshot=sid))
    assert events[-1]["ok"] is True, events[-1]
    assert meta(deploy, sid)["status"] == "verified"
    assert not (deploy / ".fleet" / "snapshots" / sid / "applied.mark").exists()


def test_a_later_killed_converge_still_refuses(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    applied_on_a_full_disk(monkeypatch)
    before = set(p.name for p in (deploy / ".fleet" / "snapshots").iterdir())

    def kill(box: Any, refs: list[str]) -> None:
        raise Killed

    with monkeypatch.context() as m, pytest.raises(Killed):
        m.setattr(converge, "pull", kill)
        run_events(converge, converge_payload(managed_env={"FOO": "3"}))
    (killed,) = set(p.name for p in (deploy / ".fleet" / "snapshots").iterdir()) - before
    code, events = run_events(converge, converge_payload(services=["vllm-worker"]))
    assert code == 1 and events[-1]["interrupted"]["snapshot"] == killed, events[-1]
    assert events[-1]["interrupted"]["kind"] == "converge"


def test_a_killed_rollback_to_it_drops_the_mark_and_refuses(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    sid, _ = applied_on_a_full_disk(monkeypatch)
    mark = deploy / ".fleet" / "snapshots" / sid / "applied.mark"
    killed_rollback(converge, monkeypatch, sid)
    assert not mark.exists() and meta(deploy, sid)["status"] == "rolling-back"
    assert meta(deploy, sid)["rollback_from"] == "applied"  # read through the mark
    code, events = run_events(converge, converge_payload(services=["vllm-worker"]))
    assert code == 1 and events[-1]["interrupted"]["kind"] == "rollback", events[-1]


def test_without_even_the_mark_the_refusal_stands_and_the_note_says_what_to_run(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    monkeypatch.setattr(converge, "mark_applied", lambda box, sid: False)
    sid, events = applied_on_a_full_disk(monkeypatch)
    assert (
        f"snapshot {sid}: could not record its status applied: the next converge refuses the "
        "box as interrupted until it is; once the disk has room, converge with "
        "--accept-interrupted (this converge completed)" in notes(events)
    ), notes(events)
    code, events = run_events(converge, converge_payload(services=["vllm-worker"]))
    assert code == 1 and events[-1]["interrupted"]["snapshot"] == sid, events[-1]
