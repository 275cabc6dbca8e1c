"""A recorded replay's history and metrics, each box's share made in the worker that compared
it (reconciler/replay_workers.py), beside its part of the JSON report (report/json_parts.py).

A recorded 1,000-box replay used to read its own printed report back whole (33 MB of JSON into
~150 MB of objects in one process), then read, parse, mask and pack every snapshot file again,
one after another, while the workers that had just held each box sat idle (~2.5 s and 270 MB
at 1,000 boxes; BENCHMARKS.md, issue 12). Here each worker turns the box it compared into what
the store and the metrics keep of it: its rows (history/record.box_rows, from the same entry
the report prints), what the metrics count, and its observation packed for the store
(history/store.pack: masked, compressed) from the very bytes the comparison read. The store
keeps the report as it was printed (its parts joined): the same document, in 9% more bytes
than json.dumps would write, with no second copy of every box's entry held to write it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from reconciler.compare.drift import BoxResult
from reconciler.history.record import BoxRow, EntryRow, ReportText, box_rows
from reconciler.report.json_parts import BoxPart, PartsReport, entry_part, spooled
from reconciler.report.json_report import box_entry
from reconciler.report.summary import tally

if TYPE_CHECKING:
    from reconciler.report.spool import Held, ItemSpool, Spooled, TextSpool

# What the metrics read of a box's entry (metrics.drift_registry), and of each drift (its
# subject: which column it is in, not counted when the box's faults left that column unseen).
_COUNTED = ("box", "reachable", "observation", "errors")
_DRIFT_COUNTED = ("kind", "cause", "subject")


class KeptPart(NamedTuple):
    """One box of a recorded replay: its report part and what the history and metrics keep."""

    part: BoxPart
    row: BoxRow
    entries: list[EntryRow]
    counted: dict[str, Any]  # what metrics.drift_registry reads of its entry
    observation: bytes | None  # store.Packed; None: not observed in full, or unreadable
    seconds: float | None  # how long its collector ran (metrics.collector_seconds)


def kept_part(box: BoxResult, data: bytes | None, many: bool) -> KeptPart:
    """`box` compared from its snapshot file's `data` (None: there was no file to keep)."""
    from reconciler.history.hooks import decoded
    from reconciler.history.parts import faults_of
    from reconciler.history.store import pack
    from reconciler.metrics import collector_seconds

    causes: set[str] = set()
    entry = box_entry(box, causes)
    row, entries = box_rows(entry, faults_of(box.errors))
    counted = {key: entry[key] for key in _COUNTED}
    counted["drifts"] = [{key: d[key] for key in _DRIFT_COUNTED} for d in entry["drifts"]]
    packed, seconds = None, None
    if data is not None and entry["observation"] == "full":
        try:
            observation, plain = decoded(data, many)
        except ValueError:
            pass  # the report says what was wrong with that box's file
        else:
            seconds = collector_seconds(observation)
            packed = pack(observation, plain)
    part = entry_part(entry, causes, tally(box))
    return KeptPart(part, row, entries, counted, packed, seconds)


def spooled_kept(
    text: TextSpool, rows: ItemSpool[EntryRow] | None, kept: list[KeptPart]
) -> tuple[Spooled, tuple[int, int] | Held[EntryRow], list[KeptPart]]:
    """json_parts.spooled of a chunk of recorded boxes: their report entries' text put in the
    `text` spool and their drift entries' rows in `rows` (each holds the box's desired mesh
    seeds: they grow with the fleet), and the boxes without either. `rows` None: a run that
    stores no history (--metrics alone), whose rows are dropped where they were made."""
    from reconciler.report.spool import Held

    where, parts = spooled(text, [k.part for k in kept])
    entries = Held([]) if rows is None else rows.put([e for k in kept for e in k.entries])
    light = [k._replace(part=part, entries=[]) for k, part in zip(kept, parts, strict=True)]
    return where, entries, light


def report_text(printed: Iterable[str]) -> ReportText:
    """The document as the store keeps it: the JSON report as it was printed
    (json_parts.render_json_parts), whole."""
    return ReportText(printed)


def metrics_document(head: dict[str, Any], report: PartsReport) -> dict[str, Any]:
    """What metrics.drift_registry reads of the document: its summary and each box's counts."""
    return {"summary": head["summary"], "boxes": [k.counted for k in report.kept]}
