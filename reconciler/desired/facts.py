"""The desired-state facts an inventory takes from outside the repository, kept with a snapshot.

The lab's inventory layers what `lab up` wrote over group_vars: `image_overlay:
.lab/images.yaml` (the digests it pushed to its registry) and `box_overlay:
.lab/overlay/{box}.yaml` (the digest of its compose override). A saved snapshot was judged
against those files, and it is replayed where no lab ever ran (a fresh clone, CI, a reviewer's
laptop). So `--save-snapshot DIR` copies them into DIR/facts/ (images.yaml and
overlay/<box>.yaml: the layout of examples/lab-incidents/facts/), and `--from-snapshot DIR`
layers DIR/facts/ in their place. A snapshot without facts/ (saved by an earlier version) is
judged against the inventory's own files, as before.

Stdlib only (a drift run's inputs name these files before anything heavy is imported).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reconciler.desired.fleet import Fleet
    from reconciler.desired.models import InventorySpec

FACTS = "facts"
IMAGES = "images.yaml"
BOX_OVERLAY = "overlay/{box}.yaml"


def fact_files(
    root: Path, image_overlay: str | None, box_overlay: str | None, boxes: Iterable[str]
) -> dict[str, str]:
    """Name inside a snapshot's facts/ -> the file the inventory reads it from."""
    files = {}
    if image_overlay is not None:
        files[IMAGES] = str(_under(root, image_overlay))
    if box_overlay is not None:
        for box in boxes:
            source = _under(root, box_overlay.replace("{box}", box))
            files[BOX_OVERLAY.format(box=box)] = str(source)
    return files


def facts_of(fleet: Fleet) -> dict[str, str]:
    """The files outside group_vars that decided `fleet` (every box's, whichever are judged:
    the whole inventory is loaded again when the snapshot is replayed). A replay saved again
    keeps its snapshot's facts, but for a box that snapshot holds none of (added to the
    inventory since: `with_facts`), which its replays judge against the inventory's own."""
    inv = fleet.inventory
    files = fact_files(fleet.root, inv.image_overlay, inv.box_overlay, inv.boxes)
    # A live run's are all there (the loader read each); a replay's box overlay that is not
    # is one its snapshot lacked (`with_facts`), and a replay of the new snapshot does as it did.
    return {name: path for name, path in files.items() if name == IMAGES or os.path.lexists(path)}


def write_facts(snapshot: Path, files: Mapping[str, str]) -> None:
    """Copy `files` into SNAPSHOT/facts/, replacing what an earlier save left there (none left
    if there is nothing to keep). Built beside it and renamed: never half a set of facts."""
    target = snapshot / FACTS
    if not files:
        shutil.rmtree(target, ignore_errors=True)
        return
    building = Path(tempfile.mkdtemp(prefix=".facts-", dir=snapshot))
    try:
        for name, source in files.items():
            dest = building / name
            if building.resolve() not in dest.resolve().parents:  # a box name is a file name
                raise ValueError(f"fact {name!r} would leave {target}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, dest)
        if target.exists():
            shutil.rmtree(target)
        os.replace(building, target)
    finally:
        shutil.rmtree(building, ignore_errors=True)


def snapshot_facts(snapshot: Path) -> Path | None:
    """SNAPSHOT/facts/ if the snapshot carries its facts."""
    facts = snapshot / FACTS
    return facts if facts.is_dir() else None


def with_facts(inv: InventorySpec, facts: Path) -> InventorySpec:
    """The inventory with each overlay it names read from `facts` (a snapshot's) instead. A
    box whose overlay `facts` does not hold (added to the inventory since the snapshot was
    saved; the snapshot holds no observation of it either) keeps the inventory's own: the
    loader reads that one for it (load.py `_box_overlays`), never a file that is not there."""
    update = {}
    if inv.image_overlay is not None:
        update["image_overlay"] = str(facts / IMAGES)
    if inv.box_overlay is not None:
        update["box_overlay"] = str(facts / BOX_OVERLAY)
    return inv.model_copy(update=update)


def _under(root: Path, value: str) -> Path:
    path = Path(value)
    return path if path.is_absolute() else root / path
