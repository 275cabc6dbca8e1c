"""A file the operator names for a run's output (`-o FILE`, `--metrics FILE`): checked before
anything runs, then written aside and renamed into place.

Replaced whole or not at all: a reader (a dashboard, node_exporter's textfile collector, a
browser) never sees half a report, and a write that fails (a full disk) leaves the last one.
A rename replaces whatever is at the path, so it is only ever done onto a regular file: a
symlink's target is written (the link stays), and a device or a FIFO (`-o /dev/null`) is
written into, as the shell's `>` does. Before, `--metrics /dev/null` run as root replaced the
device with a file.

A descriptor this process was given (`-o /dev/stdout`, `/dev/stderr`, `/dev/fd/N`,
`/proc/self/fd/N`, a symlink to one) is written through: a pipe, a socket, a terminal, or the
file the shell opened (`>>` appends to it), never replaced or truncated. Before, the path was
resolved to what the descriptor is: a pipe's `/proc/PID/fd/pipe:[N]` failed as a missing file
(`-o /dev/stdout | wc`), and a file opened with `>>` had the report renamed over it, its earlier
lines lost.

Stdlib only: a drift run imports it before its boxes answer.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path


def target_problem(option: str, path: str) -> str | None:
    """Why `option PATH` cannot take the output (said before any box is contacted), or None."""
    fd = descriptor(path)
    if fd is not None:
        return _descriptor_problem(option, path, fd)
    try:
        mode: int | None = Path(path).stat().st_mode  # a symlink: its target
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # a name too long, a loop, a component that is not a directory
        return f"{option} {path}: {exc.strerror or exc}"
    if mode is not None and stat.S_ISDIR(mode):
        return f"{option} {path}: is a directory, not a file"
    real = Path(os.path.realpath(path))
    parent = real.parent
    if mode is None and not parent.is_dir():
        return f"{option} {path}: the directory {parent} does not exist"
    if mode is not None and not stat.S_ISREG(mode):  # a device, a FIFO: written into
        return None if os.access(real, os.W_OK) else f"{option} {path}: not writable"
    # A regular file is replaced by a file written beside it (write_whole): checked by making
    # one, since what stat or access(2) say is not what a write meets (a read-only mount, a
    # directory root may not write in without CAP_DAC_OVERRIDE). Found only after every box
    # was observed, the run was lost.
    probe = parent / f".{_short(real.name)}.{os.getpid()}.{os.urandom(6).hex()}.probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except OSError as exc:
        return f"{option} {path}: cannot write in {parent}: {exc.strerror or exc}"
    # The rename is what replaces the file: one a directory refuses (append-only, `chattr +a`)
    # left the report aside and the probe behind. Renamed, then removed, as the write's own.
    moved = probe.with_name(probe.name + "2")
    try:
        os.rename(probe, moved)
        os.unlink(moved)
    except OSError as exc:
        return f"{option} {path}: cannot replace files in {parent}: {exc.strerror or exc}"
    if mode is not None and _sticky_refuses(parent, real):
        return (
            f"{option} {path}: another user's file in a sticky directory ({parent}): it "
            "cannot be replaced; choose another path"
        )
    return None


def _sticky_refuses(parent: Path, real: Path) -> bool:
    """Whether a rename over `real` is refused by its directory's sticky bit (/tmp): neither
    the file nor the directory is this user's, and the user is not root."""
    euid = os.geteuid()
    if euid == 0:
        return False
    try:
        directory, target = parent.stat(), real.stat()
    except OSError:
        return False  # the write says what it meets
    sticky = bool(directory.st_mode & stat.S_ISVTX)
    return sticky and euid not in (directory.st_uid, target.st_uid)


def write_whole(path: Path, pieces: Iterable[str]) -> None:
    """The text in a new file beside `path` (mode from the umask, as `open` makes it), flushed
    to disk, then renamed over it; into it when it is a device or a FIFO; through the
    descriptor `path` names when it names one of this process's (`descriptor`). OSError when
    it cannot be (a regular file at `path` is then as it was)."""
    fd = descriptor(str(path))
    if fd is not None:
        _write_through(fd, pieces)
        return
    real = Path(os.path.realpath(path))  # a symlink's target is what is replaced
    try:
        replaced = stat.S_ISREG(real.stat().st_mode)
    except FileNotFoundError:
        replaced = True  # a new file
    if not replaced:  # a device, a FIFO: written into
        with real.open("w", encoding="utf-8") as out:
            out.writelines(pieces)
        return
    # A name of this write's own: a run killed between writing and renaming leaves its file,
    # and a later run given the same PID (a timer's runs reuse them) found it in the way.
    aside = real.with_name(f".{_short(real.name)}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
    try:
        with aside.open("x", encoding="utf-8") as out:  # "x": never through what is there
            out.writelines(pieces)
            out.flush()
            # On disk before the name points at it: after a crash the path holds the old
            # file or the new one, never an empty one (ext4 without auto_da_alloc, xfs).
            os.fsync(out.fileno())
        os.replace(aside, real)
    except BaseException:
        with suppress(OSError):
            aside.unlink(missing_ok=True)
        raise
    _sync_directory(real.parent)


# /proc/<pid>/fd/N, /proc/<pid>/task/<tid>/fd/N: what /dev/stdout, /dev/fd/N, /proc/self/fd/N
# and /proc/thread-self/fd/N lead to, link by link.
_PROC_FD = re.compile(r"/proc/(\d+)/(?:task/\d+/)?fd/(\d+)")
# Their names, for a system without /proc mounted (the links then lead nowhere).
_NAMED_FD = re.compile(r"/dev/(?:(stdin|stdout|stderr)|fd/(\d+))")
_STANDARD = ("stdin", "stdout", "stderr")
_MAX_LINKS = 40  # as the kernel's own limit (ELOOP): past it the path is no descriptor


def descriptor(path: str) -> int | None:
    """The descriptor of this process that `path` names, or None (another file).

    os.path.realpath cannot tell: /proc/self/fd/1 is a link to what the descriptor is, so a
    pipe resolves to `/proc/PID/fd/pipe:[N]`, which is no file, and a file to its own path,
    which a rename would replace. So the path is followed here link by link, and stops at this
    process's /proc/PID/fd/N when that is its last component."""
    named = _NAMED_FD.fullmatch(path)
    if named:
        return _STANDARD.index(named[1]) if named[1] else int(named[2])
    pid = str(os.getpid())
    todo = path.split("/")[::-1]  # components still to walk, the next one last
    done = "/" if path.startswith("/") else os.getcwd()  # the part walked: no links left in it
    links = 0
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            done = os.path.dirname(done)
            continue
        here = os.path.join(done, name)
        own = _PROC_FD.fullmatch(here)
        if own and own[1] == pid:
            # Not through it to something further (a directory's descriptor): that is a file.
            return int(own[2]) if all(n in ("", ".") for n in todo) else None
        try:
            if not stat.S_ISLNK(os.lstat(here).st_mode):
                done = here
                continue
            target = os.readlink(here)
        except OSError:  # missing, not a directory, unreadable: no descriptor; stat says why
            return None
        links += 1
        if links > _MAX_LINKS:
            return None
        todo += target.split("/")[::-1]
        if target.startswith("/"):
            done = "/"
    return None


def _descriptor_problem(option: str, path: str, fd: int) -> str | None:
    import fcntl

    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        return f"{option} {path}: descriptor {fd} is not open"
    if flags & os.O_ACCMODE == os.O_RDONLY:
        return f"{option} {path}: descriptor {fd} is open for reading only"
    return None


def _write_through(fd: int, pieces: Iterable[str]) -> None:
    """Into a copy of the descriptor: it shares the shell's open file (its offset, `>>`'s
    append), and closing the copy leaves the descriptor open for what follows."""
    # What this program already printed there comes first (`--metrics /dev/stdout` after the
    # report on stdout): Python's own streams hold it until flushed.
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError, AttributeError):  # a closed stream, a reader gone
            stream.flush()
    copy = os.dup(fd)
    try:
        out = open(copy, "w", encoding="utf-8")  # noqa: SIM115 - closed below, with the copy
    except BaseException:
        os.close(copy)
        raise
    with out:
        out.writelines(pieces)


# The temporary name adds up to 1 + 1 + 10 + 1 + 12 + 4 bytes to the target's: a target name
# near the file system's limit (255 bytes) is shortened in it, or a legal -o FILE failed.
_NAME_ROOM = 255 - 29


def _short(name: str) -> str:
    raw = os.fsencode(name)
    if len(raw) <= _NAME_ROOM:
        return name
    return os.fsdecode(raw[:_NAME_ROOM]).encode("utf-8", "ignore").decode("utf-8", "ignore")


def _sync_directory(directory: Path) -> None:
    """The rename itself on disk (best effort: a filesystem may not sync directories)."""
    with suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def written(option: str, path: str, pieces: Iterable[str]) -> bool:
    """write_whole, said on stderr either way; False when it could not be written."""
    try:
        write_whole(Path(path), pieces)
    except OSError as exc:
        print(f"error: {option} {path}: {exc.strerror or exc}", file=sys.stderr)
        return False
    print(f"wrote {path}", file=sys.stderr)
    return True
