"""A fleet's own `secret_patterns` in `reconcile diff` and `reconcile audit` (review 8): neither
adopted them, so a value named only by a fleet pattern (`DB_PW` under `*_PW`) that a run
recorded, or a replayed box's text held, was printed in clear where drift prints `***`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.unit.history_helpers import AUDIT_FIXTURES, INCIDENTS, ROOT, reconcile, unvouched


def _fleet_with_pattern(tmp_path: Path, pattern: bool) -> Path:
    root = tmp_path / ("fleet" if pattern else "fleet-before")
    shutil.copytree(INCIDENTS, root)
    if pattern:
        all_yaml = root / "group_vars" / "all.yaml"
        text = all_yaml.read_text()
        assert "secret_patterns: [" in text
        all_yaml.write_text(text.replace("secret_patterns: [", 'secret_patterns: ["*_PW", ', 1))
    return root


def _snapshot_with(root: Path, name: str, value: str) -> Path:
    snap = root / name
    shutil.copytree(root / "snapshot", snap)
    thor = json.loads((snap / "thor.json").read_text())
    thor["collected"]["envfile"].append({"key": "DB_PW", "line": 9001, "value": value})
    (snap / "thor.json").write_text(json.dumps(thor))
    unvouched(snap)
    return snap


def _two_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path, root: Path, *values: str) -> Path:
    """A store holding a replay of the example per value, thor's `.env` DB_PW set to it."""
    db = tmp_path / "h.sqlite3"
    for n, value in enumerate(values):
        code, _, err = reconcile(
            capsys, "drift", "--from-snapshot", str(_snapshot_with(root, f"s{n}", value)),
            "--history", str(db), root=root,
        )  # fmt: skip
        assert code == 2, err
    return db


def test_diff_of_runs_recorded_before_a_pattern_masks_them_now(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _fleet_with_pattern(tmp_path, pattern=False)
    db = _two_runs(capsys, tmp_path, before, "clearvalA1", "othervalB2")
    code, out, _ = reconcile(capsys, "diff", "--history", str(db), root=before)
    assert "clearvalA1" in out  # no pattern names it: a plain value, shown
    after = _fleet_with_pattern(tmp_path, pattern=True)
    for fmt in ("text", "json"):
        code, out, err = reconcile(
            capsys, "diff", "--history", str(db), "--format", fmt, root=after
        )
        assert code in (0, 2) and "Traceback" not in err, err
        assert "clearvalA1" not in out and "othervalB2" not in out, out


def test_diff_outside_a_fleet_says_the_patterns_are_not_known(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _fleet_with_pattern(tmp_path, pattern=False)
    db = _two_runs(capsys, tmp_path, before, "x1", "x2")
    empty = tmp_path / "not-a-fleet"
    empty.mkdir()
    code, _, err = reconcile(capsys, "diff", "--history", str(db), root=empty)
    assert code == 2
    assert "note: the fleet's secret_patterns are not known" in err


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "html"])
def test_audit_masks_what_a_fleet_pattern_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    root = tmp_path / "fleet"
    for part in ("inventory", "group_vars"):
        shutil.copytree(ROOT / part, root / part)
    all_yaml = root / "group_vars" / "all.yaml"
    text = all_yaml.read_text()
    assert "secret_patterns: [" in text
    all_yaml.write_text(text.replace("secret_patterns: [", 'secret_patterns: ["*_PW", ', 1))
    snap = tmp_path / "audit-snap"
    shutil.copytree(AUDIT_FIXTURES / "fully_keyed_mesh", snap)
    spark = json.loads((snap / "spark.json").read_text())
    spark["collected"]["login_shell"] = {
        "error": "bash: export DB_PW=clearvalQ7: bad --db-pw clearvalR8"
    }
    (snap / "spark.json").write_text(json.dumps(spark))
    unvouched(snap)
    out_file = tmp_path / f"audit.{fmt}"
    _, _, err = reconcile(
        capsys, "audit", "--from-snapshot", str(snap), "--no-history", "--format", fmt,
        "-o", str(out_file), root=root,
    )  # fmt: skip
    assert "Traceback" not in err
    said = out_file.read_text().replace("\\", "")  # markdown's escapes
    assert "DB_PW=***" in said  # the finding is there, its value masked
    assert "clearvalQ7" not in said and "clearvalR8" not in said


@pytest.mark.parametrize("command", ["rollback", "snapshots"])
def test_rollback_and_snapshots_judge_under_the_fleets_patterns(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    """What a box says while it rolls back (its events, printed live) or lists its snapshots
    was masked under the built-in names only: no drift had adopted the fleet's."""
    from reconciler.apply import cli as apply_cli
    from reconciler.desired.secret_names import adopt_fleet_patterns, fleet_patterns

    adopt_fleet_patterns(())
    seen: list[tuple[str, ...]] = []

    def handler(args: object, fleet: object) -> int:
        seen.append(fleet_patterns())
        return 0

    monkeypatch.setattr(apply_cli, f"_cmd_{command}", handler)
    root = _fleet_with_pattern(tmp_path, pattern=True)
    code, _, err = reconcile(capsys, command, "thor", root=root)
    assert code == 0, err
    assert seen and "*_PW" in seen[0]


def test_a_validation_message_hides_what_the_layers_own_pattern_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _fleet_with_pattern(tmp_path, pattern=True)
    spark = root / "group_vars" / "spark.yaml"
    spark.write_text(spark.read_text() + 'mesh:\n  heartbeat_s: "DB_PW=clearvalF5"\n')
    code, out, err = reconcile(capsys, "validate", root=root)
    assert code == 1
    assert "mesh.heartbeat_s" in err
    assert "clearvalF5" not in err + out
