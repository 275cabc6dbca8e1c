"""Running commands and daemons: argument lists only, pidfiles as the only handle on a daemon.

`lab down` must stop exactly what `lab up` started, so every daemon writes a pidfile and is
stopped by that pid, never by name.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypedDict

VERBOSE = os.environ.get("FLEET_LAB_VERBOSE") == "1"


class LabError(RuntimeError):
    """A lab step failed; the message says which step and carries the command's stderr."""


def log(msg: str) -> None:
    print(f"[lab] {msg}", file=sys.stderr, flush=True)


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    check: bool = True,
    input: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = 120,
) -> subprocess.CompletedProcess[str]:
    args = [str(a) for a in argv]
    if VERBOSE:
        log("$ " + " ".join(args))
    proc = subprocess.run(
        args,
        input=input,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise LabError(
            f"command failed ({proc.returncode}): {' '.join(args)}\n"
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc


def ok(argv: Sequence[str | os.PathLike[str]], **kw: Any) -> bool:
    """True when the command exits 0 (for idempotence probes: does the thing already exist?)."""
    return run(argv, check=False, **kw).returncode == 0


class Identity(TypedDict):
    """What a daemon's pid must be to count as the lab's (`is_program`): pass as **identity."""

    program: str
    argv_has: str


def read_pid(pidfile: Path) -> int | None:
    """The pid in `pidfile`, or None when there is none worth looking at.

    0, 1 and negative numbers are never a daemon's pid, and kill() would read them as
    "my process group", "init" and "every process I may signal".
    """
    try:
        pid = int(pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if pid > 1 else None


def pid_alive(pid: int | None) -> bool:
    """Some process has this pid (not a zombie). Says nothing about *which* process:
    use `is_program` before trusting or signalling it."""
    if not pid or pid < 1:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as dead.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _cmdline(pid: int) -> str | None:
    """/proc/PID/cmdline with NULs as spaces; None when unreadable or empty (kernel thread)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return text or None


def program_name(pid: int) -> str | None:
    """Basename of the program `pid` runs, or None: gone, or a kernel thread (no exe).

    From /proc/PID/exe; only when that link may not be read (not root, another user's
    process) from argv[0] of /proc/PID/cmdline, whose first word may carry a ':' from a
    process title ("sshd: /usr/sbin/sshd -D ...").
    """
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except PermissionError:
        argv = _cmdline(pid)
        if argv is None:
            return None
        return os.path.basename(argv.split()[0].rstrip(":")) or None
    except OSError:
        return None  # ENOENT: a kernel thread has no exe; or the process is gone
    return os.path.basename(exe.removesuffix(" (deleted)")) or None


def is_program(pid: int | None, program: str | None = None, *, argv_has: str | None = None) -> bool:
    """True when `pid` is alive and is `program` (a path or a name; compared by basename),
    with `argv_has` in its command line when given.

    Without `program` any user-space process passes, never a kernel thread: callers that
    know their daemon should say which it is, since pids are reused.
    """
    if not pid or not pid_alive(pid):
        return False
    name = program_name(pid)
    if name is None:
        return False
    if program is not None:
        wanted = {os.path.basename(program), os.path.basename(os.path.realpath(program))}
        if name not in wanted:
            return False
    if argv_has is not None:
        argv = _cmdline(pid)
        if argv is None or argv_has not in argv:
            return False
    return True


def running(pidfile: Path, *, program: str | None = None, argv_has: str | None = None) -> bool:
    """The pidfile names a live process that is `program` (see `is_program`)."""
    return is_program(read_pid(pidfile), program, argv_has=argv_has)


def daemon_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without any proxy setting (http_proxy, HTTPS_PROXY, all_proxy,
    no_proxy, ftp_proxy, ... in any case).

    The lab's daemons talk only inside the lab: dockerd sends registry traffic through
    HTTP(S)_PROXY, so pushes and pulls of 10.77.0.1:5000 would leave for a proxy outside.
    """
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if not k.lower().endswith("_proxy")}


def spawn(argv: Sequence[str | os.PathLike[str]], logfile: Path) -> subprocess.Popen[bytes]:
    """Start a long-running daemon detached from our session, output to a log file, with no
    proxy settings in its environment (`daemon_env`).

    start_new_session so a Ctrl-C on `lab up` does not kill the lab it just built.
    """
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with logfile.open("ab") as out:
        return subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=daemon_env(),
            start_new_session=True,
            close_fds=True,
        )


def _pidfd(pid: int) -> int | None:
    """A pidfd pinning `pid` (signals through it cannot reach a later owner of the number)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _signal(pid: int, pidfd: int | None, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)


def _wait_gone(pid: int, pidfd: int | None, still_ours: Callable[[], bool], timeout: float) -> bool:
    """Wait up to `timeout` s for the process to exit; True when it did."""
    deadline = time.monotonic() + timeout
    if pidfd is not None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if poller.poll(max(0, int(min(left, 0.5) * 1000))):
                return True  # a pidfd turns readable when its process exits
            if not pid_alive(pid):
                return True  # exited, or a zombie
            if left <= 0:
                return False
    while still_ours():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def stop_pidfile(
    pidfile: Path,
    *,
    program: str | None = None,
    argv_has: str | None = None,
    timeout: float = 20.0,
    kill_timeout: float = 10.0,
) -> bool:
    """Stop the daemon in `pidfile` and remove the pidfile. True if it ran.

    The pid is the lab's only while it is `program` with `argv_has` in its command line (see
    `is_program`): pids are reused, and a pidfile outlives a daemon killed without `lab down`.
    Anything else (no such pid, a kernel thread, somebody else's process) makes the pidfile
    stale: it is removed and nothing is signalled. The daemon gets SIGTERM, `timeout` s, then
    SIGKILL and `kill_timeout` s more; still alive after that is a LabError (pidfile kept).
    """
    pid = read_pid(pidfile)
    pidfd = _pidfd(pid) if pid else None
    try:
        # Checked after pinning: a pid reused in between fails the check, and a process that
        # exits after it can no longer be reached through the pidfd under another owner.
        if pid is None or not is_program(pid, program, argv_has=argv_has):
            if pid_alive(pid):
                log(
                    f"stale pidfile {pidfile}: pid {pid} is not {program or 'a user process'}"
                    "; removed, nothing signalled"
                )
            pidfile.unlink(missing_ok=True)
            return False

        def still_ours() -> bool:
            return is_program(pid, program, argv_has=argv_has)

        what = f"pid {pid} ({program or 'pidfile ' + str(pidfile)})"
        _signal(pid, pidfd, signal.SIGTERM)
        if not _wait_gone(pid, pidfd, still_ours, timeout):
            if pidfd is not None or still_ours():
                _signal(pid, pidfd, signal.SIGKILL)
            if not _wait_gone(pid, pidfd, still_ours, kill_timeout):
                raise LabError(
                    f"{what} still alive {kill_timeout:.0f}s after SIGKILL (SIGTERM "
                    f"{timeout:.0f}s before; stuck in the kernel?); {pidfile} kept"
                )
    finally:
        if pidfd is not None:
            os.close(pidfd)
    pidfile.unlink(missing_ok=True)
    return True


def wait_for(
    predicate: Callable[[], bool], *, timeout: float, interval: float = 0.1, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
