"""The mesh side: what a caller on the network gets from each gateway without credentials.

Run from the controller with httpx. Nothing here carries a key: every request is the one an
anonymous caller could send. Phase 1 runs while the collectors run; phase 2 (the weakest-link
proofs and published lane ports) needs phase 1's postures to know which request proves what.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from reconciler.observe.probes import body_json, failure, fetch, needs_tls, skip_httpx_cli
from reconciler.scrub import exception_text

# The response headers that prove a request crossed the mesh (lobes stamps them on every
# auto-proxied answer, contracts §3.5), and why the gateway routed it where it did.
MESH_HEADERS = ("X-Lobes-Mesh-Member", "X-Lobes-Proxied-By", "X-Lobes-Route-Reason")
CONNECT_S, READ_S = 2.0, 5.0  # each answer is read bounded (observe.probes.fetch)


@dataclass(frozen=True)
class Endpoint:
    box: str
    base: str  # http://host:port of the gateway, as a mesh member reaches it
    chat_model: str | None  # a role served on this box (payload.local_chat_role)


@dataclass(frozen=True)
class ProofAttempt:
    """POST through `via` (live open) for `role`, which `host` (live keyed) serves."""

    via: str
    base: str
    role: str
    host: str


@dataclass(frozen=True)
class LanePort:
    box: str
    container: str
    url: str  # http://box-address:host-port/v1/models


def chat_body(model: str | None) -> dict[str, Any]:
    # One token: enough to prove the request reached a model, as cheap as a request can be.
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "audit"}], "max_tokens": 1}
    if model:
        body["model"] = model
    return body


def mesh_side(endpoints: list[Endpoint]) -> dict[str, dict[str, Any]]:
    """Per box, in the shape observe's controller probes have (`health`, `capabilities`,
    `models_noauth`), plus `audit`: the unauthenticated chat and `/mesh/detect`."""
    skip_httpx_cli()
    import httpx  # imported here: only commands that probe pay for it

    out: dict[str, dict[str, Any]] = {}
    timeout = httpx.Timeout(READ_S, connect=CONNECT_S)
    verify = needs_tls([ep.base for ep in endpoints])
    with httpx.Client(timeout=timeout, trust_env=False, verify=verify) as c:
        for ep in endpoints:
            probes: dict[str, Any] = {"base": ep.base}
            probes["health"] = _request(c, "GET", ep.base + "/health", keep_body=True)
            probes["capabilities"] = _request(c, "GET", ep.base + "/capabilities", keep_body=True)
            probes["models_noauth"] = _request(c, "GET", ep.base + "/v1/models")
            chat = _request(
                c, "POST", ep.base + "/v1/chat/completions", json=chat_body(ep.chat_model)
            )
            chat["model"] = ep.chat_model
            probes["audit"] = {
                "chat_noauth": chat,
                "mesh_detect": _request(c, "GET", ep.base + "/mesh/detect", keep_body=True),
            }
            out[ep.box] = probes
    return out


def prove(attempts: list[ProofAttempt], lanes: list[LanePort]) -> dict[str, Any]:
    """Phase 2: the weakest-link requests and unauthenticated calls to published lane ports."""
    skip_httpx_cli()
    import httpx

    proofs, ports = [], []
    timeout = httpx.Timeout(READ_S, connect=CONNECT_S)
    verify = needs_tls([a.base for a in attempts] + [lane.url for lane in lanes])
    with httpx.Client(timeout=timeout, trust_env=False, verify=verify) as c:
        for a in attempts:
            url = a.base + "/v1/chat/completions"
            result = _request(c, "POST", url, json=chat_body(a.role))
            proofs.append({"via": a.via, "role": a.role, "host": a.host, "url": url, **result})
        for lane in lanes:
            result = _request(c, "GET", lane.url)
            ports.append({"box": lane.box, "container": lane.container, "url": lane.url, **result})
    return {"weakest_link": proofs, "lane_ports": ports}


def _request(
    client: Any, method: str, url: str, keep_body: bool = False, json: Any = None
) -> dict[str, Any]:
    import httpx

    started = time.monotonic()
    try:
        resp, raw = fetch(client, method, url, json=json)
    except httpx.HTTPError as exc:
        return {"status": None, "error": exception_text(exc)}
    except Exception as exc:  # one gateway's odd answer fails that request, never the others
        return {"status": None, "error": failure(exc)}
    elapsed_ms = int((time.monotonic() - started) * 1000)
    result: dict[str, Any] = {"status": resp.status_code, "ms": elapsed_ms}
    headers = {h: resp.headers[h] for h in MESH_HEADERS if h in resp.headers}
    if headers:
        result["headers"] = headers
    body = body_json(raw)  # read as a box's answer is: bounded, no NaN, no absurd nesting
    if keep_body:
        result["body"] = body
    elif isinstance(body, dict) and isinstance(body.get("error"), dict):
        # The error type says why (invalid_api_key, role_unverified); a model's answer is no
        # evidence and could echo anything, so it is never kept.
        result["error_type"] = str(body["error"].get("type"))[:80]
    return result
