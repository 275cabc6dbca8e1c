"""Drift reports for people (text, markdown) and machines (versioned JSON).

`render()` is the one entry point the CLI needs; each format's module, and rich, are imported
only when that format is asked for, since the CLI's import time is part of every run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from reconciler.compare.drift import DriftReport

Format = Literal["text", "json", "markdown", "html"]
FORMATS: tuple[Format, ...] = ("text", "json", "markdown", "html")


def render(report: DriftReport, fmt: Format, color: bool = False, width: int = 100) -> str:
    """The report in `fmt`; `color` and `width` apply to text only."""
    if fmt == "text":
        from reconciler.report.text import render_text

        return render_text(report, color=color, width=width)
    if fmt == "json":
        from reconciler.report.json_report import render_json

        return render_json(report)
    if fmt == "markdown":
        from reconciler.report.markdown import render_markdown

        return render_markdown(report)
    if fmt == "html":  # without lanes or history; the CLI passes both (report/html.py)
        from reconciler.report.html import render_drift_html

        return render_drift_html(report)
    raise ValueError(f"unknown report format {fmt!r} (one of: {', '.join(FORMATS)})")


__all__ = ["FORMATS", "Format", "render"]
