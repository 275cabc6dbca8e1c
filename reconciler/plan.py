"""The converge plan: a box's drifts -> ordered steps. Pure: no I/O, no pyinfra.

The drift engine decides what differs and which action each difference calls for; this module
only orders those actions into what a converge does, one box at a time:

    write-env -> restore-files -> pull -> recreate lanes (one at a time) -> remove -> gateway

A drift whose action is report-only (a login-shell export, a person's decision) is carried in
`Plan.report_only` and never becomes a step. Faults that make the desired state unknowable (a
missing secret source, an unreadable deployment) block the plan instead of being guessed at, and
so does a drift a converge must fix that no step can (a service the desired state does not know):
no actionable drift is ever dropped from a plan. An observed service name the box's converge
program refuses blocks it too (the only I/O: that program's rule, read from its file once).
Mesh order (`mesh_order`) is pure too: it puts a box that hosts a role before the boxes that
proxy that role.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from reconciler.compare.context import GATEWAY, BoxExpectation
from reconciler.compare.drift import Action, BoxError, BoxResult, Drift, Kind, Part


class StepKind(StrEnum):
    WRITE_ENV = "write-env"
    RESTORE_FILES = "restore-files"
    PULL = "pull"
    RECREATE_LANE = "recreate-lane"
    REMOVE = "remove"
    RECREATE_GATEWAY = "recreate-gateway"


# Actions a converge never takes on its own. DROP_CACHES is not a step: the memory gate runs
# before every lane boot anyway, and only when MemAvailable is short.
PASSIVE = frozenset({Action.SCRUB_SHELL, Action.REPORT, Action.DROP_CACHES})

# Parts of a box whose fault still allows a converge: the converge itself fixes them (a
# gateway that does not answer is recreated) or they only weaken a report (the login-shell
# probe, the list of interpolated variables, compose's config hashes: a pending recreate is
# report-only, and no converge reads or changes it).
TOLERATED = frozenset({Part.GATEWAY_PROBE, Part.LOGIN_SHELL, Part.VARIABLES, Part.CONFIG_HASH})


@dataclass(frozen=True)
class FileRestore:
    """A compose file to put back: by its pinned digest, or (None) its last known-good copy."""

    name: str
    sha256: str | None


@dataclass(frozen=True)
class Step:
    kind: StepKind
    subject: str  # ".env", "files", an image reference, a compose service
    reasons: tuple[str, ...] = ()  # drift paths that call for it (names, never values)
    keys: tuple[str, ...] = ()  # write-env: the managed keys to write
    files: tuple[FileRestore, ...] = ()  # restore-files
    timeout_s: int = 0  # lanes and gateway: how long to wait for health
    gpu_memory_utilization: float = 0.0  # lanes: the memory gate's share of MemTotal

    def title(self) -> str:
        """One line for operators and pyinfra operation names: names only, never values."""
        if self.kind is StepKind.WRITE_ENV:
            shown = ", ".join(self.keys[:6]) + (", …" if len(self.keys) > 6 else "")
            return f"write .env ({len(self.keys)} keys: {shown})" if self.keys else "write .env"
        if self.kind is StepKind.RESTORE_FILES:
            return "restore " + ", ".join(f.name for f in self.files)
        if self.kind is StepKind.PULL:
            return f"pull {self.subject}"
        if self.kind is StepKind.RECREATE_LANE:
            return f"recreate {self.subject}"
        if self.kind is StepKind.REMOVE:
            return f"remove {self.subject}"
        return "recreate gateway"


@dataclass(frozen=True)
class Plan:
    box: str
    steps: tuple[Step, ...] = ()
    report_only: tuple[Drift, ...] = ()
    blocked: tuple[BoxError, ...] = ()  # why this box cannot be converged now

    @property
    def empty(self) -> bool:
        return not self.steps

    @property
    def services(self) -> tuple[str, ...]:
        """Compose services the converge recreates, in order (the snapshot inspects these)."""
        kinds = (StepKind.RECREATE_LANE, StepKind.RECREATE_GATEWAY)
        return tuple(s.subject for s in self.steps if s.kind in kinds)

    def summary(self) -> str:
        if self.blocked:
            return "blocked: " + "; ".join(self.blocked)
        if self.empty:
            return "no changes"
        return "; ".join(s.title() for s in self.steps)


@dataclass
class _Acc:
    env_keys: list[str] = field(default_factory=list)
    files: dict[str, FileRestore] = field(default_factory=dict)
    pulls: dict[str, list[str]] = field(default_factory=dict)  # image -> services
    lanes: dict[str, list[str]] = field(default_factory=dict)  # service -> reasons
    removes: dict[str, list[str]] = field(default_factory=dict)
    gateway: list[str] = field(default_factory=list)
    passive: list[Drift] = field(default_factory=list)
    write_env: bool = False  # `.env` is written even with no key listed (its mode)
    orphans: list[Drift] = field(default_factory=list)  # for a service nothing recreates
    # Dead knobs with no file to put back: every file of the chain is pinned and as pinned.
    unrestorable: list[Drift] = field(default_factory=list)


def plan_box(result: BoxResult, exp: BoxExpectation) -> Plan:
    """Order the actions `result`'s drifts call for into converge steps."""
    blocked = _blocking(result) or _refused_names(result, exp)
    if blocked:
        return Plan(result.box, blocked=blocked)
    acc = _Acc()
    for drift in result.drifts:
        _collect(acc, drift, exp)
    for error in result.errors:
        if error.part is Part.GATEWAY_PROBE:
            acc.gateway.append(error.where)
    unplanned = _unplanned(acc)
    if unplanned:
        return Plan(result.box, blocked=unplanned)
    return Plan(result.box, tuple(_steps(acc, exp)), tuple(acc.passive))


def _unplanned(acc: _Acc) -> tuple[BoxError, ...]:
    """Drifts a converge must fix that no step fixes: they block the plan, never vanish from
    it. A converge could not verify (they would still be there) and would be rolled back; the
    box is better left untouched, with the reason said. A stray container's port drift is
    fixed by the stray's removal."""
    why = "no converge step can {} a service the desired state does not know"
    orphans = tuple(
        BoxError(Part.DEPLOYMENT, f"{d.subject} {d.path}", why.format(d.action.value))
        for d in acc.orphans
        if d.subject.removeprefix("lane:") not in acc.removes
    )
    # Recreating from the same files renders the same value again: a person decides whether
    # the pinned files or the knob are wrong.
    pinned = (
        "every compose file is as the desired state pins it, and they render another value "
        "than .env asks for: no file to restore (fix the pinned files or the knob)"
    )
    return orphans + tuple(
        BoxError(Part.DEPLOYMENT, f"{d.subject} {d.path}", pinned) for d in acc.unrestorable
    )


def _blocking(result: BoxResult) -> tuple[BoxError, ...]:
    if not result.reachable:
        return tuple(result.errors) or (BoxError(Part.OBSERVATION, "not observed"),)
    return tuple(e for e in result.errors if e.part not in TOLERATED)


def _refused_names(result: BoxResult, exp: BoxExpectation) -> tuple[BoxError, ...]:
    """Observed services the box's converge program refuses to be told about. Every container
    of the compose project goes into the plan's fingerprint (apply/payload.py `fingerprint`),
    and the box refuses the whole payload over one name it does not accept (converge.py
    SERVICE: a leading `-`, an overlong name): promised here, every converge failed there.
    Each container of a service the desired state does not know is a drift of its own
    (compare/containers.py: a stray or a `run` one-off), so its name is among the subjects."""
    found: dict[str, list[str]] = {}  # service -> its containers, for the hint
    for d in result.drifts:
        service = d.subject.removeprefix("lane:")
        if d.subject.startswith("lane:") and service not in exp.lanes:
            containers = found.setdefault(service, [])
            if d.source and d.source not in containers:
                containers.append(d.source)
    if not found:
        return ()
    # The box program's own rule, loaded on demand (payload.py imports this module); the
    # desired state's lane names are narrower than it and never checked here.
    from reconciler.apply.payload import box_rules

    rule = box_rules().SERVICE
    why = (
        "a service name the box's converge refuses (compose's rule, but not starting with `-`, "
        "at most 128 characters), and every container of the project is in a plan: remove "
        "its containers by hand"
    )
    return tuple(
        BoxError(Part.DEPLOYMENT, f"service {_shown(name)}", why + _containers(names))
        for name, names in found.items()
        if not rule.match(name)
    )


def _shown(name: str) -> str:
    return repr(name) if len(name) <= 80 else repr(name[:60]) + f"… ({len(name)} characters)"


def _containers(names: list[str]) -> str:
    return f" (docker rm -f {' '.join(names)})" if names else ""


def _add(bucket: dict[str, list[str]], key: str, reason: str) -> None:
    reasons = bucket.setdefault(key, [])
    if reason not in reasons:
        reasons.append(reason)


def _collect(acc: _Acc, drift: Drift, exp: BoxExpectation) -> None:
    service = drift.subject.removeprefix("lane:")
    action = drift.action
    if action in PASSIVE:
        acc.passive.append(drift)
    elif action is Action.REWRITE_ENV:
        _rewrite_env(acc, drift, exp)
    elif action is Action.RESTORE_FILE:
        _restore(acc, drift, exp)
    elif action is Action.RECREATE_GATEWAY or (service == GATEWAY and action in _RECREATES):
        # The gateway's container in state `created` (never started) comes as START: for the
        # gateway every (re)start is its recreate, last, with the auth and contract checks.
        if drift.kind is Kind.IMAGE:
            _add(acc.pulls, exp.gateway_image, GATEWAY)
        acc.gateway.append(drift.path)
    elif action is Action.REMOVE:
        _add(acc.removes, service, drift.path)
    elif action in _RECREATES:
        if service not in exp.lanes:
            acc.orphans.append(drift)  # nothing to recreate it from: see _unplanned
            return
        if action is Action.PULL_RECREATE:
            _add(acc.pulls, exp.lanes[service].image, service)
        _add(acc.lanes, service, drift.path)


_RECREATES = (Action.RECREATE, Action.PULL_RECREATE, Action.START)


def _rewrite_env(acc: _Acc, drift: Drift, exp: BoxExpectation) -> None:
    # A missing file is written with every managed key; `mode` (0644 where 0600 is desired) by
    # the write alone, which the box always does at 0600; otherwise the key names are listed.
    acc.write_env = True
    if drift.path == "(file)":
        acc.env_keys.extend(e.key for e in exp.env if e.key not in acc.env_keys)
    elif drift.path != "mode" and drift.path not in acc.env_keys:
        acc.env_keys.append(drift.path)


def _restore(acc: _Acc, drift: Drift, exp: BoxExpectation) -> None:
    pinned = exp.file_digests
    if drift.subject.startswith("file:"):
        name = drift.subject.removeprefix("file:")
        acc.files[name] = FileRestore(name, pinned.get(name))
        return
    # A dead knob: the compose chain renders another value than `.env` asks for. The files
    # named in `source` (pinned ones whose digest changed) or, failing that, every unpinned
    # file of the chain go back to a copy that rendered the knob (pinned digest / known-good),
    # and the lane is recreated from them.
    # compare/composefiles.py names the changed pinned files "a, b", or the chain "a / b / c".
    source = drift.source or ""
    chain = exp.compose_files
    named = [] if " / " in source else [n.strip() for n in source.split(",") if n.strip() in pinned]
    files = named or [n for n in chain if n not in pinned]
    if not files:
        acc.unrestorable.append(drift)  # a recreate would render the same value again
        return
    for name in files:
        acc.files.setdefault(name, FileRestore(name, pinned.get(name)))
    service = drift.subject.removeprefix("lane:")
    if service in exp.lanes:
        _add(acc.lanes, service, f"{drift.path} (restored files)")
    elif service == GATEWAY:
        acc.gateway.append(f"{drift.path} (restored files)")


def _steps(acc: _Acc, exp: BoxExpectation) -> Iterable[Step]:
    if acc.write_env:
        yield Step(StepKind.WRITE_ENV, ".env", keys=tuple(acc.env_keys))
    if acc.files:
        files = tuple(acc.files[n] for n in sorted(acc.files))
        yield Step(StepKind.RESTORE_FILES, "files", files=files)
    for image, services in acc.pulls.items():
        yield Step(StepKind.PULL, image, reasons=tuple(services))
    # Lanes in the desired state's order (the order operators wrote them, e.g. embed and rerank
    # before the worker that depends on them), one at a time.
    for service, lane in exp.lanes.items():
        if service in acc.lanes:
            yield Step(
                StepKind.RECREATE_LANE,
                service,
                reasons=tuple(acc.lanes[service]),
                timeout_s=lane.boot_timeout_s,
                gpu_memory_utilization=lane.gpu_memory_utilization,
            )
    for service, reasons in sorted(acc.removes.items()):
        yield Step(StepKind.REMOVE, service, reasons=tuple(reasons))
    if acc.gateway:
        yield Step(
            StepKind.RECREATE_GATEWAY,
            GATEWAY,
            reasons=tuple(dict.fromkeys(acc.gateway)),
            timeout_s=exp.gateway.health_timeout_s,
        )


def actionable(drifts: Iterable[Drift]) -> tuple[Drift, ...]:
    """Drifts a converge acts on: what must be gone after a verified converge."""
    return tuple(d for d in drifts if d.action not in PASSIVE)


def mesh_order(hosts: Mapping[str, Iterable[str]], boxes: Iterable[str]) -> list[str]:
    """Boxes ordered so that the box hosting a role comes before the boxes proxying it.

    `hosts[box]` are the boxes `box` proxies a role to. A mesh where every member proxies
    another (thor -> spark -> orin -> thor) has no such order; the cycle is broken at the box
    the most others depend on, then by the given order, so the result is always complete and
    stable.
    """
    order = list(boxes)
    needs = {b: {h for h in hosts.get(b, ()) if h in order and h != b} for b in order}
    done: list[str] = []
    while len(done) < len(order):
        left = [b for b in order if b not in done]
        ready = [b for b in left if needs[b] <= set(done)]
        if not ready:
            ready = [max(left, key=lambda b: sum(b in needs[o] for o in left))]
        done.append(ready[0])
    return done
