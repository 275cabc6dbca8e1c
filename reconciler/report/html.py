"""`--format html`: one self-contained page (no script, no CDN, no fetch) for drift and audit.

Jinja2 renders it with autoescape on, so every value (an observed value is whatever the box
says, and can be hostile) reaches the page as text. Jinja2 is imported here only, and this
module only when html is asked for: the repeated text/json drift path never loads it.
The page's Content-Security-Policy allows inline styles and data: images and nothing else,
so even markup that slipped through could neither run nor fetch anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.compare.drift import Action, BoxResult, DriftReport, Part
from reconciler.report import grouped
from reconciler.report.values import clean, display, free_text, guarded, secret_tag

GATEWAY = "gateway"
BOX_WIDE = "box-wide"  # .env, compose files, the login shell, the host: not one lane's
# Entries a converge does nothing about: a person decides, so the cell warns, not fails.
REPORT_ONLY = frozenset({Action.REPORT, Action.SCRUB_SHELL})
RANK = {"ok": 0, "warn": 1, "fail": 2, "unobserved": 3}


@dataclass(frozen=True)
class Cell:
    state: str  # ok / warn / fail / unobserved / absent (no such lane on the box)
    count: int = 0
    title: str = ""


def environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("reconciler.report", "templates"),
        autoescape=True,  # every value is text, whatever it holds
        undefined=jinja2.StrictUndefined,  # a template typo fails the render, never blank
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # Names the page shows as the other formats do: control and bidi characters escaped (a
    # U+202E in a lane's or a box's name must not reorder the page, ESC and NUL are no text).
    env.filters["clean"] = clean
    return env


def columns(lanes: Mapping[str, Sequence[str]], boxes: Sequence[str], seen: set[str]) -> list[str]:
    """The gateway, every lane of any box (desired first, in order, then lanes only drift
    names), then the box-wide column."""
    out: list[str] = [GATEWAY]
    for box in boxes:
        out += [lane for lane in lanes.get(box, ()) if lane not in out]
    out += sorted(lane for lane in seen if lane not in out and lane != BOX_WIDE)
    return [*out, BOX_WIDE]


def column_of(subject: str) -> str:
    if subject == GATEWAY:
        return GATEWAY
    if subject.startswith("lane:"):
        return subject.removeprefix("lane:")
    return BOX_WIDE


def worse(a: str, b: str) -> str:
    return a if RANK.get(a, 0) >= RANK.get(b, 0) else b


def sparkline(counts: Sequence[int], width: int = 120, height: int = 24) -> dict[str, Any] | None:
    """An inline SVG polyline's points for `counts` (oldest first); None under two points."""
    if len(counts) < 2:
        return None
    top = max(max(counts), 1)
    step = width / (len(counts) - 1)
    points = " ".join(
        f"{i * step:.1f},{height - 2 - (c / top) * (height - 4):.1f}" for i, c in enumerate(counts)
    )
    return {"points": points, "width": width, "height": height, "counts": list(counts)}


def drift_matrix(
    report: DriftReport, lanes: Mapping[str, Sequence[str]]
) -> tuple[list[str], dict[str, dict[str, Cell]]]:

    seen = {column_of(d.subject) for d in report.drifts}
    cols = columns(lanes, [b.box for b in report.boxes], seen)
    matrix: dict[str, dict[str, Cell]] = {}
    for box in report.boxes:
        own = set(lanes.get(box.box, ())) | {GATEWAY, BOX_WIDE}
        unseen = unobserved(box)
        # Every entry is drift the run saw: compare makes none where it could not look
        # (dockerd down: no "no container" lanes), and what a faulted part still showed (the
        # controller's own probes of a gateway whose /health timed out, a `.env` read while
        # the login shell hung) keeps its cell's colour, its hover saying what was not seen.
        # Greyed, a gateway answering without a key read "not observed".
        row: dict[str, Cell] = {}
        for col in cols:
            drifts = [d for d in box.drifts if column_of(d.subject) == col]
            if not box.reachable and box.partial is None:
                row[col] = Cell("unobserved", title="not observed")
                continue
            why = unseen.get(col if col in (GATEWAY, BOX_WIDE) else LANES)
            here = col in own or not lanes
            if not drifts:
                if not here:
                    row[col] = Cell("absent")
                elif why is not None:
                    row[col] = Cell("unobserved", title=f"not observed: {why}")
                else:
                    row[col] = Cell("ok", title="in sync")
                continue
            state = "warn" if all(d.action in REPORT_ONLY for d in drifts) else "fail"
            kinds = sorted({d.kind.value for d in drifts})
            title = f"{len(drifts)} entries: {', '.join(kinds)}"
            if why is not None:
                title += f"; not all observed: {why}"
            row[col] = Cell(state, len(drifts), title)
        matrix[box.box] = row
    return cols, matrix


LANES = ""  # in unobserved(): every lane's column
# The columns a part of the box answers for: when it had a fault, a cell there without drift
# is not "in sync" but not observed (grey). Parts not listed leave every cell observed (a
# connection only through an existing master still brought the whole answer).
_UNSEEN: dict[Part, tuple[str, ...]] = {
    Part.DOCKER: (LANES, GATEWAY),  # no container inspected
    Part.RENDER: (LANES, GATEWAY),  # command, environment, runtime not compared
    Part.DEPLOYMENT: (LANES, GATEWAY, BOX_WIDE),
    Part.GATEWAY_PROBE: (GATEWAY,),  # contract and auth from the box's side
    Part.LOGIN_SHELL: (BOX_WIDE,),
    Part.VARIABLES: (BOX_WIDE,),
    Part.BOX_FILE: (BOX_WIDE,),
    Part.SECRET_SOURCE: (BOX_WIDE,),
    # Only the lanes' pending recreates go unjudged (entries of their own, report-only): every
    # other entry of every column was compared.
    Part.CONFIG_HASH: (),
}


def unobserved(box: BoxResult) -> dict[str, str]:
    """Column (LANES: every lane) -> why it was not observed, for a box that was. A partial box
    (its gateway answered the controller, SSH did not): every column, the gateway included
    (its container was not inspected)."""
    if box.partial is not None:
        why = "only the gateway's answers to the controller were seen"
        return {LANES: why, GATEWAY: why, BOX_WIDE: why}
    out: dict[str, str] = {}
    for error in box.errors:
        part = getattr(error, "part", None)  # a plain string (made by hand) names no part
        for col in _UNSEEN.get(part, ()) if isinstance(part, Part) else ():
            out.setdefault(col, free_text(str(error)))
    return out


def drift_causes(report: DriftReport) -> list[dict[str, Any]]:
    """The causes as text and markdown list them (grouped.py), as plain strings."""
    order = tuple(b.box for b in report.boxes)
    out = []
    for cause in grouped.causes(report):
        rows = []
        for row in grouped.rows(cause, fold=True):
            d = row.first
            tag = secret_tag(d)
            folded = ""
            if row.folded:  # many values, one per box (grouped.rows): how many, in their place
                folded = grouped.folded_change(row) + (f" ({tag})" if tag else "")
            rows.append(
                {
                    "symptom": row.symptom,
                    "kind": d.kind.value,
                    "path": clean(d.path),
                    "folded": folded,
                    "desired": display(d.desired),
                    "observed": display(d.observed) + (f" ({tag})" if tag else ""),
                    "action": d.action.value,
                    "where": clean(grouped.where(row, order)),
                    # As text and markdown print them (clean: escaped, wire digests masked):
                    # free_text's key-shaped-run masking would hide a container's name.
                    "notes": [clean(n) for n, _ in grouped.per_box(row, "note")],
                    "sources": [clean(s) for s, _ in grouped.per_box(row, "source")],
                }
            )
        out.append(
            {
                "id": clean(cause.id),
                "boxes": [clean(box) for box in cause.boxes],
                "entries": cause.entries,
                "rows": rows,
            }
        )
    return out


def render_drift_html(
    report: DriftReport,
    lanes: Mapping[str, Sequence[str]] | None = None,
    history: Mapping[str, Sequence[int]] | None = None,
) -> str:
    """`lanes`: each box's desired lanes (services); `history`: each box's drift entry counts,
    oldest first, this run last (no sparkline for a box without)."""
    from reconciler.history.parts import seen_in_full
    from reconciler.report.summary import summarize

    report = guarded(report)
    cols, matrix = drift_matrix(report, lanes or {})
    boxes = []
    for box in report.boxes:
        boxes.append(
            {
                "name": clean(box.box),
                "observation": clean(box.observation),
                "partial": free_text(box.partial) if box.partial else None,
                "errors": [free_text(str(e)) for e in box.errors],
                # Every entry found (what the metrics count). Unless every part was observed
                # (history/parts.py) the count is a lower bound, and a 0 is not known
                # (dockerd down is no box in sync): the badge says so.
                "entries": len(box.drifts),
                "seen": seen_in_full(box),
                "spark": sparkline((history or {}).get(box.box, ())),
            }
        )
    causes = drift_causes(report)
    s = summarize(report, causes=len(causes))
    return (
        environment()
        .get_template("drift.html.j2")
        .render(
            title=f"drift: {clean(report.inventory)}",
            inventory=clean(report.inventory),
            run_id=clean(report.run_id),
            generated_at=clean(report.generated_at),
            summary=s,
            columns=cols,
            matrix=matrix,
            boxes=boxes,
            causes=causes,
        )
    )


def drift_page(report: DriftReport, inputs: Any, history: Any, root: str | None = None) -> str:
    """The CLI's entry: lanes from the drift inputs (the desired state), each box's earlier
    counts from the history store `history` (a Path, or None: no sparkline), this run last.
    `root`: the fleet repository (hooks.RunOutputs.root): only this fleet's runs are drawn
    (another inventory's or repository's box of the same name is another box)."""
    from reconciler.history.parts import seen_in_full
    from reconciler.history.series import drift_counts

    names = [b.box for b in report.boxes]
    lanes = {b: list(inputs.expectations[b].lanes) for b in names if b in inputs.expectations}
    series = drift_counts(history, names, inventory=report.inventory, root=root)
    for box in report.boxes:
        # Only a box observed in full has its count (a gap is not zero drift), as the store's.
        if box.box in series and seen_in_full(box):
            series[box.box].append(len(box.drifts))
    return render_drift_html(report, lanes, series)
