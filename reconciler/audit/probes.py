"""The mesh side: what a caller on the network gets from each gateway without credentials.

Run from the controller with httpx. Nothing here carries a key: every request is the one an
anonymous caller could send. Phase 1 runs while the collectors run; phase 2 (the weakest-link
proofs and published lane ports) needs phase 1's postures to know which request proves what.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from reconciler.observe.probes import (
    GRACE_S,
    Deadline,
    body_json,
    failure,
    fetch,
    needs_tls,
    probe_budget,
    skip_httpx_cli,
    unanswered,
    unanswered_gateway,
    waited,
)
from reconciler.observe.transport import Background
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


def mesh_side(endpoints: list[Endpoint], timeout: float | None = None) -> dict[str, dict[str, Any]]:
    """Per box, in the shape observe's controller probes have (`health`, `capabilities`,
    `models_noauth`), plus `audit`: the unauthenticated chat and `/mesh/detect`.

    Every box at once, a thread each (as drift's probes, observe/probes.py), its requests one
    after another within its `timeout` (default: the run's, observe/fanout.py) from now: a
    gateway that accepts and never answers costs its own box that time, and delays no other
    box. A box still going past it (and GRACE_S) is given up: its probes say so."""
    budget = probe_budget(timeout)
    deadline = (time.monotonic() + budget, budget)  # from the call: the import below counts
    skip_httpx_cli()
    import httpx  # imported here: only commands that probe pay for it

    verify = needs_tls([ep.base for ep in endpoints])
    with _Client(httpx, verify) as c:
        jobs = [(ep, Background(_box_probes, c.client, ep, deadline)) for ep in endpoints]
        out = {ep.box: _waited_box(ep, job, deadline) for ep, job in jobs}
        c.leave_open = not all(job.done for _, job in jobs)
    return out


def _box_probes(c: Any, ep: Endpoint, deadline: Deadline) -> dict[str, Any]:
    probes: dict[str, Any] = {"base": ep.base}
    probes["health"] = _request(c, "GET", ep.base + "/health", True, None, deadline)
    probes["capabilities"] = _request(c, "GET", ep.base + "/capabilities", True, None, deadline)
    probes["models_noauth"] = _request(c, "GET", ep.base + "/v1/models", False, None, deadline)
    url = ep.base + "/v1/chat/completions"
    chat = _request(c, "POST", url, False, chat_body(ep.chat_model), deadline)
    chat["model"] = ep.chat_model
    probes["audit"] = {
        "chat_noauth": chat,
        "mesh_detect": _request(c, "GET", ep.base + "/mesh/detect", True, None, deadline),
    }
    return probes


def _waited_box(ep: Endpoint, job: Background, deadline: Deadline) -> dict[str, Any]:
    budget = deadline[1]
    try:
        found: dict[str, Any] = job.result(max(0.0, deadline[0] + GRACE_S - time.monotonic()))
        return found
    except TimeoutError:  # given up: every probe of the box says it had no answer in time
        pass
    chat = {**unanswered(budget), "model": ep.chat_model}
    return {
        "base": ep.base,
        **unanswered_gateway(budget),
        "audit": {"chat_noauth": chat, "mesh_detect": unanswered(budget)},
    }


def prove(
    attempts: list[ProofAttempt], lanes: list[LanePort], timeout: float | None = None
) -> dict[str, Any]:
    """Phase 2: the weakest-link requests and unauthenticated calls to published lane ports,
    all at once, within `timeout` (default: the run's) from now, as mesh_side's."""
    budget = probe_budget(timeout)
    deadline = (time.monotonic() + budget, budget)
    skip_httpx_cli()
    import httpx

    verify = needs_tls([a.base for a in attempts] + [lane.url for lane in lanes])
    with _Client(httpx, verify) as c:
        chats = [(a, a.base + "/v1/chat/completions") for a in attempts]
        proof_jobs = [
            (a, url, Background(_request, c.client, "POST", url, False, body, deadline))
            for a, url, body in ((a, url, chat_body(a.role)) for a, url in chats)
        ]
        lane_jobs = [
            (lane, Background(_request, c.client, "GET", lane.url, False, None, deadline))
            for lane in lanes
        ]
        proofs, ports = [], []
        for a, url, job in proof_jobs:
            result = waited(job, deadline)
            proofs.append({"via": a.via, "role": a.role, "host": a.host, "url": url, **result})
        for lane, job in lane_jobs:
            result = waited(job, deadline)
            ports.append({"box": lane.box, "container": lane.container, "url": lane.url, **result})
        jobs = [job for *_, job in proof_jobs] + [job for _, job in lane_jobs]
        c.leave_open = not all(job.done for job in jobs)
    return {"weakest_link": proofs, "lane_ports": ports}


class _Client:
    """The audit's httpx client, shared by its threads (httpx's pool is thread-safe), without
    a limit on connections (httpx's 100 would make the 101st box wait on the pool). Left open
    when a thread was given up while still using it: closing the pool under it could wait."""

    def __init__(self, httpx: Any, verify: bool) -> None:
        timeout = httpx.Timeout(READ_S, connect=CONNECT_S)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self.client = httpx.Client(timeout=timeout, trust_env=False, verify=verify, limits=limits)
        self.leave_open = False

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.leave_open:
            self.client.close()


def _request(
    client: Any,
    method: str,
    url: str,
    keep_body: bool = False,
    json: Any = None,
    deadline: Deadline | None = None,
) -> dict[str, Any]:
    """One request, its failure included; sent only while its box has time left
    (`deadline`), each of its waits bounded by what is left."""
    import httpx

    started = time.monotonic()
    timeout = None
    if deadline is not None:
        left = deadline[0] - started
        if left <= 0:
            return {"status": None, "error": "not sent: its box's time was spent"}
        timeout = httpx.Timeout(min(READ_S, left), connect=min(CONNECT_S, left))
    try:
        resp, raw = fetch(client, method, url, json=json, deadline=deadline, timeout=timeout)
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
