"""A box that could not be observed, whose gateway still answered the controller. Pure.

SSH failed (or the collector's answer was refused), but the controller's own probes of the
gateway need no SSH: `/health`, `/capabilities` and `GET /v1/models` without a key, sent from
the mesh side while the collectors ran (observe/probes.py). What they show is compared: the
gateway's version, its contract against the desired one (without the lanes' windows, which
only `docker inspect` on the box knows), and its auth posture from the mesh side. The box stays
not observed (its error says why, the run exits 1) and is marked partial, with what was seen.
"""

from __future__ import annotations

from typing import Any

from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import BoxError, BoxResult, Drift, Part, sorted_drifts
from reconciler.compare.gateway import compare_auth, contract_drifts
from reconciler.observe.document import ControllerProbes, Probe

PARTIAL = "only the gateway, as the controller sees it"


def answered(probes: ControllerProbes) -> bool:
    """Did any of the controller's probes get an HTTP answer (any status)?"""
    return any(p is not None and p.status is not None for p in _probes(probes))


def partial_result(exp: BoxExpectation, probes: ControllerProbes, why: BoxError) -> BoxResult:
    """The result of a box that was not observed (`why`): partial when its gateway answered
    the controller, else nothing but the error."""
    if not answered(probes):
        return BoxResult(exp.name, reachable=False, errors=(why,))
    # Every desired lane's role, its running window unknown: the desired contract decides.
    windows: dict[str, int | None] = {lane.role: None for lane in exp.lanes.values()}
    drifts: list[Drift] = [
        *contract_drifts(exp, probes.health, probes.capabilities, windows, {}),
        *compare_auth(exp, None, probes),
    ]
    # A probe answered with a body lobes never sends (observe/document.py `_answered`): what
    # it would tell was not compared, said beside why the box was not observed.
    odd = [
        BoxError(Part.GATEWAY_PROBE, f"gateway {name} (from the controller)", probe.error)
        for name, probe in (("health", probes.health), ("capabilities", probes.capabilities))
        if probe is not None and probe.status is not None and probe.error
    ]
    return BoxResult(
        exp.name,
        reachable=False,
        drifts=sorted_drifts(drifts),
        errors=(why, *odd),
        facts=controller_facts(probes),
        partial=f"{PARTIAL}: {seen(probes)}",
    )


def seen(probes: ControllerProbes) -> str:
    """`GET /health 200 (0.91.0), GET /capabilities 200, GET /v1/models without a key 401
    (keyed)`: what each probe got, for a person."""
    health, caps, models = probes.health, probes.capabilities, probes.models_noauth
    version = f" ({health.version})" if health is not None and health.version else ""
    posture = ""
    if models is not None and models.status is not None:
        posture = " (keyed)" if models.status == 401 else " (open)"
    return ", ".join(
        (
            f"GET /health {_status(health)}{version}",
            f"GET /capabilities {_status(caps)}",
            f"GET /v1/models without a key {_status(models)}{posture}",
        )
    )


def controller_facts(probes: ControllerProbes) -> dict[str, Any]:
    health, models = probes.health, probes.models_noauth
    return {
        "gateway_version": health.version if health is not None else None,
        "controller_health": health.status if health is not None else None,
        "controller_models_noauth": models.status if models is not None else None,
    }


def _probes(probes: ControllerProbes) -> tuple[Probe | None, ...]:
    return (probes.health, probes.capabilities, probes.models_noauth)


def _status(probe: Probe | None) -> str:
    if probe is None:
        return "not sent"
    if probe.status is not None:
        return str(probe.status)
    return f"no answer ({probe.error})" if probe.error else "no answer"
