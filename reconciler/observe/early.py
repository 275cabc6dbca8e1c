"""Start the boxes' collectors before anything heavy is imported, when nothing changed.

A drift run's two slow halves are independent: the boxes answering over SSH, and this process
importing what it compares and reports with. When the remembered drift inputs are still valid
(reconciler/drift_inputs.py: same desired-state files, same code), the collectors are sent at
once from them, the controller's own gateway probes start in a thread, and the run goes on to
import the comparison while the boxes work. On a miss nothing starts here: the desired state
is loaded and validated first, and the boxes are asked after.
"""

from __future__ import annotations

import base64
import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.drift_inputs import DriftInputs, cached_inputs
from reconciler.observe.probes import probe_gateways
from reconciler.observe.transport import Running, python_command, spawn

COLLECTOR = Path(__file__).parent / "remote" / "collector.py"


@dataclass
class EarlyStart:
    """Collectors and gateway probes already running, and the inputs they were started from."""

    inputs: DriftInputs
    running: dict[str, Running]
    run_key: str
    probes: Future[dict[str, dict[str, Any]]]

    def cancel(self) -> None:
        for handle in self.running.values():
            handle.cancel()


def encoded_payload(payload: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(payload).encode("utf-8")).decode("ascii")


def start(root: Path, inventory: Path, boxes: list[str] | None, run_key: str) -> EarlyStart | None:
    """Spawn the collectors from the remembered inputs, or None if anything may have changed."""
    inputs = cached_inputs(root, inventory)
    if inputs is None:
        return None
    wanted = boxes or list(inputs.boxes)
    if any(box not in inputs.boxes for box in wanted):
        return None  # an unknown box is reported by the normal path
    running = {
        box: spawn(
            inputs.targets[box],
            python_command(COLLECTOR, encoded_payload(inputs.payload(box, run_key))),
        )
        for box in wanted
    }
    # The mesh-side probes need nothing but the URLs: start them too (httpx is imported in
    # that thread, while this one goes on to import the comparison).
    probes = start_probes({box: inputs.bases[box] for box in wanted})
    return EarlyStart(inputs, running, run_key, probes)


def start_probes(bases: dict[str, str]) -> Future[dict[str, dict[str, Any]]]:
    """The controller's gateway probes, running in a thread of their own."""
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(probe_gateways, bases)
    pool.shutdown(wait=False)  # the thread ends with the probes; nobody waits for the pool
    return future
