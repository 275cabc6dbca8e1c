"""`reconcile audit --format html`: the page of reconciler/report/html.py for an audit.

The matrix is boxes x (gateway + lanes): the gateway cell is the box's auth verdict, a lane
cell fails when the lane publishes a host port (callers reach it around the gateway's key; a
loopback-only port warns, as the verdict says). Under it: each box's findings, then the mesh
and its weakest-link proof. Values come from the JSON document (report_json.to_document), which
has already scrubbed every free-text field; Jinja2 escapes them all on top.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reconciler.audit.report import AuditReport
from reconciler.audit.report_json import host_network_error
from reconciler.report.html import BOX_WIDE, GATEWAY, Cell, environment, sparkline, worse


def audit_matrix(
    report: AuditReport, lanes: Mapping[str, Sequence[str]]
) -> tuple[list[str], dict[str, dict[str, Cell]]]:
    cols: list[str] = [GATEWAY]
    for row in report.rows:
        cols += [lane for lane in lanes.get(row.box, ()) if lane not in cols]
    # box -> lane -> (worst state, why) of the ways it is reachable around the gateway
    published: dict[str, dict[str, tuple[str, str]]] = {}

    def reachable(box: str, lane: str, state: str, why: str) -> None:
        if lane not in cols:
            cols.append(lane)
        mine = published.setdefault(box, {})
        was, said = mine.get(lane, ("ok", why))
        now = worse(was, state)
        mine[lane] = (now, why if now != was else said)  # the worst way's words

    for row in report.rows:
        pub = row.published
        if pub is None:
            continue
        for b in pub.lanes:
            state = "warn" if b.loopback else "fail"
            reachable(row.box, b.service or b.container, state, "publishes a host port")
        # A lane on the host network publishes nothing, yet every port it opens is on the box
        # (verdict.py: publish.host-network, a failure).
        for name in pub.host_network:
            if name != row.gateway_container:
                lane = pub.host_network_services.get(name) or name
                reachable(row.box, lane, "fail", "runs on the host network")
    matrix: dict[str, dict[str, Cell]] = {}
    for row, verdict in zip(report.rows, report.verdicts, strict=True):
        # The host network's containers not listed: a lane publishing no port may still run on
        # it, so no lane without a finding is "no host port" (docs/audit-report.md).
        unlisted = host_network_error(row) is not None
        cells: dict[str, Cell] = {}
        for col in cols:
            # A box whose gateway alone is silent: its lanes' exposure was seen all the same.
            if not verdict.audited and (col == GATEWAY or not row.collected):
                cells[col] = Cell("unobserved", title="not audited")
            elif col == GATEWAY:
                n = len(verdict.findings)
                cells[col] = Cell(verdict.verdict.value, n, f"auth verdict {verdict.verdict.value}")
            elif col in published.get(row.box, {}):
                state, why = published[row.box][col]
                cells[col] = Cell(state, 1, f"{why}: reachable around the gateway")
            elif (col in lanes.get(row.box, ()) or not lanes) and unlisted:
                cells[col] = Cell("unobserved", title="host network not listed")
            elif col in lanes.get(row.box, ()) or not lanes:
                cells[col] = Cell("ok", title="no host port")
            else:
                cells[col] = Cell("absent")
        matrix[row.box] = cells
    return cols, matrix


def render_html(
    report: AuditReport,
    lanes: Mapping[str, Sequence[str]] | None = None,
    history: Mapping[str, Sequence[int]] | None = None,
) -> str:
    """`history`: each box's drift entry counts over its drift runs (sparklines), if any."""
    from reconciler.audit.report_json import to_document
    from reconciler.audit.report_text import sentence

    doc = to_document(report)
    cols, matrix = audit_matrix(report, lanes or {})
    boxes = [{**b, "spark": sparkline((history or {}).get(b["box"], ()))} for b in doc["boxes"]]
    return (
        environment()
        .get_template("audit.html.j2")
        .render(
            title=f"audit: {report.inventory}",
            doc=doc,
            sentence=sentence(report),
            columns=[c for c in cols if c != BOX_WIDE],
            matrix=matrix,
            boxes=boxes,
            mesh=doc["mesh"],
        )
    )


def audit_page(report: AuditReport, fleet: Any, history: Any, root: str | None = None) -> str:
    """The CLI's entry: lanes from the desired state, sparklines from the history store (this
    fleet's drift runs: its inventory, in `root`, the fleet repository)."""
    from reconciler.history.series import drift_counts

    names = [r.box for r in report.rows]
    lanes = {
        name: [lane.service_name for lane in fleet.boxes[name].lanes.values()]
        for name in names
        if name in fleet.boxes
    }
    counts = drift_counts(history, names, inventory=report.inventory, root=root)
    return render_html(report, lanes, counts)
