"""`reconcile diff --from-snapshot DIR_A DIR_B`: two saved snapshots as diff sides.

The observations are the snapshot's box files as saved. The drift entries are each snapshot's
drift against the desired state (its own facts, as `drift --from-snapshot` judges it), when the
desired state loads here; otherwise only the observations are compared, and stderr says so.
The inventory is the one the snapshot's index names (the one it was taken against), unless
`-i` (or FLEET_INVENTORY) chooses one: then a warning names both when they differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from reconciler.history.diff import Side
from reconciler.history.parts import known, probes_of
from reconciler.history.record import RunRecord
from reconciler.snapshot_inventory import judged_inventory


def snapshot_sides(args: argparse.Namespace, dir_a: str, dir_b: str) -> tuple[Side, Side] | None:
    sides = []
    for directory in (dir_a, dir_b):
        index = _index(Path(directory))
        if index is None:
            return None
        boxes: list[str] = index["boxes"]
        observations = {}
        for box in boxes:
            try:
                observations[box] = _box_file(Path(directory), box)
            except (OSError, ValueError) as exc:
                print(f"error: {directory}/{box}.json: {_reason(exc)}", file=sys.stderr)
                return None
        judged = _judged(args, directory, index.get("inventory"))
        faults: dict[str, tuple[str, ...] | None] = {}
        probes: dict[str, frozenset[str] | None] = {}
        if judged is not None:  # how the drift judged each box observed, and its faults
            entries, seen = tuple(judged.entries), {b.box: b.observation for b in judged.boxes}
            faults = {b.box: known(b.errors, b.faults) for b in judged.boxes}
            probes = probes_of(faults, _error_texts(judged))
        else:  # no drift judged: how each box file says it was observed
            entries, seen = (), {box: _observed(doc) for box, doc in observations.items()}
        label = f"snapshot {directory}"
        sides.append(Side(label, entries, (), observations, seen, label, faults, probes))
    return sides[0], sides[1]


def _error_texts(judged: RunRecord) -> dict[Any, Any]:
    """Each box's fault texts, as the judged report keeps them (`boxes[].errors`)."""
    report = judged.report if isinstance(judged.report, dict) else {}
    return {b.get("box"): b.get("errors") for b in report.get("boxes") or () if isinstance(b, dict)}


def _observed(doc: Any) -> str:
    """A box file's observation when no drift judged it: the collector's answer, or none."""
    answered = isinstance(doc, dict) and isinstance(doc.get("collected"), dict)
    return "full" if answered and not doc.get("error") else "none"


def _index(directory: Path) -> dict[str, Any] | None:
    from reconciler.observe.observe import snapshot_index

    try:
        return snapshot_index(directory)
    except OSError as exc:
        index = directory / "index.json"
        print(f"error: {index}: not a snapshot's index ({_reason(exc)})", file=sys.stderr)
        return None
    except ValueError as exc:  # it names the file
        print(f"error: {exc}", file=sys.stderr)
        return None


def _box_file(directory: Path, box: str) -> Any:
    """A box's file as json reads it, within the replay's bound (size, depth): ValueError."""
    from reconciler.fast_json import loads_bytes
    from reconciler.observe.observe import snapshot_box_bytes

    return loads_bytes(snapshot_box_bytes(directory, box))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    if isinstance(exc, KeyError):
        return f"no {exc.args[0]!r} key"
    return str(exc)


def _judged(args: argparse.Namespace, directory: str, taken: Any) -> RunRecord | None:
    """The snapshot's drift (its entries, and how each box was observed), or None (said on
    stderr) without a loadable desired state. `taken`: the inventory its index names."""
    from reconciler import cli
    from reconciler.desired.problems import DesiredStateError

    inventory = judged_inventory(args, directory, taken)
    replay = argparse.Namespace(
        **{**vars(args), "from_snapshot": directory, "boxes": [], "inventory": inventory}
    )
    try:
        inputs = cli._drift_inputs(replay)
        boxes = [b for b in cli._snapshot_boxes(replay, inputs.boxes)]
        from reconciler.drift import run_drift_on
        from reconciler.history.parts import faults_of
        from reconciler.history.record import drift_record
        from reconciler.report.json_report import to_document

        run = run_drift_on(inputs, boxes, from_snapshot=Path(directory), keep_observations=False)
        doc: dict[str, Any] = to_document(run.report)
    except (DesiredStateError, OSError, ValueError) as exc:
        what = f"{len(exc.problems)} problems" if isinstance(exc, DesiredStateError) else exc
        print(
            f"note: {directory}: drift not compared (the desired state did not load: {what});"
            " observations only",
            file=sys.stderr,
        )
        return None
    faults = {b.box: faults_of(b.errors) for b in run.report.boxes}
    return drift_record(doc, {}, source="snapshot", started=0.0, duration_s=0.0, faults=faults)
