"""Run one command per box over OpenSSH, all boxes in parallel, with connection reuse.

Why OpenSSH and not paramiko: a drift run is one round trip per box, so connection setup is
most of its cost; OpenSSH's ControlMaster lets consecutive runs (and the converge that follows
a drift report) reuse one authenticated connection. Faults are results: a box that refuses,
times out or is unknown returns an error string, and the other boxes are unaffected.
"""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from reconciler.scrub import exception_text, scrub_text


@dataclass(frozen=True)
class Target:
    """Where a box's sshd is and how to trust it (plain values: this module imports nothing
    heavy, so a drift run can start its SSH round trips before loading anything else)."""

    box: str
    hostname: str
    user: str
    port: int
    key_file: str | None
    known_hosts: str | None


@dataclass(frozen=True)
class RemoteResult:
    box: str
    returncode: int | None
    stdout: str
    stderr: str
    error: str | None  # set when the command could not run at all (unreachable, timeout)


def control_dir() -> Path:
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    path = base / f"fleet-reconciler-ssh-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def ssh_argv(target: Target, remote_command: str, connect_timeout: int = 5) -> list[str]:
    argv = [
        "ssh",
        "-p",
        str(target.port),
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={connect_timeout}",
        "-o",
        "ServerAliveInterval=5",
        "-o",
        "ServerAliveCountMax=2",
        "-o",
        "ControlMaster=auto",
        "-o",
        f"ControlPath={control_dir()}/%C",
        "-o",
        "ControlPersist=120",
        "-o",
        "LogLevel=ERROR",
    ]
    if target.key_file:
        argv += ["-i", target.key_file, "-o", "IdentitiesOnly=yes"]
    if target.known_hosts:
        argv += [
            "-o",
            f"UserKnownHostsFile={target.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
        ]
    argv += [f"{target.user}@{target.hostname}", "--", remote_command]
    return argv


@dataclass
class Running:
    """A remote command in flight; `finish()` waits for it."""

    box: str
    proc: subprocess.Popen[str] | None
    error: str | None = None

    def finish(self, timeout: float) -> RemoteResult:
        if self.proc is None:
            return RemoteResult(self.box, None, "", "", self.error)
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return RemoteResult(self.box, None, "", "", f"no answer within {timeout:g} s")
        if self.proc.returncode == 255:
            last = (err.strip().splitlines() or ["ssh failed"])[-1]
            return RemoteResult(self.box, 255, out, err, f"unreachable: {scrub_text(last)}")
        return RemoteResult(self.box, self.proc.returncode, out, err, None)

    def cancel(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def spawn(target: Target, remote_command: str) -> Running:
    try:
        proc = subprocess.Popen(
            ssh_argv(target, remote_command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except OSError as exc:
        return Running(target.box, None, f"cannot run ssh: {exception_text(exc)}")
    return Running(target.box, proc)


def finish_all(running: list[Running], timeout: float) -> dict[str, RemoteResult]:
    """Wait for every box at once (pipes drained in parallel: a report is ~150 KB)."""
    if not running:
        return {}
    with ThreadPoolExecutor(max_workers=len(running)) as pool:
        futures = {r.box: pool.submit(r.finish, timeout) for r in running}
        return {box: future.result() for box, future in futures.items()}


def run_one(target: Target, remote_command: str, timeout: float) -> RemoteResult:
    return spawn(target, remote_command).finish(timeout)


def run_all(
    targets: list[Target], commands: dict[str, str], timeout: float = 60.0
) -> dict[str, RemoteResult]:
    """Run commands[box] on every target at once; returns results by box."""
    return finish_all([spawn(t, commands[t.box]) for t in targets], timeout)


# Runs on the box before the program. Compiling the program costs each run ~10 ms of the
# box's CPU, so the compiled code is kept in the user's private cache directory (the one the
# collector keeps its renders in: ~/.cache/fleet-reconciler, else /tmp/fleet-reconciler-UID),
# one file per program and Python version, stamped with the digest of its source; a directory
# that is not the user's own and private is not used, a stale or damaged file is compiled
# over (atomically).
BOOTSTRAP = """\
import base64,hashlib,marshal,os,sys,zlib
def _code(s,name):
 h=hashlib.sha256(s).digest()
 tmp=os.environ.get('TMPDIR') or '/tmp'
 for d in (os.path.expanduser('~/.cache/fleet-reconciler'),
           os.path.join(tmp,'fleet-reconciler-%d'%os.getuid())):
  try:
   os.makedirs(d,0o700,exist_ok=True)
   i=os.stat(d)
  except OSError:
   continue
  if i.st_uid!=os.getuid() or i.st_mode&0o077:
   continue
  p=os.path.join(d,'%s.%s.code'%(name,sys.implementation.cache_tag))
  try:
   with open(p,'rb') as f:
    b=f.read()
   if b[:32]==h:
    return marshal.loads(b[32:])
  except Exception:
   pass
  c=compile(s,'<'+name+'>','exec')
  try:
   t='%s.%d'%(p,os.getpid())
   with open(t,'wb') as f:
    f.write(h+marshal.dumps(c))
   os.replace(t,p)
  except OSError:
   pass
  return c
 return compile(s,'<'+name+'>','exec')
exec(_code(zlib.decompress(base64.b64decode('{packed}')),'{name}'))
"""


def python_command(program: Path, argument: str) -> str:
    """A remote `python3 -I -S -c BOOTSTRAP ARG` line that runs `program` (a stdlib-only
    script) on the box; the program travels compressed to stay short.

    `-I`: the deploy user's PYTHONPATH/PYTHONSTARTUP and user site cannot change the program;
    `-S`: it is stdlib only, so the site machinery (a tenth of its start-up) is skipped."""
    packed = _packed(program, program.stat().st_mtime_ns)
    bootstrap = BOOTSTRAP.format(packed=packed, name=program.stem)
    return f"python3 -I -S -c {shlex.quote(bootstrap)} {shlex.quote(argument)}"


@functools.lru_cache(maxsize=4)
def _packed(program: Path, _version: int) -> str:
    # Read and compressed once per process and version of the file: every box of a run
    # receives the same program.
    import base64
    import zlib

    script = program.read_text(encoding="utf-8")
    return base64.b64encode(zlib.compress(script.encode("utf-8"), 9)).decode("ascii")
