"""A file the operator names for a run's output (`-o FILE`, `--metrics FILE`): checked before
anything runs, then written aside and renamed into place.

Replaced whole or not at all: a reader (a dashboard, node_exporter's textfile collector, a
browser) never sees half a report, and a write that fails (a full disk) leaves the last one.
A rename replaces whatever is at the path, so only a regular file, or nothing, is replaced:
never a directory, a device, a FIFO or a symlink (as root, `-o /dev/null` would have replaced
the device; a FIFO with no reader blocked the run forever).

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
    target = Path(path)
    try:
        mode: int | None = target.lstat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # a name too long, a loop, a component that is not a directory
        return f"{option} {path}: {exc.strerror or exc}"
    if mode is not None and stat.S_ISDIR(mode):
        return f"{option} {path}: is a directory, not a file"
    if mode is not None and not stat.S_ISREG(mode):
        return f"{option} {path}: exists and is not a regular file; nothing replaces it"
    parent = target.parent
    if not parent.is_dir():
        return f"{option} {path}: the directory {parent} does not exist"
    return None


def write_whole(path: Path, pieces: Iterable[str]) -> None:
    """The text in a new file beside `path` (mode from the umask, as `open` makes it), then
    renamed over it. OSError (nothing at `path` changed) when it cannot be."""
    aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with aside.open("x", encoding="utf-8") as out:  # "x": never through what is there
            out.writelines(pieces)
        os.replace(aside, path)
    except BaseException:
        with suppress(OSError):
            aside.unlink(missing_ok=True)
        raise


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
