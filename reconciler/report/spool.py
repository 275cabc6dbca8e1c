"""A large report's box entries kept in a temporary file until the document around them is
written, then read back a chunk at a time.

A JSON report's head (its summary) comes before its boxes, and the summary is known only once
every box is compared, so a replay cannot write its boxes as they arrive. Held in memory
instead, they are what grows as the square of the fleet: each box's desired
`LOBES_MESH_SEEDS` names every member, so each entry grows with the fleet (9.6 KB a box at 10
boxes, 33 KB at 1,000: a 33 MB report; BENCHMARKS.md, issue 12). So the worker that made a
chunk of entries writes them here itself (`put`) and sends the replaying process only where
they are (`Spooled`): no process holds more than a chunk of entries at a time, however large
the fleet, and none of them travels through a pipe.

The file is made before the workers fork, so they share it; each write takes the next free
bytes under a POSIX record lock (which, unlike flock, excludes the other processes sharing
the descriptor). It is made unlinked (`tempfile.TemporaryFile`, in TMPDIR): a run that is
killed leaves nothing behind. Where no file can be made or written (TMPDIR unwritable, a full
disk), the text itself comes back instead and is kept in memory, as before the spool: a run is
never lost to it.

A recorded replay's history rows grow alike (each box's drift entries hold its desired seeds),
so they are kept the same way (`ItemSpool`), pickled, until the history store inserts them.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import BinaryIO, Generic, TypeVar

# Text is written as UTF-8 that keeps a lone surrogate (json.dumps writes one where a box's
# answer had it): read back, it is the same str.
_ERRORS = "surrogatepass"

# Buffers a write may take at once (IOV_MAX on Linux).
_MAX_BUFFERS = 1024

# Where a `put` left its text: (offset, length) in the file, or the text itself.
Spooled = tuple[int, int] | str
Item = TypeVar("Item")


class _SharedFile:
    """The unlinked temporary file, shared with the processes forked after it was made: each
    write takes the next free bytes under a POSIX record lock."""

    def __init__(self) -> None:
        self.file: BinaryIO | None = None
        # None: nothing can be kept in a file. Open as long as the report is (closed by
        # `close` or with it): no `with` block.
        with suppress(OSError):
            self.file = tempfile.TemporaryFile(prefix="fleet-report-")  # noqa: SIM115

    def write(self, data: list[bytes]) -> tuple[int, int] | None:
        """Where the data, one after another, now is; None if it could not be written (no
        file, a full disk: what was written of it is never read)."""
        if self.file is None:
            return None
        fd = self.file.fileno()
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            try:
                offset = os.fstat(fd).st_size
                _write_all(fd, data, offset)
            finally:
                fcntl.lockf(fd, fcntl.LOCK_UN)
        except OSError:
            return None
        return offset, sum(map(len, data))

    def read(self, where: tuple[int, int]) -> bytes:
        assert self.file is not None, "a chunk in the file was written to it"
        return _read(self.file.fileno(), *where)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class TextSpool:
    """Text put chunk by chunk (in this process or one forked from it after it was made), kept
    in order (`keep`), then read back in those chunks, as often as asked."""

    def __init__(self, between: str = "") -> None:
        self._between = between  # written between two chunks kept
        self._kept: list[Spooled] = []
        self._file = _SharedFile()

    @property
    def in_memory(self) -> bool:
        """Whether every chunk's text comes back to be kept in memory (no file could be made)."""
        return self._file.file is None

    def put(self, pieces: Sequence[str]) -> Spooled:
        """The pieces' text, one after another, written to the file (or, if it cannot be, given
        back): what `keep` takes in the process reading the report."""
        where = self._file.write([piece.encode("utf-8", _ERRORS) for piece in pieces])
        return "".join(pieces) if where is None else where

    def keep(self, chunk: Spooled) -> None:
        """A chunk `put` made, after those kept before it; an empty one is skipped."""
        empty = chunk[1] == 0 if isinstance(chunk, tuple) else not chunk
        if not empty:
            self._kept.append(chunk)

    def pieces(self) -> Iterator[str]:
        """The text kept, chunk by chunk: one chunk in memory at a time. OSError if the file
        cannot be read back."""
        for index, chunk in enumerate(self._kept):
            if index and self._between:
                yield self._between
            if isinstance(chunk, str):
                yield chunk
            else:
                yield self._file.read(chunk).decode("utf-8", _ERRORS)

    def close(self) -> None:
        self._file.close()


@dataclass(frozen=True)
class Held(Generic[Item]):
    """A chunk `ItemSpool.put` could not write to its file: the items themselves."""

    items: list[Item]


class ItemSpool(Generic[Item]):
    """Items (a recorded replay's history rows) put a chunk at a time, as `TextSpool` puts text:
    pickled into the file by the process that made them, kept in order here, then iterated
    (as often as asked) a chunk in memory at a time. Only this run's own file is unpickled:
    made by this process, unlinked, never named, and written by its own forks."""

    def __init__(self) -> None:
        self._kept: list[tuple[int, int] | Held[Item]] = []
        self._file = _SharedFile()

    def put(self, items: list[Item]) -> tuple[int, int] | Held[Item]:
        where = self._file.write([pickle.dumps(items, pickle.HIGHEST_PROTOCOL)])
        return Held(items) if where is None else where

    def keep(self, chunk: tuple[int, int] | Held[Item]) -> None:
        self._kept.append(chunk)

    def __iter__(self) -> Iterator[Item]:
        for chunk in self._kept:
            if isinstance(chunk, Held):
                yield from chunk.items
            else:
                yield from pickle.loads(self._file.read(chunk))  # this run's own file

    def close(self) -> None:
        self._file.close()


def _write_all(fd: int, data: list[bytes], offset: int) -> None:
    views = [memoryview(d) for d in data if d]
    while views:
        written = os.pwritev(fd, views[:_MAX_BUFFERS], offset)
        offset += written
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def _read(fd: int, offset: int, size: int) -> bytes:
    chunks = []
    while size:
        data = os.pread(fd, size, offset)
        if not data:
            raise OSError(f"the report's temporary file ended {size} bytes early")
        chunks.append(data)
        offset, size = offset + len(data), size - len(data)
    return b"".join(chunks)
