"""The drift report as GitHub-flavoured markdown, for pasting into a change record.

Values are shown whole (a change record is where the full speculative config belongs), inside
code spans; secrets are `***` with (changed)/(unchanged), never a digest.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from reconciler.compare.drift import BoxResult, Drift, DriftReport
from reconciler.report.order import ordered_drifts
from reconciler.report.summary import sentence, summarize
from reconciler.report.values import clean, display, free_json, guarded, secret_tag

DRIFT_COLUMNS = ("subject", "kind", "path", "desired", "observed", "action", "source", "note")
EXIT_MEANING = {0: "in sync", 1: "a box not observed or with errors", 2: "drift"}
_PROSE_SPECIALS = re.compile(r"([\\`*_\[\]<>|~&])")


def render_markdown(report: DriftReport) -> str:
    report = guarded(report)
    s = summarize(report)
    lines = [
        f"# Drift report: {text(report.inventory)}, run {code(report.run_id)}, "
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
    for box in report.boxes:
        lines += ["", f"## {text(box.box)}", "", *_box_section(box)]
    return "\n".join(lines) + "\n"


def text(value: str) -> str:
    """Prose-safe: markdown's inline specials (and `|`, for tables) backslash-escaped."""
    return _PROSE_SPECIALS.sub(r"\\\1", clean(value))


def code(value: str) -> str:
    """A code span that survives any content, inside a table cell too.

    GFM splits table cells on `|` even inside code spans, hence `\\|`; the fence is one backtick
    longer than any run of backticks in the value.
    """
    body = clean(value).replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if body.startswith(("`", " ")) or body.endswith(("`", " ")) else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def _status(box: BoxResult) -> str:
    if not box.reachable:
        return "not observed"
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


def _box_section(box: BoxResult) -> list[str]:
    """Paragraphs, in order: status, errors, facts, the drift table; blank lines between."""
    blocks: list[list[str]] = []
    if not box.reachable:
        blocks.append(["Not observed (the error says why)."])
    elif not box.drifts and not box.errors:
        blocks.append(["In sync."])
    if box.errors:
        blocks.append([f"- error: {code(free_json(e))}" for e in box.errors])
    if box.facts:
        facts = ", ".join(code(f"{k}={display(v)}") for k, v in sorted(box.facts.items()))
        blocks.append([f"Facts: {facts}"])
    if box.drifts:
        blocks.append(_table(DRIFT_COLUMNS, [_drift_row(d) for d in ordered_drifts(box.drifts)]))
    lines: list[str] = []
    for block in blocks:
        lines += [*([""] if lines else []), *block]
    return lines


def _drift_row(drift: Drift) -> list[str]:
    tag = secret_tag(drift)
    observed = _value(drift.observed) + (f" ({tag})" if tag else "")
    return [
        text(drift.subject),
        drift.kind.value,
        code(drift.path),
        _value(drift.desired),
        observed,
        drift.action.value,
        code(drift.source) if drift.source else "",
        text(drift.note) if drift.note else "",
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
