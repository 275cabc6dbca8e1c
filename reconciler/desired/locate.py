"""Where the fleet repository and its inventory are (stdlib only: a drift run asks this before
it imports anything heavy)."""

from __future__ import annotations

import os
from pathlib import Path

INVENTORY_ENV = "FLEET_INVENTORY"
ROOT_ENV = "FLEET_ROOT"


def root_or_none(start: Path | None = None) -> Path | None:
    """$FLEET_ROOT, else the nearest parent holding inventory/ and group_vars/."""
    if os.environ.get(ROOT_ENV):
        # realpath, not Path.resolve(): a symlink loop is the loader's located error
        return Path(os.path.realpath(os.environ[ROOT_ENV]))
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "inventory").is_dir() and (candidate / "group_vars").is_dir():
            return candidate
    return None


def inventory_file(root: Path, selector: str | None = None) -> Path:
    """`hosts` (default), `lab`, or a path: FLEET_INVENTORY or --inventory picks it."""
    choice = selector or os.environ.get(INVENTORY_ENV) or "hosts"
    if "/" in choice or choice.endswith((".yaml", ".yml")):
        path = Path(choice)
        return path if path.is_absolute() else root / path
    return root / "inventory" / f"{choice}.yaml"
