"""lab/proc.py trusts a pidfile only while its pid is the program the lab started.

Pids are reused (pid_max is 32768 on the CI machines) and /run/fleet-lab outlives daemons
killed without `lab down`, so a pidfile may name a kernel thread or somebody else's process:
such a pidfile is stale, removed, and nothing is signalled. Every wait after SIGKILL has a
deadline. Pure: fake pidfiles under tmp_path and children these tests start themselves; where
a test must prove nothing is signalled, signalling fails the test instead of reaching a process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab import dns, proc

SLEEP = shutil.which("sleep") or "/bin/sleep"
PYTHON = os.path.realpath(sys.executable)


@pytest.fixture
def child() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start short-lived children of our own; each is killed and reaped afterwards."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*argv: str, **kw: object) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def unique_sleep(
    child: Callable[..., subprocess.Popen[bytes]],
) -> tuple[subprocess.Popen[bytes], str]:
    """A `sleep` with a duration no other process has: it doubles as the argv marker."""
    marker = f"30.{uuid.uuid4().int % 10**9:09d}"
    p = child(SLEEP, marker)
    # Popen returns once exec began; the new argv shows in /proc a moment later.
    proc.wait_for(lambda: marker in (proc._cmdline(p.pid) or ""), timeout=5, what="sleep")
    return p, marker


def pidfile_for(tmp_path: Path, pid: int) -> Path:
    path = tmp_path / "daemon.pid"
    path.write_text(f"{pid}\n")
    return path


class _Refusing:
    """A module as proc.py sees it, minus sending signals (kill(pid, 0) still probes)."""

    def __init__(self, module: object) -> None:
        self._module = module

    def __getattr__(self, name: str) -> object:
        return getattr(self._module, name)

    def kill(self, pid: int, sig: int) -> None:
        if sig:
            raise AssertionError(f"signalled pid {pid} with {sig}")
        os.kill(pid, sig)

    def pidfd_send_signal(self, pidfd: int, sig: int, *args: object) -> None:
        raise AssertionError(f"signalled pidfd {pidfd} with {sig}")


@pytest.fixture
def no_signals(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any signal proc.py sends fails the test (and never reaches a process); only proc.py's
    view of os and signal changes, so the tests' own children can still be killed."""
    monkeypatch.setattr(proc, "os", _Refusing(os))
    monkeypatch.setattr(proc, "signal", _Refusing(signal))


def kernel_thread() -> int | None:
    """Some kernel thread's pid (PF_KTHREAD in /proc/PID/stat's flags), if /proc shows one."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            flags = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[6])
        except (OSError, IndexError, ValueError):
            continue
        if flags & 0x00200000:
            return int(entry.name)
    return None


# -- reading pidfiles ----------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "abc", "12x", "0", "1", "-1", "-4242", "\xff"])
def test_read_pid_refuses_what_is_no_daemon_pid(tmp_path: Path, text: str) -> None:
    path = tmp_path / "x.pid"
    path.write_text(text, errors="surrogateescape")
    assert proc.read_pid(path) is None


def test_read_pid_missing_file(tmp_path: Path) -> None:
    assert proc.read_pid(tmp_path / "none.pid") is None
    assert not proc.running(tmp_path / "none.pid", program="dnsmasq")


def test_read_pid_plain(tmp_path: Path) -> None:
    assert proc.read_pid(pidfile_for(tmp_path, 4242)) == 4242


# -- identity ------------------------------------------------------------------------------


def test_running_needs_the_program_and_the_marker(tmp_path: Path, child) -> None:
    p, marker = unique_sleep(child)
    pidfile = pidfile_for(tmp_path, p.pid)
    assert proc.running(pidfile, program=SLEEP, argv_has=marker)
    assert proc.running(pidfile, program="sleep")
    assert not proc.running(pidfile, program="/usr/sbin/dnsmasq")
    assert not proc.running(pidfile, program=SLEEP, argv_has="--pid-file=/run/fleet-lab/x.pid")


def test_zombie_is_not_running(tmp_path: Path, child) -> None:
    p, marker = unique_sleep(child)
    p.kill()
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert not proc.running(pidfile_for(tmp_path, p.pid), program=SLEEP, argv_has=marker)


def test_kernel_thread_is_nobodys_daemon(tmp_path: Path, no_signals: None) -> None:
    pid = kernel_thread()
    if pid is None:
        pytest.skip("no kernel thread visible in /proc")
    assert proc.program_name(pid) is None
    assert not proc.is_program(pid)  # not even "any user process"
    pidfile = pidfile_for(tmp_path, pid)
    assert not proc.running(pidfile)
    assert proc.stop_pidfile(pidfile, program="/usr/sbin/dockerd", timeout=0.1) is False
    assert not pidfile.exists()


def test_program_name_without_exe_falls_back_to_argv0(
    monkeypatch: pytest.MonkeyPatch, child
) -> None:
    p, _ = unique_sleep(child)
    real = os.readlink

    def readlink(path: str, *a: object, **kw: object) -> str:
        if path == f"/proc/{p.pid}/exe":
            raise PermissionError(13, "Permission denied")
        return real(path, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(proc.os, "readlink", readlink)
    assert proc.program_name(p.pid) == "sleep"
    # A process title as sshd sets it: argv[0] is the whole title.
    monkeypatch.setattr(proc, "_cmdline", lambda pid: "sshd: /usr/sbin/sshd -D -f /x [listener]")
    assert proc.program_name(p.pid) == "sshd"
    monkeypatch.setattr(proc, "_cmdline", lambda pid: None)  # kernel thread: empty cmdline
    assert proc.program_name(p.pid) is None


def test_program_name_of_a_replaced_binary(monkeypatch: pytest.MonkeyPatch, child) -> None:
    p, _ = unique_sleep(child)
    real = os.readlink

    def readlink(path: str, *a: object, **kw: object) -> str:
        if path == f"/proc/{p.pid}/exe":
            return "/usr/sbin/dockerd (deleted)"  # the package was upgraded under it
        return real(path, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(proc.os, "readlink", readlink)
    assert proc.program_name(p.pid) == "dockerd"
    assert proc.is_program(p.pid, "/usr/sbin/dockerd")


# -- stale pidfiles: removed, nothing signalled ---------------------------------------------


@pytest.mark.parametrize(
    ("program", "argv_has"),
    [("/usr/sbin/dnsmasq", None), (SLEEP, "--pid-file=/run/fleet-lab/dnsmasq.pid")],
    ids=["other-program", "other-argv"],
)
def test_stale_pidfile_of_a_live_unrelated_process(
    tmp_path: Path, child, no_signals: None, program: str, argv_has: str | None
) -> None:
    p, _ = unique_sleep(child)
    pidfile = pidfile_for(tmp_path, p.pid)
    assert proc.stop_pidfile(pidfile, program=program, argv_has=argv_has, timeout=0.1) is False
    assert not pidfile.exists()
    assert p.poll() is None  # untouched


def test_stale_pidfile_of_a_gone_process(tmp_path: Path, child, no_signals: None) -> None:
    p, marker = unique_sleep(child)
    p.kill()
    p.wait()
    pidfile = pidfile_for(tmp_path, p.pid)
    assert proc.stop_pidfile(pidfile, program=SLEEP, argv_has=marker) is False
    assert not pidfile.exists()


def test_without_program_a_process_lacking_exe_is_not_signalled(
    tmp_path: Path, child, no_signals: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a kernel thread looks like (no exe, empty cmdline), on a child of ours."""
    p, _ = unique_sleep(child)
    monkeypatch.setattr(proc, "program_name", lambda pid: None)
    pidfile = pidfile_for(tmp_path, p.pid)
    assert proc.stop_pidfile(pidfile, timeout=0.1) is False
    assert not pidfile.exists()
    assert p.poll() is None


# -- stopping the real thing -----------------------------------------------------------------


@pytest.fixture(params=["pidfd", "no-pidfd"])
def pidfd_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "no-pidfd":
        monkeypatch.setattr(proc, "_pidfd", lambda pid: None)
    return str(request.param)


def test_stop_sigterm(tmp_path: Path, child, pidfd_mode: str) -> None:
    p, marker = unique_sleep(child)
    pidfile = pidfile_for(tmp_path, p.pid)
    assert proc.stop_pidfile(pidfile, program=SLEEP, argv_has=marker, timeout=10) is True
    assert p.wait(timeout=5) == -signal.SIGTERM
    assert not pidfile.exists()


def test_stop_escalates_to_sigkill(tmp_path: Path, child, pidfd_mode: str) -> None:
    marker = f"ignores-term-{uuid.uuid4().hex}"
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(30)"
    )
    p = child(PYTHON, "-c", code, marker, stdout=subprocess.PIPE)
    assert p.stdout is not None
    assert p.stdout.readline() == b"ready\n"  # SIGTERM is ignored from here on
    pidfile = pidfile_for(tmp_path, p.pid)
    ok = proc.stop_pidfile(pidfile, program=PYTHON, argv_has=marker, timeout=0.3, kill_timeout=5)
    assert ok is True
    assert p.wait(timeout=5) == -signal.SIGKILL
    assert not pidfile.exists()


def test_wait_after_sigkill_has_a_deadline(
    tmp_path: Path, child, pidfd_mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that does not die (D state; here: signals swallowed) ends in a LabError."""
    p, marker = unique_sleep(child)
    sent: list[signal.Signals] = []
    monkeypatch.setattr(proc, "_signal", lambda pid, pidfd, sig: sent.append(sig))
    pidfile = pidfile_for(tmp_path, p.pid)
    with pytest.raises(proc.LabError, match=r"still alive 0s after SIGKILL"):
        proc.stop_pidfile(pidfile, program=SLEEP, argv_has=marker, timeout=0.2, kill_timeout=0.2)
    assert sent == [signal.SIGTERM, signal.SIGKILL]
    assert pidfile.exists()  # kept: the daemon is still there


# -- the callers say what their daemon is ----------------------------------------------------


def test_dns_identity_matches_its_argv() -> None:
    argv = dns.argv()
    assert dns._IDENTITY["program"] == argv[0]
    assert dns._IDENTITY["argv_has"] in argv
