"""The audit as GitHub-flavoured markdown, for a change record or an incident ticket.

The same matrices as the text report (one row per box), then each verdict with its reasons
and findings. Escaping is the drift report's (`report.markdown.text` / `code`): everything in
a cell came from a box and is untrusted.
"""

from __future__ import annotations

from collections.abc import Sequence

from reconciler.audit import report_text as cells
from reconciler.audit.evidence import BoxEvidence
from reconciler.audit.report import AuditReport
from reconciler.audit.report_json import mesh_names, names_of, naming
from reconciler.audit.verdict import Verdict
from reconciler.report.markdown import code, text

EXIT_MEANING = cells.EXIT_MEANING


def render_markdown(report: AuditReport) -> str:
    rows = list(report.rows)
    code_ = report.exit_code
    lines = [
        f"# Mesh audit: {text(report.inventory)}, run {code(report.run_id)}, "
        f"{text(report.generated_at)}",
        "",
        f"Exit code {code_}: {EXIT_MEANING.get(code_, 'unknown')}.",
        "",
        f"**{text(cells.sentence(report))}**",
        "",
        "## Who can call what",
        "",
        *_table(
            (
                "box",
                "want",
                "live",
                "no key (loopback)",
                "no key (mesh side)",
                "key",
                "published",
                "mesh",
                "verdict",
            ),
            [_access(r, v) for r, v in zip(report.rows, report.verdicts, strict=True)],
        ),
        "",
        "No key: `GET /health`, `GET /capabilities`, `GET /v1/models`, `POST "
        "/v1/chat/completions` without credentials. Key: `GET /v1/models` with the right key, "
        "sent on the box.",
        "",
        "## Where the keys come from",
        "",
        *_table(
            ("box", ".env", "gateway runs with", "login shell exports", "key use"),
            [_keys(r, rows) for r in report.rows],
        ),
        "",
        "API = `GATEWAY_API_KEY`, CULTURE = `CULTURE_VLLM_API_KEY`, MESH = `LOBES_MESH_KEY`. "
        "Digests compare within this run only; no key value is ever shown.",
    ]
    named = [names_of(r) for r in report.rows] + [mesh_names(report)]
    for verdict, names in zip((*report.verdicts, report.mesh_verdict), named, strict=True):
        lines += ["", *_verdict(verdict, names)]
    return "\n".join(lines) + "\n"


def _cell(value: str) -> str:
    # Multi-line cells: each line escaped on its own, joined with <br> (GFM has no newlines).
    return "<br>".join(text(part) for part in value.split("\n")) if value else ""


def _access(row: BoxEvidence, verdict: Verdict) -> list[str]:
    values = cells.access_cells(row, verdict)
    return [_cell(str(v)) for v in values[:-1]] + [f"**{verdict.verdict.value}**"]


def _keys(row: BoxEvidence, rows: list[BoxEvidence]) -> list[str]:
    return [_cell(str(v)) for v in cells.key_cells(row, rows)]


def _verdict(v: Verdict, names: set[str]) -> list[str]:
    head = f"## {text(v.subject)}: {v.verdict.value}"
    if not v.audited:
        head += " (not audited)"
    out = [head, ""]
    # Free text, scrubbed, the names in it shown as names (report_json.naming), then escaped.
    out += [f"- {text(naming(r, names))}" for r in v.reasons]
    if v.findings:
        out += [
            "",
            *_table(
                ("severity", "code", "finding"),
                [
                    [f.severity.value, code(f.code), text(naming(f.message, names))]
                    for f in v.findings
                ],
            ),
        ]
    return out


def _table(header: Sequence[str], rows: list[list[str]]) -> list[str]:
    def line(cells_: Sequence[str]) -> str:
        return "| " + " | ".join(cells_) + " |"

    return [line(header), line(["---"] * len(header)), *(line(r) for r in rows)]
