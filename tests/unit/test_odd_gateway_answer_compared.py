"""A gateway body lobes never sends fails that probe (observe/document.py `_answered`): the
drift report says so as an error of the box (exit 1), never a silent "in sync" for what the
probe would have told, nor a version "absent"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reconciler import cli

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "fleet"
    shutil.copytree(EXAMPLE, root)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return root


def _edit(root: Path, box: str, change: object) -> None:
    path = root / "snapshot" / f"{box}.json"
    doc = json.loads(path.read_text())
    change(doc["collected"]["gateway"])  # type: ignore[operator]
    path.write_text(json.dumps(doc))


def _thor(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    argv = ["--root", str(root), "-i", "lab", "drift", "--from-snapshot", str(root / "snapshot")]
    code = cli.main([*argv, "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    (thor,) = [b for b in report["boxes"] if b["box"] == "thor"]
    return code, thor


def test_odd_capabilities_are_an_error_of_the_box(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, before = _thor(fleet, capsys)
    assert any(d["kind"] == "contract" for d in before["drifts"])  # what the probe tells
    _edit(fleet, "thor", lambda g: g["capabilities"]["body"]["associate"].update(ready="yes"))
    code, thor = _thor(fleet, capsys)
    assert code == 1
    errors = json.dumps(thor["errors"])
    assert "gateway capabilities (loopback)" in errors
    assert "the gateway's answer is not what lobes sends" in errors


def test_an_odd_health_body_is_an_error_not_a_version_absent(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _edit(fleet, "thor", lambda g: g["health"]["body"].update(version=91))
    code, thor = _thor(fleet, capsys)
    assert code == 1
    assert "gateway health (loopback)" in json.dumps(thor["errors"])
    assert not [d for d in thor["drifts"] if d["path"] == "health.version"]
