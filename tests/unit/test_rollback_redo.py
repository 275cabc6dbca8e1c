"""Rollbacks that undo and redo converges (converge.py `redo_by_rollback`, `chain_needs`):
a rollback run again after a kill never brings its `rolling-back` back, and pruning keeps the
record of an undone converge a rollback to a kept snapshot would put back."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.unit.conftest import load_box_program
from tests.unit.converge_harness import (
    EXTRA,
    EXTRA_V1,
    Engine,
    FileEngine,
    converge_payload,
    killed_rollback,
    meta,
    run_events,
)
from tests.unit.converge_helpers import deployment

converge = load_box_program("box_rollback_redo", "reconciler/apply/remote/converge.py")


@pytest.fixture
def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(converge, "_STDOUT_OK", [True])
    return deployment(tmp_path, monkeypatch, "FOO=1\n") / ".lobes"


def result(p: dict[str, object]) -> dict[str, object]:
    event: dict[str, object] = run_events(converge, p)[1][-1]
    return event


def test_a_rollback_run_again_after_a_kill_is_redone_as_what_it_was(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    a = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    b = result(converge_payload(managed_env={"FOO": "3"}))["snapshot"]
    assert isinstance(a, str) and isinstance(b, str)
    killed_rollback(converge, monkeypatch, a)
    assert result(converge_payload("rollback", snapshot=a))["ok"] is True  # run again, as told
    assert meta(deploy, a)["undone_from"] == "applied"  # not the rolling-back it replaced
    assert result(converge_payload("rollback", snapshot=b))["ok"] is True
    assert meta(deploy, a)["status"] == "applied"  # a's change is back, and nothing refuses
    code, events = run_events(converge, converge_payload(managed_env={"FOO": "4"}))
    assert code == 0, events[-1]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("keep", [2, 10])
def test_pruning_keeps_an_undone_record_a_kept_snapshots_rollback_puts_back(
    deploy: Path, monkeypatch: pytest.MonkeyPatch, keep: int
) -> None:
    """s0..sc applied (sb creates a compose file); back to sa; a failed converge prunes to
    `keep`. A rollback to sc puts sa's and sb's changes back; a rollback to s0 must then
    undo them, so their records stay however few are kept."""
    FileEngine(monkeypatch, converge, deploy)
    s0 = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    sa = result(converge_payload(managed_env={"FOO": "3"}))["snapshot"]
    good = deploy / ".fleet" / "known-good"
    good.mkdir(mode=0o700)
    (good / EXTRA).write_bytes(EXTRA_V1)
    restore = [{"name": EXTRA, "sha256": _sha(EXTRA_V1)}]
    result(converge_payload(managed_env={"FOO": "4"}, restore=restore))
    assert (deploy / EXTRA).exists()
    sc = result(converge_payload(managed_env={"FOO": "5"}))["snapshot"]
    assert result(converge_payload("rollback", snapshot=sa))["ok"] is True
    assert not (deploy / EXTRA).exists()
    monkeypatch.setattr(converge, "gateway_problems", lambda box, deadline=None: ["down"])
    failed = converge_payload(managed_env={"FOO": "6"}, services=["gateway"], keep=keep)
    assert run_events(converge, failed)[1][-1]["ok"] is False
    monkeypatch.setattr(converge, "gateway_problems", lambda box, deadline=None: [])
    assert result(converge_payload("rollback", snapshot=sc))["ok"] is True
    assert (deploy / EXTRA).exists() and (deploy / ".env").read_text() == "FOO=4\n"
    assert result(converge_payload("rollback", snapshot=s0))["ok"] is True
    assert not (deploy / EXTRA).exists() and (deploy / ".env").read_text() == "FOO=1\n"
