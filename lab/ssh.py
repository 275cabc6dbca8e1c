"""Reaching a box the way an operator does: SSH as the box user with the lab's key.

Host keys are pinned by .lab/ssh/known_hosts (StrictHostKeyChecking=yes) and the user's
~/.ssh/config is ignored (-F /dev/null) so nothing on the host changes how the lab is reached.
"""

from __future__ import annotations

import subprocess

from .config import CLIENT_KEY, KNOWN_HOSTS, Box


def argv(box: Box, command: str | None = None, *, tty: bool = False) -> list[str]:
    opts = [
        "-F",
        "/dev/null",
        "-i",
        str(CLIENT_KEY),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={KNOWN_HOSTS}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "LogLevel=ERROR",
    ]
    if tty:
        opts.append("-t")
    # `-l USER` and `--` before the host: neither can ever be read as an ssh option.
    for value in (box.user, box.address):
        if not value or value.startswith("-"):
            raise ValueError(f"refusing ssh user/host {value!r}")
    opts += ["-l", box.user]
    return ["ssh", *opts, "--", box.address, *([command] if command is not None else [])]


def run(
    box: Box, command: str, *, check: bool = True, input: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run one shell command line on the box as its user (the remote shell parses it)."""
    proc = subprocess.run(
        argv(box, command),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"ssh {box.user}@{box.address} {command!r} failed ({proc.returncode}):\n"
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc
