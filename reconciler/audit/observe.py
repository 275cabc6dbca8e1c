"""Observe boxes for an audit: the drift collector (with its audit section) over SSH, the mesh
side's probes from the controller at the same time, then the live proofs phase 2 asks for.

`observe.observe()` builds its payloads itself and takes no audit flag, so this mirrors its
few lines of orchestration with `collector_payload(..., audit=True)`; the per-box results are
the same `BoxObservation`s (snapshots included), with the controller's audit probes under
`controller["audit"]`.
"""

from __future__ import annotations

import base64
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from reconciler.audit.probes import Endpoint, LanePort, ProofAttempt, mesh_side, prove
from reconciler.desired.envfile import box_env
from reconciler.desired.fleet import Fleet
from reconciler.drift_inputs import targets
from reconciler.observe.early import COLLECTOR
from reconciler.observe.observe import BoxObservation, _observation
from reconciler.observe.payload import collector_payload, local_chat_role
from reconciler.observe.transport import python_command, run_all


def gateway_base(fleet: Fleet, box: str) -> str:
    """Where a mesh member (and the controller) reaches the box's gateway: as drift probes it."""
    return f"http://{fleet.connection(box).ssh_hostname}:{fleet.boxes[box].gateway.port}"


def observe_audit(
    fleet: Fleet, boxes: list[str], run_key: str, timeout: float = 60.0
) -> dict[str, BoxObservation]:
    commands = {}
    for name in boxes:
        payload = collector_payload(fleet.boxes[name], box_env(fleet, name), run_key, audit=True)
        encoded = base64.b64encode(json.dumps(payload).encode("utf-8")).decode("ascii")
        commands[name] = python_command(COLLECTOR, encoded)
    endpoints = [
        Endpoint(b, gateway_base(fleet, b), local_chat_role(fleet.boxes[b])) for b in boxes
    ]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=1) as pool:
        probes = pool.submit(mesh_side, endpoints)
        results = run_all(list(targets(fleet, boxes).values()), commands, timeout=timeout)
        controller = probes.result()
    elapsed = time.monotonic() - started
    return {
        name: _observation(name, results[name], controller.get(name, {}), elapsed) for name in boxes
    }


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
