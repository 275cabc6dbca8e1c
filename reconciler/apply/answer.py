"""The converge program's answer (reconciler/apply/remote/converge.py), typed once.

A box may be broken or hostile, and what its program prints decides what the controller does
next (verify, roll back, mark good) and what an operator reads. So its result and each of its
events are read here into frozen values with checked types: a result that does not have the
result's shape is a failure that names the field (never the value), and an event that is not
understood is dropped (it is still kept, scrubbed, in the evidence's raw actions).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# converge.py's snapshot ids (its SNAPSHOT_ID): UTC time, and a counter when two fall in one
# second. Matched whole and in ASCII digits only, exactly as the box does: `\d` takes other
# scripts' digits and `$` a trailing newline, ids the box would refuse to roll back to.
_SNAPSHOT_ID = re.compile(r"[0-9]{8}T[0-9]{6}Z(?:-[0-9]{1,4})?")
_MAX_TEXT = 4096
_MAX_ITEMS = 1000


class _Wrong(Exception):
    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{path}: {what}")
        self.path, self.what = path, what

    def under(self, parent: str) -> _Wrong:
        return _Wrong(f"{parent}.{self.path}", self.what)


def _text(obj: Mapping[str, Any], key: str, required: bool = False) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise _Wrong(key, "missing")
        return None
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise _Wrong(key, "expected a string")
    return value


def _name(obj: Mapping[str, Any], key: str, required: bool = False) -> str | None:
    value = _text(obj, key, required)
    if value is not None and not value.isprintable():
        raise _Wrong(key, "a name with control characters")
    return value


def _names(obj: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = obj.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > _MAX_ITEMS:
        raise _Wrong(key, "expected a list of names")
    if not all(isinstance(v, str) and v.isprintable() and len(v) <= _MAX_TEXT for v in value):
        raise _Wrong(key, "expected a list of names")
    return tuple(value)


def _flag(obj: Mapping[str, Any], key: str) -> bool:
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise _Wrong(key, "expected true or false")
    return value


def _number(obj: Mapping[str, Any], key: str) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Wrong(key, "expected a number")
    if not math.isfinite(value) or not 0 <= value <= 2**53:
        raise _Wrong(key, "a number out of range")
    return float(value)


def _snapshot(obj: Mapping[str, Any], key: str) -> str | None:
    value = _text(obj, key)
    if value is not None and not _SNAPSHOT_ID.fullmatch(value):
        raise _Wrong(key, "not a snapshot id")
    return value


# -- the result -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeptFile:
    """A file the rollback would have removed (absent at the snapshot) but kept: not what a
    converge wrote (an operator's edit, a file made by hand). `why` is the box's words."""

    name: str
    why: str


@dataclass(frozen=True)
class RollbackResult:
    ok: bool
    snapshot: str | None
    files: tuple[str, ...] = ()  # changed: restored, or removed (a subset: `removed`)
    config_equal: bool = False  # every container's config as in the snapshot
    unequal: tuple[str, ...] = ()  # services whose config still differs
    failed: str | None = None
    removed: tuple[str, ...] = ()  # absent at the snapshot, created by a converge since
    kept: tuple[KeptFile, ...] = ()  # absent at the snapshot, not removed, and why
    removed_containers: tuple[str, ...] = ()  # services whose container went with the files
    started: tuple[str, ...] = ()  # strays a converge had stopped (to remove), started again
    # Files edited by hand since the snapshot, copied aside before it was restored over them
    # (converge.py `edited_since`): where each copy is.
    set_aside: tuple[KeptFile, ...] = ()

    @property
    def restored(self) -> tuple[str, ...]:
        """The files put back in place (changed, not removed)."""
        return tuple(f for f in self.files if f not in self.removed)


@dataclass(frozen=True)
class Interrupted:
    """The previous converge of the box did not finish (killed after its snapshot): the box
    refused this one before any change (converge.py refuse_interrupted)."""

    snapshot: str
    taken_at: str
    holder: str
    # Which run did not finish: "converge", "rollback" (killed) or "failed-rollback" (it
    # failed after its first change). An older box program sends none: a converge.
    kind: str = "converge"


@dataclass(frozen=True)
class ConvergeResult:
    ok: bool
    failed: str | None = None
    snapshot: str | None = None  # taken before anything changed (None: nothing was touched)
    rollback: RollbackResult | None = None
    # The strays the converge stopped and keeps until mark-good removes them (stop_stray).
    strays: tuple[str, ...] = ()
    interrupted: Interrupted | None = None


def rollback_result(raw: Any) -> RollbackResult | None:
    """A rollback's result (inside a failed converge's result, or a `rollback` call's)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        return RollbackResult(False, None, failed="the box's rollback result is not an object")
    try:
        return RollbackResult(
            ok=_flag(raw, "ok"),
            snapshot=_snapshot(raw, "snapshot"),
            files=_names(raw, "files"),
            config_equal=_flag(raw, "config_equal"),
            unequal=_names(raw, "unequal"),
            failed=_text(raw, "failed"),
            removed=_names(raw, "removed"),
            kept=_kept(raw),
            set_aside=_kept(raw, "set_aside"),
            removed_containers=_names(raw, "removed_containers"),
            started=_names(raw, "started"),
        )
    except _Wrong as exc:
        return RollbackResult(False, None, failed=f"the box's rollback result is malformed: {exc}")


def _kept(raw: Mapping[str, Any], key: str = "kept") -> tuple[KeptFile, ...]:
    """The files a rollback kept (or set aside): a list of {name, why}; absent from an older
    box program."""
    value = raw.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > _MAX_ITEMS:
        raise _Wrong(key, "expected a list of {name, why}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise _Wrong(f"{key}[{i}]", "expected {name, why}")
        try:
            out.append(KeptFile(_name(item, "name", True) or "", _text(item, "why", True) or ""))
        except _Wrong as exc:
            raise exc.under(f"{key}[{i}]") from None
    return tuple(out)


def converge_result(raw: Any) -> ConvergeResult:
    """The program's `result` event; anything not shaped like one is a failed converge."""
    if not isinstance(raw, Mapping):
        return ConvergeResult(False, "the box program's result is not an object")
    try:
        ok = _flag(raw, "ok")
        snapshot = _snapshot(raw, "snapshot")
        failed = _text(raw, "failed")
        strays = _names(raw, "strays")
        interrupted = _interrupted(raw.get("interrupted"))
    except _Wrong as exc:
        # A snapshot id we cannot trust is not one to roll back to: nothing is claimed.
        return ConvergeResult(False, f"the box program's result is malformed: {exc}")
    rollback = rollback_result(raw.get("rollback"))
    return ConvergeResult(ok, failed, snapshot, rollback, strays, interrupted)


INTERRUPTED_KINDS = ("converge", "rollback", "failed-rollback")


def _interrupted(value: Any) -> Interrupted | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _Wrong("interrupted", "expected {snapshot, taken_at, holder}")
    try:
        snapshot = _snapshot(value, "snapshot")
        if snapshot is None:
            raise _Wrong("snapshot", "missing")
        kind = _name(value, "kind") or "converge"
        if kind not in INTERRUPTED_KINDS:
            raise _Wrong("kind", f"expected one of {', '.join(INTERRUPTED_KINDS)}")
        return Interrupted(
            snapshot,
            _name(value, "taken_at") or "?",
            _name(value, "holder") or "?",
            kind,
        )
    except _Wrong as exc:
        raise exc.under("interrupted") from None


@dataclass(frozen=True)
class ActionResult:
    """Any other action's result (mark-good): did it do it, and if not, the box's words."""

    ok: bool
    failed: str | None = None
    # mark-good: the strays its converge kept stopped, removed now, and those left (said why
    # in the box's notes)
    strays_removed: tuple[str, ...] = ()
    strays_kept: tuple[str, ...] = ()


def action_result(raw: Any) -> ActionResult:
    if not isinstance(raw, Mapping):
        return ActionResult(False, "the box program's result is not an object")
    try:
        return ActionResult(
            _flag(raw, "ok"),
            _text(raw, "failed"),
            _names(raw, "strays_removed"),
            _names(raw, "strays_kept"),
        )
    except _Wrong as exc:
        return ActionResult(False, f"the box program's result is malformed: {exc}")


# -- the snapshot listing (`reconcile snapshots`, and the check of `rollback --to`) -------------
@dataclass(frozen=True)
class SnapshotEntry:
    id: str
    status: str | None  # taken, running, converged, rolled-back, unreadable, ...
    services: tuple[str, ...]
    holder: str | None
    failed: str | None


@dataclass(frozen=True)
class LockHolder:
    holder: str | None
    pid: int | None
    since: str | None


@dataclass(frozen=True)
class SnapshotListing:
    ok: bool
    failed: str | None = None
    snapshots: tuple[SnapshotEntry, ...] = ()
    lock: LockHolder | None = None  # who holds the box's converge lock now, if anyone


def snapshot_listing(raw: Any) -> SnapshotListing:
    """A `snapshots` call's result. An entry whose id is not a snapshot id is a malformed
    listing as a whole: `rollback --to` trusts this list to say what the box holds."""
    if not isinstance(raw, Mapping):
        return SnapshotListing(False, "the box's snapshot listing is not an object")
    try:
        if not _flag(raw, "ok"):
            return SnapshotListing(False, _text(raw, "failed") or "the box listed no snapshots")
        entries = raw.get("snapshots") or []
        if not isinstance(entries, list) or len(entries) > _MAX_ITEMS:
            raise _Wrong("snapshots", "expected a list")
        return SnapshotListing(
            True,
            snapshots=tuple(_snapshot_entry(e, i) for i, e in enumerate(entries)),
            lock=_lock_holder(raw.get("lock")),
        )
    except _Wrong as exc:
        return SnapshotListing(False, f"the box's snapshot listing is malformed: {exc}")


def _snapshot_entry(raw: Any, index: int) -> SnapshotEntry:
    if not isinstance(raw, Mapping):
        raise _Wrong(f"snapshots[{index}]", "expected an object")
    try:
        return SnapshotEntry(
            id=_snapshot(raw, "id") or "",
            status=_name(raw, "status"),
            services=_names(raw, "services"),
            holder=_text(raw, "holder"),
            failed=_text(raw, "failed"),
        )
    except _Wrong as exc:
        raise exc.under(f"snapshots[{index}]") from None


def _lock_holder(raw: Any) -> LockHolder | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise _Wrong("lock", "expected an object")
    pid = raw.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int | None) or not 0 <= (pid or 0) < 2**31:
        raise _Wrong("lock.pid", "expected a process id")
    return LockHolder(_text(raw, "holder"), pid, _text(raw, "since"))


# -- events ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Wait:
    service: str
    state: str
    elapsed: float
    timeout: float


@dataclass(frozen=True)
class Healthy:
    service: str
    elapsed: float


@dataclass(frozen=True)
class StepEvent:
    step: str
    status: str | None
    subject: str | None
    keys: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    reason: str | None = None


@dataclass(frozen=True)
class SnapshotTaken:
    id: str


@dataclass(frozen=True)
class Message:
    failed: bool  # a `failed` event, else a `note`
    text: str


@dataclass(frozen=True)
class Memory:
    service: str
    available_kib: float
    need_kib: float
    dropped: str | None


Event = Wait | Healthy | StepEvent | SnapshotTaken | Message | Memory


def event(raw: Any) -> Event | None:
    """One line of the program's output as a typed event; None when it is not one we know."""
    if not isinstance(raw, Mapping):
        return None
    try:
        return _event(raw)
    except _Wrong:
        return None


def _event(raw: Mapping[str, Any]) -> Event | None:
    kind = raw.get("event")
    if kind == "wait":
        service = _name(raw, "service", required=True) or ""
        state = _name(raw, "state") or "?"
        return Wait(service, state, _number(raw, "elapsed"), _number(raw, "timeout"))
    if kind == "healthy":
        return Healthy(_name(raw, "service", required=True) or "", _number(raw, "elapsed"))
    if kind == "step":
        return StepEvent(
            step=_name(raw, "step", required=True) or "",
            status=_name(raw, "status"),
            subject=_name(raw, "subject"),
            keys=_names(raw, "keys"),
            files=_names(raw, "files"),
            reason=_text(raw, "reason"),
        )
    if kind == "snapshot":
        return SnapshotTaken(_snapshot(raw, "id") or "?")
    if kind in ("note", "failed"):
        return Message(kind == "failed", _text(raw, "message") or "")
    if kind == "memory":
        dropped = raw.get("dropped")
        return Memory(
            _name(raw, "service", required=True) or "",
            _number(raw, "available_kib"),
            _number(raw, "need_kib"),
            dropped if isinstance(dropped, str) and dropped.isprintable() else None,
        )
    return None


def taken_snapshot(raw: Any) -> str | None:
    """The snapshot id a `snapshot` event names (None: not such an event, or no valid id).

    A converge announces its snapshot before it changes anything; when its result never comes
    (the connection dropped, the controller's deadline passed) this is the snapshot to roll
    back to."""
    found = event(raw)
    if isinstance(found, SnapshotTaken) and _SNAPSHOT_ID.fullmatch(found.id):
        return found.id
    return None
