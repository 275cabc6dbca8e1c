"""Bad desired state: each case gives exact messages at exact file:line:col, exit code 1,
and nothing written."""

import shutil
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError

from .bad_inputs_table import BAD_INPUTS

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "fleet"


def _fleet_with(tmp_path: Path, file: str, old: str | None, new: str) -> Path:
    root = tmp_path / "fleet"
    shutil.copytree(FIXTURE, root)
    target = root / file
    if old is None:
        target.write_text(new, encoding="utf-8")
    else:
        text = target.read_text(encoding="utf-8")
        assert old in text, f"the fixture no longer contains {old!r}"
        target.write_text(text.replace(old, new, 1), encoding="utf-8")
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_fixture_fleet_is_valid() -> None:
    """The unmodified fixture loads, so every failure below comes from its one edit."""
    fleet = load_fleet(FIXTURE)
    assert sorted(fleet.boxes) == ["spark", "thor"]


@pytest.mark.parametrize(
    ("file", "old", "new", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_INPUTS],
)
def test_bad_input_is_reported_exactly(
    tmp_path: Path, file: str, old: str | None, new: str, expected: list[str]
) -> None:
    root = _fleet_with(tmp_path, file, old, new)
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(root)
    assert [str(p) for p in caught.value.problems] == expected


@pytest.mark.parametrize(
    ("file", "old", "new", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_INPUTS[:6]],
)
def test_cli_validate_exits_1_prints_every_problem_and_writes_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    file: str,
    old: str | None,
    new: str,
    expected: list[str],
) -> None:
    root = _fleet_with(tmp_path, file, old, new)
    before = _snapshot(tmp_path)
    code = main(["--root", str(root), "validate"])
    err = capsys.readouterr().err.splitlines()
    assert code == 1
    assert err[:-1] == expected
    assert err[-1].startswith("invalid desired state:")
    assert _snapshot(tmp_path) == before


def test_distinct_bad_inputs_cover_at_least_thirty_cases() -> None:
    names = {case[0] for case in BAD_INPUTS}
    messages = {line.split(": ", 1)[1] for case in BAD_INPUTS for line in case[4]}
    assert len(names) == len(BAD_INPUTS) >= 30
    assert len(messages) >= 30
