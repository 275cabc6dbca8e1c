"""A report's entries by cause, as the lines text and markdown print (JSON keeps every entry).

Within a cause, entries that read the same (kind, path, values, action) are one row listing
where they are: `HAND_IMAGE (absent)` on twelve containers of three boxes is one row, not
twelve. The change comes first, then the symptoms it explains. A key whose value differs box by
box (each mesh member's seeds name every other member) would be a row per box: past
`FOLD_PAST` values, `VALUES_LISTED` of them are rows and one row holds the rest, so at 1,000
boxes that key is four rows, not a thousand; a value of another shape (an observed absence, an
empty value, one stray address among lists of seeds) is never folded out of sight (`rows`).
Stdlib only, like the rest of the repeated-drift path.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Sequence
from dataclasses import dataclass

from reconciler.compare.causes import Cause, group_causes
from reconciler.compare.drift import BoxResult, Drift, DriftReport
from reconciler.records import replace
from reconciler.report.order import ordered_drifts
from reconciler.report.values import ABSENT, MASK, display, secret_tag


@dataclass(frozen=True)
class Row:
    """Entries of one cause that read the same; `drifts` in report order."""

    symptom: bool
    drifts: tuple[Drift, ...]
    # Distinct values folded into this row (`rows`); 0: its entries read the same, and its
    # first entry's values are every entry's.
    folded: int = 0
    # A folded row's observed value as displayed, when every entry in it has the same ("" if
    # they differ): shown, as the listed rows show theirs.
    observed: str = ""

    @property
    def first(self) -> Drift:
        return self.drifts[0]


def ordered_boxes(report: DriftReport) -> tuple[BoxResult, ...]:
    """The boxes with their drifts in report order, so grouping never depends on how compare
    happened to emit them."""
    return tuple(replace(box, drifts=tuple(ordered_drifts(box.drifts))) for box in report.boxes)


def causes(report: DriftReport) -> tuple[Cause, ...]:
    return group_causes(ordered_boxes(report))


# Distinct values of one key (kind, path, secret tag, action) in one cause that are each a row;
# past that many, the key lists VALUES_LISTED of them and folds the rest into one row.
FOLD_PAST = 12
VALUES_LISTED = 3


def rows(cause: Cause, fold: bool = False) -> list[Row]:
    """The cause's rows, changes first. `fold`: a key with more than FOLD_PAST values lists a
    few of them (those on the most entries, then on the boxes first in report order) and holds
    the rest in one row after them, but never hides a kind of difference no row shows: its
    values are told apart by shape (`_shape`: absent, empty, one item or a list of items, and
    the items' form), each shape gets rows of its own (VALUES_LISTED for the commonest, one
    for each other) and its own folded row; an observed absence or empty value keeps its own
    row (up to FOLD_PAST of them: a key missing on 1,000 boxes is still a few rows)."""
    rank = {box: i for i, box in enumerate(cause.boxes)}
    out: list[Row] = []
    for symptom, drifts in ((False, cause.changes), (True, cause.symptoms)):
        read = [(drift, _reads(drift)) for drift in drifts]  # display() once per entry
        same: dict[tuple[str, ...], list[Drift]] = {}
        for drift, reading in read:
            same.setdefault(reading, []).append(drift)
        by_key: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
        for reading in same:
            by_key.setdefault(_key(reading), []).append(reading)
        # A folded reading's fold (a number), each fold's readings, the listed reading it follows
        fold_of: dict[tuple[str, ...], int] = {}
        folds: list[list[tuple[str, ...]]] = []
        after: dict[tuple[str, ...], int] = {}
        for readings in by_key.values():
            if fold and len(readings) > FOLD_PAST:
                for listed, held in _folds(readings, same, rank):
                    after[max(listed)] = len(folds)
                    fold_of.update((r, len(folds)) for r in held)
                    folds.append(held)
        in_fold: list[list[Drift]] = [[] for _ in folds]  # each fold's entries, report order
        if folds:
            for drift, reading in read:
                at = fold_of.get(reading)
                if at is not None:
                    in_fold[at].append(drift)
        for reading in sorted(r for r in same if r not in fold_of):
            out.append(Row(symptom, tuple(same[reading])))
            at = after.get(reading)
            if at is not None:  # the shape's other entries
                observed = {r[3] for r in folds[at]}
                shared = observed.pop() if len(observed) == 1 else ""
                out.append(Row(symptom, tuple(in_fold[at]), len(folds[at]), shared))
    return out


def _folds(
    readings: list[tuple[str, ...]],
    same: dict[tuple[str, ...], list[Drift]],
    rank: dict[str, int],
) -> list[tuple[list[tuple[str, ...]], list[tuple[str, ...]]]]:
    """One key's readings by shape, each shape's (listed, folded); a shape whose readings are
    all listed has no fold and is not returned (its readings stay rows)."""
    readings.sort(key=lambda r: (-len(same[r]), rank.get(same[r][0].box, 0), r))
    shapes: dict[tuple[tuple[object, ...], tuple[object, ...]], list[tuple[str, ...]]] = {}
    for reading in readings:
        shapes.setdefault((_shape(reading[2]), _shape(reading[3])), []).append(reading)
    commonest = max(shapes.values(), key=len)
    out = []
    for (_desired, observed), of_shape in shapes.items():
        if observed in _NEVER_FOLDED:
            limit = FOLD_PAST
        else:
            limit = VALUES_LISTED if of_shape is commonest else 1
        if len(of_shape) > limit + 1:  # one more is a row, not "(1 more values)"
            out.append((of_shape[:limit], of_shape[limit:]))
    return out


_NEVER_FOLDED = ((ABSENT,), ('""',))


def _shape(text: str) -> tuple[object, ...]:
    """A displayed value's shape: absent, empty or a secret as itself; else whether it is one
    item or a comma-separated list, and the forms of its items (what is left without ASCII
    letters and digits: `http://10.77.0.12:8000` is `://...:`), so a box's own mesh seeds
    share the shape of every other box's and a stray `http://203.0.113.66:8000` does not."""
    if text in (ABSENT, '""', MASK):
        return (text,)
    # In C (bytes.translate, one comparison), not item by item: a 1,000-box mesh's seeds are
    # 999 items on each box, read here for every box (~0.1 s more a report done in Python).
    form = text.encode("utf-8", "surrogatepass").translate(None, _ALNUM)
    first, comma, _ = form.partition(b",")
    if not comma:
        return ("one", first)
    if form == (first + b",") * form.count(b",") + first:  # every item of one form
        return ("list", first)
    return ("list", *sorted(set(form.split(b","))))


_ALNUM = (string.ascii_letters + string.digits).encode("ascii")


def folded_values(row: Row) -> str:
    """What a folded row says in place of its values: how many (`Row.observed`, shown beside
    it, is what they all observed when they share it)."""
    return f"({row.folded} more values)"


def folded_change(row: Row) -> str:
    """A folded row's values as one text: how many, and what they all observed if they share
    it (`(14 more values) -> (absent)`)."""
    return folded_values(row) + (f" -> {row.observed}" if row.observed else "")


def _key(reading: tuple[str, ...]) -> tuple[str, ...]:
    """A reading (`_reads`) without its values."""
    kind, path, _desired, _observed, tag, action = reading
    return (kind, path, tag, action)


def _reads(drift: Drift) -> tuple[str, ...]:
    return (
        drift.kind.value,
        drift.path,
        display(drift.desired),
        display(drift.observed),
        secret_tag(drift) or "",
        drift.action.value,
    )


def named(boxes: Sequence[str], limit: int | None = None) -> str:
    """`thor, spark, orin`; past `limit` names, the first of them and how many more: a cause
    seen on 700 boxes of a fleet is one line, not 60 (each box is named, with its count of
    differences, at the top of the text report; JSON lists every entry's box)."""
    if limit is None or len(boxes) <= limit:
        return ", ".join(boxes)
    return f"{', '.join(boxes[:limit])} and {len(boxes) - limit} more"


def where(row: Row, box_order: tuple[str, ...], limit: int | None = None) -> str:
    """`gateway on thor, orin`; `lane:a, lane:b on thor, spark; lane:c on spark`: subjects
    seen on the same boxes share one list. `limit`: the most boxes a list names (`named`)."""
    # Dicts as ordered sets: a row of a 1,000-box fleet has a drift on each box, and a list's
    # `in` made each row quadratic (as did a rank of every box built again for each row).
    by_subject: dict[str, dict[str, None]] = {}
    for drift in row.drifts:
        by_subject.setdefault(drift.subject, {})[drift.box] = None
    rank = _rank(tuple(box_order))
    by_boxes: dict[tuple[str, ...], list[str]] = {}
    for subject in sorted(by_subject):
        seen_on = tuple(sorted(by_subject[subject], key=lambda b: rank.get(b, len(rank))))
        by_boxes.setdefault(seen_on, []).append(subject)
    parts = sorted(by_boxes.items(), key=lambda kv: (-len(kv[0]), kv[1]))
    return "; ".join(f"{', '.join(subjects)} on {named(boxes, limit)}" for boxes, subjects in parts)


@functools.lru_cache(maxsize=4)  # one report's order, asked for by each of its rows
def _rank(box_order: tuple[str, ...]) -> dict[str, int]:
    return {box: i for i, box in enumerate(box_order)}


def per_box(row: Row, field: str, limit: int | None = None) -> list[tuple[str, str]]:
    """A row's distinct sources or notes (`field`), each with the boxes it was seen on when it
    is not the same on every box of the row ("" when it is); at most `limit` of them named."""
    seen: dict[str, dict[str, None]] = {}  # ordered sets, as in `where`
    for drift in row.drifts:
        text = getattr(drift, field)
        if text:
            seen.setdefault(text, {})[drift.box] = None
    boxes_of_row = {d.box for d in row.drifts}
    return [
        (text, "" if len(seen) == 1 or boxes.keys() == boxes_of_row else named(list(boxes), limit))
        for text, boxes in seen.items()
    ]
