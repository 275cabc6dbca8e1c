"""`-o FILE` and `--metrics FILE`: checked before anything runs, replaced whole or not at all,
and only ever a regular file (reconciler/output_file.py).

A rename replaces whatever is at the path: before these checks, `--metrics` over a device
replaced the device (as root: /dev/null), `-o` into a FIFO with no reader blocked the run
forever, and `-o` at a directory or in a missing one ended in a traceback.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from reconciler.output_file import target_problem
from tests.unit.history_helpers import AUDIT_FIXTURES, ROOT, SNAPSHOT, reconcile

AUDIT = AUDIT_FIXTURES / "open_mesh"
RUNS: dict[str, Callable[[str], list[str]]] = {
    "drift -o": lambda p: ["drift", "--from-snapshot", str(SNAPSHOT), "-o", p],
    "drift --metrics": lambda p: ["drift", "--from-snapshot", str(SNAPSHOT), "--metrics", p],
    "audit -o": lambda p: ["audit", "--from-snapshot", str(AUDIT), "-o", p],
    "schema -o": lambda p: ["schema", "-o", p],
}


def run_with(capsys: pytest.CaptureFixture[str], run: str, path: Path) -> tuple[int, str, str]:
    # The audit fixtures are judged against the repository's own lab inventory
    root = {"root": ROOT} if run.startswith("audit") else {}
    return reconcile(capsys, *RUNS[run](str(path)), **root)


def not_a_file(tmp_path: Path, kind: str) -> Path:
    target = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        (tmp_path / "elsewhere.txt").write_text("kept\n")
        target.symlink_to(tmp_path / "elsewhere.txt")
    elif kind == "directory":
        target.mkdir()
    return target


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
@pytest.mark.parametrize("run", sorted(RUNS))
def test_only_a_regular_file_is_replaced_and_the_run_never_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], run: str, kind: str
) -> None:
    target = not_a_file(tmp_path, kind)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = run_with(capsys, run, target)
    assert (code, out) == (1, "")
    option = run.split()[1]
    wanted = "is a directory" if kind == "directory" else "exists and is not a regular file"
    assert err.startswith(f"error: {option} {target}: {wanted}")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing made or replaced
    if kind == "symlink":
        assert target.is_symlink() and (tmp_path / "elsewhere.txt").read_text() == "kept\n"


@pytest.mark.parametrize("run", sorted(RUNS))
def test_a_missing_directory_or_a_name_too_long_is_said_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], run: str
) -> None:
    option = run.split()[1]
    missing = tmp_path / "missing" / "out"
    code, out, err = run_with(capsys, run, missing)
    assert (code, out, err) == (
        1, "", f"error: {option} {missing}: the directory {missing.parent} does not exist\n"
    )  # fmt: skip
    long = tmp_path / ("x" * 300)
    code, out, err = run_with(capsys, run, long)
    assert (code, out, err) == (1, "", f"error: {option} {long}: File name too long\n")


@pytest.mark.parametrize("run", ["drift -o", "audit -o", "schema -o"])
def test_a_report_is_replaced_whole_or_the_old_one_is_kept(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    run: str,
) -> None:
    report = tmp_path / "report.txt"
    report.write_text("the last report\n")
    inode = report.stat().st_ino
    code, _, err = run_with(capsys, run, report)
    assert code in (0, 1, 2) and err.endswith(f"wrote {report}\n")
    assert report.stat().st_ino != inode and report.read_text() != "the last report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.txt"]  # nothing left aside
    written = report.read_text()

    def disk_full(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", disk_full)
    code, out, err = run_with(capsys, run, report)
    assert (code, out) == (1, "")
    assert err.endswith(f"error: -o {report}: No space left on device\n")
    assert report.read_text() == written  # the last one, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.txt"]


def test_target_problem_accepts_a_new_file_or_a_regular_one(tmp_path: Path) -> None:
    assert target_problem("-o", str(tmp_path / "new.json")) is None
    (tmp_path / "old.json").write_text("{}")
    assert target_problem("-o", str(tmp_path / "old.json")) is None
    (tmp_path / "file").write_text("")
    assert target_problem("-o", str(tmp_path / "file" / "x")) == (
        f"-o {tmp_path}/file/x: Not a directory"
    )
