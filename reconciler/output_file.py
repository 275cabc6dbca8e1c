"""A file the operator names for a run's output (`-o FILE`, `--metrics FILE`): checked before
anything runs, then written aside and renamed into place.

Replaced whole or not at all: a reader (a dashboard, node_exporter's textfile collector, a
browser) never sees half a report, and a write that fails (a full disk) leaves the last one.
A rename replaces whatever is at the path, so it is only ever done onto a regular file: a
symlink's target is written (the link stays), and a device or a FIFO (`-o /dev/null`, `-o
/dev/stdout`, a pipe to another program) is written into, as the shell's `>` does. Before,
`--metrics /dev/null` run as root replaced the device with a file.

Stdlib only: a drift run imports it before its boxes answer.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path


def target_problem(option: str, path: str) -> str | None:
    """Why `option PATH` cannot take the output (said before any box is contacted), or None."""
    try:
        mode: int | None = Path(path).stat().st_mode  # a symlink: its target
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # a name too long, a loop, a component that is not a directory
        return f"{option} {path}: {exc.strerror or exc}"
    if mode is not None and stat.S_ISDIR(mode):
        return f"{option} {path}: is a directory, not a file"
    parent = Path(os.path.realpath(path)).parent
    if mode is None and not parent.is_dir():
        return f"{option} {path}: the directory {parent} does not exist"
    return None


def write_whole(path: Path, pieces: Iterable[str]) -> None:
    """The text in a new file beside `path` (mode from the umask, as `open` makes it), flushed
    to disk, then renamed over it; into it when it is a device or a FIFO. OSError when it
    cannot be (a regular file at `path` is then as it was)."""
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
    import sys

    try:
        write_whole(Path(path), pieces)
    except OSError as exc:
        print(f"error: {option} {path}: {exc.strerror or exc}", file=sys.stderr)
        return False
    print(f"wrote {path}", file=sys.stderr)
    return True
