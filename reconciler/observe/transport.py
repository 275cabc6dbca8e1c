"""Run one command per box over OpenSSH, all boxes in parallel, with connection reuse.

Why OpenSSH and not paramiko: a drift run is one round trip per box, so connection setup is
most of its cost; OpenSSH's ControlMaster lets consecutive runs (and the converge that follows
a drift report) reuse one authenticated connection. Faults are results: a box that refuses,
times out or is unknown returns an error string, and the other boxes are unaffected.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shlex
import stat
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

from reconciler.box_program import box_source, box_stamp
from reconciler.scrub import exception_text, reason, scrub_text

T = TypeVar("T")


# The types a drift run needs before its collectors are spawned are NamedTuples and plain
# classes, not dataclasses: importing dataclasses (and inspect under it) costs ~16 ms of CPU,
# and setting up a frozen dataclass ~1 ms more (Python 3.11 compiles each generated method),
# on the path every repeated run waits on; the comparison's dataclasses load while the boxes
# work (tests/unit/test_prespawn_imports.py).
class Target(NamedTuple):
    """Where a box's sshd is and how to trust it (plain values: this module imports nothing
    heavy, so a drift run can start its SSH round trips before loading anything else)."""

    box: str
    hostname: str
    user: str
    port: int
    key_file: str | None
    known_hosts: str | None


class WithStdin(str):
    """A remote command line and what its program reads on stdin (`stdin`): how the pyinfra
    fact hands the collector its payload to the `@openssh` connector, which sends it on ssh's
    stdin (pyinfra's facts have a command and no stdin of their own)."""

    stdin: bytes

    def __new__(cls, command: str, stdin: bytes) -> WithStdin:
        made = super().__new__(cls, command)
        made.stdin = stdin
        return made


class RemoteResult(NamedTuple):
    """One remote command's outcome: exit code, output (bounded), or why it could not run."""

    box: str
    returncode: int | None
    stdout: str
    stderr: str
    error: str | None  # set when the command could not run at all (unreachable, timeout)
    truncated: bool = False  # stdout passed the reading limit: reading stopped, ssh was killed


# What is read of a box's answer at most. A box is not trusted to be brief: a hostile or broken
# one could stream gigabytes, and a pipe read whole (communicate()) would hold them all in the
# controller's memory before anything could check the size. observe/document.py refuses answers
# over its own limit (the same 8 MiB); reading stops one byte past it and the ssh client is
# killed. Real answers are 120-160 KB. stderr is only ever shown as its last line, so its
# last STDERR_LIMIT_BYTES are kept (a login shell's noise comes first, ssh's error last).
OUTPUT_LIMIT_BYTES = 8 * 1024 * 1024
STDERR_LIMIT_BYTES = 64 * 1024
_CHUNK = 64 * 1024
# Whether a box takes a new SSH connection: connect, and its greeting, each within this.
CHECK_S = 2.0
# A master's socket path must fit sun_path (NUL included): 108 bytes on Linux, 104 on macOS
# and the BSDs. ssh binds it first as ControlPath + "." + 16 random characters and
# then links it into place (mux.c muxserver_listen); a path too long for that makes every ssh
# exit 255 ("ControlPath too long" or "too long for Unix domain socket"). ControlPath is
# DIR/NAME and NAME is SOCKET_NAME_HEX hex digits (control_path), as long as ssh's own %C.
SUN_PATH_BYTES = 108 if sys.platform.startswith("linux") else 104
SOCKET_NAME_HEX = 40
SOCKET_NAME_BYTES = len("/") + SOCKET_NAME_HEX + len(".") + 16


class UnsafeTarget(ValueError):
    """A user or host that ssh could read as an option (or as more than one argument)."""


# What a box's error says when ssh exits 255 and says nothing: at LogLevel=ERROR it keeps its
# fatal reasons to itself when they are logged at INFO (a connection timed out after the SSH
# banner, "Bad packet length", a reset mid-run), which leaves only these.
SILENT_255 = (
    "ssh gave up without a reason: the connection timed out or broke "
    "(sshd silent, or the network cut)"
)
# How long cancel() waits for a killed ssh to be reaped (at once, unless the kernel holds it).
CANCEL_WAIT_S = 5.0
# The controller's own limits: too many open files (its process's, or the system's), no process
# or thread to be had (EAGAIN: a pids cgroup, systemd's TasksMax), no memory for a socket.
_CONTROLLER_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM, errno.ENOBUFS}
)


def controller_short(exc: BaseException) -> str | None:
    """What the controller ran out of when `exc` is its own limit, never the box's doing (so a
    box is never said unreachable for it); None for any other failure."""
    if isinstance(exc, OSError) and exc.errno in _CONTROLLER_ERRNOS:
        return reason(exc)  # "too many open files (EMFILE)"
    if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
        return "no thread could be started (its process or thread limit)"
    return None


_said_short: set[str] = set()


def say_controller_short(what: str, why: str) -> None:
    """On stderr, once per process and kind: the controller itself could not do `what`."""
    if what in _said_short:
        return
    _said_short.add(what)
    print(
        f"reconcile: this controller could not {what}: {why}; a limit of the controller, not "
        "of the boxes (lower --max-parallel, or raise its limit: `ulimit -n`, TasksMax)",
        file=sys.stderr,
    )


def control_dir() -> Path | None:
    """Where the ControlMaster sockets live, or None: then no connection is shared.

    Whoever can write this directory can put a socket of their own where ssh looks for the
    master, and then receives every command and every secret sent on stdin. So it is used only
    when it is ours, a real directory and mode 0700 (a /tmp name can be taken by anyone first),
    and no one else can rename it or a directory above it (private_dir)."""
    return private_dir(Path(_runtime_base()) / f"fleet-reconciler-ssh-{os.getuid()}")


def _runtime_base() -> str:
    """XDG_RUNTIME_DIR, else the temporary directory as tempfile names it (TMPDIR, TEMP, TMP,
    /tmp). Not tempfile.gettempdir(): it imports random and test-writes a file in each
    candidate on every run, and private_dir checks the one place used anyway."""
    for name in ("XDG_RUNTIME_DIR", "TMPDIR", "TEMP", "TMP"):
        value = os.environ.get(name)
        if value and os.path.isabs(value):
            return value
    return "/tmp"


@functools.lru_cache(maxsize=8)
def private_dir(path: Path) -> Path | None:
    """`path`, created 0700 if missing, if it is safe to keep sockets in; else None, said once.

    Checked once per process, so what is checked must stay true: the path is used with its
    parent's symbolic links resolved (a link in it could be re-pointed later by whoever owns
    it), and every directory above it must be one that only this user or root can change
    (ancestors_problem): otherwise the checked directory could be renamed away and another put
    in its place after the check."""
    path = Path(os.path.realpath(path.parent)) / path.name
    problem = (
        ancestors_problem(path.parent) or private_dir_problem(path) or socket_dir_problem(path)
    )
    if problem is None:
        return path
    print(f"reconcile: not sharing SSH connections: {path} {problem}", file=sys.stderr)
    return None


def ancestors_problem(directory: Path) -> str | None:
    """Why someone other than this user or root could rename or replace what `directory`
    holds, or what a directory above it holds; None if no one can. As OpenSSH's own check of
    its files (safe_path): each must belong to the user or root and be writable by no one
    else, except a sticky directory (/tmp: 1777), where only an entry's owner can rename it.
    A directory that does not exist yet is skipped: creating the sockets' one says so."""
    uid = os.getuid()
    for here in (directory, *directory.parents):
        try:
            info = os.lstat(here)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"is under {here}, which cannot be read ({exc.strerror})"
        if stat.S_ISLNK(info.st_mode):  # resolved a moment ago: replaced since
            return f"is under {here}, a symbolic link"
        if info.st_uid not in (0, uid):
            return f"is under {here}, which belongs to uid {info.st_uid}"
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            return (
                f"is under {here}, which others may write (mode "
                f"{stat.S_IMODE(info.st_mode):04o}, no sticky bit): they could rename it"
            )
    return None


def private_dir_problem(path: Path) -> str | None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot be created ({exc.strerror})"
    try:
        info = os.lstat(path)  # never follow a link someone else planted
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != os.getuid():
        return f"belongs to uid {info.st_uid}, not to uid {os.getuid()}"
    if info.st_mode & 0o077:
        return f"has mode {stat.S_IMODE(info.st_mode):04o}, not 0700"
    return None


def socket_dir_problem(path: Path) -> str | None:
    """Why ssh could not keep its masters' sockets in `path` (ControlPath=`path`/NAME), or None."""
    try:
        ssh_config_path(str(path))
    except UnsafeTarget:
        return "holds characters ssh's config parser would read as syntax"
    longest = len(os.fsencode(path)) + SOCKET_NAME_BYTES
    if longest >= SUN_PATH_BYTES:
        return (
            f"is too long: ssh's sockets in it would need {longest} bytes, "
            f"a socket path holds at most {SUN_PATH_BYTES - 1}"
        )
    return None


def refuse_unsafe(target: Target) -> None:
    """Defence in depth: the desired-state types already refuse these, but a Target can also
    come from a remembered cache or pyinfra's host data, and a user or host starting with `-`
    must never reach ssh (`-oProxyCommand=...` runs a command on this machine)."""
    for what, value in (("user", target.user), ("host", target.hostname)):
        if not value or value.startswith("-") or any(c in value for c in "\0\r\n \t"):
            raise UnsafeTarget(f"{target.box}: refusing ssh {what} {value!r}")


def ssh_config_path(path: str, tokens: str = "") -> str:
    """A controller file as the value of an ssh `-o` option. ssh parses that value as a config
    line (whitespace separates files, quotes and backslashes are syntax) and expands `%` tokens
    and `${VAR}` in it, and `-i` expands them too: a repository checked out under
    `/home/me/my fleet` or `.../100%` must still name its own key. So the path is quoted with
    `%` doubled (`tokens`, such as `/%C`, are appended for ssh to expand); a path holding
    what cannot be quoted that way is refused."""
    if any(c in path for c in '"\\') or "${" in path or not path.isprintable():
        raise UnsafeTarget(f"refusing ssh file path {path!r}: ssh would parse it")
    return '"' + path.replace("%", "%%") + tokens + '"'


# Nothing but the command's own session goes to a box, whatever the user's ssh config says
# (`Host *` with `ForwardAgent yes` is common): a box is not trusted (README, Boundaries), and a
# forwarded agent would let whoever controls one log in to every other box with the operator's
# keys while a session is open; a RemoteForward would open a controller port to it, a
# LocalCommand run on the controller, a forced TTY mangle the answer, a RemoteCommand refuse
# the command. Options OpenSSH has had for years (7.6+), so an older controller still runs.
CLOSED_CHANNELS = (
    "-o",
    "ForwardAgent=no",
    "-o",
    "ForwardX11=no",
    "-o",
    "ClearAllForwardings=yes",
    "-o",
    "Tunnel=no",
    "-o",
    "PermitLocalCommand=no",
    "-o",
    "RequestTTY=no",
    "-o",
    "RemoteCommand=none",
)


def ssh_argv(target: Target, remote_command: str, connect_timeout: int = 5) -> list[str]:
    """`ssh -l USER -p PORT [options] -- HOST COMMAND`: the user is an option's argument and the
    host comes after `--`, so neither can ever be read as an option."""
    refuse_unsafe(target)
    socket = control_path(target)
    sharing = (
        [
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={ssh_config_path(str(socket))}",
            "-o",
            "ControlPersist=120",
        ]
        if socket is not None
        else ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
    )
    return [
        "ssh",
        "-l",
        target.user,
        "-p",
        str(int(target.port)),
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={connect_timeout}",
        "-o",
        "ServerAliveInterval=5",
        "-o",
        "ServerAliveCountMax=2",
        *sharing,
        "-o",
        "LogLevel=ERROR",
        *CLOSED_CHANNELS,
        *trust_options(target),
        "--",
        target.hostname,
        remote_command,
    ]


def trust_options(target: Target) -> list[str]:
    """The options that decide who we are to the box and which host key we trust. They (and
    the files they name) are part of a master's name (control_path): a change to any of them
    must never be served by a master opened under the old ones."""
    options: list[str] = []
    if target.key_file:
        key = ssh_config_path(str(target.key_file))
        options += ["-o", f"IdentityFile={key}", "-o", "IdentitiesOnly=yes"]
    if target.known_hosts:
        # The pinned file alone decides which host key is trusted: not the system's known_hosts
        # files, nor a KnownHostsCommand from the user's ssh config (`none`: OpenSSH 8.5+).
        options += [
            "-o",
            f"UserKnownHostsFile={ssh_config_path(str(target.known_hosts))}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "KnownHostsCommand=none",
            "-o",
            "StrictHostKeyChecking=yes",
        ]
    return options


class Running:
    """A remote command in flight; `finish()` waits for it."""

    def __init__(
        self,
        box: str,
        proc: subprocess.Popen[bytes] | None,
        error: str | None = None,
        fresh: Background | None = None,
    ) -> None:
        self.box = box
        self.proc = proc
        self.error = error
        # Started beside the command: can the box take a NEW connection, or does this
        # command go through a master connection that outlived the box's sshd?
        # (`new_connections_refused`)
        self.fresh = fresh

    def refused_anew(self, timeout: float = CHECK_S * 2) -> str | None:
        """Why the box took this command only through an existing connection (new SSH
        connections are refused), or None: no master was in use, or the box took a new one."""
        if self.fresh is None:
            return None
        try:
            return self.fresh.result(timeout)
        except Exception:  # a check that could not finish says nothing either way
            return None

    def finish(self, timeout: float, limit: int = OUTPUT_LIMIT_BYTES) -> RemoteResult:
        if self.proc is None:
            return RemoteResult(self.box, None, "", "", self.error)
        proc = self.proc
        out = _Capped(limit + 1, kill=proc)  # one byte past the limit: the parser says too large
        err = _Tail(STDERR_LIMIT_BYTES)  # read to its end, its last bytes kept
        readers = [
            threading.Thread(target=_drained, args=(out.drain, proc.stdout), daemon=True),
            threading.Thread(target=_drained, args=(err.drain, proc.stderr), daemon=True),
        ]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + timeout
        for reader in readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        if any(reader.is_alive() for reader in readers):
            proc.kill()
            proc.wait()
            return RemoteResult(self.box, None, "", "", f"no answer within {timeout:g} s")
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return RemoteResult(self.box, None, "", "", f"no answer within {timeout:g} s")
        # Undecodable bytes stay as lone surrogates: observe/document.py names them, no raise.
        stdout = out.data().decode("utf-8", "surrogateescape")
        stderr = err.data().decode("utf-8", "replace")
        if out.overflowed:
            return RemoteResult(self.box, proc.returncode, stdout, stderr, None, truncated=True)
        if proc.returncode == 255:
            last = (stderr.strip().splitlines() or [SILENT_255])[-1]
            return RemoteResult(self.box, 255, stdout, stderr, f"unreachable: {scrub_text(last)}")
        return RemoteResult(self.box, proc.returncode, stdout, stderr, None)

    def cancel(self) -> None:
        """Stop the command now (the run is cancelled: Ctrl-C, a box refused): ssh killed and
        reaped. Never raises: it runs on the way out of an interrupted run, where an exception
        would replace the interrupt with a traceback and leave the later boxes' ssh clients
        running. Not communicate(): spawn() closed ssh's stdin once the payload was written,
        and communicate() flushes it first ("flush of closed file"); the pipes are drained by
        finish()'s readers, if any, and closed with the process object otherwise."""
        proc = self.proc
        if proc is None:
            return
        try:
            proc.kill()  # nothing if it has ended (Popen knows its return code)
            proc.wait(CANCEL_WAIT_S)
        except (OSError, subprocess.TimeoutExpired):
            pass  # already reaped elsewhere, or unkillable (stuck in the kernel): nothing to do


def _drained(drain: Callable[[Any], None], pipe: Any) -> None:
    """`drain(pipe)`, then the pipe closed by the thread that read it (never under a reader):
    a box's handle lives until the whole run is gathered, and its pipes with it, so a finished
    box kept two descriptors open: 2,000 on a 1,000-box run, whatever --max-parallel said."""
    try:
        drain(pipe)
    finally:
        with contextlib.suppress(OSError, ValueError):
            pipe.close()


class _Capped:
    """One pipe (stdout) read in chunks into at most `cap` bytes. Past the cap the process is
    killed (the answer is refused whole anyway), or, without `kill`, the rest is read and
    dropped."""

    def __init__(self, cap: int, kill: subprocess.Popen[bytes] | None) -> None:
        self.cap = cap
        self.kill = kill
        self.chunks: list[bytes] = []
        self.size = 0
        self.overflowed = False

    def drain(self, stream: Any) -> None:
        while True:
            chunk = stream.read1(_CHUNK)
            if not chunk:
                return
            room = self.cap - self.size
            if room > 0:
                self.chunks.append(chunk[:room])
                self.size += min(room, len(chunk))
            if len(chunk) > room:
                self.overflowed = True
                if self.kill is not None:
                    self.kill.kill()
                    return

    def data(self) -> bytes:
        return b"".join(self.chunks)


class _Tail:
    """One pipe (stderr) read to its end, only its last `cap` bytes kept: what is reported is
    the last line (ssh's error, the collector's exception), and ssh must never block on a full
    pipe."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()

    def drain(self, stream: Any) -> None:
        while chunk := stream.read1(_CHUNK):
            self.kept += chunk
            if len(self.kept) > self.cap:
                del self.kept[: len(self.kept) - self.cap]

    def data(self) -> bytes:
        return bytes(self.kept)


def spawn(target: Target, remote_command: str, stdin: bytes | None = None) -> Running:
    """`stdin`: sent to the remote command, then closed (a collector's payload and the
    controller_env secrets travel here, never in the command line). Up to PIPE_BUF bytes (a
    payload is ~3 KB) are written here: they fit any pipe, so the write never waits for ssh
    to connect; more is written by a thread of its own, so that no other box waits for it."""
    try:
        proc = subprocess.Popen(
            ssh_argv(target, remote_command),
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        return _not_started(target.box, exc) or Running(
            target.box, None, f"cannot run ssh: {exception_text(exc)}"
        )
    except UnsafeTarget as exc:
        return Running(target.box, None, str(exc))
    try:
        fresh = Background(new_connections_refused, target)
        if stdin is not None and proc.stdin is not None:
            if len(stdin) <= PIPE_BUF:
                _write_all(proc.stdin, stdin)
            else:
                threading.Thread(target=_write_all, args=(proc.stdin, stdin), daemon=True).start()
    except RuntimeError as exc:  # no thread to be had: this ssh is stopped, never left behind
        Running(target.box, proc).cancel()
        return _not_started(target.box, exc) or Running(target.box, None, str(exc))
    return Running(target.box, proc, fresh=fresh)


def _not_started(box: str, exc: BaseException) -> Running | None:
    """A box whose ssh the controller could not start for a limit of its own (open files,
    processes, threads): said as the controller's, here and on stderr; None for another cause."""
    short = controller_short(exc)
    if short is None:
        return None
    say_controller_short("start ssh for every box", short)
    return Running(box, None, f"the controller could not start ssh: {short}")


# What a write to an empty pipe takes whole, whatever its capacity (POSIX: at least 512; Linux
# gives 4096, and a pipe of a user past pipe-user-pages-soft holds one page).
PIPE_BUF = 4096


def _write_all(pipe: Any, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except (OSError, ValueError):  # ssh gone (its exit says why), or cancelled: pipe closed
        pass


def finish_all(running: list[Running], timeout: float) -> dict[str, RemoteResult]:
    """Wait for every box at once (pipes drained in parallel: a report is ~150 KB)."""
    jobs = {r.box: Background(r.finish, timeout) for r in running}
    return {box: job.result() for box, job in jobs.items()}


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
# one file per program and Python version, stamped with the digest of its source. Code loaded
# from there runs as the deploy user, so: a directory that is not the user's own and private
# is not used; a cached file is run only if it is a regular file (no link is followed) owned
# by the user with no group/other permission bits, else it is compiled from the shipped source
# and written over; files are created 0600 (O_EXCL, never through a planted name) and
# replaced atomically; a stale or damaged file is compiled over too: the file holds the
# source's digest and the digest of the code itself, so code bytes that marshal would still
# accept but that are not what was compiled (a damaged disk) are never run. It imports what hashing
# and unpacking need and no more: hashlib (OpenSSL) and base64 cost each run ~4 ms of the
# box's CPU, CPython's builtin SHA-256 and binascii give the same digest and bytes. The
# source's digest comes on the command line with the packed source (the controller computes
# it when it packs it: `_packed`): a cached file stamped with it is run without the source
# being unpacked and hashed on the box (~1.2 ms of each box's CPU every run); only a miss
# unpacks it, compiles it and stamps the file with the digest of what it compiled.
BOOTSTRAP = """\
import binascii,marshal,os,stat,sys,zlib
try:
 from _sha2 import sha256
except ImportError:
 try:
  from _sha256 import sha256
 except ImportError:
  from hashlib import sha256
def _code(unpack,z,h,name):
 s=None
 u=os.getuid()
 tmp=os.environ.get('TMPDIR') or '/tmp'
 for d in (os.path.expanduser('~/.cache/fleet-reconciler'),
           os.path.join(tmp,'fleet-reconciler-%d'%u)):
  try:
   os.makedirs(d,0o700,exist_ok=True)
   i=os.stat(d)
  except OSError:
   continue
  if i.st_uid!=u or i.st_mode&0o077 or not stat.S_ISDIR(i.st_mode):
   continue
  p=os.path.join(d,'%s.%s.code'%(name,sys.implementation.cache_tag))
  try:
   with os.fdopen(os.open(p,os.O_RDONLY|os.O_NOFOLLOW|os.O_NONBLOCK),'rb') as f:
    i=os.fstat(f.fileno())
    if stat.S_ISREG(i.st_mode) and i.st_uid==u and not i.st_mode&0o077:
     b=f.read()
     if b[:32]==h and sha256(b[64:]).digest()==b[32:64]:
      return marshal.loads(b[64:])
  except Exception:
   pass
  if s is None:
   s=unpack(binascii.a2b_base64(z))
  c=compile(s,'<'+name+'>','exec')
  m=marshal.dumps(c)
  t='%s.%d'%(p,os.getpid())
  try:
   with os.fdopen(os.open(t,os.O_WRONLY|os.O_CREAT|os.O_EXCL|os.O_NOFOLLOW,0o600),'wb') as f:
    f.write(sha256(s).digest()+sha256(m).digest()+m)
   os.replace(t,p)
  except OSError:
   try:
    os.unlink(t)
   except OSError:
    pass
  return c
 return compile(unpack(binascii.a2b_base64(z)),'<'+name+'>','exec')
exec(_code(zlib.decompress,'{packed}',binascii.a2b_hex('{digest}'),'{name}'))
"""


def python_command(program: Path, argument: str) -> str:
    """A remote `python3 -I -S -c BOOTSTRAP ARG` line that runs `program` (a stdlib-only
    script) on the box; the program travels compressed to stay short.

    `-I`: the deploy user's PYTHONPATH/PYTHONSTARTUP and user site cannot change the program;
    `-S`: it is stdlib only, so the site machinery (a tenth of its start-up) is skipped."""
    packed, digest = _packed(program, box_stamp(program))
    bootstrap = BOOTSTRAP.format(packed=packed, digest=digest, name=program.stem)
    return f"python3 -I -S -c {shlex.quote(bootstrap)} {shlex.quote(argument)}"


@functools.lru_cache(maxsize=4)
def _packed(program: Path, stamp: tuple[int, ...]) -> tuple[str, str]:
    """The program as the command line carries it (its text with the shared code written in,
    reconciler/box_program.py; zlib at level 9, base64) and the SHA-256 (hex) of that text,
    which the box's cached code is stamped with (BOOTSTRAP). Packing the collector (~210 KB
    of text) costs ~30 ms of CPU, on every run, before any box is sent its work; so the result
    is remembered per process (every box of a run gets the same program) and in the controller
    user's private cache, under the files' stamps (device, inode, size, mtime, ctime of the
    program and of every shared module: any edit or checkout changes them) and with its own
    SHA-256 (a damaged entry, or one without the source's digest, is packed again)."""
    import hashlib

    from reconciler.desired.fingerprint import cache_dir, read_private, write_private

    where = f"{os.path.realpath(program)}\0{stamp}".encode()
    entry = cache_dir() / f"packed-{hashlib.sha256(where).hexdigest()[:24]}.b64"
    kept = read_private(entry)
    if kept is not None:
        digest, _, body = kept.partition(b"\n")
        source, _, text = body.partition(b"\n")
        valid = digest.decode("ascii", "replace") == hashlib.sha256(body).hexdigest()
        if valid and len(source) == 64 and text:
            return text.decode("ascii"), source.decode("ascii")
    import base64
    import zlib

    script = box_source(program).encode("utf-8")
    packed = base64.b64encode(zlib.compress(script, 9))
    body = hashlib.sha256(script).hexdigest().encode() + b"\n" + packed
    write_private(entry, hashlib.sha256(body).hexdigest().encode() + b"\n" + body, keep=8)
    return packed.decode("ascii"), hashlib.sha256(script).hexdigest()


# -- a master connection that outlived the box's sshd ------------------------------------------
# With ControlPersist, a box whose sshd died (or stopped listening) still runs commands through
# the master connection opened before: the observation succeeds, and only the next new
# connection (a master that expired, another operator, a converge from another machine) finds
# the box unreachable. So when a command goes through a live master, the box is asked, at the
# same time, whether it still takes a new connection: TCP to its sshd, the server's greeting,
# our own identification line, close. That costs the box one pre-auth sshd child (~13 ms of
# CPU, logged as "Connection closed by ... [preauth]", like ssh-keyscan; without our
# identification line sshd would log a kex_exchange_identification error) and the controller
# a thread; it runs in parallel with the command, so a healthy box's run takes no longer.
MASTER_ONLY = "reachable only through an existing connection: new SSH connections are refused"
IDENT = b"SSH-2.0-fleet-reconciler-check\r\n"


class Background:
    """`fn(*args)` running in a daemon thread; `result(timeout)` gives its value or raises its
    exception (TimeoutError if it has not finished), as concurrent.futures.Future does for
    these callers. Not a Future: importing concurrent.futures imports logging (~9 ms of CPU),
    and this runs before the boxes are sent their work; the pools come later."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(fn, args), daemon=True).start()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            self._value = fn(*args)
        except BaseException as exc:  # the caller decides what a failure means
            self._error = exc
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it finished within `timeout`; on the main thread in slices, so that a
        Ctrl-C Python swallowed still ends the wait (interrupts.py)."""
        from reconciler import interrupts

        return interrupts.wait(self._done, timeout)

    def result(self, timeout: float | None = None) -> Any:
        if not self._done.wait(timeout):
            raise TimeoutError(f"not finished within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value


class Pool(Generic[T]):
    """`each(item)` for every item, in their order, by at most `size` daemon threads started
    at once (the controller's probes and readers: a thread per box in flight, never per box of
    a fleet). A thread the controller cannot start (its thread limit) is done without: the
    ones started do it all, and where none could start, the caller's thread does it before
    the pool is made. Not concurrent.futures: it imports logging (~7 ms of a repeated run)."""

    def __init__(self, items: Iterable[T], size: int, each: Callable[[T], None]) -> None:
        self._items = deque(items)
        self._lock = threading.Lock()
        self._each = each
        self._threads: list[Background] = []
        for _ in range(max(1, min(size, len(self._items)))):
            try:
                self._threads.append(Background(self._work))
            except RuntimeError:
                break
        if not self._threads:
            self._work()

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._items:
                    return
                item = self._items.popleft()
            self._each(item)

    def stop(self) -> None:
        """No item not yet taken is taken from now on (those under way go on)."""
        with self._lock:
            self._items.clear()

    @property
    def done(self) -> bool:
        return all(thread.done for thread in self._threads)

    def wait(self, timeout: float | None = None) -> bool:
        """Whether every thread ended within `timeout` (from now; None: no limit), waited for
        as Background.wait does (a swallowed Ctrl-C still ends it)."""
        end = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            left = None if end is None else max(0.0, end - time.monotonic())
            if not thread.wait(left):
                return False
        return True


def master_running(target: Target) -> bool:
    """Is a master connection to `target` up? Its socket is asked directly (no `ssh -O check`:
    that process costs ~10 ms of CPU per box on every repeated run): a master accepts on its
    socket, a stale socket refuses. The socket is the one ssh_argv names (`control_path`)."""
    import socket

    path = control_path(target)
    if path is None or not path.exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(CHECK_S)
            sock.connect(str(path))
    except OSError:
        return False
    return True


def control_path(target: Target) -> Path | None:
    """Where the master connection of `target` lives: ssh_argv's ControlPath, or None when no
    connection is shared.

    ssh's own %C hashes only the local host, the host, the port and the user: a master opened
    with the right key and host-key pin would then also serve a run whose pin was changed to
    refuse that host key, or whose key the box no longer accepts (ssh never authenticates a
    command sent through a master). So the name is a digest of everything that decides whom
    ssh connects to as whom and what it trusts: %C's parts, the key and host-key options
    (trust_options), and the content of the files they name (the key, its .pub and -cert.pub,
    the pinned known_hosts). Unchanged settings give the same name, so a repeated run still
    reuses its master; a changed one opens a new master, and the old one ends after
    ControlPersist's idle time. SOCKET_NAME_HEX digits, as long as %C: socket paths must fit
    sun_path (socket_dir_problem). Unlike %C, the host, port and user are the inventory's,
    not what the user's own ssh config may rewrite them to (a master under a changed alias is
    still one this key and pin accepted), so master_running always finds the socket ssh uses."""
    sockets = control_dir()
    if sockets is None:
        return None
    return sockets / connection_name(target)


# What names the parts of a master's name: a change of what goes into it changes every name.
_NAME_VERSION = "fleet-reconciler-ssh-master-2"


def connection_name(target: Target) -> str:
    """The master's socket name of `target` (control_path says what it covers)."""
    import hashlib  # already imported by a drift run's remembered inputs

    # The files by their real paths: a repository reached through a symlink (`--root` a
    # `current -> release` link, pyinfra's inventory.py resolved) names the same key and pin,
    # so drift and a pyinfra converge share one master. Their contents are hashed below.
    key = _real(target.key_file)
    target = target._replace(key_file=key, known_hosts=_real(target.known_hosts))
    parts = (
        _NAME_VERSION,
        os.uname().nodename,  # %l: one runtime directory seen by two machines
        target.hostname.lower(),  # ssh connects to the lower-cased name (%h)
        int(target.port),
        target.user,
        tuple(trust_options(target)),  # the key and known_hosts paths, the host-key policy
        # The key and what ssh loads beside it (its public half, its certificate), by content:
        # a key replaced at the same path is another identity.
        tuple(file_identity(f"{key}{suffix}") for suffix in ("", ".pub", "-cert.pub"))
        if key
        else None,
        file_identity(target.known_hosts) if target.known_hosts else None,
    )
    digest = hashlib.sha256(repr(parts).encode("utf-8", "surrogateescape")).hexdigest()
    return digest[:SOCKET_NAME_HEX]


def _real(path: str | None) -> str | None:
    return os.path.realpath(os.path.expanduser(path)) if path else path


# A file changed this recently may change again within its file system's clock granularity and
# keep the same stamps, so its digest is not remembered (fingerprint.RACY_NS says the same).
_RACY_NS = 3_000_000_000
# path -> (stamp, digest) of files read by file_identity in this process.
_IDENTITIES: dict[str, tuple[tuple[int, ...], str]] = {}


def file_identity(path: str) -> str:
    """The SHA-256 of the file ssh reads at `path` (`~` expanded as ssh does), or what is
    there instead (`unreadable: ERRNO`, a missing file included; a FIFO's type). Remembered
    for the process under the file's stamps (device, inode, size, mtime, ctime), so a
    thousand boxes sharing one key read it once; a file changed in the last few seconds is
    read every time."""
    where = os.path.expanduser(path)
    try:
        info = os.stat(where)
    except OSError as exc:
        return f"unreadable: {exc.errno}"
    stamp = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    kept = _IDENTITIES.get(where)
    if kept is not None and kept[0] == stamp:
        return kept[1]
    identity = _read_identity(where)
    if max(info.st_mtime_ns, info.st_ctime_ns) < time.time_ns() - _RACY_NS:
        _IDENTITIES[where] = (stamp, identity)
    return identity


def _read_identity(path: str) -> str:
    import hashlib

    try:  # O_NONBLOCK: a FIFO put in a key's place must not hang the run
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return f"unreadable: {exc.errno}"
    # The type before fdopen: a directory opens O_RDONLY, and fdopen raised IsADirectoryError,
    # an OSError no caller expects here (pyinfra's connect died with a traceback for every box).
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        return f"unreadable: {exc.errno}"
    if not stat.S_ISREG(mode):
        os.close(fd)
        return f"not a regular file: {stat.S_IFMT(mode):o}"
    with os.fdopen(fd, "rb") as file:
        digest = hashlib.sha256()
        try:
            while chunk := file.read(_CHUNK):
                digest.update(chunk)
        except OSError as exc:
            return f"unreadable: {exc.errno}"
    return digest.hexdigest()


def greets(hostname: str, port: int, timeout: float = CHECK_S) -> str | None:
    """None if an SSH server at hostname:port answers a new connection with its greeting,
    else why not (refused, no answer, not an SSH server)."""
    # The collector's own connect: an ASCII host goes to getaddrinfo as bytes, so the idna
    # codec (unicodedata, stringprep: ~8 ms of CPU) is never imported for an address.
    from reconciler.box_shared.http11 import tcp_connect

    where = f"{hostname}:{port}"
    try:
        sock = tcp_connect(hostname, port, timeout)
    except TimeoutError:
        return f"no answer from {where} within {timeout:g} s"
    except OSError as exc:
        return f"connect to {where}: {exc.strerror or type(exc).__name__}"
    try:  # not `with`: the collector's sockets are _socket's, which have no context manager
        return _greeting(sock, where, timeout)
    except TimeoutError:
        return f"{where} sent no SSH greeting within {timeout:g} s"
    except OSError as exc:
        return f"{where} broke the connection: {exc.strerror or type(exc).__name__}"
    finally:
        sock.close()


def _greeting(sock: Any, where: str, timeout: float) -> str | None:
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    line = b""
    # The server may send other lines before its version line (RFC 4253 4.2): skipped.
    while not (line.startswith(b"SSH-") and line.endswith(b"\n")):
        if line.endswith(b"\n"):
            line = b""
        if time.monotonic() > deadline or len(line) > 255:
            return f"{where} sent no SSH greeting within {timeout:g} s"
        chunk = sock.recv(1)
        if not chunk:
            return f"{where} closed the connection before its SSH greeting"
        line += chunk
    sock.sendall(IDENT)  # said who we are: sshd logs a plain "Connection closed ... [preauth]"
    return None


def new_connections_refused(target: Target, config: Path | None = None) -> str | None:
    """MASTER_ONLY with the reason, when a master to `target` is up and the box does not take a
    new connection; None otherwise (without a master the command's own connection is new, and
    whether it succeeds says all). `config`: an ssh config file read instead of the user's."""
    if not master_running(target):
        return None
    why = greets(target.hostname, int(target.port))
    if why is not None:
        # The user's ssh config may take the box another way (a ProxyJump or ProxyCommand, a
        # HostName or Port given to the inventory's address): then the address refusing says
        # nothing of the box. Asked only after a refusal: a box reached directly (the usual
        # case, every repeated run) pays no `ssh -G` process.
        route = configured_route(target, config)
        if route == PROXIED:
            return None  # only a whole new connection could tell: not made on every run
        if route is not None and route != (target.hostname, int(target.port)):
            why = greets(*route)
    return None if why is None else f"{MASTER_ONLY} ({scrub_text(why)})"


PROXIED = ("proxied", 0)  # configured_route: through a proxy, no address to greet


def configured_route(target: Target, config: Path | None = None) -> tuple[str, int] | None:
    """Where ssh's configuration sends a connection to `target` (`ssh -G`, the argv ssh_argv
    makes): (host, port), PROXIED when through a ProxyJump or ProxyCommand, None when ssh could
    not say (its answer is then no reason to doubt the inventory's address)."""
    argv = ssh_argv(target, "true")
    extra = ["-F", str(config)] if config is not None else []
    try:
        out = subprocess.run(
            [argv[0], "-G", *extra, *argv[1:]],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=CHECK_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    resolved: dict[str, str] = {}
    for line in out.stdout.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        resolved.setdefault(key, value)
    if any(resolved.get(key, "none") != "none" for key in ("proxyjump", "proxycommand")):
        return PROXIED
    port = resolved.get("port", "")
    if not resolved.get("hostname") or not port.isdigit():
        return None
    return resolved["hostname"], int(port)
