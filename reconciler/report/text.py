"""The drift report for a terminal: the boxes' state, then the drift grouped by cause.

    drift report: inventory lab, run r1, 2026-11-29T08:30:00Z
    thor: reachable, 3 differences
    spark: reachable, 2 differences
    orin: not observed, 1 error
      error: ssh: connect to host 10.77.0.4 port 22: No route to host

    envfile:HAND_IMAGE: 4 differences on thor, spark
      cause    envfile     HAND_IMAGE       abc -> (absent)            rewrite-env
               on: file:.env on thor, spark
               source: absent
      symptom  env         HAND_IMAGE       abc -> (absent)            recreate
               on: lane:vllm-embed on thor, spark
               source: model-gear-vllm-embed

    shell:GATEWAY_API_KEY: 1 difference on thor
      cause    shell-leak  GATEWAY_API_KEY  (absent) -> *** (changed)  report-only:shell
               on: shell on thor
               source: ~/.bashrc:6

    drift: 2 causes, 5 differences on 2 of 3 boxes (env 2, envfile 2, shell-leak 1); 1 box not
    observed

A cause (reconciler/compare/causes.py) leads with the change that fixes it, then the symptoms
it explains; entries that read the same are one row listing where they are (subjects and
boxes), so one cause on many boxes is one line. `--format json` lists every entry.

Column widths are computed once for the whole report, so columns line up across causes. What
does not fit its column goes on a line of its own below the row (values across the width, cut
around where they differ when very long; where, sources, notes); nothing is cut mid-column.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reconciler.compare.causes import Cause
from reconciler.compare.drift import Action, BoxResult, Drift, DriftReport
from reconciler.report.grouped import (
    Row,
    causes,
    folded_values,
    named,
    per_box,
    rows,
    where,
)
from reconciler.report.summary import plural, sentence, summarize
from reconciler.report.values import (
    abbreviate_pair,
    clean,
    display,
    free_text,
    guarded,
    secret_tag,
)

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.text import Text

SUBJECT_INDENT = 2
ROW_INDENT = 2
GAP = 2  # spaces between columns
PATH_MAX, CHANGE_MAX = 32, 48
MAX_LISTED = 3  # distinct sources or notes a row lists; more: JSON has every one
# Boxes a list names (a cause's, a row's `on:`, a source's); more: the first ones and how many
# more. The box lines at the top name every box, JSON every entry's.
BOXES_NAMED = 12
# Who gives up room first, and down to what: the values narrow (a longer one moves below its
# row), then the path (the drift's identity) wraps, then the rest narrows.
SHRINK = (
    ("change", 26),
    ("path", 28),
    ("change", 20),
    ("path", 16),
    ("action", 10),
    ("kind", 6),
    ("role", 5),
)
ROLES = ("cause", "symptom")
BELOW = "(below)"
VALUE_LIMIT = 160  # longer values (a 2 kB speculative config) are cut, in text only
ARROW = " -> "

STYLE = {
    "box": "bold",
    "in_sync": "green",
    "drifted": "yellow",
    "unreachable": "bold red",
    "error": "red",
    "cause": "bold",
    "role": "bold",
    "symptom": "dim",
    "where": "dim",
    "kind": "cyan",
    "desired": "green",
    "observed": "red",
    "secret_tag": "magenta",
    "action": "yellow",
    "report_only": "dim",
    "source": "dim",
    "note": "dim italic",
    "meta": "dim",
}
REPORT_ONLY = {Action.REPORT, Action.SCRUB_SHELL}


@dataclass(frozen=True)
class _Widths:
    role: int
    kind: int
    path: int
    change: int
    action: int
    total: int = 100  # the whole line


def render_text(report: DriftReport, color: bool, width: int = 100) -> str:
    report = guarded(report)
    from rich.console import Console  # lazy: rich costs import time the JSON path never needs

    out = io.StringIO()
    console = Console(
        file=out,
        width=width,
        force_terminal=color,
        no_color=not color,
        color_system="standard" if color else None,
        markup=False,  # values come from boxes: "[red]" in an env value is text, not style
        highlight=False,
        emoji=False,
        legacy_windows=False,
        force_jupyter=False,
        force_interactive=False,
    )
    grouped = causes(report)
    box_order = tuple(b.box for b in report.boxes)
    laid_out = [
        (cause, [(row, where(row, box_order, BOXES_NAMED)) for row in rows(cause, fold=True)])
        for cause in grouped
    ]
    widths = _widths([r for _, cause_rows in laid_out for r in cause_rows], width)
    parts: list[RenderableType] = [_meta(report)]
    for box in report.boxes:
        parts += _box_lines(box)
    _flush(console, parts, widths.total)
    for cause, cause_rows in laid_out:
        parts = [_styled("", "meta"), _cause_header(cause)]
        for row, places in cause_rows:
            parts += _row(row, places, widths)
        _flush(console, parts, widths.total)
    console.print()
    console.print(_styled(sentence(summarize(report, causes=len(grouped))), "box"))
    # rich pads cells to their column width; trailing blanks only make diffs and pastes noisy.
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"


def _meta(report: DriftReport) -> Text:
    return _styled(
        f"drift report: inventory {clean(report.inventory)}, run {clean(report.run_id)}, "
        f"{clean(report.generated_at)}",
        "meta",
    )


def _box_lines(box: BoxResult) -> list[RenderableType]:
    from rich.padding import Padding

    parts: list[RenderableType] = [_box_header(box)]
    if box.partial is not None:
        seen = _styled(f"partial: {free_text(box.partial)}", "meta")
        parts.append(Padding(seen, (0, 0, 0, SUBJECT_INDENT)))
    for error in box.errors:
        parts.append(
            Padding(_styled(f"error: {free_text(error)}", "error"), (0, 0, 0, SUBJECT_INDENT))
        )
    return parts


def _cause_header(cause: Cause) -> Text:
    from rich.text import Text

    header = Text()
    header.append(clean(cause.id), style=STYLE["cause"])
    header.append(f": {plural(cause.entries, 'difference')} on {named(cause.boxes, BOXES_NAMED)}")
    return header


def _flush(console: Console, parts: list[RenderableType], width: int) -> None:
    # One print per block: each print asks the terminal its size and sets up a render.
    from rich.console import Group

    if console.no_color:
        _print_plain(console, parts, width)
    else:
        console.print(Group(*parts))


def _print_plain(console: Console, parts: list[RenderableType], width: int) -> None:
    """Without colour a line that fits is its own text: written as is, it is what rich would
    print (rich lays out each line again, ~10 ms a box); the rest goes through rich."""
    from rich.cells import cell_len
    from rich.console import Group
    from rich.text import Text

    pending: list[RenderableType] = []
    for part in parts:
        if isinstance(part, Text):
            plain = part.plain
            if plain.isprintable() and cell_len(plain) <= width:
                if pending:
                    console.print(Group(*pending))
                    pending = []
                console.file.write(plain + "\n")
                continue
        pending.append(part)
    if pending:
        console.print(Group(*pending))


def _box_header(box: BoxResult) -> Text:
    from rich.text import Text

    header = Text()
    header.append(clean(box.box), style=STYLE["box"])
    header.append(": ")
    if not box.reachable:
        header.append("not observed", style=STYLE["unreachable"])
        if box.partial is not None:
            header.append(" (its gateway answered the controller)")
        if box.drifts:
            header.append(f", {plural(len(box.drifts), 'difference')}")
    elif box.drifts:
        header.append("reachable, ")
        header.append(plural(len(box.drifts), "difference"), style=STYLE["drifted"])
    elif box.errors:
        # Partly observed: "in sync" would be a claim the run could not check.
        header.append("reachable, no differences found")
    else:
        header.append("in sync", style=STYLE["in_sync"])
    if box.errors:
        header.append(", ")
        header.append(plural(len(box.errors), "error"), style=STYLE["error"])
    return header


def _row(row: Row, places: str, widths: _Widths) -> list[RenderableType]:
    """The row, then what does not fit it below: the values across the width (a speculative
    config wrapped into 25 columns is unreadable), the places, the sources and the notes."""
    from rich.text import Text

    drift = row.first
    desired = observed = ""
    if row.folded:  # many values, one per box: JSON has each, the listed rows show a few
        folded = _folded(row)
        change = folded if len(folded) <= widths.change else None
    else:
        desired, observed = abbreviate_pair(
            display(drift.desired), display(drift.observed), VALUE_LIMIT
        )
        tag = secret_tag(drift)
        change = _change(desired, observed, f" ({tag})" if tag else "", widths.change)
    role = ROLES[row.symptom]
    cells: list[Text] = [
        _styled(role, "symptom" if row.symptom else "role"),
        _styled(drift.kind.value, "kind"),
        Text(clean(drift.path)),
        change or _styled(BELOW, "meta"),
        _styled(drift.action.value, "report_only" if drift.action in REPORT_ONLY else "action"),
    ]
    out: list[RenderableType] = [_line(cells, widths) or _grid(cells, widths)]
    under = ROW_INDENT + widths.role + GAP  # below-row lines start at the kind column
    if row.folded and change is None:
        out.append(_indented(_folded(row), under, widths.total))
    elif change is None:
        labelled = [
            [_styled("desired", "meta"), _styled(desired, "desired")],
            [_styled("observed", "meta"), _styled(observed, "observed")],
        ]
        lines = _folded_values(labelled, under, widths.total)
        if lines is not None:
            out += lines
        else:
            out.append(_value_grid(labelled, under))
    # Where it is, always on a line of its own: a list of boxes and containers.
    out.append(_indented(_styled(f"on: {clean(places)}", "where"), under, widths.total))
    for field, style in (("source", "source"), ("note", "note")):
        seen = per_box(row, field, BOXES_NAMED)
        texts = [clean(t) + (f" ({boxes})" if boxes else "") for t, boxes in seen]
        if len(texts) > MAX_LISTED:  # one per container: `on:` names them, JSON has each
            texts = [f"{len(texts)} different (--format json lists each entry's)"]
        for text in texts:
            out.append(_indented(_styled(f"{field}: {text}", style), under, widths.total))
    return out


def _indented(text: Text, indent: int, total: int) -> RenderableType:
    """`text` after `indent` spaces: one line if it fits, else wrapped under its start."""
    from rich.cells import cell_len
    from rich.padding import Padding

    width = cell_len(text.plain)
    line = _padded([text], [width], indent) if indent + width <= total else None
    return line or Padding(text, (0, 0, 0, indent))


def _columns(widths: _Widths) -> list[int]:
    return [widths.role, widths.kind, widths.path, widths.change, widths.action]


def _folded_values(rows: list[list[Text]], indent: int, total: int) -> list[Text] | None:
    """The desired and observed values below a row, line by line as the two-column grid
    (`_value_grid`) lays them out, without laying out a table: the values' column as wide as
    the longest value, at most the rest of the line, and a longer value folded across it (a
    mesh's seeds, a speculative config: on nearly every row of a large fleet's report, where
    a rich table per value cost ~1.5 s at 1,000 boxes). None where the width leaves the
    values too little room to fold (the grid squeezes the labels then)."""
    from rich.cells import cell_len
    from rich.text import Text

    label, room = len("observed"), total - indent - len("observed") - GAP
    if room < label:
        return None
    width = min(room, max(cell_len(value.plain) for _, value in rows))
    out: list[Text] = []
    for name, value in rows:
        pieces = (
            [value]
            if cell_len(value.plain) <= width
            else value.wrap(_measuring_console(), width, overflow="fold")
        )
        for index, piece in enumerate(pieces):
            line = _padded([name if index == 0 else Text(""), piece], [label, width], indent)
            if line is None:
                return None
            out.append(line)
    return out


@functools.cache
def _measuring_console() -> Console:
    """A console only for wrapping text (its tab size, its cell widths); it prints nothing."""
    from rich.console import Console

    return Console(width=200, color_system=None, markup=False, highlight=False)


def _value_grid(rows: list[list[Text]], indent: int) -> RenderableType:
    """The values below a row as rich's two-column grid, labels then values folded."""
    from rich.padding import Padding
    from rich.table import Table

    values = Table.grid(padding=(0, GAP, 0, 0))
    values.add_column(width=len("observed"))
    values.add_column(overflow="fold")
    for labels in rows:
        values.add_row(*labels)
    return Padding(values, (0, 0, 0, indent), expand=False)


def _line(cells: list[Text], widths: _Widths) -> Text | None:
    """The row as one line of text, padded as the grid would pad it, when every cell fits its
    column on one line (nearly every row); None otherwise. A rich table per row cost 30 ms a
    box: the text report of 1,000 boxes took half a minute."""
    return _padded(cells, _columns(widths), ROW_INDENT)


def _padded(cells: list[Text], columns: list[int], indent: int) -> Text | None:
    """`cells` on one line, each padded to its column in its own style, GAP between; None if
    a cell does not fit its column on one line."""
    from rich.cells import cell_len
    from rich.text import Text

    if len(cells) != len(columns):
        return None
    line = Text(" " * indent)
    for index, (cell, width) in enumerate(zip(cells, columns, strict=True)):
        used = cell_len(cell.plain)
        if used > width or "\n" in cell.plain:
            return None
        if index:
            line.append(" " * GAP)
        padded = cell.copy()  # the padding takes the cell's style, as in the grid
        padded.pad_right(width - used)
        line.append_text(padded)
    return line


def _grid(cells: list[Text], widths: _Widths) -> RenderableType:
    """The row as a grid: cells that do not fit fold within their column."""
    from rich.padding import Padding
    from rich.table import Table

    grid = Table.grid(padding=(0, GAP, 0, 0))
    for width in _columns(widths):
        grid.add_column(width=width, overflow="fold")
    grid.add_row(*cells)
    return Padding(grid, (0, 0, 0, ROW_INDENT), expand=False)


def _folded(row: Row) -> Text:
    """A folded row's values: how many (grouped.rows), what they observed if the same, and
    its secret tag."""
    tag = secret_tag(row.first)
    folded = _styled(folded_values(row), "meta")
    if row.observed:  # what they all observed, cut as a listed row's value is
        folded.append(ARROW)
        folded.append(abbreviate_pair("", row.observed, VALUE_LIMIT)[1], style=STYLE["observed"])
    if tag:
        folded.append(f" ({tag})", style=STYLE["secret_tag"])
    return folded


def _change(desired: str, observed: str, suffix: str, width: int) -> Text | None:
    """`desired -> observed` on one line, or `-> observed` on a second line; None if even
    that does not fit (the caller then prints the values below the row)."""
    from rich.text import Text

    if len(desired) + len(ARROW) + len(observed) + len(suffix) <= width:
        arrow = ARROW
    elif len(desired) <= width and len(ARROW.lstrip()) + len(observed) + len(suffix) <= width:
        arrow = "\n" + ARROW.lstrip()
    else:
        return None
    change = Text()  # styles per span: a base style would colour the arrow too
    change.append(desired, style=STYLE["desired"])
    change.append(arrow)
    change.append(observed, style=STYLE["observed"])
    if suffix:
        change.append(suffix, style=STYLE["secret_tag"])
    return change


def _widths(laid_out: list[tuple[Row, str]], width: int) -> _Widths:
    """Each column as wide as its longest value (path and change capped); when that is too
    wide, columns give up room in SHRINK order, each down to its floor. Below ~60 columns
    that is still too wide; rich then squeezes every column to fit."""
    drifts = [row.first for row, _ in laid_out]
    changes = [len(_folded(row)) if row.folded else _one_line(row.first) for row, _ in laid_out]
    one_line = [n for n in changes if n <= CHANGE_MAX]  # longer ones go below
    natural = {
        "role": max((len(ROLES[row.symptom]) for row, _ in laid_out), default=5),
        "kind": max((len(d.kind.value) for d in drifts), default=4),
        "path": min(max((len(clean(d.path)) for d in drifts), default=4), PATH_MAX),
        "change": max(one_line, default=len(BELOW)),
        "action": max((len(d.action.value) for d in drifts), default=6),
    }
    have, _ = _shrink(natural, width, SHRINK)
    return _Widths(**have, total=width)


def _shrink(
    natural: dict[str, int], width: int, order: tuple[tuple[str, int], ...]
) -> tuple[dict[str, int], int]:
    have = dict(natural)
    columns = sum(1 for n in have.values() if n)
    excess = ROW_INDENT + GAP * (columns - 1) + sum(have.values()) - width
    for name, floor in order:
        give = max(0, min(excess, have[name] - min(floor, natural[name])))
        have[name] -= give
        excess -= give
    return have, excess


def _one_line(drift: Drift) -> int:
    tag = secret_tag(drift)
    desired, observed = display(drift.desired), display(drift.observed)
    return len(desired) + len(ARROW) + len(observed) + (len(f" ({tag})") if tag else 0)


def _styled(text: str, style: str) -> Text:
    from rich.text import Text

    return Text(text, style=STYLE[style])
