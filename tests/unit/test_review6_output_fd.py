"""`-o /dev/stdout` and `--metrics /dev/stdout` (sixth review): written through the descriptor
the run was given (reconciler/output_file.py), whatever it is.

Before, the path was resolved (os.path.realpath) to what descriptor 1 is: a pipe's
`/proc/PID/fd/pipe:[N]` was taken for a missing file (`-o /dev/stdout | wc`: exit 1, nothing
written), and a file the shell opened with `>>` had the report renamed over it (its earlier
lines lost, another inode). The CLI runs here in a process of its own, its stdout a real pipe
or a real file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest

from reconciler.output_file import target_problem

ROOT = Path(__file__).resolve().parents[2]
INCIDENTS = ROOT / "examples" / "lab-incidents"
# A replay of the captured lab: no box is contacted, no run recorded
DRIFT = (
    "--root", str(INCIDENTS), "-i", "lab", "drift", "--from-snapshot", str(INCIDENTS / "snapshot"),
    "--no-history", "--format", "json",
)  # fmt: skip


def unstamped(data: bytes) -> bytes:
    """The report without the time it was made (a second apart in two runs)."""
    return re.sub(rb'"generated_at": "[^"]*"', b'"generated_at": ""', data)


def run(
    *args: str, stdout: int | IO[bytes] = subprocess.PIPE, pass_fds: tuple[int, ...] = ()
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *args],
        cwd=ROOT,
        stdout=stdout,
        stderr=subprocess.PIPE,
        pass_fds=pass_fds,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def plain() -> dict[str, bytes]:
    """What each command prints on stdout without -o: what -o /dev/stdout must deliver."""
    outputs = {}
    for name, args in {"schema": ("schema",), "drift": DRIFT}.items():
        done = run(*args)
        assert done.returncode in (0, 2) and done.stdout, done.stderr
        outputs[name] = unstamped(done.stdout)
    return outputs


@pytest.mark.parametrize("name", ["schema", "drift"])
def test_o_dev_stdout_into_a_pipe_delivers_the_report(name: str, plain: dict[str, bytes]) -> None:
    args = ("schema",) if name == "schema" else DRIFT
    done = run(*args, "-o", "/dev/stdout")
    assert done.returncode == (0 if name == "schema" else 2), done.stderr
    assert unstamped(done.stdout) == plain[name]
    assert done.stderr.decode() == "wrote /dev/stdout\n"


@pytest.mark.parametrize("name", ["schema", "drift"])
def test_o_dev_stdout_appended_to_a_log_keeps_its_lines_and_its_inode(
    tmp_path: Path, name: str, plain: dict[str, bytes]
) -> None:
    log = tmp_path / "log.txt"
    earlier = b"earlier run 1\nearlier run 2\n"
    log.write_bytes(earlier)
    inode = log.stat().st_ino
    args = ("schema",) if name == "schema" else DRIFT
    with log.open("ab") as appended:  # the shell's `>> log.txt`
        done = run(*args, "-o", "/dev/stdout", stdout=appended)
    assert done.returncode == (0 if name == "schema" else 2), done.stderr
    assert log.stat().st_ino == inode  # the same file, not one renamed over it
    assert unstamped(log.read_bytes()) == earlier + plain[name]


def test_o_dev_stdout_into_a_file_opened_with_gt_is_written_at_its_offset(
    tmp_path: Path, plain: dict[str, bytes]
) -> None:
    out = tmp_path / "out.json"
    with out.open("wb") as opened:  # the shell's `> out.json`: the run owns what follows
        opened.write(b"header\n")
        opened.flush()
        inode = out.stat().st_ino
        done = run("schema", "-o", "/dev/stdout", stdout=opened)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_ino == inode
    assert out.read_bytes() == b"header\n" + plain["schema"]


def test_metrics_dev_stdout_into_a_pipe_follow_the_report(plain: dict[str, bytes]) -> None:
    done = run(*DRIFT, "--metrics", "/dev/stdout")
    assert done.returncode == 2, done.stderr
    out = unstamped(done.stdout)
    report, metrics = out[: len(plain["drift"])], out[len(plain["drift"]) :]
    assert report == plain["drift"]  # printed first, whole, then the metrics
    json.loads(report)
    assert b"\nfleet_drift_last_run_exit_code 2.0\n" in metrics
    assert metrics.startswith(b"# HELP ")


def test_both_to_dev_stdout_through_a_pipe(plain: dict[str, bytes]) -> None:
    done = run(*DRIFT, "-o", "/dev/stdout", "--metrics", "/dev/fd/1")
    assert done.returncode == 2, done.stderr
    out = unstamped(done.stdout)
    assert out.startswith(plain["drift"])
    assert b"fleet_drift_last_run_exit_code 2.0" in out[len(plain["drift"]) :]


def test_a_descriptor_not_open_is_refused_before_the_run(tmp_path: Path) -> None:
    done = run(*DRIFT, "-o", "/dev/fd/9")  # subprocess closes every descriptor not passed
    assert done.returncode == 1
    assert done.stderr.decode() == "error: -o /dev/fd/9: descriptor 9 is not open\n"
    assert done.stdout == b""


def test_a_read_only_descriptor_is_refused_and_its_file_untouched(tmp_path: Path) -> None:
    kept = tmp_path / "kept.txt"
    kept.write_bytes(b"kept\n")
    inode = kept.stat().st_ino
    with kept.open("rb") as read_only:
        fd = read_only.fileno()
        done = run(*DRIFT, "--metrics", f"/proc/self/fd/{fd}", pass_fds=(fd,))
    assert done.returncode == 1
    said = done.stderr.decode()
    assert (
        said == f"error: --metrics /proc/self/fd/{fd}: descriptor {fd} is open for reading only\n"
    )
    assert done.stdout == b""  # refused before the report
    assert kept.read_bytes() == b"kept\n" and kept.stat().st_ino == inode


def test_the_names_of_a_descriptor_are_recognised(tmp_path: Path) -> None:
    from reconciler.output_file import descriptor  # new with the fix: the CLI tests run before

    read, write = os.pipe()
    try:
        link = tmp_path / "link"
        link.symlink_to(f"/dev/fd/{write}")
        for path in (
            f"/dev/fd/{write}",
            f"/proc/self/fd/{write}",
            f"/proc/{os.getpid()}/fd/{write}",
            f"/proc/thread-self/fd/{write}",
            str(link),
        ):
            assert descriptor(path) == write, path
            assert target_problem("-o", path) is None, path
        assert descriptor("/dev/stdout") == 1 and descriptor("/dev/stderr") == 2
        said = target_problem("-o", f"/dev/fd/{read}")
        assert said == f"-o /dev/fd/{read}: descriptor {read} is open for reading only"
    finally:
        os.close(read)
        os.close(write)
    # Closed now: refused, and not taken for a missing file to create
    assert target_problem("-o", f"/dev/fd/{write}") == (
        f"-o /dev/fd/{write}: descriptor {write} is not open"
    )
    # Not a descriptor: a file, a device, another process's descriptor
    (tmp_path / "f").write_text("x")
    for path in (str(tmp_path / "f"), "/dev/null", "/proc/1/fd/1", str(tmp_path / "new")):
        assert descriptor(path) is None, path
