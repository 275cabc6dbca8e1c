"""Observe boxes for an audit: the drift collector (with its audit section) over SSH, the mesh
side's probes from the controller at the same time, then the live proofs phase 2 asks for.

The per-box results are the same `BoxObservation`s a drift run makes (snapshots included),
with the controller's audit probes under `controller["audit"]`.
"""

from __future__ import annotations

from typing import Any

from reconciler.audit.probes import Endpoint, LanePort, MeshSide, ProofAttempt, prove
from reconciler.desired.envfile import fleet_env
from reconciler.desired.fleet import Fleet
from reconciler.drift_inputs import gateway_bases, targets
from reconciler.observe.collectors import start_collectors
from reconciler.observe.fanout import box_timeout, cancel_all, limit
from reconciler.observe.observe import BoxObservation, gather
from reconciler.observe.payload import collector_payload, local_chat_role


def gateway_base(fleet: Fleet, box: str) -> str:
    """Where a mesh member (and the controller) reaches the box's gateway: as drift probes it."""
    return gateway_bases(fleet, [box])[box]


def observe_audit(
    fleet: Fleet, boxes: list[str], run_key: str, timeout: float | None = None
) -> dict[str, BoxObservation]:
    """Every box's collector (audit's payload) and the controller's mesh-side probes; each
    box's `timeout` defaults to the configured one (--timeout, $FLEET_BOX_TIMEOUT, 60 s)."""
    envs = fleet_env(fleet, boxes)
    payloads = {
        name: collector_payload(fleet.boxes[name], envs[name], run_key, audit=True)
        for name in boxes
    }
    endpoints = [
        Endpoint(b, gateway_base(fleet, b), local_chat_role(fleet.boxes[b])) for b in boxes
    ]
    running = start_collectors(targets(fleet, boxes), payloads)
    try:
        probes = MeshSide(endpoints, timeout, limit())  # as many boxes at once as the ssh
        return gather(running, probes, timeout or box_timeout())
    except BaseException:
        # Ctrl-C (exit 130) or a failure: no box's ssh is left running behind the run, and none
        # waiting for a slot starts.
        cancel_all(running.values())
        raise


def attach_proofs(
    observations: dict[str, BoxObservation],
    attempts: list[ProofAttempt],
    lanes: list[LanePort],
) -> None:
    """Phase 2, stored with the box each request went to (so a snapshot keeps it)."""
    if not attempts and not lanes:
        return
    found = prove(attempts, lanes)
    for box, obs in observations.items():
        audit: dict[str, Any] = obs.controller.setdefault("audit", {})
        audit["weakest_link"] = [p for p in found["weakest_link"] if p["via"] == box]
        audit["lane_ports"] = [p for p in found["lane_ports"] if p["box"] == box]
        obs.reread()  # the typed view of the probes, proofs included (parsed like the rest)
