"""Running commands and daemons: argument lists only, pidfiles as the only handle on a daemon.

`lab down` must stop exactly what `lab up` started, so every daemon writes a pidfile and is
stopped by that pid, never by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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


def read_pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def pid_alive(pid: int | None) -> bool:
    if not pid:
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
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def running(pidfile: Path) -> bool:
    return pid_alive(read_pid(pidfile))


def spawn(argv: Sequence[str | os.PathLike[str]], logfile: Path) -> subprocess.Popen[bytes]:
    """Start a long-running daemon detached from our session, output to a log file.

    start_new_session so a Ctrl-C on `lab up` does not kill the lab it just built.
    """
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with logfile.open("ab") as out:
        return subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def stop_pidfile(pidfile: Path, *, timeout: float = 20.0) -> bool:
    """SIGTERM the pid in `pidfile`, wait, SIGKILL if needed; remove the pidfile. True if it ran."""
    pid = read_pid(pidfile)
    was_running = pid_alive(pid)
    if was_running and pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while pid_alive(pid):
                time.sleep(0.05)
    pidfile.unlink(missing_ok=True)
    return was_running


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
