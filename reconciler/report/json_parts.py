"""A large JSON drift report written in parts: each box's entry as text, made where the box was
compared (a replay's worker process, reconciler/replay_workers.py), then the document around
them.

Building a 1,000-box report's values and writing its 33 MB of text is ~0.5 s of one process
after every box is compared; a replay's workers have each box at hand already, so they make
its entry's text beside its comparison, on every core. The text is the one `render_json`
writes, byte for byte: the same values (`json_report.box_entry`, the same guard against clear
secrets), the same encoder (`fast_json.dumps_indented`), each entry indented as it stands in
the document's `boxes` list (tests/unit/test_json_parts.py holds the two to the same bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from reconciler import fast_json
from reconciler.compare.drift import BoxResult, DriftReport
from reconciler.gc_pause import paused_gc
from reconciler.report.json_report import box_entry, head

# An entry of the document's `boxes` list stands two levels deep (json.dumps, indent=2).
_ENTRY_INDENT = " " * 4
_NO_BOXES = '"boxes": []\n}'


class BoxPart(NamedTuple):
    """One box's entry of the JSON report, as text, and the causes its drifts name."""

    text: str
    causes: frozenset[str]


def box_part(box: BoxResult) -> BoxPart:
    causes: set[str] = set()
    entry = fast_json.dumps_indented(box_entry(box, causes))
    # A JSON text has line breaks only between its tokens (a string's are escaped `\n`), so
    # every line after the first moves in by the entry's depth.
    return BoxPart(entry.replace("\n", "\n" + _ENTRY_INDENT), frozenset(causes))


def render_json_parts(report: DriftReport, parts: Sequence[BoxPart]) -> str:
    """`json_report.render_json(report)`, from the parts of its boxes (in the report's order)."""
    if len(parts) != len(report.boxes):
        raise ValueError(f"{len(parts)} report parts for {len(report.boxes)} boxes")
    causes = frozenset().union(*(part.causes for part in parts))
    with paused_gc():
        text = fast_json.dumps_indented({**head(report, len(causes)), "boxes": []})
    if not parts:
        return text + "\n"
    assert text.endswith(_NO_BOXES), "the document ends with its boxes"
    entries = f",\n{_ENTRY_INDENT}".join(part.text for part in parts)
    return f'{text[: -len(_NO_BOXES)]}"boxes": [\n{_ENTRY_INDENT}{entries}\n  ]\n}}\n'
