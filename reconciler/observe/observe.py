"""Observe boxes: one collector run per box over SSH, plus the controller's own gateway probes,
all boxes at once. Everything comes back as plain JSON-able data (a BoxObservation), which is
what `--save-snapshot` writes and `--from-snapshot` reads back for an offline comparison.
"""

from __future__ import annotations

import base64
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reconciler.desired.envfile import box_env
from reconciler.desired.fleet import Fleet
from reconciler.desired.locate import inventory_file
from reconciler.observe.early import EarlyStart, store
from reconciler.observe.payload import collector_payload
from reconciler.observe.probes import probe_gateways
from reconciler.observe.transport import RemoteResult, Target, finish_all, python_command, spawn

COLLECTOR = Path(__file__).parent / "remote" / "collector.py"


@dataclass
class BoxObservation:
    box: str
    collected: dict[str, Any] | None  # the collector's document; None if it could not run
    error: str | None  # why the box could not be observed at all
    controller: dict[str, Any] = field(default_factory=dict)  # probes from the controller
    elapsed_s: float = 0.0

    @property
    def reachable(self) -> bool:
        return self.collected is not None


def targets(fleet: Fleet, boxes: list[str]) -> list[Target]:
    out = []
    for name in boxes:
        conn = fleet.connection(name)
        out.append(
            Target(
                box=name,
                hostname=conn.ssh_hostname,
                user=conn.ssh_user,
                port=conn.ssh_port,
                key_file=fleet.resolve_path(conn.ssh_key) if conn.ssh_key else None,
                known_hosts=(
                    fleet.resolve_path(conn.ssh_known_hosts_file)
                    if conn.ssh_known_hosts_file
                    else None
                ),
            )
        )
    return out


def observe(
    fleet: Fleet,
    boxes: list[str],
    run_key: str,
    timeout: float = 60.0,
    early: EarlyStart | None = None,
) -> dict[str, BoxObservation]:
    """Observe `boxes`; `early` holds collectors started from cached payloads, used only if
    they were sent exactly what this desired state asks for."""
    payloads = {
        name: collector_payload(fleet.boxes[name], box_env(fleet, name), run_key) for name in boxes
    }
    box_targets = {t.box: t for t in targets(fleet, boxes)}
    bases = gateway_bases(fleet, boxes)
    inventory_path = inventory_file(fleet.root, fleet.inventory_file)
    started = time.monotonic()
    if early is not None and early.payloads == payloads and early.run_key == run_key:
        running = early.running
    else:
        if early is not None:
            early.cancel()  # the desired state changed since the cache: ask again
        running = {}
        for name, payload in payloads.items():
            encoded = base64.b64encode(json.dumps(payload).encode("utf-8")).decode("ascii")
            running[name] = spawn(box_targets[name], python_command(COLLECTOR, encoded))
        store(fleet.root, inventory_path, list(fleet.inputs), box_targets, payloads, bases)
    with ThreadPoolExecutor(max_workers=1) as pool:
        if early is not None and early.probes is not None and early.bases == bases:
            probes = early.probes
        else:
            probes = pool.submit(probe_gateways, bases)
        results = finish_all(list(running.values()), timeout)
        controller = probes.result()
    elapsed = time.monotonic() - started
    return {
        name: _observation(name, results[name], controller.get(name, {}), elapsed) for name in boxes
    }


def _observation(
    box: str, result: RemoteResult, controller: dict[str, Any], elapsed: float
) -> BoxObservation:
    if result.error:
        return BoxObservation(box, None, result.error, controller, elapsed)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        return BoxObservation(box, None, f"collector failed: {last[:300]}", controller, elapsed)
    try:
        doc = json.loads(result.stdout)
    except ValueError:
        return BoxObservation(box, None, "collector printed no JSON", controller, elapsed)
    return BoxObservation(box, doc, None, controller, elapsed)


def gateway_bases(fleet: Fleet, boxes: list[str]) -> dict[str, str]:
    return {
        name: f"http://{fleet.connection(name).ssh_hostname}:{fleet.boxes[name].gateway.port}"
        for name in boxes
    }


# -- snapshots -------------------------------------------------------------------------------------
SNAPSHOT_VERSION = 1


def save_snapshot(
    directory: Path, observations: dict[str, BoxObservation], meta: dict[str, Any]
) -> None:
    """One JSON file per box plus an index; secrets were hashed on the boxes already."""
    directory.mkdir(parents=True, exist_ok=True)
    index = {"snapshot": SNAPSHOT_VERSION, **meta, "boxes": sorted(observations)}
    for name, obs in observations.items():
        text = json.dumps(asdict(obs), indent=1, sort_keys=True)
        (directory / f"{name}.json").write_text(text + "\n", encoding="utf-8")
    (directory / "index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def load_snapshot(directory: Path) -> tuple[dict[str, Any], dict[str, BoxObservation]]:
    index = json.loads((directory / "index.json").read_text(encoding="utf-8"))
    if index.get("snapshot") != SNAPSHOT_VERSION:
        raise ValueError(f"{directory}: snapshot version {index.get('snapshot')} is not supported")
    observations = {}
    for name in index["boxes"]:
        raw = json.loads((directory / f"{name}.json").read_text(encoding="utf-8"))
        observations[name] = BoxObservation(**raw)
    return index, observations
