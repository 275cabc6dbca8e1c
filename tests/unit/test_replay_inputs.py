"""`drift --from-snapshot` over byte-identical desired-state files takes the remembered drift
inputs (reconciler/drift_inputs.py) instead of loading the validated state and deriving them
again, as a live run's early start does; a snapshot with facts of its own never does."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from reconciler import cli
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import drift_inputs, remembered_inputs

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"


@pytest.fixture
def fleet_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "fleet"
    shutil.copytree(EXAMPLE, root)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return root


def _args(root: Path, *extra: str) -> argparse.Namespace:
    snapshot = str(root / "snapshot")
    argv = ["--root", str(root), "-i", "lab", "drift", "--from-snapshot", snapshot, *extra]
    return cli.build_parser().parse_args(argv)


def test_a_replay_takes_the_remembered_inputs(fleet_repo: Path) -> None:
    inventory = fleet_repo / "inventory" / "lab.yaml"
    assert cli._replay_inputs(_args(fleet_repo)) is None  # nothing remembered yet
    stored = remembered_inputs(load_fleet(fleet_repo, "lab"), inventory)
    hit = cli._replay_inputs(_args(fleet_repo))
    assert hit == stored == drift_inputs(load_fleet(fleet_repo, "lab"))
    assert cli._drift_inputs(_args(fleet_repo)) == stored


def test_a_changed_file_loads_the_state_again(fleet_repo: Path) -> None:
    inventory = fleet_repo / "inventory" / "lab.yaml"
    remembered_inputs(load_fleet(fleet_repo, "lab"), inventory)
    thor = fleet_repo / "group_vars" / "thor.yaml"
    thor.write_text(thor.read_text(encoding="utf-8") + "\n# changed\n", encoding="utf-8")
    assert cli._replay_inputs(_args(fleet_repo)) is None


def test_a_snapshot_with_its_own_facts_or_a_saving_run_never_does(
    fleet_repo: Path, tmp_path: Path
) -> None:
    inventory = fleet_repo / "inventory" / "lab.yaml"
    remembered_inputs(load_fleet(fleet_repo, "lab"), inventory)
    assert cli._replay_inputs(_args(fleet_repo, "--save-snapshot", str(tmp_path / "s"))) is None
    (fleet_repo / "snapshot" / "facts").mkdir()  # judged against the snapshot's own facts
    assert cli._replay_inputs(_args(fleet_repo)) is None
