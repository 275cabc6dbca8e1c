"""An empty selector is refused, never read as "not given" (review 2, item 1): `-i "$INV"` with
INV unset selected `hosts`, the real mesh; `--root ""` and `FLEET_ROOT=` the repository found
from the working directory; `history --since ""` every run; `FLEET_INVENTORY=` the real mesh,
for `reconcile` and for pyinfra's inventory.py alike."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError

ROOT = Path(__file__).resolve().parents[2]


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as ended:
        main(argv)
    assert ended.value.code == 1  # a usage error exits 1, never 2 (drift)
    return capsys.readouterr().err


def test_an_empty_inventory_option_is_a_usage_error(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    said = _usage_error(["--root", str(repo), "-i", "", "validate"], capsys)
    assert "argument -i/--inventory: an empty value (is a variable unset?)" in said


def test_an_empty_root_option_is_a_usage_error(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo)  # where the empty value used to find a repository
    said = _usage_error(["--root", "", "validate"], capsys)
    assert "argument --root: an empty path" in said


def test_an_empty_since_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    said = _usage_error(["history", "--since", "", "--history", str(tmp_path / "h.db")], capsys)
    assert "argument --since: an empty value" in said


def test_an_empty_fleet_inventory_is_refused_not_the_real_mesh(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_INVENTORY", "")
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(repo)
    (problem,) = caught.value.problems
    assert problem.message.startswith("FLEET_INVENTORY is set but empty (is a variable unset?)")
    # an explicit selector wins over the variable, as before
    assert load_fleet(repo, "hosts").inventory_file == "inventory/hosts.yaml"


def test_an_empty_inventory_selector_is_refused(repo: Path) -> None:
    with pytest.raises(DesiredStateError, match="an empty inventory"):
        load_fleet(repo, " ")


def test_an_empty_fleet_root_is_refused(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(repo)
    monkeypatch.setenv("FLEET_ROOT", "")
    assert main(["validate"]) == 1
    assert "FLEET_ROOT is set but empty" in capsys.readouterr().err


def test_pyinfra_inventory_refuses_an_empty_fleet_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `FLEET_INVENTORY= pyinfra inventory.py deploys/thor.py` runs first."""
    monkeypatch.setenv("FLEET_INVENTORY", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(str(ROOT / "inventory.py"))
    assert ended.value.code == 1
    assert "FLEET_INVENTORY is set but empty" in capsys.readouterr().err
