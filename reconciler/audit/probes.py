"""The mesh side: what a caller on the network gets from each gateway without credentials.

Run from the controller with httpx. Nothing here carries a key: every request is the one an
anonymous caller could send. Phase 1 runs while the collectors run; phase 2 (the weakest-link
proofs and published lane ports) needs phase 1's postures to know which request proves what.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reconciler.observe.probes import (
    GRACE_S,
    Deadline,
    ProbeRun,
    body_json,
    failure,
    fetch,
    needs_tls,
    probe_budget,
    skip_httpx_cli,
    unanswered,
    unanswered_gateway,
)
from reconciler.observe.transport import Background, Pool
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
    box. A box still going past it (and GRACE_S) is given up: its probes say so. A run over a
    fleet bounds how many boxes go at once: MeshSide."""
    skip_httpx_cli()
    import httpx  # imported here: only commands that probe pay for it

    with _Client(httpx, needs_tls([ep.base for ep in endpoints])) as c:
        out, c.leave_open = _probed(c.client, endpoints, timeout)
    return out


def _probed(
    client: Any, endpoints: list[Endpoint], timeout: float | None
) -> tuple[dict[str, dict[str, Any]], bool]:
    """Each box's probes through `client`, every box at once, each within `timeout` from now;
    and whether a box was given up while its thread may still use the client."""
    budget = probe_budget(timeout)
    deadline = (time.monotonic() + budget, budget)
    jobs = [(ep, Background(_box_probes, client, ep, deadline)) for ep in endpoints]
    out = {ep.box: _waited_box(ep, job, deadline) for ep, job in jobs}
    return out, not all(job.done for _, job in jobs)


class MeshSide(ProbeRun):
    """mesh_side over a fleet, at most `size` boxes at a time (the collectors' limit,
    fanout.limit(), as drift's ProbeRun bounds its probes), each box within `timeout` from its
    own start, all through one client. All at once, a 1,000-box audit opened a socket and
    started a thread for every box together: past the controller's open files (1,024 by
    default) the later boxes' probes failed, read as their gateways' faults. A `Background`
    for gather (observe.py): `result()` is every box's probes, a box not done `unanswered`."""

    def __init__(self, endpoints: list[Endpoint], timeout: float | None, size: int) -> None:
        self._endpoints = {ep.box: ep for ep in endpoints}
        self._client: Any = None  # the run's, made in its thread (_all)
        self._given_up = False  # a box given up whose thread may still use the client
        bases = {ep.box: ep.base for ep in endpoints}
        super().__init__(self._probe_some, bases, timeout, size)

    def _all(self) -> dict[str, dict[str, Any]]:
        skip_httpx_cli()
        import httpx

        with _Client(httpx, needs_tls(list(self._bases.values()))) as c:
            self._client = c.client
            try:
                return super()._all()
            finally:
                c.leave_open = self._given_up

    def _probe_some(self, bases: dict[str, str], budget: float | None) -> dict[str, dict[str, Any]]:
        out, given_up = _probed(self._client, [self._endpoints[b] for b in bases], budget)
        self._given_up = self._given_up or given_up
        return out

    def _filled(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            done = dict(self._out)
        return {
            box: done.get(box) or _unanswered_box(ep, self._budget)
            for box, ep in self._endpoints.items()
        }


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
    try:
        found: dict[str, Any] = job.result(max(0.0, deadline[0] + GRACE_S - time.monotonic()))
        return found
    except TimeoutError:  # given up: every probe of the box says it had no answer in time
        return _unanswered_box(ep, deadline[1])


def _unanswered_box(ep: Endpoint, budget: float) -> dict[str, Any]:
    chat = {**unanswered(budget), "model": ep.chat_model}
    return {
        "base": ep.base,
        **unanswered_gateway(budget),
        "audit": {"chat_noauth": chat, "mesh_detect": unanswered(budget)},
    }


def prove(
    attempts: list[ProofAttempt],
    lanes: list[LanePort],
    timeout: float | None = None,
    size: int | None = None,
) -> dict[str, Any]:
    """Phase 2: the weakest-link requests and unauthenticated calls to published lane ports,
    at most `size` at a time (default: the collectors' limit, fanout.limit(); five lanes a
    box made 5,000 sockets and threads at once at 1,000 boxes), each within `timeout`
    (default: the run's) from its own start."""
    budget = probe_budget(timeout)
    skip_httpx_cli()
    import httpx

    verify = needs_tls([a.base for a in attempts] + [lane.url for lane in lanes])
    with _Client(httpx, verify) as c:
        chats = [(a, a.base + "/v1/chat/completions", chat_body(a.role)) for a in attempts]
        calls: list[Callable[[Deadline], dict[str, Any]]] = [
            functools.partial(_request, c.client, "POST", url, False, body)
            for _, url, body in chats
        ]
        calls += [
            functools.partial(_request, c.client, "GET", lane.url, False, None) for lane in lanes
        ]
        results, c.leave_open = _bounded(calls, _size(size), budget)
    proofs = [
        {"via": a.via, "role": a.role, "host": a.host, "url": url, **result}
        for (a, url, _), result in zip(chats, results[: len(chats)], strict=True)
    ]
    ports = [
        {"box": lane.box, "container": lane.container, "url": lane.url, **result}
        for lane, result in zip(lanes, results[len(chats) :], strict=True)
    ]
    return {"weakest_link": proofs, "lane_ports": ports}


def _size(size: int | None) -> int:
    if size is not None:
        return size
    from reconciler.observe.fanout import limit

    return limit()


def _bounded(
    calls: list[Callable[[Deadline], dict[str, Any]]], size: int, budget: float
) -> tuple[list[dict[str, Any]], bool]:
    """Each call given its own deadline (`budget` from when it starts), at most `size` running
    at once, in order; a call not done within its deadline and GRACE_S is `unanswered`. And
    whether one was given up while its thread may still run."""
    results: list[dict[str, Any] | None] = [None] * len(calls)

    def run(item: tuple[int, Callable[[Deadline], dict[str, Any]]]) -> None:
        index, call = item
        try:
            results[index] = call((time.monotonic() + budget, budget))
        except Exception as exc:  # as _request's own: one request's failure, not the run's
            results[index] = {"status": None, "error": failure(exc)}

    pool = Pool(enumerate(calls), size, run)
    turns = -(-len(calls) // max(1, size))
    pool.wait(turns * (budget + GRACE_S) + GRACE_S)  # each ends by its deadline; Ctrl-C ends it
    pool.stop()  # a call not started by now never starts
    done = list(results)
    return [r if r is not None else unanswered(budget) for r in done], not pool.done


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
