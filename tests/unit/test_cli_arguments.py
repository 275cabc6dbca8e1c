"""The command line's own checks: a usage error is bad input (exit 1; 2 says drift), an empty
directory argument is refused rather than read as "none given" (which went live), and a
relative one is the working directory's, not --root's (reconciler/arg_types.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reconciler import cli
from tests.unit.history_helpers import INCIDENTS, SNAPSHOT, undated

EMPTY = {
    "drift --from-snapshot": ["drift", "--from-snapshot", ""],
    "drift --save-snapshot": ["drift", "--save-snapshot", " "],
    "audit --from-snapshot": ["audit", "--from-snapshot", ""],
    "import --from-snapshot": ["import", "--from-snapshot", "", "--output", "/tmp/never"],
    "diff --from-snapshot": ["diff", "--from-snapshot", str(SNAPSHOT), ""],
    # A file or path argument: `-o ""` printed the report instead of writing it, `--history ""`
    # recorded into the default store, `--metrics ""` wrote nothing, all without a word.
    "drift -o/--output": ["drift", "--from-snapshot", str(SNAPSHOT), "-o", ""],
    "drift --metrics": ["drift", "--from-snapshot", str(SNAPSHOT), "--metrics", " "],
    "drift --history": ["drift", "--from-snapshot", str(SNAPSHOT), "--history", ""],
    "audit -o/--output": ["audit", "--from-snapshot", str(SNAPSHOT), "-o", ""],
    "schema -o/--output": ["schema", "--report", "-o", ""],
    "history --history": ["history", "--history", ""],
    "apply --evidence": ["apply", "thor", "--yes", "--evidence", ""],
    "import --output": ["import", "--from-snapshot", str(SNAPSHOT), "--output", ""],
}


@pytest.mark.parametrize("run", sorted(EMPTY))
def test_an_empty_directory_argument_is_refused_before_anything_runs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, run: str
) -> None:
    def no_box(*args: object, **kwargs: object) -> None:
        raise AssertionError("a box was contacted")

    monkeypatch.setattr("reconciler.observe.transport.ssh_argv", no_box)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--root", str(INCIDENTS), "-i", "lab", *EMPTY[run]])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    option = run.split()[1]
    assert f"error: argument {option}: an empty path (is a variable unset?)" in err


@pytest.mark.parametrize(
    "argv",
    [["drift", "--bogus"], ["drift", "--format", "yaml"], ["nosuchcommand"], []],
    ids=["unknown option", "bad choice", "unknown command", "no command"],
)
def test_a_usage_error_exits_1_never_2_which_says_drift(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 1
    assert "usage: reconcile" in capsys.readouterr().err


def test_a_relative_snapshot_is_the_working_directorys_also_with_its_facts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot carries the facts it was judged against (facts/): their path was taken
    relative to the working directory, then joined to --root (`DIR/facts/images.yaml does
    not exist`, exit 1)."""
    case = tmp_path / "case"
    shutil.copytree(INCIDENTS, case)
    shutil.copytree(case / "facts", case / "snapshot" / "facts")
    monkeypatch.chdir(tmp_path)
    absolute = cli.main(["--root", str(case), "-i", "lab", "drift", "--from-snapshot",
                         str(case / "snapshot"), "--format", "json"])  # fmt: skip
    wanted = capsys.readouterr()
    relative = cli.main(["--root", "case", "-i", "lab", "drift", "--from-snapshot",
                         "case/snapshot", "--format", "json"])  # fmt: skip
    got = capsys.readouterr()
    assert absolute == relative == 2 and got.err == wanted.err == ""
    assert undated(got.out) == undated(wanted.out)
