"""The counts every format agrees on, and the one-line sentence text and markdown end with."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

from reconciler.compare.causes import link_box
from reconciler.compare.drift import BoxResult, DriftReport, Kind, worst_exit
from reconciler.records import record_class
from reconciler.report.order import ordered_drifts


@record_class()
class Summary:
    """The counts a report's first line and the metrics give."""

    boxes: int
    reachable: int
    unreachable: int
    with_errors: int  # boxes with at least one error, reachable or not
    drifted_boxes: int  # boxes with at least one drift
    drifts: int
    causes: int  # distinct causes across the fleet (one cause on many boxes counts once)
    by_kind: dict[str, int]  # kind -> drifts, keys sorted
    exit_code: int
    reachable_with_errors: int  # observed, but only in part: the sentence names these apart
    partial: int = 0  # not observed, but their gateway answered the controller (compared)


class Tally(NamedTuple):
    """What the summary counts of one box: all a large replay keeps of a box's result once its
    part of the report is written (report/json_parts.py)."""

    reachable: bool
    errors: bool
    partial: bool
    kinds: tuple[Kind, ...]  # each drift's


def tally(box: BoxResult) -> Tally:
    return Tally(
        box.reachable, bool(box.errors), box.partial is not None, tuple(d.kind for d in box.drifts)
    )


def summarize(report: DriftReport, causes: int | None = None) -> Summary:
    """`causes`: the count when the caller has grouped the drift already (grouping twice is
    the one cost here that grows with every entry)."""
    return summary_of(map(tally, report.boxes), _causes(report) if causes is None else causes)


def summary_of(tallies: Iterable[Tally], causes: int) -> Summary:
    """The summary of boxes counted apart (`causes`: the distinct causes of their drift)."""
    boxes = tuple(tallies)
    # Counted by member, then named: one Enum.value per kind, not per drift.
    kinds = {kind.value: n for kind, n in Counter(k for b in boxes for k in b.kinds).items()}
    return Summary(
        boxes=len(boxes),
        reachable=sum(1 for b in boxes if b.reachable),
        unreachable=sum(1 for b in boxes if not b.reachable),
        with_errors=sum(1 for b in boxes if b.errors),
        drifted_boxes=sum(1 for b in boxes if b.kinds),
        drifts=sum(len(b.kinds) for b in boxes),
        causes=causes,
        by_kind=dict(sorted(kinds.items())),
        exit_code=worst_exit(
            any(not b.reachable or b.errors for b in boxes), any(b.kinds for b in boxes)
        ),
        reachable_with_errors=sum(1 for b in boxes if b.reachable and b.errors),
        partial=sum(1 for b in boxes if b.partial),
    )


def _causes(report: DriftReport) -> int:
    return len({link.cause for b in report.boxes for link in link_box(ordered_drifts(b.drifts))})


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def sentence(s: Summary) -> str:
    """`drift: 3 causes, 7 differences on 2 of 3 boxes (envfile 2, contract 1, ...); 1 box not
    observed`.

    Kinds are listed most frequent first (then by name): the reader wants the bulk of the work.
    """
    of_boxes = f"of {plural(s.boxes, 'box', 'boxes')}"
    if s.drifts:
        kinds = ", ".join(
            f"{kind} {n}" for kind, n in sorted(s.by_kind.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        counts = f"{plural(s.causes, 'cause')}, {plural(s.drifts, 'difference')}"
        line = f"drift: {counts} on {s.drifted_boxes} {of_boxes} ({kinds})"
    else:
        line = f"drift: no differences on {s.reachable} {of_boxes}"
    if s.unreachable:
        line += f"; {plural(s.unreachable, 'box', 'boxes')} not observed"
        if s.partial:
            line += f" ({s.partial} seen from the gateway only)"
    if s.reachable_with_errors:
        line += f"; {plural(s.reachable_with_errors, 'box', 'boxes')} with errors"
    return line
