"""Read one desired-state file, refusing anything that is not a small regular file (stdlib only:
the drift caches fingerprint files with it before anything heavy is imported).

A layer that is a FIFO would block `open()` forever, `/dev/zero` never ends, a directory or a
dangling symlink raises in odd places, and a multi-megabyte file keeps the pure-Python YAML
parser busy for seconds. So: open without blocking, check what was actually opened (fstat on
the descriptor, not the path, so nothing can be swapped in between), and read at most
MAX_BYTES + 1 bytes.

MAX_BYTES is 64 KiB: the largest layer of this repository is under 5 KB and the whole desired
state about 11 KB, so that is 14 times the largest file. The limit is what keeps the parse fast:
ruamel.yaml's pure-Python reader walks about a megabyte of comments or long strings per second,
so a file at the limit costs well under a second whatever it holds (yaml_source.py also caps
the number of values, which cost more per byte).

Symlinks: a layer may be a symlink to a regular file inside the repository (one layer shared by
two boxes, say). A symlink that leaves the repository is refused: a desired-state file is part
of the repository, and error messages quote values from what they read (a link to
~/.ssh/id_ed25519 or /etc/shadow in a cloned repository must not end up in a terminal or a CI
log). So is a file reached through a directory symlink that leaves it (`group_vars ->
/elsewhere`), or through a symlink and `..` (`lnk/../x.yaml` with lnk -> /elsewhere/sub is
/elsewhere/x.yaml to the kernel, whatever the text says). A path the operator names explicitly
(`-i /elsewhere/hosts.yaml`) is not a symlink and is read where it is.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

MAX_BYTES = 64 * 1024
# The inventory is the one file that grows with the fleet (about 200 bytes a box): 2 MiB holds
# some 10,000 boxes, and its value count is capped by yaml_source.py as well.
INVENTORY_MAX_BYTES = 2 * 1024 * 1024


class Unreadable(Exception):
    """Why a desired-state file was not read (the message names no content)."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


def read_regular(path: Path, *, within: Path | None = None, limit: int = MAX_BYTES) -> bytes:
    """The bytes of `path` if it is a regular file of at most `limit` bytes; else Unreadable.

    `within`: a symlink must resolve to a file inside this directory."""
    return read_regular_as_found(path, within=within, limit=limit)[0]


def read_regular_as_found(
    path: Path, *, within: Path | None = None, limit: int = MAX_BYTES
) -> tuple[bytes, os.stat_result]:
    """`read_regular`, and the file's status as it was opened, before a byte of it was read
    (what the desired-state caches record of the file the loader parsed)."""
    target = _follow(path, within)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags)
    except OSError as exc:
        raise Unreadable(_why(exc)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable(f"{_kind(info.st_mode)}, expected a regular file")
        if info.st_size > limit:
            raise Unreadable(_too_big(info.st_size, limit))
        chunks, total = [], 0
        while total <= limit:  # a file that grows while being read is still capped
            chunk = os.read(fd, limit + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise Unreadable(_too_big(total, limit))
        return b"".join(chunks), info
    except OSError as exc:
        raise Unreadable(_why(exc)) from None
    finally:
        os.close(fd)


def refused_link(path: Path, within: Path) -> bool:
    """Whether `read_regular(path, within=within)` refuses `path` for the way to it (a symlink
    leading out of `within`, on the file or a directory, a loop or a dangling link), without
    opening it: what the caches ask of a file before they hash it."""
    try:
        _follow(path, within)
    except Unreadable:
        return True
    return False


def _follow(path: Path, within: Path | None) -> str:
    """The path to open: `path` itself, or the regular file its symlink points to."""
    if within is not None:
        _no_way_out(path, within)
    try:
        is_link = stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError as exc:
        raise Unreadable("symlink loop" if exc.errno == errno.ELOOP else _why(exc)) from None
    if not is_link:
        return str(path)
    try:
        pointed = os.readlink(path)
        real = os.path.realpath(path, strict=True)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unreadable("symlink loop") from None
        raise Unreadable(f"dangling symlink (to {pointed!r} that does not exist)") from None
    if within is not None:
        base = os.path.realpath(within)
        if os.path.commonpath([base, real]) != base:
            raise Unreadable(f"symlink to {pointed!r}, which is outside the repository")
    return real


def _no_way_out(path: Path, within: Path) -> None:
    """A file inside the repository reached through a directory symlink that leaves it
    (`group_vars -> /elsewhere`) is outside it just the same; the last component's own
    symlink is _follow's. A path given outside the repository is read where it is."""
    # Strings, not Paths: a cold load of 1,000 boxes asks this for 2,006 files (~60 ms as Paths).
    base = os.path.abspath(within)
    here = os.path.abspath(path)
    if not here.startswith(base + os.sep):
        return
    if climbs(path):
        # abspath drops `link/..` as text, but the kernel takes `..` from where the link
        # leads: `lnk/../x.yaml` with lnk -> /elsewhere/sub opens /elsewhere/x.yaml. Where the
        # directory really is is what counts (realpath follows each link before its `..`).
        real_base = os.path.realpath(base)
        real_dir = os.path.realpath(os.path.dirname(os.path.join(os.getcwd(), path)))
        if os.path.commonpath([real_base, real_dir]) != real_base:
            raise Unreadable(
                f"leads through a symlink and `..` to {real_dir!r}, which is outside the repository"
            )
        return
    step = base
    for part in here[len(base) + 1 :].split(os.sep)[:-1]:
        step = f"{step}{os.sep}{part}"
        if os.path.islink(step):
            real_base = os.path.realpath(base)
            if os.path.commonpath([real_base, os.path.realpath(step)]) != real_base:
                shown = step[len(base) + 1 :]
                pointed = os.readlink(step)
                raise Unreadable(
                    f"{shown}/ is a symlink to {pointed!r}, which is outside the repository"
                )


def climbs(path: str | os.PathLike[str]) -> bool:
    """Whether `path` has a `..` component: only then does abspath's textual answer differ
    from the kernel's (`.` and `//` mean the same to both)."""
    return ".." in os.fspath(path).split(os.sep)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISFIFO(mode):
        return "is a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device"
    if stat.S_ISSOCK(mode):
        return "is a socket"
    return "is not a regular file"


def _too_big(size: int, limit: int) -> str:
    return f"file is larger than {limit // 1024} KiB ({size} bytes or more); a layer is small"


def _why(exc: OSError) -> str:
    return {
        errno.ENOENT: "file not found",
        errno.ENOTDIR: "file not found (a parent is not a directory)",
        errno.ELOOP: "is a symlink that changed while being read",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.ENXIO: "is a socket or a device without a reader, expected a regular file",
        errno.EISDIR: "is a directory, expected a regular file",
    }.get(exc.errno or 0, f"cannot be read ({os.strerror(exc.errno or 0)})")
