"""examples/lab-incidents replayed from a copy whose one box's collected observation a test
edited: the replay several test files make of their own edits (causes, dead knobs, one-offs)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reconciler.desired.load import load_fleet
from reconciler.drift import DriftRun, run_drift

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"


def replay_edited(
    tmp: Path,
    box: str,
    edit: Callable[[dict[str, Any]], None],
    boxes: list[str] | None = None,
) -> tuple[Any, DriftRun]:
    """The fleet (a copy of the example under `tmp`) and its replay of `boxes` (default:
    every box), `box`'s snapshot file edited first by `edit(collected)`."""
    root = tmp / "fleet"
    shutil.copytree(EXAMPLE, root)
    snap = root / "snapshot" / f"{box}.json"
    doc = json.loads(snap.read_text(encoding="utf-8"))
    edit(doc["collected"])
    snap.write_text(json.dumps(doc), encoding="utf-8")
    fleet = load_fleet(root, "lab")
    return fleet, run_drift(fleet, boxes or list(fleet.boxes), from_snapshot=root / "snapshot")
