"""A rollback that fails after its first change leaves the box half restored, as a killed one
does (converge.py `half_restored`): the next converge refuses, naming it, until that rollback
is run again and completes or the operator accepts the state. One that fails before changing
anything (a damaged copy) leaves the box as it was and refuses nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import boxcall, engine
from reconciler.apply.answer import converge_result
from tests.unit.conftest import load_box_program
from tests.unit.converge_harness import Engine, converge_payload, meta, run_events
from tests.unit.converge_helpers import deployment
from tests.unit.test_apply_review_fixes import fleet, prep  # noqa: F401 (fixtures)

converge = load_box_program("box_rollback_failed_half", "reconciler/apply/remote/converge.py")


@pytest.fixture
def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(converge, "_STDOUT_OK", [True])
    return deployment(tmp_path, monkeypatch, "FOO=1\n") / ".lobes"


def result(p: dict[str, Any]) -> dict[str, Any]:
    event: dict[str, Any] = run_events(converge, p)[1][-1]
    return event


def _engine_gone(*_args: Any, **_kwargs: Any) -> Any:
    raise converge.Failed("the engine went away")


def failed_rollback_after_its_files(monkeypatch: pytest.MonkeyPatch, sid: str) -> dict[str, Any]:
    """A rollback to `sid` whose files were restored, then the engine failed it."""
    with monkeypatch.context() as m:
        m.setattr(converge, "remove_containers", _engine_gone)
        done = result(converge_payload("rollback", snapshot=sid))
    assert done["ok"] is False and "the engine went away" in done["failed"]
    return done


def test_a_rollback_that_failed_half_way_refuses_the_next_converge_until_run_again(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    first = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    result(converge_payload(managed_env={"FOO": "3"}))
    failed_rollback_after_its_files(monkeypatch, first)
    assert (deploy / ".env").read_text() == "FOO=1\n"  # restored, the containers not
    assert meta(deploy, first)["status"] == "rollback-failed"
    code, events = run_events(converge, converge_payload(managed_env={"FOO": "4"}))
    done = events[-1]
    assert code == 1 and done["interrupted"]["snapshot"] == first
    assert done["interrupted"]["kind"] == "failed-rollback"
    assert f"the previous rollback (to snapshot {first}, started at " in done["failed"]
    assert (deploy / ".env").read_text() == "FOO=1\n"  # nothing changed
    # Run again, and it fails again before its first change (a copy damaged since): the box
    # is still as half restored as the first attempt left it.
    (deploy / ".fleet" / "snapshots" / first / ".env").write_text("damaged\n")
    again = result(converge_payload("rollback", snapshot=first))
    assert again["ok"] is False and "does not match its recorded sha256" in again["failed"]
    assert result(converge_payload(managed_env={"FOO": "4"}))["interrupted"]["snapshot"] == first
    (deploy / ".fleet" / "snapshots" / first / ".env").write_text("FOO=1\n")
    assert result(converge_payload("rollback", snapshot=first))["ok"] is True
    assert meta(deploy, first)["status"] == "rolled-back"
    assert meta(deploy, first)["undone_from"] == "applied"  # what it was before the failures
    assert result(converge_payload(managed_env={"FOO": "5"}))["ok"] is True


def test_a_rollback_that_failed_before_any_change_refuses_nothing(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    first = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    result(converge_payload(managed_env={"FOO": "3"}))
    (deploy / ".fleet" / "snapshots" / first / ".env").write_text("GATEWAY")  # truncated copy
    done = result(converge_payload("rollback", snapshot=first))
    assert done["ok"] is False and "nothing was restored" in done["failed"]
    assert meta(deploy, first)["status"] == "rollback-failed"
    assert meta(deploy, first)["half_restored"] is False
    assert result(converge_payload(managed_env={"FOO": "4"}))["ok"] is True


def test_a_converges_own_failed_rollback_refuses_the_next_converge(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The converge changed the box before it failed; its own rollback then failed too."""
    Engine(monkeypatch, converge, deploy)
    with monkeypatch.context() as m:
        m.setattr(converge, "pull", _engine_gone)
        m.setattr(converge, "snapshot_chain", _engine_gone)  # fails before any restore
        failed = result(converge_payload(managed_env={"FOO": "2"}))
    assert failed["ok"] is False and failed["rollback"]["ok"] is False
    assert (deploy / ".env").read_text() == "FOO=2\n"  # the converge's write stayed
    refused = result(converge_payload(managed_env={"FOO": "3"}))
    assert refused["interrupted"]["snapshot"] == failed["snapshot"]
    assert (deploy / ".env").read_text() == "FOO=2\n"


def test_accept_interrupted_converges_over_a_failed_rollback(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    first = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    failed_rollback_after_its_files(monkeypatch, first)
    _, events = run_events(
        converge, converge_payload(managed_env={"FOO": "3"}, accept_interrupted=True)
    )
    assert events[-1]["ok"] is True
    said = "\n".join(e["message"] for e in events if e["event"] == "note")
    assert f"snapshot {first}: its rollback to it did not finish" in said
    assert meta(deploy, first)["status"] == "interrupted"


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("failed-rollback", "the previous rollback of thor (to snapshot {sid}, started at T by "
         "bob) failed: the box may be half restored"),
        ("rollback", "the previous rollback of thor (to snapshot {sid}, started at T by bob) "
         "did not finish: the box may be half restored"),
        (None, "the previous converge of thor (snapshot {sid}, started at T by bob) did not "
         "finish: the box may be half converged"),
    ],
)  # fmt: skip
def test_the_controller_says_which_run_did_not_finish(
    prep: engine.Prepared,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    kind: str | None,
    words: str,
) -> None:
    sid = "20261129T100000Z"
    found: dict[str, Any] = {"snapshot": sid, "taken_at": "T", "holder": "bob"}
    if kind is not None:
        found["kind"] = kind  # none: an older box program's refusal, of a converge
    answer = {"event": "result", "ok": False, "failed": "refused", "interrupted": found}

    def call(_target: object, _payload: dict[str, Any], _on: object = None) -> boxcall.BoxCall:
        return boxcall.BoxCall(result=answer, events=[answer])

    monkeypatch.setattr(engine, "call_box", call)
    out = engine.execute(prep, "test")
    assert out.failed is not None and words.format(sid=sid) in out.failed
    assert f"`reconcile rollback thor --to {sid}`" in out.failed


def test_an_unknown_kind_of_interrupted_run_is_a_malformed_answer() -> None:
    found = {"snapshot": "20261129T100000Z", "taken_at": "T", "holder": "b", "kind": "x\n"}
    answer = converge_result({"ok": False, "failed": "refused", "interrupted": found})
    assert answer.interrupted is None and answer.failed is not None
    assert "malformed" in answer.failed and "interrupted" in answer.failed


class _Killed(BaseException):
    """SIGKILL: nothing of the program runs after it."""


def _kill(*_args: Any, **_kwargs: Any) -> Any:
    raise _Killed


def test_a_killed_converge_stays_refused_after_its_rollback_failed_before_any_change(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The converge wrote `.env` and was killed; the rollback to its snapshot then found a
    damaged copy and changed nothing: the box is still half converged."""
    Engine(monkeypatch, converge, deploy)
    before = (
        {p.name for p in (deploy / ".fleet" / "snapshots").glob("*")}
        if (deploy / ".fleet" / "snapshots").exists()
        else set()
    )
    with monkeypatch.context() as m, pytest.raises(_Killed):
        m.setattr(converge, "pull", _kill)
        run_events(converge, converge_payload(managed_env={"FOO": "2"}))
    (sid,) = {p.name for p in (deploy / ".fleet" / "snapshots").glob("*")} - before
    (deploy / ".fleet" / "snapshots" / sid / ".env").write_text("damaged\n")
    failed = result(converge_payload("rollback", snapshot=sid))
    assert failed["ok"] is False and "nothing was restored" in failed["failed"]
    refused = result(converge_payload(managed_env={"FOO": "3"}))
    assert refused["ok"] is False and refused["interrupted"]["snapshot"] == sid
    assert refused["interrupted"]["kind"] == "converge"
    assert (deploy / ".env").read_text() == "FOO=2\n"


def test_the_rerun_of_a_converges_failed_rollback_recreates_only_what_it_touched(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The converge failed before recreating anything; its rollback restored the files, then
    failed. Run again as the refusal says, it must not restart the healthy lane the converge
    never touched (a GPU lane's model reload takes minutes)."""
    eng = Engine(monkeypatch, converge, deploy)
    worker = eng.c["vllm-worker"]["Id"]
    with monkeypatch.context() as m:
        m.setattr(converge, "pull", _engine_gone)
        m.setattr(converge, "remove_containers", _engine_gone)
        failed = result(converge_payload(managed_env={"FOO": "2"}, services=["vllm-worker"]))
    assert failed["ok"] is False and failed["rollback"]["ok"] is False
    assert (deploy / ".env").read_text() == "FOO=1\n"  # the files were restored
    assert result(converge_payload(managed_env={"FOO": "3"}))["interrupted"]["kind"] == (
        "failed-rollback"
    )
    again = result(converge_payload("rollback", snapshot=failed["snapshot"]))
    assert again["ok"] is True and again["recreated"] == [], again
    assert eng.c["vllm-worker"]["Id"] == worker
    assert result(converge_payload(managed_env={"FOO": "3"}))["ok"] is True
