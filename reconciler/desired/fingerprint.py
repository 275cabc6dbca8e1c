"""What a run may remember of the desired state, and whether it still holds (stdlib only).

A loaded desired state is a pure function of its input files (the inventory, the group_vars
layers, the overlays the inventory names), of which layers exist at all, and of the code that
loaded it. The caches that skip work on a repeated run (the validated state, the drift inputs)
store their value with this fingerprint, pickled in the controller user's private cache
directory, and trust it only while it still matches, byte for byte.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import mmap
import os
import pickle
import stat
import struct
import sys
import time
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

from reconciler.desired.safe_read import (
    INVENTORY_MAX_BYTES,
    Unreadable,
    read_regular,
    refused_link,
)
from reconciler.gc_pause import paused_gc
from reconciler.pids import may_run

Buffer = bytes | bytearray | memoryview
KEEP = 16  # entries per kind: each repository checkout and inventory has its own


def cache_dir() -> Path:
    """The controller user's cache directory (never on a box, never shared between users)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fleet-reconciler"


def file_digest(path: Path) -> str | None:
    """None for anything the loader would refuse to read: a layer replaced by a FIFO must
    miss (and be reported by the loader), not block the check of a remembered entry."""
    try:
        # The inventory's limit, the largest: a file within it must be hashed, never None (an
        # inventory past a layer's limit would otherwise match any edit of itself).
        return hashlib.sha256(read_regular(path, limit=INVENTORY_MAX_BYTES)).hexdigest()
    except Unreadable:
        return None


def layer_listing(root: Path) -> list[str]:
    """A layer added or removed changes the state even when no recorded file changed; so does
    any other entry the loader refuses (a directory, `x.YAML`, `x.txt`: load.py `_entries`),
    so that a cached command meets that refusal as `validate` does. Hidden entries (an
    editor's swap file) are the loader's to ignore, and this listing's too."""
    try:
        names = os.listdir(root / "group_vars")
    except OSError:
        return []  # no group_vars/: the loader says so, the listing is empty
    return sorted(n for n in names if not ignored_entry(n))


# What group_vars/ may hold besides layers, never read and never an error: hidden entries (an
# editor's swap file, .gitkeep), an editor's or a merge's leftovers (`thor.yaml~`, `#all.yaml#`,
# `.orig`, `.rej`, `.bak`, a package manager's `.dpkg-old`/`.rpmnew`) and notes (`README`,
# `*.md`). Anything else that is not a layer (a directory, `x.YAML`, `x.txt`) is an error: it
# is most likely a layer its author expected to apply (load.py `_load_group_vars`).
_LEFTOVER_SUFFIXES = (".orig", ".rej", ".bak", ".md", ".rpmnew", ".rpmsave")


def ignored_entry(name: str) -> bool:
    """An entry of group_vars/ the loader neither reads nor refuses (_LEFTOVER_SUFFIXES)."""
    return (
        name.startswith(".")
        or name.endswith("~")
        or (name.startswith("#") and name.endswith("#"))
        or name.endswith(_LEFTOVER_SUFFIXES)
        or ".dpkg-" in name
        or name.split(".", 1)[0] == "README"
    )


def entry_name(kind: str, root: Path, inventory: Path) -> Path:
    """One cache file per (kind, repository, inventory), each as named and as resolved."""
    # realpath, not Path.resolve(): a symlink loop named by `-i` must not raise here (the
    # loader reports it at the file). The paths as named too (absolute, not resolved): the
    # state names its inventory by the path it was given (`inventory/current.yaml`, a link to
    # lab.yaml, is reported as current.yaml), so two names of one file are two entries; one
    # entry for both reported and recorded every run under the name first loaded.
    named = (os.path.abspath(root), os.path.abspath(inventory))
    where = "\0".join((os.path.realpath(root), os.path.realpath(inventory), *named))
    key = hashlib.sha256(where.encode()).hexdigest()[:24]
    return cache_dir() / f"{kind}-{key}"


# A file changed this recently may change again within its file system's clock granularity
# (a few ms here, 2 s on FAT) and keep the same stamps: its stamp is not recorded, so every
# check reads it (git's "racily clean" entries).
RACY_NS = 3_000_000_000


def file_stamp(path: str, settled_before: int | None = None) -> tuple[int, ...] | None:
    """What changes whenever a file's content does: its identity and change stamps (device,
    inode, size, mtime, ctime; no user can set a ctime back). None if it cannot be stat'ed,
    or (`settled_before`, ns since the epoch) if it changed since then."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    return _stamp(info, settled_before)


def _stamp(info: os.stat_result, settled_before: int | None) -> tuple[int, ...] | None:
    if settled_before is not None and max(info.st_mtime_ns, info.st_ctime_ns) >= settled_before:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class FileRead(NamedTuple):  # not a dataclass: a repeated drift imports this module early
    """One input as the loader read it: its stamp, taken when it was opened and before a byte
    was read (None while it may still change unseen, see RACY_NS), and the SHA-256 of the
    bytes it parsed."""

    stamp: tuple[int, ...] | None
    digest: str


def file_read(data: bytes, opened: os.stat_result) -> FileRead:
    """What to remember of a file whose bytes `data` were read after `opened` was taken."""
    stamp = _stamp(opened, time.time_ns() - RACY_NS)  # as file_stamp takes it for a check
    return FileRead(stamp, hashlib.sha256(data).hexdigest())


class InputsRead(NamedTuple):
    """What a load saw of its inputs: the layer listing taken before any layer was read, and
    each file it parsed (by path, as `Fleet.inputs` names it)."""

    listing: list[str]
    files: dict[str, FileRead]


def fingerprint(
    root: Path, inputs: Iterable[Path], seen: InputsRead | None = None
) -> dict[str, Any]:
    """The record a cache entry is trusted by. With `seen`, the loader's own record of what it
    parsed: reading the files again after the load would record an edit made meanwhile as
    the content of a state loaded from the text before it (a stale hit on every later run),
    and would read and hash the 2,006 files of a 1,000-box fleet a second time."""
    paths = [str(p) for p in inputs]
    known = seen.files if seen is not None else {}
    # Each stamp taken before its file is read: a write in between changes the stamp, and the
    # next check then reads the file.
    settled = time.time_ns() - RACY_NS
    stamps: dict[str, tuple[int, ...] | None] = {}
    digests: dict[str, str | None] = {}
    for path in paths:
        read = known.get(path)
        if read is None:
            stamps[path] = file_stamp(path, settled)
            digests[path] = file_digest(Path(path))
        else:
            stamps[path], digests[path] = read.stamp, read.digest
    return {
        "listing": seen.listing if seen is not None else layer_listing(root),
        "inputs": digests,
        "stamps": stamps,
        **symlinks(root, paths),
        "home": os.path.expanduser("~"),  # `~/` in inventory key paths expands against it
    }


def symlinks(root: Path, paths: list[str]) -> dict[str, Any]:
    """The loader's symlink policy is part of what it decided (a layer that leads out of the
    repository is refused, safe_read.py), and a link swapped for one leading elsewhere can keep
    its target's stamps and bytes (a bind mount, a hard link): so the record holds the text of
    every symlink on the way to an input. `links`: input -> its link's text (links only);
    `dirs`: each directory between the repository and an input -> its link's text, or None."""
    links = {path: text for path in paths if (text := _link_text(path)) is not None}
    base = os.path.abspath(root)
    under = {os.path.dirname(p) for p in paths if p.startswith(base + os.sep)}
    steps = set()
    for directory in under:  # a handful: inventory/, group_vars/, the overlays' folders
        while directory.startswith(base + os.sep):
            steps.add(directory)
            directory = os.path.dirname(directory)
    return {"links": links, "dirs": {d: _link_text(d) for d in sorted(steps)}}


def _link_text(path: str) -> str | None:
    """What the symlink at `path` says; None if it is no symlink (or is not there)."""
    try:
        return os.readlink(path)
    except (OSError, ValueError):
        return None


def code_version(package: Path, salt: object = "") -> str:
    """Every source file of `package` and the Python that runs it: a cache entry written by
    other code is never trusted. Runs on every repeated drift, so each file counts by its
    identity and change stamps (device, inode, size, mtime, ctime), not its ~1.6 MB of text:
    an edit, a checkout or an install changes the ctime, which no user can set back (a
    stamp that differs while the text is the same only costs one load). ~1 ms, where
    reading and hashing every file cost ~4 ms."""
    digest = hashlib.sha256(f"{salt}\0{sys.version}".encode())
    top = os.path.join(package, "")
    sources = []
    for directory, subdirectories, files in os.walk(top):
        subdirectories[:] = [d for d in subdirectories if d != "__pycache__"]
        sources += [os.path.join(directory, name) for name in files if name.endswith(".py")]
    for source in sorted(sources):
        stamp = file_stamp(source)
        # The path below `package` (os.walk's paths all start with `top`): a slice.
        digest.update(f"{source[len(top) :]}\0{stamp}\n".encode())
    return digest.hexdigest()


def library_stamps(*modules: str) -> str:
    """The installed version of each of these modules (`pydantic`, `ruamel.yaml`), told by
    the stamp of its package's first file (its `__init__.py`, or the extension module): an
    upgrade or a reinstall writes it anew (a new inode and ctime). Found, not imported: a
    repeated drift checks its remembered inputs before it imports pydantic or the YAML
    parser (~0.2 ms for four, where importing them costs ~100 ms)."""
    from importlib.machinery import PathFinder  # imported by Python's own start already

    found = []
    for name in modules:
        origin = getattr(sys.modules.get(name), "__file__", None)
        if origin is None:
            top, _, below = name.partition(".")
            spec = PathFinder.find_spec(top)
            if below and spec is not None:  # `ruamel` is a namespace package
                spec = PathFinder.find_spec(name, spec.submodule_search_locations)
            origin = spec.origin if spec is not None else None
        found.append(f"{name}={file_stamp(origin) if origin else None}")
    return ";".join(found)


def unchanged(root: Path, recorded: dict[str, Any]) -> bool:
    """True if the layer listing and every recorded input still have the recorded content.
    A file whose stamps are the recorded ones is not read again (hashing the 2,006 files of a
    1,000-box fleet on every run was ~0.1 s before its replay could start); any other is
    hashed and compared, so a file touched but not changed still counts as the same."""
    inputs = recorded.get("inputs")
    if not isinstance(inputs, dict) or not inputs:
        return False
    if recorded.get("listing") != layer_listing(root):
        return False
    if recorded.get("home") != os.path.expanduser("~"):
        return False
    stamps = recorded.get("stamps")
    stamps = stamps if isinstance(stamps, dict) else {}
    links, dirs = recorded.get("links"), recorded.get("dirs")
    if not isinstance(links, dict) or not isinstance(dirs, dict):
        return False
    if any(_link_text(d) != text for d, text in dirs.items()):
        return False  # a directory on the way became, stopped being or changed a symlink

    def same(path: str, digest: str | None) -> bool:
        now = _linked_stamp(path, links.get(path))
        if now is False:
            return False  # the file became, stopped being or changed a symlink
        stamp = stamps.get(path)
        if stamp is not None and now == stamp:
            return True
        # Hashed as the loader reads it: never through a symlink the loader refuses.
        return not refused_link(Path(path), root) and file_digest(Path(path)) == digest

    return all(same(p, d) for p, d in inputs.items())


def _linked_stamp(path: str, link: str | None) -> tuple[int, ...] | Literal[False] | None:
    """The file's stamp as file_stamp takes it (its target's for a symlink), with one lstat for
    a file that is no symlink (as many calls as the stat it replaces); False if whether it is
    a symlink, or what its link says, is not `link` (the recorded text; None: no symlink)."""
    try:
        info = os.lstat(path)
    except (OSError, ValueError):
        return None  # gone: its digest (None) then differs from the recorded one
    if not stat.S_ISLNK(info.st_mode):
        return False if link is not None else _stamp(info, None)  # lstat is stat here
    return file_stamp(path) if _link_text(path) == link else False


def write_private(path: Path, data: bytes | Sequence[Buffer], keep: int = KEEP) -> None:
    """Atomically, readable by this user only, keeping the `keep` newest entries of its kind
    (one per repository and inventory); a cache that cannot be written only costs time.

    The bytes reach the disk (fsync) before the rename: after a crash or a power cut the name
    holds the whole new file or the old one, never a file of the right size full of zeros
    (a file system may commit the rename before the data). A write that fails or is
    interrupted (Ctrl-C: KeyboardInterrupt) removes its temporary file; one a killed process
    left (SIGKILL, SIGTERM) is removed by the next write of its kind (`_prune`)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _close_to_others(path.parent)
        if not _private(os.lstat(path.parent), directory=True):
            return  # not ours alone: remembered() would not read it back either
        tmp = path.with_name(f".{path.name}.{os.getpid()}{_TMP}")
        tmp.unlink(missing_ok=True)  # O_EXCL below: never write through a planted name
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                out.writelines([data] if isinstance(data, bytes) else data)
                out.flush()
                os.fsync(out.fileno())
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _prune(path, keep)
    except OSError:
        pass


_TMP = ".tmp"


def _prune(path: Path, keep: int) -> None:
    """Only the `keep` newest entries of `path`'s kind, and no temporary file of it whose
    writer is gone (`.NAME.PID.tmp`)."""
    kind = path.name.rsplit("-", 1)[0]
    siblings = sorted(path.parent.glob(f"{kind}-*{path.suffix}"), key=lambda p: p.stat().st_mtime)
    for old in siblings[:-keep]:
        old.unlink(missing_ok=True)
    for tmp in path.parent.glob(f".{kind}-*{path.suffix}.*{_TMP}"):
        pid = tmp.name[: -len(_TMP)].rsplit(".", 1)[-1]
        if pid.isdigit() and not may_run(int(pid)):
            tmp.unlink(missing_ok=True)


def _close_to_others(directory: Path) -> None:
    """Our own cache directory that others may read but not write (0755: made as the parent
    of another directory, e.g. the collector's compose cache when it runs as this user): made
    0700, or every run would find it not private and remember nothing. One others may write
    to is left as it is, and refused."""
    info = os.lstat(directory)
    if (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.getuid()
        and info.st_mode & 0o077
        and not info.st_mode & 0o022
    ):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)


def _private(info: os.stat_result, directory: bool) -> bool:
    kind_ok = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    return kind_ok and info.st_uid == os.getuid() and not info.st_mode & 0o077


def read_private(path: Path) -> bytes | None:
    """The file's bytes if it is a regular file this user alone could have written, in a
    directory only this user can write (no link followed, no FIFO waited on); else None."""
    try:
        if not _private(os.lstat(path.parent), directory=True):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as source:
            if not _private(os.fstat(source.fileno()), directory=False):
                return None
            return source.read()
    except OSError:
        return None


def remembered(kind: str, root: Path, inventory: Path, code: str) -> Any | None:
    """The value stored for (kind, repository, inventory) if it was stored by this code and no
    input changed since; None otherwise. A file another user owns or could write is never read."""
    path = entry_name(kind, root, inventory).with_suffix(".pickle")
    view = map_private(path)  # unpickling runs code: only what this user alone wrote
    if view is None:
        return None
    try:
        with paused_gc():  # a 1,000-box fleet's inputs are ~1M acyclic objects: no GC passes
            entry: dict[str, Any] = _unpacked(view)
    except Exception:  # missing, truncated, or pickled by code that no longer exists: a miss
        return None
    if entry.get("code") != code or not unchanged(root, entry):
        return None
    return entry.get("value")


def forget(kind: str, root: Path, inventory: Path) -> None:
    """Drop the entry stored for (kind, repository, inventory): the next run loads and stores
    it again (an entry found damaged where it was read, drift_inputs._PerBox)."""
    with contextlib.suppress(OSError):
        entry_name(kind, root, inventory).with_suffix(".pickle").unlink(missing_ok=True)


def remember(
    kind: str,
    root: Path,
    inventory: Path,
    code: str,
    inputs: Iterable[Path],
    value: Any,
    seen: InputsRead | None = None,
) -> None:
    """Store `value` with the fingerprint of `inputs` (as the loader `seen` them, else taken
    now) and of `code`; behind the caller's back if it asked for that (`store_behind`)."""
    entry = {"code": code, **fingerprint(root, inputs, seen), "value": value}
    path = entry_name(kind, root, inventory).with_suffix(".pickle")
    if _behind is not None and _alone():
        try:
            pid = os.fork()
        except OSError:
            pid = -1  # no process to spare: store it here
        if pid == 0:  # the child: pickle, write, and end without any of the parent's exit work
            # No collector passes: pickling makes no cycles, and a pass would walk (and copy
            # the pages of) every object the parent had, a 1,000-box fleet's million.
            gc.disable()
            status = 1
            try:
                write_private(path, _packed(entry))
                status = 0
            finally:
                os._exit(status)
        if pid > 0:
            _behind.append(pid)
            return
    write_private(path, _packed(entry))


# An entry's file: this magic, the CRC-32 of its pickle, the length of that pickle and of
# each out-of-band buffer (8-byte little-endian counts), the pickle, the buffers. A value that
# keeps bulk it rarely reads in full (the drift inputs' expectations and payloads: ~9 MB at
# 1,000 boxes) hands it to pickle as a PickleBuffer (protocol 5); reading
# maps the file and gives those buffers back as views of the mapping, so a run reads only the
# pages it uses (a replay's workers, their own boxes), and nothing is copied or read in full
# to open the entry. The pickle is checked as it is opened (~0.1 ms for the drift inputs'
# 0.6 MB at 1,000 boxes, ~1 ms for the validated state's 7 MB, which a hit then unpickles in
# ~0.4 s); the buffers are their owner's to check where it reads them (drift_inputs._PerBox).
_MAGIC = b"FRPK\x00\x00\x00\x06"  # 6: the pickle's checksum
_COUNT = struct.Struct("<Q")


def _packed(entry: Any) -> list[Buffer]:
    buffers: list[pickle.PickleBuffer] = []
    main = pickle.dumps(entry, protocol=5, buffer_callback=buffers.append)
    views = [buffer.raw() for buffer in buffers]
    lengths = [_COUNT.pack(zlib.crc32(main)), _COUNT.pack(len(main)), _COUNT.pack(len(views))]
    lengths += [_COUNT.pack(view.nbytes) for view in views]
    return [_MAGIC, *lengths, main, *views]


def _unpacked(view: memoryview) -> Any:
    if view[: len(_MAGIC)] != _MAGIC:
        raise ValueError("not an entry of this format")
    at = len(_MAGIC)
    (check,), (main,) = _COUNT.unpack_from(view, at), _COUNT.unpack_from(view, at + 8)
    (count,) = _COUNT.unpack_from(view, at + 16)
    at += 24
    if count > 1024:
        raise ValueError("too many buffers")
    lengths = [_COUNT.unpack_from(view, at + 8 * i)[0] for i in range(count)]
    at += 8 * count
    if at + main + sum(lengths) != len(view):
        raise ValueError("truncated or padded")
    if zlib.crc32(view[at : at + main]) != check:
        raise ValueError("damaged")  # a pickle may load from damaged bytes, as other values
    buffers = []
    start = at + main
    for length in lengths:
        buffers.append(view[start : start + length])
        start += length
    return pickle.loads(view[at : at + main], buffers=buffers)


def map_private(path: Path) -> memoryview | None:
    """read_private's file, mapped read-only instead of read (None as read_private says)."""
    try:
        if not _private(os.lstat(path.parent), directory=True):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            info = os.fstat(fd)
            if not _private(info, directory=False) or info.st_size == 0:
                return None
            # Files here are only ever replaced whole (write_private's rename), never changed
            # in place: the mapping keeps the version it opened.
            return memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None


# Pids of the children still storing an entry; None: `remember` stores in the caller's process.
_behind: list[int] | None = None


def store_behind() -> None:
    """From now on `remember` pickles and writes its entry in a forked child while the caller
    goes on: a cold replay of 1,000 boxes pickles its drift inputs (~0.3 s of CPU), which its
    answer never waits for. The caller must call `stored()` before it ends. Only where no
    other thread runs (a fork copies one thread, not the locks others hold); otherwise, and in
    every other command, the store happens in place, as before."""
    global _behind
    if _behind is None:
        _behind = []


def stored() -> None:
    """Wait for every entry still being stored, so the next run finds them, and store in
    place again from now on (a caller that runs commands in-process runs the next one as
    if new)."""
    global _behind
    while _behind:
        pid = _behind.pop()
        with contextlib.suppress(ChildProcessError):  # already waited for elsewhere
            os.waitpid(pid, 0)
    _behind = None


def _alone() -> bool:
    threading = sys.modules.get("threading")  # not imported: no other Python thread exists
    return threading is None or threading.active_count() == 1
