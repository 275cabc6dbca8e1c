"""Causes: which drift entries one change explains, so a report can lead with the change.

Pure and stdlib only (it runs on every repeated drift): entries in, cause ids out.

On a freshly rendered box, one `.env` key the desired state pins and the box lacks is one
`envfile` entry and again one `env` entry for every container that reads `.env`: one change
(rewrite `.env`, recreate its readers) explains them all. Every entry gets a `cause` id, named
after what fixes it, never after a value (ids are stable across runs and carry no secret):

    envfile:<KEY>          a managed `.env` key (or `envfile:mode`, `envfile:(file)`)
    compose-file:<FILE>    a compose file edited on the box
    shell:<VAR>            the login shell exports a variable compose reads
    image:<SERVICE>        a container runs another image
    argv:<SERVICE>         a container runs another command (no managed key explains it)
    env:<VAR>              containers carry another value of VAR (no managed key explains it)
    port:<SERVICE>, state:<SERVICE>, auth:gateway, contract:<PATH>, host:<PATH>
    <kind>:<subject>:<path> any other entry, of a kind this module does not know: its own cause

An entry is a *symptom* of another entry of the same box when that one provably explains it:

- a container's `env` VAR: the login shell's export of VAR when the container carries the
  shell's value (equal digests or values), else the `.env` entry of VAR;
- an `image`: its service's dead image knob, when a compose file renders another image than
  the desired one (a pull and recreate would bring that one back); else as an `argv` flag:
- an `argv` flag or an `image`: the `.env` entry whose (desired, observed) pair is the same,
  of a key that lane reads (its role's `<PREFIX>_` knobs; its role's image variable);
- a `compose-file` dead knob, or a desired service the render lacks: the compose file its
  source names, when that file is edited;
- a `contract` window: the entry whose pair is the same, or reversed (the gateway advertises
  its start-time window while the lane serves the new one), of the role's own lane or `.env`
  keys (`capabilities.embedder.context`: lane vllm-embed, keys `EMBED_*`); the gateway's
  version: `.env` MODEL_GEAR_VERSION;
- `auth`: the gateway's drifted key variable, else the `.env` or login-shell entry of it.

A match on values alone must be unambiguous (one explaining cause), else the entry stays its
own cause: a report must never attribute a symptom it cannot prove. Windows (8192, 131072)
and image references recur across lanes, so a value matches only among the entries of the
lane or keys the entry is about; which lane serves a role and which keys it reads are lobes'
fixed tables (desired/roles.py): a lane under another service name than lobes' own is linked
to nothing by value. The same cause on several boxes is one Cause listing the boxes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from reconciler.compare.drift import BoxResult, Drift, Kind, SecretValue
from reconciler.desired import roles
from reconciler.records import record_class

__all__ = ["Cause", "Link", "group_causes", "link_box", "own_cause"]

# The variable that arms the gateway's key: what an auth posture follows from.
AUTH_VARIABLES = ("GATEWAY_API_KEY",)
# Kinds whose id names the service: one change (pull, recreate) fixes every entry of the kind.
_PER_SERVICE = {Kind.IMAGE: "image", Kind.ARGV: "argv", Kind.PORT: "port", Kind.STATE: "state"}
# The order causes are listed in: about the order a converge fixes them (.env and files first,
# the gateway last); a kind not listed here comes after these.
_FIX_ORDER = (
    Kind.ENVFILE,
    Kind.COMPOSE_FILE,
    Kind.SHELL_LEAK,
    Kind.IMAGE,
    Kind.ARGV,
    Kind.ENV,
    Kind.PORT,
    Kind.STATE,
    Kind.HOST,
    Kind.CONTRACT,
    Kind.AUTH,
)
_KIND_RANK = {kind: rank for rank, kind in enumerate(_FIX_ORDER)}
_TOKEN = re.compile(r"[A-Za-z0-9]+")
# The kinds whose (desired, observed) pair can explain another entry (_Index._by_value).
_EXPLAIN_BY_VALUE = (Kind.ENVFILE, Kind.ARGV, Kind.COMPOSE_FILE)
# The role lobes runs each of its services for: a lane entry's role (the `.env` keys it reads).
_ROLE_OF_SERVICE = {service: role for role, service in roles.SERVICE.items()}
# The `.env` key the running gateway's /health version follows (it is built from it).
_VERSION_KEYS = frozenset({"MODEL_GEAR_VERSION"})
# The path of a dead image knob's `compose-file` entry (compare/composefiles.py makes them).
IMAGE_KNOB = "image"


@record_class()
class Link:
    """One entry's place: the cause that explains it, and whether it is that change itself."""

    cause: str
    symptom: bool  # False: the entry is the change (or part of it); True: it follows from it


@record_class()
class Cause:
    """One cause across the fleet: the entries that are the change, then those it explains."""

    id: str
    boxes: tuple[str, ...]  # in report order
    changes: tuple[Drift, ...]
    symptoms: tuple[Drift, ...]

    @property
    def entries(self) -> int:
        return len(self.changes) + len(self.symptoms)


def own_cause(drift: Drift) -> str:
    """The id of what fixes this entry when no other entry explains it."""
    kind = drift.kind
    if kind is Kind.ENVFILE:
        return f"envfile:{drift.path}"
    if kind is Kind.COMPOSE_FILE and drift.subject.startswith("file:"):
        return f"compose-file:{drift.subject.removeprefix('file:')}"
    if kind is Kind.SHELL_LEAK:
        return f"shell:{drift.path}"
    if kind is Kind.ENV:
        return f"env:{drift.path}"
    if kind in _PER_SERVICE:
        return f"{_PER_SERVICE[kind]}:{_service(drift.subject)}"
    if kind is Kind.AUTH:
        return f"auth:{drift.subject}"
    if kind in (Kind.CONTRACT, Kind.HOST) and drift.subject in ("gateway", "host"):
        return f"{kind.value}:{drift.path}"
    return f"{kind.value}:{drift.subject}:{drift.path}"


def link_box(drifts: Sequence[Drift]) -> list[Link]:
    """One box's entries -> their links, in the same order."""
    parents = _Index(drifts).parents()
    causes: dict[int, str] = {}  # root entry -> its id: the symptoms of one change share it
    links = []
    for i in range(len(drifts)):
        root, steps = i, 0
        parent = parents[root]
        while parent is not None and steps < len(drifts):  # a chain, never a cycle
            root, steps, parent = parent, steps + 1, parents[parent]
        cause = causes.get(root)
        if cause is None:
            cause = causes[root] = own_cause(drifts[root])
        links.append(Link(cause, root != i))
    return links


def group_causes(boxes: Iterable[BoxResult]) -> tuple[Cause, ...]:
    """Every box's entries grouped by cause, in fix order (the kind of the change, then id);
    within a cause, entries keep the boxes' order and each box's drift order."""
    order: list[str] = []
    found: dict[str, tuple[list[str], list[Drift], list[Drift]]] = {}
    for box in boxes:
        for drift, link in zip(box.drifts, link_box(box.drifts), strict=True):
            if link.cause not in found:
                order.append(link.cause)
                found[link.cause] = ([], [], [])
            names, changes, symptoms = found[link.cause]
            if not names or names[-1] != box.box:
                names.append(box.box)
            (symptoms if link.symptom else changes).append(drift)
    causes = [
        Cause(cid, tuple(names), tuple(changes), tuple(symptoms))
        for cid, (names, changes, symptoms) in ((c, found[c]) for c in order)
    ]
    return tuple(sorted(causes, key=_fix_order))


def _fix_order(cause: Cause) -> tuple[int, str]:
    first = cause.changes[0] if cause.changes else cause.symptoms[0]
    return (_KIND_RANK.get(first.kind, len(_KIND_RANK)), cause.id)


def _service(subject: str) -> str:
    return subject.split(":", 1)[1] if ":" in subject else subject


class _Index:
    """One box's entries, indexed by what can explain another entry."""

    def __init__(self, drifts: Sequence[Drift]) -> None:
        self.drifts = drifts
        self.envfile: dict[str, int] = {}
        self.shell: dict[str, int] = {}
        self.files: dict[str, int] = {}
        self.gateway_env: dict[str, int] = {}
        self.image_knobs: dict[str, int] = {}  # service subject -> its dead image knob
        self.pairs: dict[tuple[str, str], list[int]] = {}  # (desired, observed) -> entries
        for i, d in enumerate(drifts):
            if d.kind is Kind.ENVFILE and d.subject == "file:.env":
                self.envfile.setdefault(d.path, i)
            elif d.kind is Kind.SHELL_LEAK:
                self.shell.setdefault(d.path, i)
            elif d.kind is Kind.COMPOSE_FILE and d.subject.startswith("file:"):
                self.files.setdefault(d.subject.removeprefix("file:"), i)
            elif d.kind is Kind.COMPOSE_FILE and d.path == IMAGE_KNOB:
                self.image_knobs.setdefault(d.subject, i)
            elif d.kind is Kind.ENV and d.subject == "gateway":
                self.gateway_env.setdefault(d.path, i)
            if d.kind in _EXPLAIN_BY_VALUE:
                pair = _pair(d)
                if pair is not None:
                    self.pairs.setdefault(pair, []).append(i)

    def parents(self) -> list[int | None]:
        return [self._parent(i, d) for i, d in enumerate(self.drifts)]

    def _parent(self, i: int, d: Drift) -> int | None:
        kind = d.kind
        if kind is Kind.ENV:
            shell = self.shell.get(d.path)
            if shell is not None and _carries(d, self.drifts[shell]):
                return shell
            return self.envfile.get(d.path)
        if kind is Kind.IMAGE and d.subject in self.image_knobs:
            # Whatever the container runs, a recreate runs the image the files render: the
            # files are put back first (plan.py), then the pull and recreate converge.
            return self.image_knobs[d.subject]
        if kind in (Kind.ARGV, Kind.IMAGE):
            return self._by_value(i, d, reverse=False, kinds=(Kind.ENVFILE,))
        if kind is Kind.COMPOSE_FILE and not d.subject.startswith("file:"):
            names = re.split(r", | / ", d.source or "")
            return next((self.files[n] for n in names if n in self.files), None)
        if kind is Kind.CONTRACT:
            kinds = (Kind.ENVFILE, Kind.ARGV, Kind.COMPOSE_FILE)
            found = self._by_value(i, d, reverse=False, kinds=kinds)
            return found if found is not None else self._by_value(i, d, True, kinds)
        if kind is Kind.AUTH:
            for variable in AUTH_VARIABLES:
                for table in (self.gateway_env, self.envfile, self.shell):
                    if variable in table:
                        return table[variable]
        return None

    def _by_value(self, i: int, d: Drift, reverse: bool, kinds: tuple[Kind, ...]) -> int | None:
        """The entry with the same (desired, observed) pair (or reversed), among those this
        entry is about (_scope), of the first of `kinds` that has one; several of that kind:
        the one that shares the most name tokens with this entry, if that is one (else none:
        a tie proves nothing)."""
        pair = _pair(d)
        if pair is None:
            return None
        key = (pair[1], pair[0]) if reverse else pair
        matches = [j for j in self.pairs.get(key, ()) if j != i]
        if not matches:  # the common case: no scope to work out
            return None
        lane, prefix, keys = _scope(d)
        matches = [j for j in matches if _in_scope(self.drifts[j], lane, prefix, keys)]
        for kind in kinds:
            candidates = [j for j in matches if self.drifts[j].kind is kind]
            if len(candidates) == 1:
                return candidates[0]
            if candidates:
                mine = _tokens(d)
                scored = sorted(
                    ((len(mine & _tokens(self.drifts[j])), j) for j in candidates), reverse=True
                )
                return scored[0][1] if scored[0][0] > scored[1][0] else None
        return None


def _scope(d: Drift) -> tuple[str | None, str | None, frozenset[str]]:
    """What an entry explained by value can follow from: (the subject of the lane it is
    about, the prefix of the `.env` keys that lane reads, other `.env` keys it follows)."""
    subject = d.subject
    if d.kind is Kind.IMAGE:
        if subject == "gateway":
            return None, None, frozenset({roles.GATEWAY_IMAGE_VARIABLE})
        variable = roles.IMAGE_VARIABLE.get(_ROLE_OF_SERVICE.get(_service(subject), ""))
        return None, None, frozenset({variable} if variable else ())
    if d.kind is Kind.CONTRACT and subject == "gateway":
        parts = d.path.split(".")
        if len(parts) >= 3 and parts[0] == "capabilities":
            role = parts[1]
            service = roles.SERVICE.get(role)
            return (f"lane:{service}" if service else None), _prefix(role), frozenset()
        if d.path == "health.version":
            return None, None, _VERSION_KEYS
        return None, None, frozenset()
    if subject.startswith("lane:"):  # an argv flag, a lane's own window
        return subject, _prefix(_ROLE_OF_SERVICE.get(_service(subject), "")), frozenset()
    return None, None, frozenset()


def _prefix(role: str) -> str | None:
    prefix = roles.ENV_PREFIX.get(role)
    return f"{prefix}_" if prefix else None


def _in_scope(e: Drift, lane: str | None, prefix: str | None, keys: frozenset[str]) -> bool:
    if e.kind is Kind.ENVFILE:
        return e.path in keys or (prefix is not None and e.path.startswith(prefix))
    return lane is not None and e.subject == lane


def _carries(env: Drift, shell: Drift) -> bool:
    """The container carries the shell's value (not absent, not empty)."""
    carried = _norm(env.observed)
    return carried not in (None, "") and carried == _norm(shell.observed)


def _pair(d: Drift) -> tuple[str, str] | None:
    """(desired, observed) as comparable text; None when either side is absent, a flag's bare
    presence, a list, or both sides are one character ("0" -> "1" proves no relation)."""
    a, b = _norm(d.desired), _norm(d.observed)
    if a is None or b is None or (len(a) < 2 and len(b) < 2):
        return None
    return a, b


def _norm(value: object) -> str | None:
    if type(value) is str:  # most values: answered before the isinstance checks below
        return value
    if isinstance(value, SecretValue):
        return "secret:" + value.digest
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str | int | float):
        return str(value)
    return None


def _tokens(d: Drift) -> set[str]:
    return {t.lower() for t in _TOKEN.findall(f"{d.subject} {d.path}")} - {"lane", "file", "env"}
