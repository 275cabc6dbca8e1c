"""Where the fleet repository and its inventory are (stdlib only: a drift run asks this before
it imports anything heavy).

An empty selector is refused, never read as "not given": `FLEET_INVENTORY=` (or `-i ""`, a
script's unset variable) used to select `hosts`, the real mesh, and `FLEET_ROOT=` the
repository found from the working directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

INVENTORY_ENV = "FLEET_INVENTORY"
ROOT_ENV = "FLEET_ROOT"
_UNSET = "(is a variable unset?)"


def root_or_none(start: Path | None = None) -> Path | None:
    """$FLEET_ROOT, else the nearest parent holding inventory/ and group_vars/."""
    given = os.environ.get(ROOT_ENV)
    if given is not None:
        if not given.strip():
            why = f"{ROOT_ENV} is set but empty {_UNSET}: name the fleet repository, or unset it"
            _refuse(str((start or Path.cwd()).resolve()), why)
        # realpath, not Path.resolve(): a symlink loop is the loader's located error
        return Path(os.path.realpath(given))
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "inventory").is_dir() and (candidate / "group_vars").is_dir():
            return candidate
    return None


def inventory_file(root: Path, selector: str | None = None) -> Path:
    """`hosts` (default), `lab`, or a path: FLEET_INVENTORY or --inventory picks it."""
    choice = selector if selector is not None else os.environ.get(INVENTORY_ENV)
    if choice is None:
        choice = "hosts"
    elif not choice.strip():
        if selector is not None:
            why = f"an empty inventory {_UNSET}: name one (hosts, lab or a path)"
        else:
            why = f"{INVENTORY_ENV} is set but empty {_UNSET}: name an inventory (hosts, lab or "
            why += "a path), or unset it"
        _refuse(os.path.join(root, "inventory"), why)
    if "/" in choice or choice.endswith((".yaml", ".yml")):
        path = Path(choice)
        return path if path.is_absolute() else root / path
    return root / "inventory" / f"{choice}.yaml"


def _refuse(where: str, why: str) -> NoReturn:
    # Imported here: a drift run's early start imports this module and must not pay for
    # dataclasses (tests/unit/test_prespawn_imports.py).
    from reconciler.desired.problems import DesiredStateError, Location, Problem

    raise DesiredStateError([Problem(Location(where, 1, 1), "", why)])
