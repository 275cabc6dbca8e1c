"""A report's entries by cause, as the lines text and markdown print (JSON keeps every entry).

Within a cause, entries that read the same (kind, path, values, action) are one row listing
where they are: `HAND_IMAGE (absent)` on twelve containers of three boxes is one row, not
twelve. The change comes first, then the symptoms it explains. A key whose value differs box by
box (each mesh member's seeds name every other member) would be a row per box: past
`FOLD_PAST` values, `VALUES_LISTED` of them are rows and one row holds the rest, so at 1,000
boxes that key is four rows, not a thousand. Stdlib only, like the rest of the repeated-drift
path.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from reconciler.compare.causes import Cause, group_causes
from reconciler.compare.drift import BoxResult, Drift, DriftReport
from reconciler.report.order import ordered_drifts
from reconciler.report.values import display, secret_tag


@dataclass(frozen=True)
class Row:
    """Entries of one cause that read the same; `drifts` in report order."""

    symptom: bool
    drifts: tuple[Drift, ...]
    # Distinct values folded into this row (`rows`); 0: its entries read the same, and its
    # first entry's values are every entry's.
    folded: int = 0

    @property
    def first(self) -> Drift:
        return self.drifts[0]


def ordered_boxes(report: DriftReport) -> tuple[BoxResult, ...]:
    """The boxes with their drifts in report order, so grouping never depends on how compare
    happened to emit them."""
    return tuple(
        dataclasses.replace(box, drifts=tuple(ordered_drifts(box.drifts))) for box in report.boxes
    )


def causes(report: DriftReport) -> tuple[Cause, ...]:
    return group_causes(ordered_boxes(report))


# Distinct values of one key (kind, path, secret tag, action) in one cause that are each a row;
# past that many, the key lists VALUES_LISTED of them and folds the rest into one row.
FOLD_PAST = 12
VALUES_LISTED = 3


def rows(cause: Cause, fold: bool = False) -> list[Row]:
    """The cause's rows, changes first. `fold`: a key with more than FOLD_PAST values lists
    VALUES_LISTED of them (those on the most entries, then on the boxes first in report order)
    and holds the rest in one row after them."""
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
        folded: set[tuple[str, ...]] = set()
        # A folded key's last listed reading (its fold comes right after it), and its fold's size
        last: dict[tuple[str, ...], tuple[tuple[str, ...], int]] = {}
        for key, readings in by_key.items():
            if fold and len(readings) > FOLD_PAST:
                readings.sort(key=lambda r: (-len(same[r]), rank.get(same[r][0].box, 0), r))
                folded.update(readings[VALUES_LISTED:])
                last[key] = (max(readings[:VALUES_LISTED]), len(readings) - VALUES_LISTED)
        for reading in sorted(r for r in same if r not in folded):
            out.append(Row(symptom, tuple(same[reading])))
            key = _key(reading)
            if key in last and last[key][0] == reading:  # the key's other entries, report order
                rest = tuple(drift for drift, r in read if r in folded and _key(r) == key)
                out.append(Row(symptom, rest, folded=last[key][1]))
    return out


def folded_values(row: Row) -> str:
    """What a folded row says in place of its values."""
    return f"({row.folded} more values)"


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
