"""What changed between two runs (or two saved snapshots): drift entries that appeared,
cleared or now read differently, audit findings that appeared or cleared, and every observed
value that changed, drift or not (a container recreated, another image, a gateway restarted,
a new login-shell export). Pure; deepdiff is imported when observations are compared.

Nothing secret can be printed: entries hold secrets as `***` (record.py), and observations are
compared in their `comparable` form (observed.py), every digest masked before deepdiff sees it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reconciler.history.observed import comparable
from reconciler.history.record import MESH, EntryRow, FindingRow

VALUE_CHARS = 80  # a changed value longer than this is cut in the text
FULL = "full"  # a box's observation: full | partial | none (record.BoxRow.observation)
ABSENT = "absent"  # a box the run did not cover (`drift thor` leaves spark and orin out)


@dataclass(frozen=True)
class Side:
    """One run (or snapshot) as the diff reads it. `boxes`: each covered box's observation
    (full | partial | none), as the store's boxes table keeps it; None when not known (every
    box with entries or observations is then taken as observed in full)."""

    label: str
    entries: Sequence[EntryRow] = ()
    findings: Sequence[FindingRow] = ()
    observations: Mapping[str, Any] = field(default_factory=dict)  # box -> snapshot box file
    boxes: Mapping[str, str] | None = None
    name: str = ""  # how a line names this side ("run 4"); the label by default
    # Per box, the parts of its faults (history/parts.py: parts.known, NOT_RECORDED for a fault
    # of an older run whose text names none). A box not here had none.
    faults: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)
    # Per box with a gateway-probe fault, whose probes those are (parts.probe_sides: LOOPBACK,
    # CONTROLLER); None or absent: not known, every probe's entries left not compared.
    probes: Mapping[str, frozenset[str] | None] = field(default_factory=dict)

    def observation(self, box: str) -> str:
        if self.boxes is None:
            return FULL
        return self.boxes.get(box, ABSENT)

    def unseen(self, box: str) -> frozenset[str]:
        """The box's columns (parts.LANES, GATEWAY, BOX_WIDE) this side did not observe."""
        from reconciler.history.parts import unseen_columns

        return unseen_columns(self.faults.get(box, ()))


@dataclass(frozen=True)
class Unseen:
    """A box not observed in full in both runs: its entries, findings and observed values are
    not compared (an unreachable box's entries are not "cleared"). `changed`: it was covered
    by both runs, and observed otherwise (reachable, then not).

    Or the mesh (box MESH), when a member was not observed in full by both: its findings
    are not compared (`_mesh_unseen`), and its own line never counts as a change.

    Or, with `columns`, a box observed in both whose faults (dockerd down, a gateway probe
    unanswered) left those columns not observed in one of them: only its entries there are
    not compared (`changed`: the columns left differ between the runs)."""

    box: str
    a: str  # its observation in the first run (full | partial | none | absent)
    b: str
    reason: str  # "thor: not observed in run 5: not compared"
    columns: tuple[str, ...] = ()  # parts.LANES, GATEWAY, BOX_WIDE; () = the whole box
    faults_changed: bool = False

    @property
    def changed(self) -> bool:
        if self.box == MESH:  # its members' own lines say whether they changed
            return False
        return (self.a != self.b and ABSENT not in (self.a, self.b)) or self.faults_changed


@dataclass(frozen=True)
class Change:
    """One observed value: `old`/`new` are None where it was absent (`added`/`removed`)."""

    box: str
    path: str
    change: str  # changed | added | removed
    old: Any = None
    new: Any = None


@dataclass(frozen=True)
class EntryChange:
    before: EntryRow
    after: EntryRow

    @property
    def differs(self) -> tuple[str, ...]:
        """What reads otherwise: desired, observed, changed (a secret's)."""
        return _differs(self.before, self.after)


# What an entry that still drifts can read otherwise in another run: the desired value (the
# desired state was edited), the observed one, or a secret's `changed`. Each stored as the run
# wrote it: JSON text (sorted keys), a secret's value `***` (record.py).
_READS = ("desired", "observed", "changed")


def _differs(before: EntryRow, after: EntryRow) -> tuple[str, ...]:
    """Which of `_READS` differ between the two runs' readings of one entry."""
    return tuple(f for f in _READS if getattr(before, f) != getattr(after, f))


@dataclass(frozen=True)
class RunDiff:
    a: str
    b: str
    appeared: tuple[EntryRow, ...]
    cleared: tuple[EntryRow, ...]
    reworded: tuple[EntryChange, ...]  # the same entry, desired or observed otherwise
    findings_appeared: tuple[FindingRow, ...]
    findings_cleared: tuple[FindingRow, ...]
    changes: tuple[Change, ...]
    events: tuple[str, ...]  # what the changes mean, one line each ("thor: gateway recreated")
    not_compared: tuple[Unseen, ...] = ()
    # What was compared only as recorded: a box of a run recorded before the fault parts were
    # kept, one of whose faults names no part ("thor: run 1 recorded before ...").
    notes: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(
            self.appeared
            or self.cleared
            or self.reworded
            or self.findings_appeared
            or self.findings_cleared
            or self.changes
            or any(u.changed for u in self.not_compared)
        )


def diff_sides(a: Side, b: Side) -> RunDiff:
    from reconciler.history.parts import GATEWAY, column, probe_of

    unseen = _unseen(a, b)
    skipped = {u.box for u in unseen if not u.columns}
    mesh = _mesh_unseen(a, b, skipped)
    if mesh is not None:  # the mesh's findings are judged over every member: not compared
        unseen += (mesh,)
        skipped.add(MESH)
    # A box seen in both whose faults left columns not observed: its entries there neither
    # appeared nor cleared (dockerd down is no lane in sync); its findings and observed
    # values are still compared (the observation says the engine did not answer).
    hidden = {(u.box, col) for u in unseen for col in u.columns}
    # What a probe saw itself stays compared when only the other probe faulted (an auth entry
    # names its probe): a loopback probe timing out says nothing of the controller's answer.
    kept = {u.box: kept_probes(u.box, a, b) for u in unseen if GATEWAY in u.columns}
    # A box compose gave no config hashes in either run: its pending recreates (their own
    # entries) were not judged there, so they neither appeared nor cleared; the rest was.
    unhashed = _unhashed(a, b, skipped)  # box -> those runs, for the notes too
    from reconciler.compare.containers import PENDING_RECREATE

    def compared(e: EntryRow) -> bool:
        if e.box in skipped:
            return False
        if e.box in unhashed and e.path == PENDING_RECREATE:
            return False
        col = column(e.subject)
        if (e.box, col) not in hidden:
            return True
        return col == GATEWAY and probe_of(e.path) in kept.get(e.box, ())

    before = {e.key: e for e in a.entries if compared(e)}
    after = {e.key: e for e in b.entries if compared(e)}
    reworded = tuple(
        EntryChange(before[k], after[k])
        for k in after
        if k in before and _differs(before[k], after[k])
    )
    f_appeared, f_cleared = _findings(
        [f for f in a.findings if f.box not in skipped],
        [f for f in b.findings if f.box not in skipped],
    )
    changes = tuple(
        _observation_changes(
            {k: v for k, v in a.observations.items() if k not in skipped},
            {k: v for k, v in b.observations.items() if k not in skipped},
        )
    )
    return RunDiff(
        a=a.label,
        b=b.label,
        appeared=tuple(e for k, e in after.items() if k not in before),
        cleared=tuple(e for k, e in before.items() if k not in after),
        reworded=reworded,
        findings_appeared=f_appeared,
        findings_cleared=f_cleared,
        changes=changes,
        events=tuple(_events(changes)),
        not_compared=unseen,
        notes=_notes(a, b, skipped, unhashed),
    )


def _unseen(a: Side, b: Side) -> tuple[Unseen, ...]:
    """The boxes not observed in full by both runs, in the runs' order."""
    out: list[Unseen] = []
    for box in _covered(a, b):
        seen = (a.observation(box), b.observation(box))
        if seen != (FULL, FULL):
            words = [
                f"{_OBSERVED.get(state, 'observed as ' + state)} in {side.name or side.label}"
                for state, side in zip(seen, (a, b), strict=True)
                if state != FULL
            ]
            out.append(Unseen(box, *seen, f"{box}: {', '.join(words)}: not compared"))
            continue
        part = _partly(box, a, b)
        if part is not None:
            out.append(part)
    return tuple(out)


def _mesh_unseen(a: Side, b: Side, skipped: set[str]) -> Unseen | None:
    """The mesh, when a member was not observed in full by both runs (`skipped`) and either
    run has a finding of the mesh: those are judged over every member (mesh.weakest-link
    needs the open one seen), so one run's mesh findings say what it could see, and a
    difference is no change of the mesh. Its observation in a run: partial where a member
    was not observed in full (or not in the run)."""
    if not skipped or not any(f.box == MESH for side in (a, b) for f in side.findings):
        return None
    boxes = [box for box in _covered(a, b) if box in skipped]
    state = [
        FULL if all(side.observation(box) == FULL for box in boxes) else "partial"
        for side in (a, b)
    ]
    missed = ", ".join(boxes)
    reason = f"{MESH}: {missed} not observed in full in both runs: its findings not compared"
    return Unseen(MESH, state[0], state[1], reason)


def _covered(a: Side, b: Side) -> list[str]:
    """Every box either run covered, in the runs' order (not the mesh)."""
    boxes = [
        *(box for side in (a, b) for box in (side.boxes or {})),
        *(e.box for side in (a, b) for e in side.entries),
        *(box for side in (a, b) for box in side.observations),
    ]
    return [box for box in dict.fromkeys(boxes) if box != MESH]


def _partly(box: str, a: Side, b: Side) -> Unseen | None:
    """A box observed in both runs, with columns one of them did not observe, or None."""
    from reconciler.history.parts import GATEWAY, words

    columns = a.unseen(box) | b.unseen(box)
    if not columns:
        return None
    from reconciler.history.parts import NOT_RECORDED

    said = []
    for side in (a, b):
        if side.unseen(box):
            faults = side.faults.get(box)
            named = [f for f in faults or () if f != NOT_RECORDED]
            what = ", ".join(named) if named else "some part (not recorded which)"
            said.append(f"{what} not observed in {side.name or side.label}")
    reason = f"{box}: {'; '.join(said)}: its entries on {words(columns)} not compared"
    probes = sorted(kept_probes(box, a, b)) if GATEWAY in columns else []
    if probes:
        reason += f" (but those the {' and '.join(probes)} probe saw itself)"
    ordered = tuple(sorted(columns))
    changed = a.unseen(box) != b.unseen(box)
    return Unseen(box, FULL, FULL, reason, columns=ordered, faults_changed=changed)


def kept_probes(box: str, a: Side, b: Side) -> frozenset[str]:
    """The probes (parts.LOOPBACK, CONTROLLER) whose own entries on the box's gateway both runs
    observed: every probe but those a gateway-probe fault of either run was of, when no other
    fault of either left the gateway unseen and each run knows whose its probe faults were."""
    from reconciler.history.parts import (
        CONTROLLER,
        GATEWAY,
        GATEWAY_PROBE,
        LOOPBACK,
        unseen_columns,
    )

    kept = {LOOPBACK, CONTROLLER}
    for side in (a, b):
        faults = side.faults.get(box, ())
        if faults is None:
            return frozenset()
        if GATEWAY in unseen_columns([f for f in faults if f != GATEWAY_PROBE]):
            return frozenset()
        if GATEWAY_PROBE in faults:
            whose = side.probes.get(box)
            if whose is None:
                return frozenset()
            kept -= whose
    return frozenset(kept)


_OBSERVED = {"partial": "only partly observed", "none": "not observed", ABSENT: "not"}


def _unhashed(a: Side, b: Side, skipped: set[str]) -> dict[str, list[str]]:
    """Box -> the runs (names) in which compose gave it no config hashes (part config-hash),
    for each box compared."""
    from reconciler.history.parts import CONFIG_HASH

    out: dict[str, list[str]] = {}
    for side in (a, b):
        for box, faults in side.faults.items():
            if box not in skipped and CONFIG_HASH in (faults or ()):
                out.setdefault(box, []).append(side.name or side.label)
    return out


def _notes(
    a: Side, b: Side, skipped: set[str], unhashed: Mapping[str, list[str]]
) -> tuple[str, ...]:
    """Per box compared, each run of it recorded before the fault parts were kept with a
    fault whose text names no part: which of its entries that fault hid is not known, so
    they are compared as recorded (an old run's login-shell timeout must not hide a lane's
    new entry), and said. And each box whose pending recreates were not compared (`unhashed`:
    box -> the runs compose gave it no config hashes in)."""
    from reconciler.compare.containers import PENDING_RECREATE
    from reconciler.history.parts import NOT_RECORDED

    out = [
        f"{box}: compose gave no config hashes in {' and '.join(runs)}: its pending recreates "
        f"({PENDING_RECREATE} entries) not compared"
        for box, runs in unhashed.items()
    ]
    for side in (a, b):
        for box, faults in side.faults.items():
            if box not in skipped and NOT_RECORDED in (faults or ()):
                out.append(
                    f"{box}: {side.name or side.label} recorded before fault parts were kept, "
                    "and a fault of it names no part: its entries compared as recorded"
                )
    return tuple(out)


# A digest as a finding's message quotes it (`digest b66cc3…`, reports' 6 hex of a per-run
# digest) or as the collector sent it: another in every run, so masked before comparing.
_MESSAGE_DIGEST = re.compile(r"hmac:[0-9a-f]{64}|\b[0-9a-f]{6,12}…")


def _findings(
    a: Sequence[FindingRow], b: Sequence[FindingRow]
) -> tuple[tuple[FindingRow, ...], tuple[FindingRow, ...]]:
    """Findings that appeared and cleared, compared as multisets of (box, code, message with
    its digests masked): a box has one `publish.lane` finding per published lane, and one
    more or one fewer of them is a change."""

    def key(f: FindingRow) -> tuple[str, str, str]:
        return (f.box, f.code, _MESSAGE_DIGEST.sub("***", f.message))

    return _more(b, a, key), _more(a, b, key)


def _more(these: Sequence[FindingRow], than: Sequence[FindingRow], key: Any) -> tuple[Any, ...]:
    """The findings of `these` beyond as many alike as `than` holds (their order kept)."""
    left = Counter(key(f) for f in than)
    out = []
    for f in these:
        if left[key(f)] > 0:
            left[key(f)] -= 1
        else:
            out.append(f)
    return tuple(out)


def _observation_changes(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Change]:
    from deepdiff import DeepDiff

    out: list[Change] = []
    for box in [*a, *(x for x in b if x not in a)]:
        if box not in b:
            out.append(Change(box, "(observation)", "removed"))
            continue
        if box not in a:
            out.append(Change(box, "(observation)", "added"))
            continue
        before, after = comparable(a[box]), comparable(b[box])
        if before == after:  # most boxes: no deepdiff at all
            continue
        tree = DeepDiff(before, after, view="tree")
        for report, levels in tree.items():
            change = (
                "added" if "added" in report else "removed" if "removed" in report else "changed"
            )
            for level in levels:
                old = None if change == "added" else level.t1
                new = None if change == "removed" else level.t2
                out.append(Change(box, _path(level.path(output_format="list")), change, old, new))
    out.sort(key=lambda c: (c.box, c.path))
    return out


def _path(keys: list[Any]) -> str:
    parts: list[str] = []
    for i, key in enumerate(keys):
        if i == 0 and key == "collected":
            continue  # the collector's answer is what a path means by default
        if isinstance(key, int) or (i and keys[i - 1] in _NAMED):
            parts.append(f"[{key}]")
        else:
            parts.append(("." if parts else "") + str(key))
    return "".join(parts)


# Maps keyed by name in observed.py (and the collector's own name-keyed maps): printed as [name].
_NAMED = frozenset(
    {"containers", "images", "envfile", "lanes", "exports", "services", "environment", "env"}
)


def _events(changes: Sequence[Change]) -> list[str]:
    """The changes a person looks for first, said in words (the full list follows them)."""
    out: list[str] = []
    recreated = {
        (c.box, _container(c.path))
        for c in changes
        if _container(c.path) and c.path.endswith("].id") and c.change == "changed"
    }
    for c in changes:
        container = _container(c.path)
        if container and c.path.endswith("].id") and c.change == "changed":
            out.append(f"{c.box}: {container} recreated (container id {c.old} -> {c.new})")
        elif container and c.path.endswith("].image_ref") and c.change == "changed":
            out.append(f"{c.box}: {container} runs another image ({_short(c.new)})")
        elif container and c.path.endswith("].started_at") and c.change == "changed":
            if (c.box, container) not in recreated:  # a new container starts, of course
                out.append(f"{c.box}: {container} restarted at {c.new}")
        elif container and c.path == _CONTAINERS + container + "]" and c.change != "changed":
            out.append(f"{c.box}: container {container} {c.change}")
        elif c.path.startswith("login_shell.exports[") and c.path.endswith("]"):
            var = c.path[len("login_shell.exports[") : -1]
            verb = {"added": "now exports", "removed": "no longer exports"}.get(c.change)
            out.append(f"{c.box}: the login shell {verb or 'changed its export of'} {var}")
        elif c.path.startswith("envfile[") and c.path.endswith("]") and c.change != "changed":
            out.append(f"{c.box}: .env key {c.path[len('envfile[') : -1]} {c.change}")
        elif c.path in ("gateway.health.body.version", "controller.health.body.version"):
            out.append(f"{c.box}: the gateway reports version {c.new} (was {c.old})")
        elif c.path == "(observation)":
            out.append(
                f"{c.box}: observed only in the {'second' if c.change == 'added' else 'first'}"
            )
    return list(dict.fromkeys(out))


_CONTAINERS = "docker.containers["


def _container(path: str) -> str | None:
    if not path.startswith(_CONTAINERS):
        return None
    return path[len(_CONTAINERS) :].split("]", 1)[0]


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"


# -- rendering ---------------------------------------------------------------------------------


def clean(text: str) -> str:
    """A line for the terminal, as the reports print box text (report/values.py)."""
    from reconciler.report.values import clean as escaped

    return escaped(text)


def render_text(diff: RunDiff, limit: int = 40) -> str:
    """The diff for a person; `limit`: observed changes printed per box (the rest counted)."""
    lines = [f"diff: {diff.a} -> {diff.b}", ""]
    if diff.not_compared:
        lines.append("boxes not observed in full in both")  # or only some of their parts
        lines += [f"  {u.reason}" for u in diff.not_compared]
        lines.append("")
    if diff.notes:
        lines.append("compared as recorded")
        lines += [f"  {n}" for n in diff.notes]
        lines.append("")
    if diff.appeared or diff.cleared or diff.reworded:
        lines.append("drift entries")
        lines += [f"  + {_entry(e)}" for e in diff.appeared]
        lines += [f"  - {_entry(e)}" for e in diff.cleared]
        for ch in diff.reworded:
            was = f"was {_observed(ch.before)}"
            if "desired" in ch.differs:  # the desired state was edited: said first
                was = f"desired {_desired(ch.before, ch)} -> {_desired(ch.after, ch)}; {was}"
            lines.append(f"  ~ {_entry(ch.after)} ({was})")
        lines.append("")
    if diff.findings_appeared or diff.findings_cleared:
        lines.append("audit findings")
        lines += [
            f"  + {f.box}: {f.severity} {f.code}: {f.message}" for f in diff.findings_appeared
        ]
        lines += [f"  - {f.box}: {f.severity} {f.code}" for f in diff.findings_cleared]
        lines.append("")
    if diff.events:
        lines.append("what happened")
        lines += [f"  {e}" for e in diff.events]
        lines.append("")
    if diff.changes:
        lines.append("observed values that changed (drift or not)")
        boxes = list(dict.fromkeys(c.box for c in diff.changes))
        for box in boxes:
            mine = [c for c in diff.changes if c.box == box]
            lines.append(f"  {box}:")
            for c in mine[:limit]:
                if c.change == "changed":
                    lines.append(f"    {c.path}: {_short(c.old)} -> {_short(c.new)}")
                elif c.change == "added":
                    lines.append(f"    {c.path}: added {_short(c.new)}")
                else:
                    lines.append(f"    {c.path}: removed (was {_short(c.old)})")
            if len(mine) > limit:
                lines.append(f"    … and {len(mine) - limit} more (--format json lists every one)")
        lines.append("")
    lines.append(_summary(diff))
    # Every field above came from a box or a snapshot (names, paths, values, a run id read
    # from a snapshot's index): each line escaped as reports escape them, so an ESC sequence
    # cannot repaint the terminal nor a newline fake a line. The lines' own text is printable.
    return "\n".join(clean(line) for line in lines) + "\n"


def _entry(e: EntryRow) -> str:
    return f"{e.box} {e.kind} {e.subject} {e.path}: {_observed(e)} [cause {e.cause}]"


def _observed(e: EntryRow) -> str:
    if e.secret:  # changed: None when the run could not tell (drift.comparable)
        if e.changed is None:
            return "*** (not comparable)"
        return "*** (changed)" if e.changed else "*** (unchanged)"
    return f"desired {_short(json.loads(e.desired))}, observed {_short(json.loads(e.observed))}"


def _desired(e: EntryRow, change: EntryChange) -> str:
    """One run's desired value of a changed entry. A secret's is `***` (or null: not desired)
    as `_observed` shows a secret's values, whatever the store holds, and when either run
    kept the entry as a secret: the other run's value is then that secret's too."""
    value = json.loads(e.desired)
    if (change.before.secret or change.after.secret) and value is not None:
        return "***"
    return _short(value)


def _summary(diff: RunDiff) -> str:
    unseen_boxes = [u for u in diff.not_compared if u.box != MESH]  # the mesh is no box
    mesh = len(unseen_boxes) != len(diff.not_compared)
    whole = sum(1 for u in unseen_boxes if not u.columns)
    partly = len(unseen_boxes) - whole
    if not diff.changed:
        unseen = [f"{whole} boxes not compared"] if whole else []
        unseen += [f"{partly} boxes compared in part"] if partly else []
        unseen += [_MESH_UNSEEN] if mesh else []
        return "diff: nothing changed" + (f" ({', '.join(unseen)})" if unseen else "")
    parts = [
        f"{len(diff.appeared)} entries appeared",
        f"{len(diff.cleared)} cleared",
        f"{len(diff.reworded)} changed",
    ]
    if diff.findings_appeared or diff.findings_cleared:
        parts.append(
            f"{len(diff.findings_appeared)} findings appeared, {len(diff.findings_cleared)} cleared"
        )
    boxes = len({c.box for c in diff.changes})
    parts.append(f"{len(diff.changes)} observed values changed on {boxes} boxes")
    if whole:
        parts.append(f"{whole} boxes not compared")
    if partly:
        parts.append(f"{partly} boxes compared in part")
    if mesh:
        parts.append(_MESH_UNSEEN)
    return "diff: " + ", ".join(parts)


_MESH_UNSEEN = "the mesh's findings not compared"


def to_json(diff: RunDiff) -> dict[str, Any]:
    def entry(e: EntryRow) -> dict[str, Any]:
        return {
            "box": e.box,
            "kind": e.kind,
            "subject": e.subject,
            "path": e.path,
            "cause": e.cause,
            "desired": json.loads(e.desired),
            "observed": json.loads(e.observed),
            "secret": e.secret,
            "changed": e.changed,
        }

    return {
        "a": diff.a,
        "b": diff.b,
        "changed": diff.changed,
        "appeared": [entry(e) for e in diff.appeared],
        "cleared": [entry(e) for e in diff.cleared],
        # differs: which of desired, observed, changed (a secret's) read otherwise
        "reworded": [
            {"before": entry(c.before), "after": entry(c.after), "differs": list(c.differs)}
            for c in diff.reworded
        ],
        "findings_appeared": [vars(f) for f in diff.findings_appeared],
        "findings_cleared": [vars(f) for f in diff.findings_cleared],
        "events": list(diff.events),
        "changes": [vars(c) for c in diff.changes],
        # columns: null for the whole box, else those of its columns not compared
        "not_compared": [
            {
                "box": u.box,
                "a": u.a,
                "b": u.b,
                "reason": u.reason,
                "columns": list(u.columns) or None,
            }
            for u in diff.not_compared
        ],
        "notes": list(diff.notes),
    }
