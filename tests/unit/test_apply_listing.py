"""`reconcile snapshots` and `rollback` read the box's answer through typed parsers: a hostile
or broken listing is one located error, never a crash, a wrong id or a terminal escape."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from reconciler.apply import boxcall
from reconciler.apply import cli as apply_cli
from reconciler.apply.answer import rollback_result, snapshot_listing

SID = "20261130T120000Z"
GOOD: dict[str, Any] = {
    "event": "result",
    "ok": True,
    "snapshots": [
        {"id": SID, "status": "converged", "services": ["vllm-embed"], "holder": "ci"},
        {"id": f"{SID}-1", "status": "rolled-back", "services": [], "failed": "lane x unhealthy"},
    ],
    "lock": {"holder": "reconcile apply", "pid": 4242, "since": "2026-11-30T12:00:00Z"},
}


def test_a_real_listing_is_typed() -> None:
    listed = snapshot_listing(GOOD)
    assert listed.ok and [s.id for s in listed.snapshots] == [SID, f"{SID}-1"]
    assert listed.snapshots[0].services == ("vllm-embed",)
    assert listed.snapshots[1].failed == "lane x unhealthy"
    assert listed.lock is not None and listed.lock.pid == 4242


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"snapshots": "all of them"}, "snapshots: expected a list"),
        ({"snapshots": [{"id": "../../.ssh"}]}, "snapshots[0].id: not a snapshot id"),
        ({"snapshots": [{"id": SID, "services": "x"}]}, "snapshots[0].services"),
        ({"snapshots": [{"id": SID, "status": "ok\x1b[2J"}]}, "snapshots[0].status"),
        ({"snapshots": [7]}, "snapshots[0]: expected an object"),
        ({"lock": {"pid": "1; rm -rf /"}}, "lock.pid: expected a process id"),
        ({"lock": ["x"]}, "lock: expected an object"),
        ({"ok": "yes"}, "ok: expected true or false"),
    ],
)
def test_a_malformed_listing_is_one_located_failure(change: dict[str, Any], where: str) -> None:
    listed = snapshot_listing({**GOOD, **change})
    assert not listed.ok and listed.snapshots == ()
    assert listed.failed is not None and where in listed.failed


def test_a_failed_listing_says_why() -> None:
    listed = snapshot_listing({"ok": False, "failed": "unreachable: ssh exited 255"})
    assert not listed.ok and listed.failed == "unreachable: ssh exited 255"
    assert not snapshot_listing("not an object").ok


def test_snapshots_command_prints_the_typed_listing(monkeypatch, capsys) -> None:
    monkeypatch.setattr("reconciler.apply.engine.snapshots", lambda *a: boxcall.BoxCall(GOOD))

    class Args:
        box = "thor"

    fleet = SimpleNamespace(boxes={"thor": None})
    assert apply_cli._cmd_snapshots(Args(), fleet) == apply_cli.EXIT_OK  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert f"{SID}  converged" in out and "failed: lane x unhealthy" in out
    assert "lock held by reconcile apply (pid 4242)" in out


def test_a_listing_that_lies_about_its_ids_refuses_rollback_to(monkeypatch, capsys) -> None:
    lying = {**GOOD, "snapshots": [{"id": SID}, {"id": "../elsewhere"}]}
    monkeypatch.setattr("reconciler.apply.engine.snapshots", lambda *a: boxcall.BoxCall(lying))
    assert apply_cli._is_snapshot_of(None, "thor", SID) is False  # type: ignore[arg-type]
    assert "malformed" in capsys.readouterr().err


def test_a_rollback_result_is_typed_and_bounded() -> None:
    done = rollback_result(
        {"ok": True, "snapshot": SID, "files": [".env"], "config_equal": True, "unequal": []}
    )
    assert done is not None and done.ok and done.files == (".env",)
    bad = rollback_result({"ok": True, "snapshot": "../x", "files": [".env"]})
    assert bad is not None and not bad.ok and "not a snapshot id" in (bad.failed or "")
