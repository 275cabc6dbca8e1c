"""Which of a saved snapshot's masks of inline secrets a replay may trust.

A box masks a desired value that carries a secret inline (`VLLM_ARGS=--api-key x`, a knob's
`Bearer x`) with the run's key, which the controller never keeps (the answer's
`envfile_desired`, `knobs_desired`; compare/inline.py). A live run compares against masks of
the desired state it sent. A snapshot replayed later holds the masks of the values it was
taken against: compare can only check their text outside the secret (`fits`), so after the
secret was rotated the stale mask of the old one would match the box's old line, and the
drift would read "no drift".

So when a live run saves a snapshot, each mask is recorded with a digest of the clear desired
value it was made from, keyed with a key of this controller (a private file in the user's
state directory, made once): the box file's `controller` section, `inline_masks`. A replay
keeps a mask only where that digest is the current desired value's under the same key, and
drops it otherwise: compare then takes its "cannot compare" path (`***`, not comparable),
never "no drift". A snapshot without digests (older, saved by another controller, or by an
audit) therefore never vouches for a mask. The key never leaves the file; the digests reveal
nothing of a secret without it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.records import replace

if TYPE_CHECKING:
    from reconciler.compare.context import BoxExpectation
    from reconciler.observe.document import Observed
    from reconciler.observe.observe import BoxObservation

KEY_FILE = "snapshot-mask.key"
KEY_BYTES = 32
# The box file's `controller` section that holds the digests (what save_snapshot writes as is).
FIELD = "inline_masks"
_HEX64 = frozenset("0123456789abcdef")


class SnapshotKeyError(ValueError):
    """The controller's snapshot key file cannot be used (the run's error, said in full)."""


def key_path() -> Path:
    """`$XDG_STATE_HOME/fleet-reconciler/snapshot-mask.key`, beside the history store."""
    from reconciler.history.location import state_dir

    return state_dir() / KEY_FILE


def _problem(info: os.stat_result, directory: bool) -> str | None:
    """Why a file or directory is not this user's alone (desired/fingerprint.py `_private`)."""
    if not (stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)):
        return "is not a directory" if directory else "is not a regular file"
    if info.st_uid != os.getuid():
        return "is owned by another user"
    if info.st_mode & 0o077:
        return f"is readable or writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _refused(path: Path, why: str) -> SnapshotKeyError:
    return SnapshotKeyError(
        f"snapshot key {path} {why}: refused (it vouches for saved masks of secrets); make it "
        f"a private file (chmod 600, owned by you, in a 0700 directory) or remove it"
    )


def load_key(create: bool) -> bytes | None:
    """The controller's key; made when missing if `create` (a save), else None (a replay on a
    controller that never saved one: nothing it replays is vouched for). A key file that is
    not a private regular file of this user, or not a key, is refused: another user could have
    written it, and then made a stale mask pass for a current one."""
    path = key_path()
    directory = path.parent
    if create:
        from reconciler.history.location import prepare

        prepare(path)  # its directory made 0700 when missing, as the history store's
    try:
        why = _problem(os.lstat(directory), directory=True)
    except FileNotFoundError:
        return None
    if why is not None:
        raise _refused(directory, why)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return _created(path) if create else None
    except OSError as exc:  # a symlink (ELOOP), unreadable
        raise _refused(path, f"cannot be opened ({exc.strerror or exc})") from None
    try:
        # Judged on what was opened (no race with a rename), before reading it.
        why = _problem(os.fstat(fd), directory=False)
        if why is not None:
            raise _refused(path, why)
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if not key and create:
        # Empty: what an earlier release left when it was stopped (or found the disk full)
        # between making the file and writing the key into it. No digest was made with it
        # (the key was written only after): a save makes a new one.
        return _created(path, replace=True)
    if len(key) != KEY_BYTES:
        raise _refused(path, f"does not hold a {KEY_BYTES}-byte key")
    return key


def _created(path: Path, replace: bool = False) -> bytes | None:
    """A new key, written whole (and synced) under a name of its own, then linked to the
    key's name, which `link` makes only where there is none: a run reading the key at the same
    time finds no file or the whole key, never an empty one, and a run stopped half way (a
    kill, a full disk) leaves no key file. If another run made one meanwhile, that one is the
    key. `replace`: the key's name holds an empty file (`load_key`), replaced."""
    key = os.urandom(KEY_BYTES)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(key)
            out.flush()
            os.fsync(out.fileno())
        if replace:
            os.replace(tmp, path)
            return load_key(create=False)  # another run may have replaced it too: the last one
        try:
            os.link(tmp, path)
        except FileExistsError:  # made meanwhile by another run: that one is the key
            return load_key(create=False)
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
            return _written_in_place(path, key)  # a file system without hard links
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return key


def _written_in_place(path: Path, key: bytes) -> bytes | None:
    """The key made at its own name and written there (where no hard link can be made): a
    run reading it in between would find it empty and refuse it, as `_created` avoids."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # made meanwhile by another run: that one is the key
        return load_key(create=False)
    with os.fdopen(fd, "wb") as out:
        out.write(key)
    return key


class KeyOnce:
    """The key, read at most once per process and only when a box has a mask to judge: a
    replay of boxes without inline secrets reads no file. A refused key file is the run's
    error, raised where it is first needed."""

    def __init__(self, create: bool = False) -> None:
        self._create = create
        self._read = False
        self._key: bytes | None = None

    def get(self) -> bytes | None:
        if not self._read:
            self._key = load_key(self._create)
            self._read = True
        return self._key


# -- the digests -----------------------------------------------------------------------------------


def _digest(key: bytes, kind: str, name: str, clear: Any) -> str:
    # The kind and key's name are inside the message: a digest vouches for one value of one
    # key, never for the same text under another key.
    message = json.dumps([kind, name, clear], separators=(",", ":"), ensure_ascii=False)
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).hexdigest()


def _envfile_clear(exp: BoxExpectation, name: str) -> list[str] | None:
    """The desired values of `.env` key `name` the box's mask may have been made from."""
    values = [e.value for e in exp.env if e.key == name and isinstance(e.value, str)]
    return values or None


def _knob_clear(exp: BoxExpectation, name: str) -> list[list[str]] | None:
    """The (flag, desired value) of knob `name` in each lane that reads it."""
    found = sorted({lane.knobs[name] for lane in exp.lanes.values() if name in lane.knobs})
    return [list(pair) for pair in found] or None


def _clear_of(exp: BoxExpectation, kind: str, name: str) -> Any:
    return _envfile_clear(exp, name) if kind == "envfile" else _knob_clear(exp, name)


def _masks(doc: Observed) -> dict[str, Mapping[str, Any]]:
    return {"envfile": doc.envfile_desired, "knobs": doc.knobs_desired}


def record(observations: Mapping[str, BoxObservation], expectations: Any) -> None:
    """For a live run about to save its snapshot: each box with masks gets, in its
    `controller` section, the digest of each mask's clear desired value (`FIELD`). A box
    without masks (nearly all) is left as it was: its file is byte for byte as before, and
    no key file is read or made for a run that has none."""
    key = KeyOnce(create=True)
    for name, obs in observations.items():
        doc = obs.document
        if doc is None or not (doc.envfile_desired or doc.knobs_desired):
            continue
        exp = expectations[name]
        digests: dict[str, dict[str, str]] = {}
        for kind, masks in _masks(doc).items():
            for masked in masks:
                clear = _clear_of(exp, kind, masked)
                if clear is not None:
                    secret = key.get()
                    assert secret is not None  # made when missing
                    digests.setdefault(kind, {})[masked] = _digest(secret, kind, masked, clear)
        if digests:
            obs.controller[FIELD] = {k: dict(sorted(v.items())) for k, v in digests.items()}


def _recorded(controller: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    section = controller.get(FIELD)
    part = section.get(kind) if isinstance(section, dict) else None
    return part if isinstance(part, dict) else {}


def _vouched(recorded: Any, key: bytes | None, kind: str, name: str, clear: Any) -> bool:
    if key is None or clear is None or type(recorded) is not str or len(recorded) != 64:
        return False
    if not set(recorded) <= _HEX64:
        return False
    return hmac.compare_digest(recorded, _digest(key, kind, name, clear))


def trusted(
    doc: Observed, controller: Mapping[str, Any], exp: BoxExpectation, key: KeyOnce
) -> Observed:
    """A replayed snapshot's `doc` with only the masks this controller's digests show were
    made from the current desired values: any other (rotated since, no digest, another
    controller's) is dropped, so compare says the secret cannot be compared. A document
    without masks is returned as it is, and no key is read for it."""
    if not (doc.envfile_desired or doc.knobs_desired):
        return doc
    kept: dict[str, dict[str, Any]] = {}
    for kind, masks in _masks(doc).items():
        recorded = _recorded(controller, kind)
        kept[kind] = {
            name: masked
            for name, masked in masks.items()
            if name in recorded
            and _vouched(recorded[name], key.get(), kind, name, _clear_of(exp, kind, name))
        }
    if len(kept["envfile"]) == len(doc.envfile_desired) and len(kept["knobs"]) == len(
        doc.knobs_desired
    ):
        return doc
    return replace(doc, envfile_desired=kept["envfile"], knobs_desired=kept["knobs"])


def trust_observation(obs: BoxObservation, exp: BoxExpectation, key: KeyOnce) -> None:
    """`trusted` on a replayed box's typed document, in place (its raw answer is unchanged:
    what is kept or saved again is what the snapshot holds)."""
    if obs.document is not None:
        obs.document = trusted(obs.document, obs.controller, exp, key)
