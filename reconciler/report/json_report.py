"""The machine-readable drift report: a versioned JSON document and its JSON Schema.

Order is part of the format (boxes in report order, drifts in `order.ordered_drifts` order,
free-form maps by key) so that two reports of the same fleet diff cleanly. The shape is in
`document.py`; `schema/drift-report.schema.json` is `drift_report_schema_json()`, committed.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Set
from enum import Enum
from typing import Any

from reconciler import fast_json
from reconciler.compare.causes import Link, link_box
from reconciler.compare.drift import BoxResult, Drift, DriftReport, SecretValue
from reconciler.gc_pause import paused_gc
from reconciler.report.order import ordered_drifts
from reconciler.report.summary import Summary, summarize
from reconciler.report.values import (
    as_secret,
    free_json,
    guarded,
    guarded_box,
    is_secret,
    scrub,
    secret_changed,
)

# Kept here as literals (and equal to document.SCHEMA_ID / VERSION, which a test checks) so that
# rendering does not import pydantic.
SCHEMA_ID = "fleet-reconciler/drift-report"
VERSION = 2  # 2: each drift's `cause` and `symptom`, the summary's `causes` (docs/drift-report.md)
DIGEST_CHARS = 12


def to_document(report: DriftReport) -> dict[str, Any]:
    report = guarded(report)
    ids: set[str] = set()  # every cause, counted as text and markdown count them
    boxes = [_box(b, ids) for b in report.boxes]
    return {**head(report, len(ids)), "boxes": boxes}


def head(report: DriftReport, causes: int) -> dict[str, Any]:
    """The document without its boxes: what it is, and the summary (`causes`: the distinct
    causes of the boxes' drift, which the boxes' entries name)."""
    return head_of(report.run_id, report.generated_at, report.inventory, summarize(report, causes))


def head_of(run_id: str, generated_at: str, inventory: str, s: Summary) -> dict[str, Any]:
    """`head` of a run counted apart (report/json_parts.py)."""
    return {
        "schema": SCHEMA_ID,
        "version": VERSION,
        "run_id": run_id,
        "generated_at": generated_at,
        "inventory": inventory,
        "summary": {
            "boxes": s.boxes,
            "reachable": s.reachable,
            "unreachable": s.unreachable,
            "with_errors": s.with_errors,
            "drifted_boxes": s.drifted_boxes,
            "drifts": s.drifts,
            "causes": s.causes,
            "by_kind": dict(s.by_kind),
            "exit_code": s.exit_code,
        },
    }


def render_json(report: DriftReport) -> str:
    # No sort_keys: the document is built in reading order ("schema" and "version" first).
    # Its objects form no cycles: the collector would only walk them (reconciler/gc_pause.py).
    # A large report is written in C: the same text as json.dumps (reconciler/fast_json.py).
    with paused_gc():
        document = to_document(report)
        if len(report.boxes) >= fast_json.LARGE:
            return fast_json.dumps_indented(document) + "\n"
        return json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def secret_digest(value: SecretValue) -> str:
    """What a report shows of a secret: 12 hex of SHA-256 over the collector's keyed digest.

    Hashing again, rather than truncating, means the report can never reveal more than a digest
    even if a collector bug ever put a clear value in a SecretValue; equal digests stay equal.
    """
    return hashlib.sha256(value.digest.encode("utf-8")).hexdigest()[:DIGEST_CHARS]


def drift_report_schema() -> dict[str, Any]:
    from reconciler.report.document import json_schema

    return json_schema()


def drift_report_schema_json() -> str:
    return json.dumps(drift_report_schema(), indent=2, sort_keys=True) + "\n"


def box_entry(box: BoxResult, ids: set[str]) -> dict[str, Any]:
    """One box's entry of the document (its drift guarded, as to_document guards the whole
    report's); the causes its drifts name are added to `ids`."""
    return _box(guarded_box(box), ids)


def _box(box: BoxResult, ids: set[str]) -> dict[str, Any]:
    drifts = ordered_drifts(box.drifts)
    links = link_box(drifts)
    ids.update(link.cause for link in links)
    return {
        "box": box.box,
        "reachable": box.reachable,
        "observation": box.observation,
        # What the gateway answered the controller: free text from the box, scrubbed as the
        # errors are (and as text, markdown and HTML show it).
        "partial": None if box.partial is None else free_json(box.partial),
        # Collector order, not sorted: the first error usually explains the rest.
        "errors": [free_json(e) for e in box.errors],
        # A map of names (not a value), so a fact called "secret" stays a fact.
        "facts": {str(k): _jsonable(v) for k, v in sorted(box.facts.items(), key=_by_key)},
        "drifts": [_drift(d, link) for d, link in zip(drifts, links, strict=True)],
    }


def _drift(drift: Drift, link: Link) -> dict[str, Any]:
    changed = secret_changed(drift)
    return {
        "kind": drift.kind.value,
        "subject": scrub(drift.subject),
        "path": scrub(drift.path),
        "desired": _jsonable(drift.desired),
        "observed": _jsonable(drift.observed),
        "action": drift.action.value,
        "source": _jsonable(drift.source),
        "note": _jsonable(drift.note),
        # `changed` is null for a secret whose digests cannot be compared: `secret` says it is one
        "secret": changed is not None or is_secret(drift),
        "changed": changed,
        # Every entry stays listed; text and markdown group them by this id.
        "cause": scrub(link.cause),
        "symptom": link.symptom,
    }


def _jsonable(value: object) -> Any:
    # Most values are plain text, numbers or absent: answered before as_secret's ABC checks
    # (exact types only, so a str or int Enum still takes the Enum branch below).
    kind = type(value)
    if kind is str:
        return scrub(str(value))  # str() of a str is itself (mypy does not narrow on type())
    if value is None or kind is bool or kind is int:
        return value
    secret = as_secret(value)
    if secret is not None:
        return {"secret": True, "digest": secret_digest(secret)}
    if isinstance(value, Enum):
        return _jsonable(value.value)
    if isinstance(value, str):
        return scrub(value)
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        # JSON has no NaN/Infinity; a string keeps the document valid and the fact visible.
        return value if math.isfinite(value) else str(value)
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, Set):
        items = [_jsonable(v) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in sorted(value.items(), key=_by_key)}
    # Anything else (a Path, a datetime) is a fact someone will read, not a structure.
    return str(value)


def _by_key(item: tuple[Any, Any]) -> str:
    return str(item[0])


if __name__ == "__main__":
    # Regenerates the committed schema: python -m reconciler.report.json_report > schema/...
    import sys

    sys.stdout.write(drift_report_schema_json())
