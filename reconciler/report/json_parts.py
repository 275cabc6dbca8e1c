"""A large JSON drift report written in parts: each box's entry as text, made where the box was
compared (a replay's worker process, reconciler/replay_workers.py), then the document around
them.

Building a 1,000-box report's values and writing its 33 MB of text is ~0.5 s of one process
after every box is compared; a replay's workers have each box at hand already, so they make
its entry's text beside its comparison, on every core. The text is the one `render_json`
writes, byte for byte: the same values (`json_report.box_entry`, the same guard against clear
secrets), the same encoder (`fast_json.dumps_indented`), each entry indented as it stands in
the document's `boxes` list (tests/unit/test_json_parts.py holds the two to the same bytes).

Each worker sends back only the part, its causes and its `Tally` (what the summary counts),
not the box's comparison: unpickling 1,000 boxes' results here was ~0.1 s of the replaying
process's CPU while the workers still needed both cores, and 27 MB it held for nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from reconciler import fast_json
from reconciler.compare.drift import BoxResult
from reconciler.gc_pause import paused_gc
from reconciler.report.json_report import box_entry, head_of
from reconciler.report.summary import Tally, summary_of, tally

if TYPE_CHECKING:
    from reconciler.report.spool import ItemSpool, Spooled, TextSpool

# An entry of the document's `boxes` list stands two levels deep (json.dumps, indent=2).
_ENTRY_INDENT = " " * 4
_NO_BOXES = '"boxes": []\n}'
# Between two entries of the `boxes` list.
_BETWEEN = f",\n{_ENTRY_INDENT}"


class BoxPart(NamedTuple):
    """One box's entry of the JSON report, as text, the causes its drifts name, and what the
    summary counts of it."""

    text: str
    causes: frozenset[str]
    tally: Tally


def box_part(box: BoxResult) -> BoxPart:
    causes: set[str] = set()
    return entry_part(box_entry(box, causes), causes, tally(box))


def entry_part(entry: dict[str, Any], causes: set[str], counted: Tally) -> BoxPart:
    """The part of a box whose document entry (`json_report.box_entry`) is `entry`: for a
    caller that reads the entry too (a recorded replay's history rows, history/kept_parts.py)."""
    text = fast_json.dumps_indented(entry)
    # A JSON text has line breaks only between its tokens (a string's are escaped `\n`), so
    # every line after the first moves in by the entry's depth.
    return BoxPart(text.replace("\n", "\n" + _ENTRY_INDENT), frozenset(causes), counted)


@dataclass(frozen=True)
class PartsReport:
    """A drift report kept as its boxes' parts, in the report's order (drift.replay_parts):
    what `DriftReport` holds, but each box's result already written as its entry."""

    parts: tuple[BoxPart, ...]
    inventory: str
    generated_at: str  # ISO 8601 UTC
    run_id: str
    # A recorded run's: each box's share of the history and the metrics, made beside its part
    # (history/kept_parts.KeptPart), in the same order; empty for a run that records nothing.
    kept: tuple[Any, ...] = ()
    # Where the entries' text is (`spooled`), the parts then holding none; None: in the parts.
    spool: TextSpool | None = None
    # A recorded run's drift entries' rows (history/kept_parts.spooled_kept), `kept` then
    # holding none; None: in `kept`.
    rows: ItemSpool[Any] | None = None

    @property
    def exit_code(self) -> int:
        return summary_of((part.tally for part in self.parts), 0).exit_code


def parts_head(report: PartsReport) -> dict[str, Any]:
    """The document's head (`json_report.head_of`: schema, run, summary) of a report kept as
    its parts: what the metrics and the history read besides the boxes."""
    parts = report.parts
    causes = frozenset().union(*(part.causes for part in parts))
    summary = summary_of((part.tally for part in parts), len(causes))
    return head_of(report.run_id, report.generated_at, report.inventory, summary)


def spooled(spool: TextSpool, parts: list[BoxPart]) -> tuple[Spooled, list[BoxPart]]:
    """A chunk of boxes' parts (made in a replay's worker) with their entries' text put in the
    spool, joined as it stands in the document, and the parts without it: what the replaying
    process gets back, to `keep` in the spool and to hold."""
    pieces: list[str] = []
    for part in parts:
        if pieces:
            pieces.append(_BETWEEN)
        pieces.append(part.text)
    return spool.put(pieces), [part._replace(text="") for part in parts]


def entries_spool() -> TextSpool:
    """A spool for a report's entries, chunk after chunk as they stand in the document."""
    from reconciler.report.spool import TextSpool

    return TextSpool(between=_BETWEEN)


def render_json_parts(report: PartsReport) -> Iterable[str]:
    """`json_report.render_json` of the report these are the parts of, in pieces to write one
    after another (as often as asked: the history keeps what was printed): joined, they would
    be one more copy of 33 MB at 1,000 boxes (~20 ms of page faults), and as much again to
    encode it whole for the write. A spooled report's entries are read back a chunk at a time."""
    parts = report.parts
    with paused_gc():
        text = fast_json.dumps_indented({**parts_head(report), "boxes": []})
    if not parts:
        return [text + "\n"]
    assert text.endswith(_NO_BOXES), "the document ends with its boxes"
    opening = f'{text[: -len(_NO_BOXES)]}"boxes": [\n{_ENTRY_INDENT}'
    closing = "\n  ]\n}\n"
    if report.spool is not None:
        return _Pieces(opening, report.spool, closing)
    pieces = [opening]
    for index, part in enumerate(parts):
        if index:
            pieces.append(_BETWEEN)
        pieces.append(part.text)
    pieces.append(closing)
    return pieces


@dataclass(frozen=True)
class _Pieces:
    """The document's pieces around its spooled entries: iterable again and again."""

    opening: str
    spool: TextSpool
    closing: str

    def __iter__(self) -> Iterator[str]:
        yield self.opening
        yield from self.spool.pieces()
        yield self.closing
