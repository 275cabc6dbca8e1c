"""Observe boxes: one collector run per box over SSH, plus the controller's own gateway probes,
all boxes at once. Everything comes back as plain JSON-able data (a BoxObservation), which is
what `--save-snapshot` writes and `--from-snapshot` reads back for an offline comparison.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reconciler.drift_inputs import DriftInputs
from reconciler.observe.early import EarlyStart, launch
from reconciler.observe.transport import RemoteResult, Running, finish_all


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


def observe(
    inputs: DriftInputs,
    boxes: list[str],
    run_key: str,
    timeout: float = 60.0,
    early: EarlyStart | None = None,
) -> dict[str, BoxObservation]:
    """Observe `boxes`; `early` holds collectors already started from these same inputs."""
    if early is None or early.run_key != run_key or set(early.running) != set(boxes):
        if early is not None:
            early.cancel()
        early = launch(inputs, boxes, run_key)
    return gather(early.running, early.probes, timeout)


def gather(
    running: dict[str, Running], probes: Future[dict[str, dict[str, Any]]], timeout: float
) -> dict[str, BoxObservation]:
    """Wait for every box's collector and for the controller's probes: one observation each."""
    started = time.monotonic()
    results = finish_all(list(running.values()), timeout)
    controller = probes.result()
    elapsed = time.monotonic() - started
    return {
        box: _observation(box, result, controller.get(box, {}), elapsed)
        for box, result in results.items()
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
