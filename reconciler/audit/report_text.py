"""The audit for a terminal: one matrix row per box, then each verdict's reasons, then the mesh.

    audit: inventory inventory/lab.yaml, run 20261129T…, 2026-11-29T09:00:00Z
     box     posture   no key      key  .env               gateway runs          …  verdict
                       h  c  m  p
     thor    keyed     lo 200 …    -    API commented :839  API empty              FAIL
             live open mesh 200 …       MESH set 2df83c…    MESH 2df83c… .env:1196

Cells are short on purpose (the details are in the findings below the matrix); digests are 6
hex of the report digest, so equal values read as equal down a column. Styling follows
reconciler/report/text.py: rich with markup off (box content is text, never style), colour
only on a terminal, trailing blanks stripped.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from reconciler.audit import phrases
from reconciler.audit.evidence import BoxEvidence, Carried, EnvLine, ShellExport, Side, key_use
from reconciler.audit.report import AuditReport
from reconciler.audit.report_json import host_network_error, mesh_names, names_of, naming
from reconciler.audit.verdict import Severity, Verdict
from reconciler.report.values import clean

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

LABEL = {"GATEWAY_API_KEY": "API", "CULTURE_VLLM_API_KEY": "CULTURE", "LOBES_MESH_KEY": "MESH"}
STYLE = {
    Severity.OK: "green",
    Severity.WARN: "yellow",
    Severity.FAIL: "bold red",
    "meta": "dim",
    "head": "bold",
    "reason": "dim",
}
LEGEND = (
    "no key: GET /health, /capabilities, /v1/models, POST /v1/chat/completions without "
    "credentials, from the box (lo) and from the controller (mesh); key: GET /v1/models with "
    "the right key, on the box. API = GATEWAY_API_KEY, CULTURE = CULTURE_VLLM_API_KEY, "
    "MESH = LOBES_MESH_KEY; digests are comparable within this run only."
)
EXIT_MEANING = {0: "every verdict ok", 1: "a box could not be audited", 2: "findings"}


def render_text(report: AuditReport, color: bool = False, width: int = 100) -> str:
    from rich.console import Console

    out = io.StringIO()
    console = Console(
        file=out,
        width=width,
        force_terminal=color,
        no_color=not color,
        color_system="standard" if color else None,
        markup=False,
        highlight=False,
        emoji=False,
        force_jupyter=False,
        force_interactive=False,
    )
    console.print(
        _styled(
            f"audit: inventory {clean(report.inventory)}, run {clean(report.run_id)}, "
            f"{clean(report.generated_at)}",
            "meta",
        )
    )
    _matrix(console, report)
    console.print(_styled(LEGEND, "meta"))
    for row, verdict in zip(report.rows, report.verdicts, strict=True):
        console.print()
        _verdict_block(console, row.box, verdict, names_of(row))
    console.print()
    _verdict_block(console, "mesh", report.mesh_verdict, mesh_names(report))
    console.print()
    console.print(_styled(sentence(report), "head"))
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"


def sentence(report: AuditReport) -> str:
    boxes = ", ".join(f"{v.subject} {v.verdict.value}" for v in report.verdicts)
    code = report.exit_code
    return f"audit: {boxes}; mesh {report.mesh_verdict.verdict.value} (exit {code}: " + (
        f"{EXIT_MEANING[code]})"
    )


def _matrix(console: Console, report: AuditReport) -> None:
    """Two matrices, one row per box each: who can call (posture, probes, exposure), then
    where the keys come from. One table with every column would not fit 100 columns."""
    rows = list(report.rows)
    pairs = list(zip(report.rows, report.verdicts, strict=True))
    console.print(
        _table(
            (
                "box",
                "want",
                "live",
                "no key (lo)\nh   c   m   p",
                "no key (mesh)\nh   c   m   p",
                "key",
                "published",
                "mesh",
                "verdict",
            ),
            [access_cells(row, verdict) for row, verdict in pairs],
        )
    )
    console.print()
    console.print(
        _table(
            ("box", ".env", "gateway runs with", "login shell exports", "key use"),
            [key_cells(row, rows) for row in report.rows],
        )
    )


def _table(titles: tuple[str, ...], rows: list[list[Text | str]]) -> Table:
    from rich import box as rich_box
    from rich.table import Table

    table = Table(
        box=rich_box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
        header_style=STYLE["head"],
    )
    for title in titles:
        # Short words read wrong when broken, and rich would rather drop a whole column than
        # leave it narrow: a floor for every column, the probes and free text wrap below 100.
        short = title in ("box", "want", "live", "key", "mesh", "verdict")
        table.add_column(title, overflow="fold", no_wrap=short, min_width=None if short else 9)
    for row in rows:
        table.add_row(*row)
    return table


def access_cells(row: BoxEvidence, verdict: Verdict) -> list[Text | str]:
    verdict_cell = _styled(verdict.verdict.value.upper(), verdict.verdict)
    if not row.audited:
        why = f"not audited ({row.fault.kind.value})" if row.fault else "not audited"
        if row.collected:  # the box answered, its gateway did not: what it publishes is known
            return [
                clean(row.box),
                row.intent.auth,
                "?",
                "not audited (gateway: no answer)",
                _codes(row.mesh_side),
                "?",
                _published(row),
                "?",  # what a gateway that does not answer runs with is not what it serves
                verdict_cell,
            ]
        if row.partial:  # its gateway answered the controller: the mesh side is known
            live = _styled(
                row.posture, Severity.OK if row.posture == row.intent.auth else Severity.FAIL
            )
            mesh = {True: "on", False: "off", None: "?"}[row.mesh_detect]
            cells: list[Text | str] = [live, why, _codes(row.mesh_side), "?", "?", mesh]
            return [clean(row.box), row.intent.auth, *cells, verdict_cell]
        return [clean(row.box), row.intent.auth, "?", why, "", "", "", "", verdict_cell]
    mesh = "on" if row.mesh_on else "off"
    if row.intent.mesh != row.mesh_on:
        mesh += f" (want {'on' if row.intent.mesh else 'off'})"
    live = _styled(row.posture, Severity.OK if row.posture == row.intent.auth else Severity.FAIL)
    return [
        clean(row.box),
        row.intent.auth,
        live,
        _codes(row.loopback),
        _codes(row.mesh_side),
        phrases.status(row.keyed) if row.posture in ("keyed", "mixed") else "-",
        _published(row),
        mesh,
        verdict_cell,
    ]


def key_cells(row: BoxEvidence, rows: list[BoxEvidence]) -> list[Text | str]:
    if not row.collected:
        return [clean(row.box), "", "", "", ""]
    return [
        clean(row.box),
        "\n".join(_env(line) for line in row.envfile.values() if line.state != "absent")
        or "no keys",
        "\n".join(
            _carried(c, row.shell_unread is not None)
            for c in row.carried.values()
            if c.digest or c.origin != "none" or c.name == "GATEWAY_API_KEY"
        ),
        "\n".join(f"{LABEL.get(s.name, s.name)} {_export(s)}" for s in row.shell)
        or ("not traced" if row.shell_unread is not None else "-"),
        _keys(row, rows),
    ]


def _export(s: ShellExport) -> str:
    value = phrases.short(s.digest) if s.digest else "empty"
    return f"{value} {clean(s.source or '?')}"


def _codes(side: Side | None) -> str:
    if side is None:
        return "-"
    probes = (side.health, side.capabilities, side.models, side.chat)
    return " ".join(f"{phrases.status(p):<3}" for p in probes)


def _env(line: EnvLine) -> str:
    label = LABEL.get(line.name, line.name)
    at = f" :{line.line}" if line.line else ""
    if line.state == "set":
        return f"{label} set {phrases.short(line.digest)}{at}" if line.digest else f"{label} set"
    if line.state == "commented-out":
        return f"{label} # {phrases.short(line.digest)}{at}" if line.digest else f"{label} #{at}"
    return f"{label} {line.state}{at}"


def _carried(c: Carried, shell_untraced: bool = False) -> str:
    label = LABEL.get(c.name, c.name)
    value = phrases.short(c.digest) if c.digest else "empty"
    said = clean(c.where) if c.where else ""  # the box's own words (a login file's name)
    where = {
        "env": said or ".env",
        "shell": said or "login shell",
        "env+shell": f"{said} + shell",
        # Not .env's: stale, or the login shell's when its trace failed (it may give it).
        "unexplained": "not .env (shell not traced)" if shell_untraced else "not .env (stale?)",
        "unknown": ".env unread",
    }.get(c.origin, "")
    return f"{label} {value} {where}".rstrip()


def _published(row: BoxEvidence) -> str:
    pub = row.published
    if pub is None:
        return "-"
    lines = [f"gw {b.address}" for b in pub.gateway] or ["gw none"]
    lines += [f"LANE {clean(b.service or b.container)} {b.address}" for b in pub.lanes]
    lines += [f"HOST-NET {clean(name)}" for name in pub.host_network]
    if host_network_error(row) is not None:
        # Not listed: which lanes run on the host network is unknown, never "none" (the why is
        # among the box's findings, audit.unobserved).
        lines.append("HOST-NET ?")
    lines += [
        f"{'expected' if b.expected_by else 'STRAY'} {clean(b.container)} {b.address}"
        for b in pub.stray
    ]
    lines += [
        f"{'expected' if name in pub.declared else 'STRAY'} HOST-NET {clean(name)}"
        for name in pub.stray_host_network
    ]
    return "\n".join(lines)


def _keys(row: BoxEvidence, rows: list[BoxEvidence]) -> str:
    lines = []
    for name, use in key_use(row, rows).items():
        label = "API" if name == "inbound" else "MESH"
        if use.digest is None:
            continue
        desired = {True: "desired", False: "NOT desired", None: "desired ?"}[use.matches_desired]
        lines.append(f"{label} {desired}")
        if use.same_as:
            lines.append(f"  {phrases.same_as(list(use.same_as))}")
    return "\n".join(lines) or "-"


def _verdict_block(console: Console, subject: str, verdict: Verdict, names: set[str]) -> None:
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    head = Text()
    head.append(clean(subject), style=STYLE["head"])
    head.append(": ")
    head.append(verdict.verdict.value.upper(), style=STYLE[verdict.verdict])
    if not verdict.audited:
        head.append(" (not audited)", style=STYLE[Severity.FAIL])
    console.print(head)
    # A grid keeps wrapped lines under their text, not under the severity.
    grid = Table.grid(padding=(0, 2, 0, 0))
    grid.add_column(width=4)
    grid.add_column(overflow="fold")
    # Free text, scrubbed; the names in it shown as names (report_json.naming), then cleaned.
    for reason in verdict.reasons:
        grid.add_row(_styled("·", "reason"), _styled(clean(naming(reason, names)), "reason"))
    for f in verdict.findings:
        line = Text()
        line.append(f"{f.code}: ", style=STYLE["head"])
        line.append(clean(naming(f.message, names)))
        grid.add_row(_styled(f.severity.value, f.severity), line)
    console.print(Padding(grid, (0, 0, 0, 2)))


def _styled(text: str, style: Severity | str) -> Text:
    from rich.text import Text

    return Text(text, style=STYLE[style])
