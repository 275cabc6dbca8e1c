"""`apply --dry` answers as `drift` does (2: a plan would change something), so a CI gate on it
fires; and an empty $FLEET_EVIDENCE_DIR is named as the mistake it is, not judged as an empty
`--evidence` nobody typed. The boxes are the lab-incidents example replayed from its snapshot
(thor's incidents make a plan), pyinfra's connect faked (test_apply_review_fixes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import engine
from reconciler.records import replace
from tests.unit.test_apply_review_fixes import apply_main, faked_calls


def test_a_dry_apply_with_a_plan_exits_2_and_calls_no_box(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = faked_calls(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert apply_main(monkeypatch, "thor", "--dry") == 2
    out = capsys.readouterr().out
    assert "thor: plan: " in out
    assert asked == []
    assert not (tmp_path / "evidence").exists()  # a dry run writes no record either


def test_a_dry_apply_with_nothing_to_do_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = engine.prepare

    def nothing(fleet: Any, box: str, run: Any) -> engine.Prepared:
        prepared = real(fleet, box, run)
        return replace(prepared, plan=replace(prepared.plan, steps=()))

    monkeypatch.setattr(engine, "prepare", nothing)
    assert apply_main(monkeypatch, "thor", "--dry") == 0
    assert "nothing to converge" in capsys.readouterr().out


def test_an_empty_evidence_variable_is_named_and_nothing_changes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = faked_calls(monkeypatch, converge={"ok": True})
    monkeypatch.setenv("FLEET_EVIDENCE_DIR", "")
    assert apply_main(monkeypatch, "thor", "--yes") == 1
    err = capsys.readouterr().err
    assert "FLEET_EVIDENCE_DIR is set but empty" in err
    assert "an empty path" not in err  # not the --evidence nobody typed
    assert asked == []


def test_the_evidence_variable_is_where_records_go(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    faked_calls(monkeypatch, converge={"ok": False, "failed": "the box changed since"})
    monkeypatch.setenv("FLEET_EVIDENCE_DIR", str(tmp_path / "records"))
    assert apply_main(monkeypatch, "thor", "--yes") == 1
    assert [p.name.endswith("-thor.json") for p in (tmp_path / "records").iterdir()] == [True]
