"""`contract` and `auth`: what the gateway advertises and enforces, against the lanes and the
desired state.

The gateway's /capabilities `context` comes from its own start-time environment, never from
the lane (lobes roles.py:793-833), so it goes stale after a lane-only recreate (incident #208):
the lane's real window is proven from `docker inspect` (its `--max-model-len`) and from the
lane's own /v1/models. Auth posture is only visible on a gated route: /health and
/capabilities stay 200 with a key armed, so we ask `GET /v1/models` without credentials.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import Drift
from reconciler.compare.rules import rule
from reconciler.compare.values import parse_argv


def lane_windows(exp: BoxExpectation, doc: dict[str, Any]) -> dict[str, int | None]:
    """role -> the --max-model-len its running lane was started with (docker inspect)."""
    containers = ((doc.get("docker") or {}).get("containers")) or []
    by_service = {c.get("service"): c for c in containers}
    out: dict[str, int | None] = {}
    for service, lane in exp.lanes.items():
        c = by_service.get(service)
        flags = parse_argv(c.get("cmd") if c else None)[1]
        raw = (flags.get("--max-model-len") or [None])[-1]
        out[lane.role] = int(raw) if isinstance(raw, str) and raw.isdigit() else None
    return out


def compare_contract(exp: BoxExpectation, doc: dict[str, Any]) -> Iterator[Drift]:
    gateway = doc.get("gateway") or {}
    health, caps_probe = gateway.get("health") or {}, gateway.get("capabilities") or {}
    if health.get("status") == 200:
        version = (health.get("body") or {}).get("version")
        if version != exp.lobes_version:
            r = rule("contract.version")
            yield Drift(
                exp.name,
                r.kind,
                "gateway",
                "health.version",
                exp.lobes_version,
                version,
                r.action,
                source="GET /health",
                note="MODEL_GEAR_VERSION and the running gateway disagree",
            )
    caps = caps_probe.get("body") if caps_probe.get("status") == 200 else None
    if not isinstance(caps, dict):
        return  # an unanswered probe is a box error, reported by the caller
    windows = lane_windows(exp, doc)
    for role, window in sorted(windows.items()):
        yield from _local_role(exp, doc, role, window, caps.get(role) or {})
    for role, contract in sorted(exp.contract.items()):
        if contract.proxied_to is not None:
            yield from _proxied_role(exp, role, contract.proxied_to, caps.get(role) or {})


def _local_role(
    exp: BoxExpectation, doc: dict[str, Any], role: str, window: int | None, entry: dict[str, Any]
) -> Iterator[Drift]:
    advertised = entry.get("context")
    path = f"capabilities.{role}.context"
    contract = exp.contract.get(role)
    if contract is not None and not contract.feasible:
        # Infeasible here; another member may still serve it through the mesh (ready, proxied).
        if entry.get("feasible"):
            r = rule("contract.ready")
            state = f"ready={entry.get('ready')} feasible={entry.get('feasible')}"
            yield Drift(
                exp.name,
                r.kind,
                "gateway",
                f"capabilities.{role}.feasible",
                "infeasible",
                state,
                r.action,
                source="GET /capabilities",
                note=f"contract.{role}.feasible is false",
            )
        return
    if window is not None and advertised != window:
        r = rule("contract.context")
        yield Drift(
            exp.name,
            r.kind,
            "gateway",
            path,
            window,
            advertised,
            r.action,
            source="GET /capabilities",
            note=f"the {role} lane serves {window} (docker inspect); the gateway still "
            "advertises its start-time window",
        )
    elif contract and contract.context is not None and advertised != contract.context:
        r = rule("contract.desired-context")
        yield Drift(
            exp.name,
            r.kind,
            "gateway",
            path,
            contract.context,
            advertised,
            r.action,
            source="GET /capabilities",
            note=f"contract.{role}.context",
        )
    if contract is not None and not (entry.get("ready") and entry.get("feasible", True)):
        r = rule("contract.ready")
        state = f"ready={entry.get('ready')} feasible={entry.get('feasible')}"
        yield Drift(
            exp.name,
            r.kind,
            "gateway",
            f"capabilities.{role}.ready",
            "ready",
            state,
            r.action,
            source="GET /capabilities",
        )
    service = next((s for s, lane in exp.lanes.items() if lane.role == role), None)
    probe = (doc.get("lanes") or {}).get(service or "") or {}
    served = _served_window(probe.get("body"))
    if window is not None and served is not None and served != window:
        r = rule("contract.lane-window")
        yield Drift(
            exp.name,
            r.kind,
            f"lane:{service}",
            "v1/models.max_model_len",
            window,
            served,
            r.action,
            source="lane GET /v1/models",
        )


def _served_window(body: Any) -> int | None:
    if not isinstance(body, dict):
        return None
    for model in body.get("data") or []:
        if isinstance(model, dict) and isinstance(model.get("max_model_len"), int):
            return int(model["max_model_len"])
    return None


def _proxied_role(
    exp: BoxExpectation, role: str, host: str, entry: dict[str, Any]
) -> Iterator[Drift]:
    r = rule("contract.ready")
    member, proxied = entry.get("member"), entry.get("proxied")
    if proxied and member == host and entry.get("ready"):
        return
    observed = f"proxied={proxied} member={member} ready={entry.get('ready')}"
    yield Drift(
        exp.name,
        r.kind,
        "gateway",
        f"capabilities.{role}.proxied",
        f"via {host}",
        observed,
        r.action,
        source="GET /capabilities",
        note="mesh membership takes a few heartbeats after a gateway restart",
    )


def compare_auth(
    exp: BoxExpectation, doc: dict[str, Any], controller: dict[str, Any]
) -> Iterator[Drift]:
    r = rule("auth.posture")
    want = 401 if exp.gateway.auth == "keyed" else 200
    sides = (
        ("loopback", ((doc.get("gateway") or {}).get("models_noauth") or {}).get("status")),
        ("controller", (controller.get("models_noauth") or {}).get("status")),
    )
    for side, status in sides:
        if status is None or status == want:
            continue
        note = (
            "the gateway serves callers without a key"
            if status == 200
            else "every caller without a key is refused; check shell-leak for an armed key"
        )
        yield Drift(
            exp.name,
            r.kind,
            "gateway",
            f"GET /v1/models without key ({side})",
            want,
            status,
            r.action,
            source=f"probe from the {side}",
            note=note,
        )
