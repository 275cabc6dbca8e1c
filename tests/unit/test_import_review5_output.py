"""`reconcile import`, review 5 (defect 6): an inventory whose file ends in `.yml`.

The report's "details and check" command named it by its stem (`-i mesh`), which selects
`inventory/mesh.yaml`: the command failed (`inventory/mesh.yaml:1:1: file not found`). And a
second import with `--force` refused its own output, which holds `inventory/mesh.yml`
(write.py accepted only `.yaml` files).

Captured data: examples/lab-incidents, its lab inventory renamed `inventory/mesh.yml`.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest

from reconciler.cli import main
from tests.unit.test_import_hostile import INCIDENTS


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """A copy of examples/lab-incidents (its snapshot inside), to edit."""
    root = tmp_path / "fleet"
    shutil.copytree(INCIDENTS, root)
    return root


def imported(capsys: pytest.CaptureFixture[str], root: Path, out: Path, *more: str) -> str:
    snapshot = str(root / "snapshot")
    argv = ["--root", str(root), "-i", "inventory/mesh.yml", "import", "--from-snapshot"]
    code = main([*argv, snapshot, "--output", str(out), *more])
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert code == 2, text
    return text


def test_the_check_command_names_a_yml_inventory_that_exists(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (fleet / "inventory/lab.yaml").rename(fleet / "inventory/mesh.yml")
    out = tmp_path / "adopted"
    text = imported(capsys, fleet, out)
    assert (out / "inventory/mesh.yml").is_file()
    line = next(line for line in text.splitlines() if line.startswith("details and check: "))
    words = shlex.split(line.removeprefix("details and check: "))
    assert words[:5] == ["reconcile", "--root", str(out), "-i", "inventory/mesh.yml"]
    # The command as printed runs: the drift of the adopted state against the snapshot. Exit
    # 1: thor's gateway key was not adopted (a placeholder file the snapshot never read, which
    # a live drift would find missing): its .env line is not compared, and said.
    code = main(words[1:])
    printed = capsys.readouterr()
    assert code == 1, printed.out + printed.err
    assert "file not found" not in printed.out + printed.err
    said = " ".join(printed.out.split())  # the report wraps its lines
    assert "secret gateway_api_key: not in this observation's secret_sources: the snapshot" in said
    assert "read another source" in said and ".secrets.unfound.env" in said


def test_a_forced_import_replaces_its_own_yml_output(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (fleet / "inventory/lab.yaml").rename(fleet / "inventory/mesh.yml")
    out = tmp_path / "adopted"
    imported(capsys, fleet, out)
    text = imported(capsys, fleet, out, "--force")
    assert "not a repository `reconcile import` wrote" not in text
    assert (out / "inventory/mesh.yml").is_file()


def test_a_yaml_inventory_is_still_named_by_its_name(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "adopted"
    argv = ["--root", str(fleet), "-i", "lab", "import", "--from-snapshot"]
    code = main([*argv, str(fleet / "snapshot"), "--output", str(out)])
    text = capsys.readouterr().out
    assert code == 2, text
    assert f"details and check: reconcile --root {out} -i lab drift --from-snapshot" in text
