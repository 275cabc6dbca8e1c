"""The test command's two workers (tests/conftest.py): every lab test must land in one unit of
work, or a second worker waits at the lab's session lock for the whole lab run (the suite then
passes, in far more time). Checked on this repository's own test files."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.conftest import LAB_UNIT, lab_apart, pytest_xdist_make_scheduler

ROOT = Path(__file__).resolve().parents[2]


def _scope(nodeid: str) -> str:
    scheduler = object.__new__(lab_apart())  # its split reads no state
    return str(scheduler._split_scope(nodeid))


def _ids(folder: str) -> list[str]:
    """Node ids in each test file of tests/FOLDER: a function, a parametrized one (an `@` in
    its parameter, as loadgroup's group suffix would be) and a class's method."""
    files = sorted((ROOT / "tests" / folder).glob("test_*.py"))
    assert len(files) > 10, files  # the tree this checks is there
    return [
        f"tests/{folder}/{f.name}::{name}"
        for f in files
        for name in ("test_one", "test_two[a@b]", "TestThing::test_three")
    ]


def test_every_lab_test_is_one_unit_of_work() -> None:
    assert {_scope(nodeid) for nodeid in _ids("lab")} == {LAB_UNIT}


def test_each_unit_test_module_or_class_is_a_unit_of_its_own() -> None:
    # A function's unit is its module, a method's its class: xdist's own split by scope.
    for nodeid in _ids("unit"):
        assert _scope(nodeid) == nodeid.rsplit("::", 1)[0], nodeid


def test_another_distribution_mode_is_left_to_xdist() -> None:
    config = SimpleNamespace(getvalue=lambda name: {"dist": "loadfile"}[name])
    assert pytest_xdist_make_scheduler(config, None) is None  # type: ignore[arg-type]
