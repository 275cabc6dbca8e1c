"""The machine-readable audit: a versioned JSON document (shape and schema in document.py,
committed as schema/audit-report.schema.json).

Secrets are `{"secret": true, "digest": "<12 hex>"}` exactly as in the drift report (the same
`secret_digest`), so a consumer handles both documents alike; a digest is only comparable
within one run. Order is part of the format: boxes in inventory order, findings worst first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from reconciler.audit.evidence import (
    BoxEvidence,
    Carried,
    KeyedProbe,
    KeyUse,
    Probe,
    Side,
    key_use,
)
from reconciler.audit.report import AuditReport
from reconciler.audit.verdict import Severity, Verdict
from reconciler.compare.drift import SecretValue
from reconciler.observe.document import Fault
from reconciler.report.json_report import secret_digest
from reconciler.report.values import free_json as scrub  # free text: via the scrubber
from reconciler.report.values import scrub as name  # a name: wire digests masked, no more

# Equal to document.SCHEMA_ID / VERSION (a test checks), so rendering needs no pydantic.
SCHEMA_ID = "fleet-reconciler/audit-report"
# 2: each box's `observation` and `partial` (a box seen from the mesh side); 3: a `.env` line
# and a carried key's origin may be `unknown` (.env not read), mixed members are `open`, the
# mesh's `not_in_run`; 4: `published.stray`, `stray_host_network`, `running` (containers
# outside the compose project), lane_probes also asks extra gateway and stray ports; 5:
# `stray[*].expected_by` and `expected_host_network` (audit.expected_containers); 6: a box
# whose gateway answered no gated request is observation `full` with its `evidence`, not
# audited, fault `not-observed` at `gateway` (was `unreachable`, evidence null); later, no
# meaning changed: `published.host_network_error` (docs/audit-report.md).
VERSION = 6


def render_json(report: AuditReport) -> str:
    return json.dumps(to_document(report), indent=2, ensure_ascii=False) + "\n"


def to_document(report: AuditReport) -> dict[str, Any]:
    verdicts = [v.verdict for v in report.verdicts]
    rows = list(report.rows)
    return {
        "schema": SCHEMA_ID,
        "version": VERSION,
        "run_id": scrub(report.run_id),  # a snapshot's index says it
        "generated_at": report.generated_at,
        "inventory": report.inventory,
        "summary": {
            "boxes": len(report.rows),
            "audited": sum(1 for v in report.verdicts if v.audited),
            "ok": verdicts.count(Severity.OK),
            "warn": verdicts.count(Severity.WARN),
            "fail": verdicts.count(Severity.FAIL),
            "mesh": report.mesh_verdict.verdict.value,
            "findings": sum(len(v.findings) for v in (*report.verdicts, report.mesh_verdict)),
            "exit_code": report.exit_code,
        },
        "boxes": [_box(r, v, rows) for r, v in zip(report.rows, report.verdicts, strict=True)],
        "mesh": _mesh(report),
    }


def said(text: str | None) -> str | None:
    """A box's (or a gateway's) own words that are not prose: a header, a URL, a name it
    runs with. Scrubbed like any free text: a hostile gateway chooses them."""
    return scrub(text) if text else text


# evidence.py (`_errors`) says a failed listing of the project's host-network containers as this
# error of the box: `Published.host_network` is then empty, which must never read as "none".
HOST_NETWORK_ERROR = "host network: "


def host_network_error(row: BoxEvidence) -> str | None:
    """Why the project's containers on the host network are unknown (the box's words,
    scrubbed); None: they were listed (or the box's answer was not read at all)."""
    if not row.collected:
        return None
    for error in row.errors:
        if error.startswith(HOST_NETWORK_ERROR):
            return scrub(error.removeprefix(HOST_NETWORK_ERROR)) or "no detail"
    return None


def names_of(row: BoxEvidence) -> set[str]:
    """The names a box's findings and reasons may hold: its containers' (the project's and
    any other running one's), their services and images, the desired expected_containers
    entries naming them. The parser let through only printable text for each
    (observe/document.py `_name`); they are shown as the drift report shows a name."""
    out = {row.box}
    if row.gateway_container:
        out.add(row.gateway_container)
    pub = row.published
    if pub is not None:
        for b in (*pub.gateway, *pub.lanes, *pub.stray):
            out.update(n for n in (b.container, b.service, b.expected_by) if n)
        out.update(pub.host_network, pub.stray_host_network, pub.host_network_services.values())
        out.update(p.container for p in pub.lane_probes)
        out.update(pub.declared)
        out.update(pub.declared.values())
    return out


# A held name is `<marker><index><marker>`, the marker a character the text does not hold (a
# box's text could hold any one of them) and that no masking rule reads as part of a word.
_MARKERS = "\u27e6\u27e7\u2983\u2984\u27ec\u27ed"
# What a key-shaped run is made of (scrub.py `_RUN`): a name is held only where it is a whole
# word of such characters, never a piece of a longer run (a key holding a name stays masked).
_RUN_CHARS = r"A-Za-z0-9_+/=\-"


def naming(text: str, names: Iterable[str]) -> str:
    """A finding's or a reason's free text (`scrub`, i.e. free_json), each of `names` in it
    shown as the drift report shows a name (wire digests masked, no more): the scrubber's
    key-shaped-run rule would mask `qwen3-8b-eval-run-20261206` as `***`. Everything else in the
    text is scrubbed as before, with each name held in place, so the rules that read
    context still read it (`HF_TOKEN=<name>`, whatever follows `Bearer`: masked, name or not)."""
    wanted = sorted({n for n in names if n and n in text}, key=len, reverse=True)
    marker = next((m for m in _MARKERS if m not in text), None)
    if not wanted or marker is None:  # no marker free: masked, the safe way
        return scrub(text)
    words = "|".join(map(re.escape, wanted))
    found: list[str] = []

    def hold(match: re.Match[str]) -> str:
        found.append(match.group(0))
        return f"{marker}{len(found) - 1}{marker}"

    held = re.sub(rf"(?<![{_RUN_CHARS}])(?:{words})(?![{_RUN_CHARS}])", hold, text)
    return re.sub(rf"{marker}(\d+){marker}", lambda m: name(found[int(m.group(1))]), scrub(held))


def secret(value: SecretValue | None) -> dict[str, Any] | None:
    return None if value is None else {"secret": True, "digest": secret_digest(value)}


def _verdict(v: Verdict, names: set[str]) -> dict[str, Any]:
    return {
        "verdict": v.verdict.value,
        "audited": v.audited,
        "findings": [
            {"code": f.code, "severity": f.severity.value, "message": naming(f.message, names)}
            for f in v.findings
        ],
        "reasons": [naming(r, names) for r in v.reasons],
    }


def _box(row: BoxEvidence, v: Verdict, rows: list[BoxEvidence]) -> dict[str, Any]:
    verdict = _verdict(v, names_of(row))
    out: dict[str, Any] = {"box": row.box, **verdict, "errors": [scrub(e) for e in row.errors]}
    out["fault"] = _fault(row.fault) if row.fault is not None else None
    out["intent"] = _intent(row)
    # A box whose gateway alone answered nothing is not audited, yet its own answer was read:
    # its evidence (what it publishes above all) is shown, as in every other format.
    out["evidence"] = _evidence(row, rows) if row.collected else None
    out["observation"] = "full" if row.collected else "partial" if row.partial else "none"
    out["partial"] = _partial(row) if row.partial else None
    return out


def _partial(row: BoxEvidence) -> dict[str, Any]:
    return {
        "posture": row.posture,
        "mesh_side": _side(row.mesh_side),
        "mesh": {"on": row.mesh_on, "detect": row.mesh_detect, "proxied": dict(row.proxied)},
    }


def _fault(fault: Fault) -> dict[str, Any]:
    path = scrub(fault.path) if fault.path else None
    return {"kind": fault.kind.value, "path": path, "what": scrub(fault.what)}


def _intent(row: BoxEvidence) -> dict[str, Any]:
    i = row.intent
    return {
        "auth": i.auth,
        "api_key": {
            "secret": i.api_key_secret,
            "source": i.api_key_where,
            "status": i.api_key_status,
            "digest": secret(i.api_key),
            "one_per_box": not i.api_key_shared,
        },
        "mesh": {
            "enabled": i.mesh,
            "secret": i.mesh_key_secret,
            "status": i.mesh_key_status,
            "digest": secret(i.mesh_key),
        },
        "bind": i.bind,
        "port": i.port,
    }


def _evidence(row: BoxEvidence, rows: list[BoxEvidence]) -> dict[str, Any]:
    pub = row.published
    return {
        "posture": row.posture,
        "envfile": {
            name: {"state": line.state, "line": line.line, "digest": secret(line.digest)}
            for name, line in row.envfile.items()
        },
        "gateway": {
            "container": row.gateway_container,
            "status": row.gateway_status,
            "inbound_key": row.inbound.name if row.inbound else None,
            "carries": {name: _carried(c) for name, c in row.carried.items()},
            "mesh_name": said(row.mesh_name),
        },
        "shell_exports": [
            {"name": s.name, "source": s.source, "digest": secret(s.digest)} for s in row.shell
        ],
        "probes": {
            "loopback": _side(row.loopback),
            "mesh_side": _side(row.mesh_side),
            "keyed": _keyed(row.keyed),
            "mesh_keyed": _keyed(row.mesh_keyed),
        },
        "published": {
            "gateway": [_binding(b) for b in pub.gateway] if pub else [],
            "lanes": [_binding(b) for b in pub.lanes] if pub else [],
            "host_network": [name(n) for n in pub.host_network] if pub else [],
            "host_network_error": host_network_error(row),
            "lane_probes": [
                {
                    "container": name(p.container),
                    "url": said(p.url),
                    "status": p.status,
                    "error": scrub(p.error) if p.error else None,
                }
                for p in (pub.lane_probes if pub else ())
            ],
            # a container outside the project: its name and image are the box's own words,
            # names all the same (never masked as a key would be: the drift report's way)
            "stray": [
                {**_binding(b), "expected_by": b.expected_by}  # the desired state's pattern
                for b in (pub.stray if pub else ())
            ],
            "stray_host_network": [name(n) for n in pub.stray_host_network] if pub else [],
            "expected_host_network": (
                [name(n) for n in pub.stray_host_network if n in pub.declared] if pub else []
            ),
            "running": said(pub.running) if pub and pub.running else None,
        },
        "keys": {name: _key_use(u) for name, u in key_use(row, rows).items()},
        "mesh": {"on": row.mesh_on, "detect": row.mesh_detect, "proxied": dict(row.proxied)},
    }


def _carried(c: Carried) -> dict[str, Any]:
    return {"digest": secret(c.digest), "origin": c.origin, "where": c.where}


def _probe(p: Probe) -> dict[str, Any]:
    return {"status": p.status, "error": scrub(p.error) if p.error else None}


def _side(side: Side | None) -> dict[str, Any] | None:
    if side is None:
        return None
    return {
        "health": _probe(side.health),
        "capabilities": _probe(side.capabilities),
        "models": _probe(side.models),
        "chat": {**_probe(side.chat), "model": said(side.chat.model)},
    }


def _keyed(k: KeyedProbe | None) -> dict[str, Any] | None:
    if k is None:
        return None
    return {
        "status": k.status,
        "key_from": said(k.key_from),
        "digest": secret(k.digest),
        "note": scrub(k.note) if k.note else None,
    }


def _binding(b: Any) -> dict[str, Any]:
    return {
        "container": name(b.container),
        "service": name(b.service) if b.service else None,
        "address": b.address,
        "container_port": b.container_port,
    }


def _key_use(u: KeyUse) -> dict[str, Any]:
    return {
        "digest": secret(u.digest),
        "matches_desired": u.matches_desired,
        "same_as": list(u.same_as),
    }


def mesh_names(report: AuditReport) -> set[str]:
    """The names the mesh's findings may hold: its boxes' and members'."""
    return {*(r.box for r in report.rows), *report.mesh.members}


def _mesh(report: AuditReport) -> dict[str, Any]:
    m = report.mesh
    return {
        **_verdict(report.mesh_verdict, mesh_names(report)),
        "members": list(m.members),
        "live_members": list(m.live_members),
        "open": m.open_members,
        "keyed": m.with_posture("keyed"),
        "mesh_keys": {box: secret(key) for box, key in m.mesh_keys.items()},
        "proofs": [
            {
                "via": p.via,
                "role": p.role,
                "host": p.host,
                "url": said(p.url),
                "status": p.status,
                "mesh_member": said(p.mesh_member),
                "proxied_by": said(p.proxied_by),
                "error": scrub(p.error) if p.error else None,
                "proven": p.proven,
            }
            for p in m.proofs
        ],
        "unaudited": list(m.unaudited),
        "not_in_run": list(m.not_in_run),
    }


def audit_report_schema_json() -> str:
    from reconciler.audit.document import json_schema

    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    # Regenerates the committed schema: python -m reconciler.audit.report_json > schema/...
    import sys

    sys.stdout.write(audit_report_schema_json())
