"""`reconcile drift`: desired -> observe -> compare -> report, changing nothing anywhere.

The one-way flow in one place: the desired state is loaded and validated first (an invalid
state stops the run before any connection) and flattened into plain drift inputs, each box is
observed once, every comparison is pure, and the report is rendered from values.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler import fast_json
from reconciler.compare.box import compare_box
from reconciler.compare.drift import BoxResult, DriftReport
from reconciler.drift_inputs import DriftInputs, drift_inputs
from reconciler.observe.document import Fault, FaultKind
from reconciler.observe.observe import (
    BoxObservation,
    load_snapshot,
    observe,
    recorded_digest,
    save_snapshot,
    snapshot_index,
    snapshot_observation,
)
from reconciler.observe.payload import new_run_key
from reconciler.replay_workers import map_boxes, worker_count

if TYPE_CHECKING:
    from reconciler.desired.fleet import Fleet
    from reconciler.observe.early import EarlyStart


NOT_IN_SNAPSHOT = Fault(FaultKind.NOT_OBSERVED, "not in the snapshot")


@dataclass(frozen=True)
class DriftRun:
    """A drift run's report and the observations it was judged on; `parts`: each box's part
    of the report, when the run was asked for them and made them beside the comparisons."""

    report: DriftReport
    observations: dict[str, BoxObservation]
    parts: tuple[Any, ...] | None = None


def run_drift(
    fleet: Fleet,
    boxes: list[str],
    save_to: Path | None = None,
    from_snapshot: Path | None = None,
) -> DriftRun:
    """Drift of `boxes` of a loaded, validated fleet."""
    return run_drift_on(drift_inputs(fleet), boxes, save_to, from_snapshot)


def run_drift_on(
    inputs: DriftInputs,
    boxes: list[str],
    save_to: Path | None = None,
    from_snapshot: Path | None = None,
    early: EarlyStart | None = None,
    keep_observations: bool = True,
    part: Callable[[BoxResult], Any] | None = None,
) -> DriftRun:
    """`keep_observations=False` (a report is all the caller wants): a snapshot's boxes are
    read and compared one at a time and not kept, so a replay of 1,000 boxes holds one box's
    observation at a time, not all of them; the run's `observations` are then empty.
    `part`: each box's part of the report, made beside its comparison when a replay's boxes
    are compared by worker processes (report/json_parts.py; else `parts` is None)."""
    run_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + os.urandom(3).hex()
    if from_snapshot is not None and save_to is None and not keep_observations:
        return _replay(inputs, boxes, from_snapshot, run_id, part)
    if from_snapshot is not None:
        index, observations = load_snapshot(from_snapshot)
        missing = [b for b in boxes if b not in observations]
        boxes = [b for b in boxes if b in observations]
        run_id = str(index.get("run_id", run_id))
        for name in missing:
            observations[name] = BoxObservation(name, None, None, fault=NOT_IN_SNAPSHOT)
        boxes += missing
    else:
        run_key = early.run_key if early is not None else new_run_key()
        observations = observe(inputs, boxes, run_key, early=early)
    if save_to is not None:
        meta = {"run_id": run_id, "inventory": inputs.inventory_file, "taken_at": _now()}
        save_snapshot(save_to, {b: observations[b] for b in boxes}, meta, inputs.facts)
    results = tuple(
        compare_box(
            inputs.expectations[name],
            observations[name].document,
            observations[name].probes,
            observations[name].failure,
            observations[name].connection,
        )
        for name in boxes
    )
    report = DriftReport(
        boxes=results, inventory=inputs.inventory_file, generated_at=_now(), run_id=run_id
    )
    return DriftRun(report, observations)


def _replay(
    inputs: DriftInputs,
    boxes: list[str],
    directory: Path,
    run_id: str,
    part: Callable[[BoxResult], Any] | None = None,
) -> DriftRun:
    index = snapshot_index(directory)
    present = set(index["boxes"])
    order = [b for b in boxes if b in present] + [b for b in boxes if b not in present]
    in_c = len(present) >= fast_json.LARGE  # files read by msgspec (reconciler/fast_json.py)
    if in_c:  # made before any worker forks, so that they share them (replay_workers.py)
        from reconciler.observe.document_c import ready

        fast_json.ready_decoder()
        ready()

    def replay_box(name: str) -> BoxResult:
        if name in present:
            path = directory / f"{name}.json"
            digest = recorded_digest(index, name)
            obs = snapshot_observation(name, path, digest, in_c, raw_kept=False)
        else:
            obs = BoxObservation(name, None, None, fault=NOT_IN_SNAPSHOT)
        return compare_box(
            inputs.expectations[name], obs.document, obs.probes, obs.failure, obs.connection
        )

    # Each box's objects die by reference count (reconciler/gc_pause.py); a large replay's
    # boxes are read and compared on every core (reconciler/replay_workers.py). Remembered
    # expectations are unpickled on first use, each box's apart (drift_inputs._PerBox): each
    # worker unpickles only the boxes it compares, from the cache file's pages it reads.
    workers = worker_count(len(order))
    parts = None
    if workers > 1 and part is not None:
        with_parts = map_boxes(lambda name: _with_part(replay_box(name), part), order, workers)
        results = [result for result, _ in with_parts]
        parts = tuple(made for _, made in with_parts)
    else:
        results = map_boxes(replay_box, order, workers)
    report = DriftReport(
        boxes=tuple(results),
        inventory=inputs.inventory_file,
        generated_at=_now(),
        run_id=str(index.get("run_id", run_id)),
    )
    return DriftRun(report, {}, parts)


def _with_part(result: BoxResult, part: Callable[[BoxResult], Any]) -> tuple[BoxResult, Any]:
    return result, part(result)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
