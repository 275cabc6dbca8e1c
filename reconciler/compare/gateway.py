"""`contract` and `auth`: what the gateway advertises and enforces, against the lanes and the
desired state.

The gateway's /capabilities `context` comes from its own start-time environment, never from
the lane (lobes roles.py:793-833), so it goes stale after a lane-only recreate (incident #208):
the lane's real window is proven from `docker inspect` (its `--max-model-len`) and from the
lane's own /v1/models. Auth posture is only visible on a gated route: /health and
/capabilities stay 200 with a key armed, so we ask `GET /v1/models` without credentials.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from reconciler.compare.containers import service_containers
from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import Drift, Value
from reconciler.compare.rules import rule
from reconciler.compare.values import flags_of
from reconciler.desired.roles import ENV_PREFIX
from reconciler.observe.document import (
    CapabilitiesProbe,
    ControllerProbes,
    HealthProbe,
    LaneProbe,
    Observed,
    RoleEntry,
)

NO_ROLE = RoleEntry()


def lane_windows(exp: BoxExpectation, doc: Observed) -> dict[str, int | None]:
    """role -> the --max-model-len its running lane was started with (docker inspect): of the
    container compare_containers compares as the service's, never of a second copy."""
    by_service = service_containers(doc)
    out: dict[str, int | None] = {}
    for service, lane in exp.lanes.items():
        group = by_service.get(service)
        c = group[0] if group else None
        flags = flags_of(c.cmd if c else None)
        given = flags.get("--max-model-len")
        raw = given[-1] if given else None
        out[lane.role] = _window(raw)
    return out


def _window(raw: object) -> int | None:
    # ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
    if isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) <= 15:
        return int(raw)
    return None


def told_windows(doc: Observed) -> frozenset[str] | None:
    """The roles whose window the gateway is told: its `<PREFIX>_MAX_MODEL_LEN` in the
    gateway's rendered environment. lobes 0.91's compose template passes PRIMARY, MULTIMODAL,
    MUSE, WORKER, ASSOCIATE, EMBED and RERANK, never HAND: its gateway advertises the hand
    role's catalog window (32768) whatever the lane serves, and no converge can change that.
    None: not known (no render), every role as told."""
    services = doc.render.services
    gateway = services.get("gateway") if services is not None else None
    if gateway is None:
        return None
    told = {f"{prefix}_MAX_MODEL_LEN" for prefix in ENV_PREFIX.values()}
    told &= set(gateway.environment)
    return frozenset(
        role for role, prefix in ENV_PREFIX.items() if f"{prefix}_MAX_MODEL_LEN" in told
    )


def compare_contract(exp: BoxExpectation, doc: Observed) -> Iterator[Drift]:
    gateway = doc.gateway
    windows = lane_windows(exp, doc)
    yield from contract_drifts(
        exp, gateway.health, gateway.capabilities, windows, doc.lanes, told_windows(doc)
    )


def contract_drifts(
    exp: BoxExpectation,
    health: HealthProbe | None,
    caps_probe: CapabilitiesProbe | None,
    windows: Mapping[str, int | None],
    lanes: Mapping[str, LaneProbe],
    told: frozenset[str] | None = None,
) -> Iterator[Drift]:
    """The contract from these probes. `windows`: role -> the window its lane was started with
    (None: unknown); `lanes`: each lane's own /v1/models; `told`: the roles whose window the
    gateway is told (told_windows; None: all). A box seen only from the controller
    (compare/partial.py) has no windows and no lanes: its contract is the desired one."""
    # A body lobes never sends (`error` beside a status) holds no version: not compared, the
    # probe's error says why (compare/box.py), rather than a version "absent".
    if health is not None and health.status == 200 and not health.error:
        version = health.version
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
    ok = caps_probe is not None and caps_probe.status == 200
    caps = caps_probe.roles if caps_probe is not None and ok else None
    if caps is None:
        return  # an unanswered probe is a box error, reported by the caller
    for role, window in sorted(windows.items()):
        entry = caps.get(role, NO_ROLE)
        yield from _local_role(exp, lanes, role, window, entry, told is None or role in told)
    for role, contract in sorted(exp.contract.items()):
        if contract.proxied_to is not None:
            yield from _proxied_role(exp, role, contract.proxied_to, caps.get(role, NO_ROLE))


def _capabilities(
    exp: BoxExpectation, name: str, path: str, desired: Value, observed: Value, note: str
) -> Drift:
    """A drift of what the gateway's /capabilities says, by the rule `name`."""
    r = rule(name)
    return Drift(
        exp.name, r.kind, "gateway", path, desired, observed, r.action,
        source="GET /capabilities", note=note,
    )  # fmt: skip


def _untold(exp: BoxExpectation, role: str, path: str, advertised: int | None) -> Iterator[Drift]:
    """A role whose window the gateway is not told (told_windows): it advertises its catalog
    window, which neither a lane's nor the gateway's recreate changes. A desired context
    other than that is said, for the record, never planned: a recreate of the gateway failed
    its check after the converge, and rolled back, on every apply."""
    contract = exp.contract.get(role)
    if contract is None or contract.context is None or advertised == contract.context:
        return
    yield _capabilities(
        exp,
        "contract.untold-context",
        path,
        contract.context,
        advertised,
        f"lobes' compose passes no {ENV_PREFIX.get(role, role.upper())}_MAX_MODEL_LEN to "
        "the gateway: it advertises its own window for this role whatever the lane serves",
    )


def _local_role(
    exp: BoxExpectation,
    lanes: Mapping[str, LaneProbe],
    role: str,
    window: int | None,
    entry: RoleEntry,
    told: bool = True,
) -> Iterator[Drift]:
    advertised = entry.context
    path = f"capabilities.{role}.context"
    # The lane's desired window: a lane that does not serve it is the argv entry's to fix (a
    # recreate of the lane), not the gateway's, whose advertised window may be the right one.
    wanted = next((x.max_model_len for x in exp.lanes.values() if x.role == role), window)
    contract = exp.contract.get(role)
    if contract is not None and not contract.feasible:
        # Infeasible here; another member may still serve it through the mesh (ready, proxied).
        if entry.feasible:
            state = f"ready={entry.ready} feasible={entry.feasible}"
            yield _capabilities(
                exp,
                "contract.ready",
                f"capabilities.{role}.feasible",
                "infeasible",
                state,
                f"contract.{role}.feasible is false",
            )
        return
    if not told:
        yield from _untold(exp, role, path, advertised)
    elif window is not None and advertised != window and window != wanted:
        # The lane, not the gateway, left its desired window (a hand-edited compose file): the
        # mismatch clients meet is said, but the lane's entries fix it; recreating the gateway
        # (its window is the desired one) would change nothing.
        yield _capabilities(
            exp,
            "contract.stale-lane",
            path,
            window,
            advertised,
            f"the {role} lane serves {window} (docker inspect), not its desired {wanted}: "
            "clients are told the gateway's window; the lane's own entries fix it",
        )
    elif window is not None and advertised != window:
        yield _capabilities(
            exp,
            "contract.context",
            path,
            window,
            advertised,
            f"the {role} lane serves {window} (docker inspect); the gateway still "
            "advertises its start-time window",
        )
    elif contract and contract.context is not None and advertised != contract.context:
        yield _capabilities(
            exp,
            "contract.desired-context",
            path,
            contract.context,
            advertised,
            f"contract.{role}.context",
        )
    if contract is not None and not (entry.ready and entry.feasible is not False):
        r = rule("contract.ready")
        state = f"ready={entry.ready} feasible={entry.feasible}"
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
    probe = lanes.get(service or "")
    served = probe.max_model_len if probe is not None else None
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


def _proxied_role(exp: BoxExpectation, role: str, host: str, entry: RoleEntry) -> Iterator[Drift]:
    r = rule("contract.ready")
    member, proxied = entry.member, entry.proxied
    if proxied and member == host and entry.ready:
        return
    observed = f"proxied={proxied} member={member} ready={entry.ready}"
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
    exp: BoxExpectation, doc: Observed | None, controller: ControllerProbes
) -> Iterator[Drift]:
    """`doc` None: the box was not observed, only the controller's side is compared."""
    r = rule("auth.posture")
    want = 401 if exp.gateway.auth == "keyed" else 200
    loopback = doc.gateway.models_noauth if doc is not None else None
    remote = controller.models_noauth
    sides = (
        ("loopback", loopback.status if loopback is not None else None),
        ("controller", remote.status if remote is not None else None),
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
