"""The markdown report's `|` (sixth review): escaped as `\\|` in a table cell only.

GFM splits a table row on `|` even inside a code span, so a cell's code span says `\\|` and the
table takes the backslash away. Anywhere else a code span shows its backslashes: an error, a
fact, a cause id holding `a|b` read `a\\|b` in a change record. Rendered here with markdown-it-py
(rich's own markdown parser, so always installed), its GFM tables enabled, as GitHub reads it.
"""

from __future__ import annotations

import re

from markdown_it import MarkdownIt
from markdown_it.token import Token

from reconciler.compare.drift import Action, BoxError, BoxResult, Drift, DriftReport, Kind
from reconciler.report.markdown import render_markdown

PIPED_KEY = "OPTS|EXTRA"  # its cause id, `envfile:OPTS|EXTRA`, is a heading and a list item
PIPED_VALUE = "cat a | tee b"
ERROR = BoxError("box", "gateway", "curl: (7) a|b refused")
FACT = "x|y"


def piped_report() -> DriftReport:
    drift = Drift(
        "thor",
        Kind.ENVFILE,
        "file:.env",
        PIPED_KEY,
        PIPED_VALUE,
        "cat a",
        Action.REWRITE_ENV,
        source=".env:3",
        note="a | in the note",
    )
    return DriftReport(
        boxes=(BoxResult("thor", True, drifts=(drift,), errors=(ERROR,), facts={"shell": FACT}),),
        inventory="lab",
        generated_at="2026-11-29T08:30:00Z",
        run_id="20261129T083000Z-7f3a",
    )


def code_spans(tokens: list[Token]) -> tuple[list[str], list[str]]:
    """The code spans' text as a reader sees it: (outside tables, inside tables)."""
    outside: list[str] = []
    inside: list[str] = []
    depth = 0
    for token in tokens:
        depth += {"table_open": 1, "table_close": -1}.get(token.type, 0)
        for child in token.children or ():
            if child.type == "code_inline":
                (inside if depth else outside).append(child.content)
    return outside, inside


def test_a_pipe_outside_a_table_is_shown_as_it_is_and_tables_keep_their_columns() -> None:
    md = render_markdown(piped_report())
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    outside, inside = code_spans(tokens)
    cause = f"envfile:{PIPED_KEY}"
    # The heading, the box's cause list, its error and its fact: as the box said them
    assert outside.count(cause) == 2, outside
    assert str(ERROR) in outside, outside
    assert f"shell={FACT}" in outside, outside
    assert not [span for span in outside if "\\" in span], outside
    # In the tables: every row as wide as its header (a parser drops a row's extra cells, so
    # they are counted in the text: a `|` without a backslash ends a cell)
    tables: list[list[int]] = [[]]
    for line in md.splitlines():
        if line.startswith("|"):
            tables[-1].append(len(re.findall(r"(?<!\\)\|", line)))
        elif tables[-1]:
            tables.append([])
    widths = [sorted(set(t)) for t in tables if t]
    assert widths == [[6], [10]], md  # the summary's 5 columns, the cause's 9
    # and what a reader sees in them: the values whole, without backslashes
    assert PIPED_KEY in inside and PIPED_VALUE in inside, inside
    assert not [span for span in inside if "\\" in span], inside
