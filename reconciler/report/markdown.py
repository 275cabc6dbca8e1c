"""The drift report as GitHub-flavoured markdown, for pasting into a change record.

The drift is grouped by cause (reconciler/compare/causes.py): one section per cause, its change
first, then the symptoms it explains; entries that read the same are one row listing where they
are, every source and note kept. Per box: its state, errors, facts and the causes it has.
Values are shown whole (a change record is where the full speculative config belongs), inside
code spans; secrets are `***` with (changed)/(unchanged), never a digest.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from reconciler.compare.causes import Cause
from reconciler.compare.drift import BoxResult, DriftReport
from reconciler.report.grouped import (
    Row,
    causes,
    folded_values,
    per_box,
    rows,
    where,
)
from reconciler.report.summary import plural, sentence, summarize
from reconciler.report.values import ABSENT, clean, display, free_json, guarded, secret_tag

DRIFT_COLUMNS = ("role", "kind", "path", "desired", "observed", "action", "on", "source", "note")
ROLES = ("cause", "symptom")
EXIT_MEANING = {0: "in sync", 1: "a box not observed or with errors", 2: "drift"}
_PROSE_SPECIALS = re.compile(r"([\\`*_\[\]<>|~&])")


def render_markdown(report: DriftReport) -> str:
    report = guarded(report)
    grouped = causes(report)
    s = summarize(report, causes=len(grouped))
    lines = [
        f"# Drift report: {text(report.inventory)}, run {code(report.run_id, cell=False)}, "
        f"{text(report.generated_at)}",
        "",
        f"Exit code {s.exit_code}: {EXIT_MEANING.get(s.exit_code, 'unknown')}.",
        "",
        f"**{text(sentence(s))}**",
        "",
        "## Summary",
        "",
        *_table(
            ("box", "reachable", "differences", "errors", "status"),
            [_summary_row(b) for b in report.boxes],
            right=(2, 3),
        ),
    ]
    box_order = tuple(b.box for b in report.boxes)
    if grouped:
        lines += ["", "## Causes"]
    for cause in grouped:
        lines += [
            "",
            _cause_title(cause),
            "",
            *_table(DRIFT_COLUMNS, _cause_rows(cause, box_order)),
        ]
    for box in report.boxes:
        lines += ["", f"## {text(box.box)}", "", *_box_section(box, grouped)]
    return "\n".join(lines) + "\n"


def text(value: str) -> str:
    """Prose-safe: markdown's inline specials (and `|`, for tables) backslash-escaped."""
    return _PROSE_SPECIALS.sub(r"\\\1", clean(value))


def code(value: str, *, cell: bool = True) -> str:
    """A code span that survives any content, inside a table cell too.

    GFM splits table cells on `|` even inside code spans, hence `\\|` in a cell (the table
    takes the backslash away); anywhere else (`cell=False`: a heading, a list, a paragraph) a
    code span shows its backslashes, so `a|b` is left as it is there. The fence is one backtick
    longer than any run of backticks in the value.
    """
    body = clean(value).replace("|", "\\|") if cell else clean(value)
    # Most values have no backtick: no regex pass over a 30 KB value (a 1,000-box mesh's seeds)
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0) if "`" in body else 0
    fence = "`" * (longest + 1)
    pad = " " if body.startswith(("`", " ")) or body.endswith(("`", " ")) else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def _status(box: BoxResult) -> str:
    if not box.reachable:
        return "not observed" + (" (gateway only)" if box.partial is not None else "")
    if box.drifts:
        return "drift"
    return "errors" if box.errors else "in sync"


def _summary_row(box: BoxResult) -> list[str]:
    return [
        text(box.box),
        "yes" if box.reachable else "**no**",
        str(len(box.drifts)),
        str(len(box.errors)),
        _status(box),
    ]


def _cause_title(cause: Cause) -> str:
    return (
        f"### {code(cause.id, cell=False)}: {plural(cause.entries, 'difference')} on "
        f"{text(', '.join(cause.boxes))}"
    )


def _cause_rows(cause: Cause, box_order: tuple[str, ...]) -> list[list[str]]:
    return [_drift_row(row, where(row, box_order)) for row in rows(cause, fold=True)]


def _box_section(box: BoxResult, grouped: tuple[Cause, ...]) -> list[str]:
    """Paragraphs, in order: status, errors, facts, its causes; blank lines between."""
    blocks: list[list[str]] = []
    if not box.reachable:
        blocks.append(["Not observed (the error says why)."])
    elif not box.drifts and not box.errors:
        blocks.append(["In sync."])
    if box.partial is not None:
        blocks.append([f"Partial: {text(free_json(box.partial))}"])
    if box.errors:
        blocks.append([f"- error: {code(free_json(e), cell=False)}" for e in box.errors])
    if box.facts:
        facts = ", ".join(
            code(f"{k}={display(v)}", cell=False) for k, v in sorted(box.facts.items())
        )
        blocks.append([f"Facts: {facts}"])
    if box.drifts:
        ids = ", ".join(code(c.id, cell=False) for c in grouped if box.box in c.boxes)
        count = sum(1 for c in grouped if box.box in c.boxes)
        blocks.append([f"{plural(len(box.drifts), 'difference')}, {plural(count, 'cause')}: {ids}"])
    lines: list[str] = []
    for block in blocks:
        lines += [*([""] if lines else []), *block]
    return lines


def _drift_row(row: Row, places: str) -> list[str]:
    drift = row.first
    tag = secret_tag(drift)
    if row.folded:  # many values, one per box (grouped.rows): JSON lists each
        desired = f"*{text(folded_values(row))}*"
        # What they all observed, when the same (grouped.Row.observed), as a value is shown
        shared = (
            "" if not row.observed else "*absent*" if row.observed == ABSENT else code(row.observed)
        )
        observed = " ".join(part for part in (shared, f"({tag})" if tag else "") if part)
    else:
        desired = _value(drift.desired)
        observed = _value(drift.observed) + (f" ({tag})" if tag else "")
    return [
        ROLES[row.symptom],
        drift.kind.value,
        code(drift.path),
        desired,
        observed,
        drift.action.value,
        text(places),
        ", ".join(
            code(src) + (f" ({text(on)})" if on else "") for src, on in per_box(row, "source")
        ),
        "; ".join(
            text(note) + (f" ({text(on)})" if on else "") for note, on in per_box(row, "note")
        ),
    ]


def _value(value: object) -> str:
    # Absent is not a value: in a code span it would read as the string "(absent)".
    return "*absent*" if value is None else code(display(value))


def _table(
    header: Sequence[str], rows: Iterable[Sequence[str]], right: Sequence[int] = ()
) -> list[str]:
    rule = ["---:" if i in right else "---" for i in range(len(header))]
    return [_line(header), _line(rule), *(_line(row) for row in rows)]


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
