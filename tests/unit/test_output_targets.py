"""`-o FILE` and `--metrics FILE`: checked before anything runs, a regular file replaced whole
or not at all, a symlink's target written, a device or a FIFO written into, never replaced
(reconciler/output_file.py).

Before: `--metrics` over a device replaced the device (as root: /dev/null), and `-o` at a
directory, in a missing one or with a name too long ended in a traceback.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


@pytest.mark.parametrize("run", sorted(RUNS))
def test_a_directory_is_refused_and_the_run_never_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], run: str
) -> None:
    target = tmp_path / "out"
    target.mkdir()
    code, out, err = run_with(capsys, run, target)
    assert (code, out) == (1, "")
    assert err == f"error: {run.split()[1]} {target}: is a directory, not a file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing made beside it


@pytest.mark.parametrize("run", sorted(RUNS))
def test_a_symlinks_target_is_replaced_and_the_link_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], run: str
) -> None:
    (tmp_path / "real").mkdir()
    kept = tmp_path / "real" / "out.txt"
    kept.write_text("the last one\n")
    link = tmp_path / "link.txt"
    link.symlink_to(kept)
    code, _, err = run_with(capsys, run, link)
    assert code in (0, 2) and "error" not in err
    assert link.is_symlink() and link.resolve() == kept
    assert kept.read_text() != "the last one\n" and kept.stat().st_size > 0
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["out.txt"]


@pytest.mark.parametrize("run", sorted(RUNS))
def test_a_fifo_is_written_into_and_stays_a_fifo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], run: str
) -> None:
    """As `>` writes into a pipe another program reads (a rename would replace it)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    code, _, err = run_with(capsys, run, fifo)
    reader.join(30)
    assert code in (0, 2) and "error" not in err
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert got and len(got[0]) > 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_device_is_written_into_never_replaced(capsys: pytest.CaptureFixture[str]) -> None:
    before = os.stat("/dev/null")
    code, _, err = run_with(capsys, "drift -o", Path("/dev/null"))
    assert code == 2 and err == "wrote /dev/null\n"
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (
        before.st_ino, before.st_rdev
    )  # fmt: skip


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


def test_a_directory_that_cannot_be_written_is_refused_before_the_run(tmp_path: Path) -> None:
    """Guard: `-o` and `--metrics` in a directory the user may not write in were accepted by
    the check (it exists), and the write failed only after every box was observed: the run
    was lost. Root writes anywhere, so the run drops CAP_DAC_OVERRIDE (setpriv), as a user
    without it meets the directory."""
    import subprocess
    import sys

    shut = tmp_path / "shut"
    shut.mkdir()
    if os.geteuid() == 0:
        os.chown(shut, 65534, 65534)  # nobody's: root is then only "other"
    shut.chmod(0o755)
    drop = (
        [
            "setpriv",
            "--bounding-set=-dac_override,-dac_read_search",
            "--inh-caps=-dac_override,-dac_read_search",
        ]
        if os.geteuid() == 0
        else []
    )
    for option in ("-o", "--metrics"):
        target = shut / "report.txt"
        done = subprocess.run(
            [
                *drop,
                sys.executable,
                "-m",
                "reconciler",
                "--root",
                str(ROOT / "examples" / "lab-incidents"),
                "-i",
                "lab",
                "drift",
                "--from-snapshot",
                str(SNAPSHOT),
                "--no-history",
                option,
                str(target),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert (done.returncode, done.stdout) == (1, ""), done.stderr
        assert done.stderr == (
            f"error: {option} {target}: cannot write in {shut}: Permission denied\n"
        )
        assert list(shut.iterdir()) == []


def test_the_write_check_leaves_nothing_behind(tmp_path: Path) -> None:
    assert target_problem("-o", str(tmp_path / "report.txt")) is None
    assert target_problem("--metrics", str(tmp_path / "m.prom")) is None
    assert list(tmp_path.iterdir()) == []


def test_a_directory_that_refuses_the_rename_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 8: in an append-only directory (`chattr +a`) a file can be made but not renamed
    or removed; the check made its probe, could not remove it, and said nothing: the run was
    lost at the end, and the probe left. The probe is now renamed as the write's file is."""
    real_rename = os.rename

    def append_only(src: Any, dst: Any) -> None:
        if str(src).endswith(".probe"):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", append_only)
    problem = target_problem("-o", str(tmp_path / "report.txt"))
    assert problem == f"-o {tmp_path / 'report.txt'}: cannot replace files in {tmp_path}: " + (
        "Operation not permitted"
    )


def test_another_users_file_in_a_sticky_directory_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 8: `--metrics /tmp/shared/fleet.prom`, root's file (0666) in a sticky directory,
    run by another user: writable, so the check passed; the rename over it was refused after
    every box was observed. Judged on the real modes and owners, as user 65534."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    theirs = shared / "fleet.prom"
    theirs.write_text("old\n")
    theirs.chmod(0o666)
    os.chown(shared, 0, 0)
    os.chown(theirs, 0, 0)
    monkeypatch.setattr(os, "geteuid", lambda: 65534)
    problem = target_problem("--metrics", str(theirs))
    assert problem is not None and "another user's file in a sticky directory" in problem
    os.chown(theirs, 65534, 65534)  # the user's own file there: replaced as usual
    assert target_problem("--metrics", str(theirs)) is None
    shared.chmod(0o777)  # no sticky bit: anyone who may write the directory may replace it
    os.chown(theirs, 0, 0)
    assert target_problem("--metrics", str(theirs)) is None
