"""`reconcile drift`: desired -> observe -> compare -> report, changing nothing anywhere.

The one-way flow in one place: the desired state is loaded and validated first (an invalid
state stops the run before any connection) and flattened into plain drift inputs, each box is
observed once, every comparison is pure, and the report is rendered from values.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler import fast_json, replay_workers
from reconciler.compare.box import Replayed, compare_box, replayed
from reconciler.compare.drift import BoxResult, DriftReport
from reconciler.desired.secret_names import adopt_fleet_patterns
from reconciler.drift_inputs import DriftInputs, drift_inputs
from reconciler.observe.document import Fault, FaultKind
from reconciler.observe.observe import (
    BoxObservation,
    load_snapshot,
    observe,
    recorded_digest,
    save_snapshot,
    snapshot_box_bytes,
    snapshot_index,
    snapshot_observation,
)
from reconciler.observe.payload import new_run_key
from reconciler.observe.snapshot_key import KeyOnce, trust_observation
from reconciler.observe.snapshot_key import record as record_masks
from reconciler.records import record_class
from reconciler.replay_workers import map_boxes, map_chunks, worker_count

if TYPE_CHECKING:
    from reconciler.desired.fleet import Fleet
    from reconciler.observe.early import EarlyStart
    from reconciler.report.json_parts import PartsReport
    from reconciler.report.spool import ItemSpool, Spooled


NOT_IN_SNAPSHOT = Fault(FaultKind.NOT_OBSERVED, "not in the snapshot")


@record_class()
class DriftRun:
    """A drift run's report and the observations it was judged on."""

    report: DriftReport
    observations: dict[str, BoxObservation]


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
) -> DriftRun:
    """`keep_observations=False` (a report is all the caller wants): a snapshot's boxes are
    read and compared one at a time and not kept, so a replay of 1,000 boxes holds one box's
    observation at a time, not all of them; the run's `observations` are then empty."""
    adopt_fleet_patterns(inputs.secret_patterns)
    run_id = _new_run_id()
    if from_snapshot is not None and save_to is None and not keep_observations:
        return _replay(inputs, boxes, from_snapshot, run_id)
    if from_snapshot is not None:
        index, observations = load_snapshot(from_snapshot)
        key = KeyOnce()
        for name in boxes:
            if name in observations:
                # Before any comparison: a mask of an inline secret counts only where this
                # controller recorded it was made from the current desired value.
                trust_observation(observations[name], inputs.expectations[name], key)
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
        if from_snapshot is None:
            # Each mask of an inline secret is saved with the digest of the desired value it
            # was made from (observe/snapshot_key.py); a snapshot saved again keeps its own.
            record_masks({b: observations[b] for b in boxes}, inputs.expectations)
        meta = {"run_id": run_id, "inventory": inputs.inventory_file, "taken_at": _now()}
        save_snapshot(save_to, {b: observations[b] for b in boxes}, meta, inputs.facts)
    results = tuple(
        compare_box(
            inputs.expectations[name],
            observations[name].document,
            observations[name].probes,
            observations[name].failure,
            observations[name].connection,
            None if from_snapshot is None else replay_checks(inputs, name, observations[name]),
        )
        for name in boxes
    )
    report = DriftReport(
        boxes=results, inventory=inputs.inventory_file, generated_at=_now(), run_id=run_id
    )
    return DriftRun(report, observations)


def replays_in_parts(boxes: int) -> bool:
    """Whether a replay of this many boxes whose caller wants its JSON report and nothing else
    takes `replay_parts`: each box's entry made beside its comparison (report/json_parts.py),
    in worker processes where there are cores for them, and kept aside in a spool
    (report/spool.py), from the size at which workers are forked, whatever the cores, so that
    its memory grows as its fleet does. A small replay renders its report whole, as always."""
    return boxes >= replay_workers.WORKERS_FROM


def replay_parts(
    inputs: DriftInputs,
    boxes: list[str],
    directory: Path,
    keep: bool = False,
    keep_rows: bool = True,
) -> PartsReport:
    """A replay's JSON report as its boxes' parts, each made beside the box's comparison and
    all that is kept of it. `keep` (a run recorded in the history or the metrics): each box's
    share of those too, made from the same file's bytes (history/kept_parts.py)."""
    from reconciler.report.json_parts import BoxPart, PartsReport, box_part, entries_spool, spooled

    index, order, replay_box, in_c = _replayer(inputs, boxes, directory)
    workers = worker_count(len(order))
    # Made before the workers fork: each puts its chunks' entries there (report/spool.py),
    # and this process holds the rest.
    spool = entries_spool()
    parts: list[BoxPart] = []
    kept: list[Any] = []
    rows: ItemSpool[Any] | None = None
    if keep:
        from reconciler.history.kept_parts import kept_part, spooled_kept
        from reconciler.report.spool import ItemSpool

        rows = held = ItemSpool[Any]()

        def keep_box(name: str) -> Any:
            read: list[bytes] = []
            result = replay_box(name, read)
            return kept_part(result, read[0] if read else None, in_c)

        def take_kept(chunk: tuple[Spooled, Any, list[Any]]) -> None:
            spool.keep(chunk[0])
            held.keep(chunk[1])
            kept.extend(chunk[2])
            parts.extend(k.part for k in chunk[2])

        # The drift entries' rows only for the history (a run with --metrics alone counts,
        # never stores them): not pickled through the spool for nothing.
        pack = partial(spooled_kept, spool, held if keep_rows else None)
        map_chunks(keep_box, order, workers, pack, take_kept)
    else:

        def take(chunk: tuple[Spooled, list[BoxPart]]) -> None:
            spool.keep(chunk[0])
            parts.extend(chunk[1])

        job = lambda name: box_part(replay_box(name))  # noqa: E731
        map_chunks(job, order, workers, partial(spooled, spool), take)
    run_id = str(index.get("run_id", _new_run_id()))
    return PartsReport(
        tuple(parts), inputs.inventory_file, _now(), run_id, tuple(kept), spool, rows
    )


def _replay(inputs: DriftInputs, boxes: list[str], directory: Path, run_id: str) -> DriftRun:
    index, order, replay_box, _ = _replayer(inputs, boxes, directory)
    results = map_boxes(replay_box, order, worker_count(len(order)))
    report = DriftReport(
        boxes=tuple(results),
        inventory=inputs.inventory_file,
        generated_at=_now(),
        run_id=str(index.get("run_id", run_id)),
    )
    return DriftRun(report, {})


def _replayer(
    inputs: DriftInputs, boxes: list[str], directory: Path
) -> tuple[dict[str, Any], list[str], Callable[..., BoxResult], bool]:
    """A snapshot's index, the boxes in report order (those it has, then those it lacks), the
    job that reads and compares one of them (given a list, it adds the bytes it read of the
    box's file), and whether the files are read by msgspec.

    Each box's objects die by reference count (reconciler/gc_pause.py); a large replay's
    boxes are read and compared on every core (reconciler/replay_workers.py). Remembered
    expectations are unpickled on first use, each box's apart (drift_inputs._PerBox): each
    worker unpickles only the boxes it compares, from the cache file's pages it reads."""
    adopt_fleet_patterns(inputs.secret_patterns)  # before the workers fork: they inherit it
    index = snapshot_index(directory)
    present = set(index["boxes"])
    order = [b for b in boxes if b in present] + [b for b in boxes if b not in present]
    in_c = len(present) >= fast_json.LARGE  # files read by msgspec (reconciler/fast_json.py)
    if in_c:  # made before any worker forks, so that they share them (replay_workers.py)
        from reconciler.observe.document_c import ready

        fast_json.ready_decoder()
        ready()

    key = KeyOnce()  # read by the first box with a mask to judge (in each worker)

    def replay_box(name: str, kept: list[bytes] | None = None) -> BoxResult:
        if name in present:
            path = directory / f"{name}.json"
            digest = recorded_digest(index, name)
            data = None
            if kept is not None:
                try:
                    data = snapshot_box_bytes(directory, name)
                except (OSError, ValueError):
                    pass  # read again below, where its fault becomes the box's
                else:
                    kept.append(data)
            obs = snapshot_observation(name, path, digest, in_c, raw_kept=False, data=data)
            # A mask of an inline secret counts only where this controller recorded that it
            # was made from the current desired value (observe/snapshot_key.py).
            trust_observation(obs, inputs.expectations[name], key)
        else:
            obs = BoxObservation(name, None, None, fault=NOT_IN_SNAPSHOT)
        result = compare_box(
            inputs.expectations[name],
            obs.document,
            obs.probes,
            obs.failure,
            obs.connection,
            replay_checks(inputs, name, obs),
        )
        forget = getattr(inputs.expectations, "forget", None)  # remembered ones (_PerBox)
        if forget is not None:
            forget(name)
        return result

    return index, order, replay_box, in_c


def replay_checks(inputs: DriftInputs, name: str, obs: BoxObservation) -> Replayed:
    """What a snapshot's box is replayed against (compare/box.py `Replayed`): the desired
    directory, user and secret sources its answer may not be for, and whether its file is
    the one saved."""
    exp = inputs.expectations[name]
    base = inputs.bases.get(name)
    return replayed(exp.directory, exp.user, exp.secret_sources, obs.altered, base)


def _new_run_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + os.urandom(3).hex()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
