"""One run as the rows the store keeps: built from the report's JSON document (the public form,
secrets already `{"secret": true, "digest": ...}`) and the observations (a snapshot's box files,
secrets hashed on the box). Pure.

Digests are keyed per run, so two runs' digests of the same value differ: an entry keeps a
secret as `***` plus whether it `changed` (differs from the desired one), which does compare
across runs; the report document, kept whole, still carries its run's digests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from reconciler.records import field, record_class

MESH = "(mesh)"  # the box column of a finding about the mesh as a whole


@record_class()
class BoxRow:
    """One box of a recorded run: reachable, how much drift, the verdict."""

    box: str
    reachable: bool
    observation: str
    entries: int
    causes: int
    errors: int
    verdict: str | None = None
    # The parts of its faults (history/parts.py: which entries the run could not observe); None
    # when not recorded (an audit's box, a drift run of older code).
    faults: tuple[str, ...] | None = None


@record_class()
class EntryRow:
    """One drift entry as the history stores it (values as JSON, secrets hashed)."""

    box: str
    kind: str
    subject: str
    path: str
    cause: str
    symptom: bool
    action: str
    desired: str  # JSON
    observed: str  # JSON
    secret: bool
    changed: bool | None

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What makes it the same entry in another run."""
        return (self.box, self.kind, self.subject, self.path)


@record_class()
class FindingRow:
    """One audit finding as the history stores it."""

    box: str
    code: str
    severity: str
    message: str


@record_class()
class RunRecord:
    """One run as the history stores it: its header, boxes, entries, findings, observations."""

    run_id: str
    command: str  # drift | audit
    source: str  # live | snapshot
    started_at: str
    started: float
    duration_s: float
    inventory: str
    exit_code: int
    summary: dict[str, Any]
    report: dict[str, Any] | ReportText  # the document, or its text as the store keeps it
    boxes: tuple[BoxRow, ...]
    # Iterated twice by the store (its size, its rows): a tuple, or a spool (ItemSpool).
    entries: Iterable[EntryRow] = ()
    findings: tuple[FindingRow, ...] = ()
    observations: Mapping[str, Any] = field(default_factory=dict)  # box -> its JSON
    root: str | None = None  # the fleet repository's directory (which fleet the run judged)


def without_digests(value: Any) -> Any:
    """A report value with each secret as `***`: what compares across runs."""
    if isinstance(value, dict):
        if value.get("secret") is True and "digest" in value:
            return "***"
        return {k: without_digests(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_digests(v) for v in value]
    return value


def _json(value: Any) -> str:
    return json.dumps(without_digests(value), sort_keys=True, ensure_ascii=False)


def drift_record(
    doc: dict[str, Any],
    observations: Mapping[str, Any],
    *,
    source: str,
    started: float,
    duration_s: float,
    root: str | None = None,
    rows: list[tuple[BoxRow, list[EntryRow]]] | None = None,
    report: ReportText | None = None,
    faults: Mapping[str, Sequence[str]] | None = None,
    entries: Iterable[EntryRow] | None = None,
) -> RunRecord:
    """A drift report document (reconciler/report/json_report.py, version 2) -> its rows.

    `faults`: each box's fault parts (parts.faults_of of the report's box: the document's
    errors are text only); a box without is recorded as "not known".
    A report kept as its boxes' parts (report/json_parts.py) gives its head as `doc`, each
    box's `box_rows` as `rows` and the document's text as `report`: the same record. `entries`:
    the drift entries' rows, when not in `rows` (a large recorded replay keeps them in a spool,
    report/spool.ItemSpool, iterated as the store inserts them)."""
    if rows is None:
        given = faults or {}
        rows = [box_rows(box, given.get(box["box"])) for box in doc["boxes"]]
    boxes = [row for row, _ in rows]
    if entries is None:
        entries = [entry for _, box_entries in rows for entry in box_entries]
    return _record(
        doc, "drift", source, started, duration_s, boxes, observations, root, entries, report
    )


def box_rows(
    box: dict[str, Any], faults: Sequence[str] | None = None
) -> tuple[BoxRow, list[EntryRow]]:
    """One box's entry of a drift report document -> its row and its drift entries' rows.
    `faults`: the parts of the box's faults (parts.faults_of), None when not known."""
    drifts = box["drifts"]
    row = BoxRow(
        box=box["box"],
        reachable=bool(box["reachable"]),
        observation=str(box.get("observation") or ("full" if box["reachable"] else "none")),
        entries=len(drifts),
        causes=len({d["cause"] for d in drifts}),
        errors=len(box["errors"]),
        faults=None if faults is None else tuple(faults),
    )
    rows = [
        EntryRow(
            box=box["box"],
            kind=d["kind"],
            subject=d["subject"],
            path=d["path"],
            cause=d["cause"],
            symptom=bool(d["symptom"]),
            action=d["action"],
            desired=_json(d["desired"]),
            observed=_json(d["observed"]),
            secret=bool(d["secret"]),
            changed=d["changed"],
        )
        for d in drifts
    ]
    return row, rows


@record_class()
class ReportText:
    """A report document already as JSON text (a large replay's, as it was printed), in the
    pieces it was printed in (json_parts.render_json_parts: iterable again and again, its
    boxes' entries read back from a spool): stored as it is, piece by piece (history/store.py),
    where a document is written with json.dumps. Joined, 33 MB at 1,000 boxes, and as much
    again in each copy SQLite makes of a value bound whole."""

    pieces: Iterable[str]

    def text(self) -> str:
        return "".join(self.pieces)


def audit_record(
    doc: dict[str, Any],
    observations: Mapping[str, Any],
    *,
    source: str,
    started: float,
    duration_s: float,
    root: str | None = None,
) -> RunRecord:
    """An audit report document (reconciler/audit/report_json.py, version 3) -> its rows."""
    boxes: list[BoxRow] = []
    findings: list[FindingRow] = []
    for box in doc["boxes"]:
        found = box["findings"]
        boxes.append(
            BoxRow(
                box=box["box"],
                reachable=box.get("observation") == "full",
                observation=str(box.get("observation") or "none"),
                entries=len(found),
                causes=len({f["code"] for f in found}),
                errors=len(box["errors"]),
                verdict=box["verdict"],
            )
        )
        findings.extend(
            FindingRow(box["box"], f["code"], f["severity"], f["message"]) for f in found
        )
    findings.extend(
        FindingRow(MESH, f["code"], f["severity"], f["message"]) for f in doc["mesh"]["findings"]
    )
    return _record(
        doc, "audit", source, started, duration_s, boxes, observations, root, findings=findings
    )


def _record(
    doc: dict[str, Any],
    command: str,
    source: str,
    started: float,
    duration_s: float,
    boxes: list[BoxRow],
    observations: Mapping[str, Any],
    root: str | None,
    entries: Iterable[EntryRow] | None = None,
    report: ReportText | None = None,
    findings: list[FindingRow] | None = None,
) -> RunRecord:
    from datetime import UTC, datetime

    return RunRecord(
        run_id=str(doc["run_id"]),
        command=command,
        source=source,
        started_at=datetime.fromtimestamp(started, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        started=started,
        duration_s=duration_s,
        inventory=str(doc["inventory"]),
        exit_code=int(doc["summary"]["exit_code"]),
        summary=dict(doc["summary"]),
        report=doc if report is None else report,
        boxes=tuple(boxes),
        # A list made here is kept as a tuple; a spool as it is (read as the store inserts).
        entries=tuple(entries) if isinstance(entries, list) else (entries or ()),
        findings=tuple(findings or ()),
        observations=observations,
        root=root,
    )
