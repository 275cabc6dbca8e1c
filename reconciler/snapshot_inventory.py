"""Which inventory a saved snapshot is judged against, by `drift --from-snapshot` and by
`reconcile diff --from-snapshot` alike (history/snapshots.py).

Its own module: a replay asks it on every run, and the diff's module imports the history's
record and comparison (~20 ms with what they import) that a replay never uses.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


def judged_inventory(args: argparse.Namespace, directory: str, taken: Any) -> str | None:
    """The inventory the snapshot is judged against: the one chosen (`-i`, FLEET_INVENTORY),
    else the one its index names. Judged against another inventory (`hosts`, the default),
    every box of a lab snapshot read "not observed": a box it does not name, the wrong
    reason. A choice that differs from the index's is kept, and said."""
    from reconciler.desired.locate import INVENTORY_ENV

    chosen = args.inventory if args.inventory is not None else os.environ.get(INVENTORY_ENV)
    if not isinstance(taken, str) or not taken.strip():
        return args.inventory  # an older or edited index: the choice, or the default
    if chosen is None:
        return taken
    if _inventory_file(args, chosen) != _inventory_file(args, taken):
        from reconciler.report.values import clean  # the index's text: escaped as reports do

        print(
            clean(
                f"warning: {directory}: judged against the inventory {chosen} "
                f"(-i or {INVENTORY_ENV}); the snapshot was taken against {taken}"
            ),
            file=sys.stderr,
        )
    return args.inventory


def _inventory_file(args: argparse.Namespace, selector: str) -> str | None:
    """The file `selector` names in the fleet repository, resolved; None where it is not
    known (no repository: the replay says why)."""
    from reconciler.desired.locate import inventory_file, root_or_none

    root = Path(os.path.realpath(args.root)) if args.root else root_or_none()
    if root is None:
        return None
    try:
        found = inventory_file(root, selector)
    except Exception as exc:
        # Its type imported only once one is raised, as cli.py's `_reported` does: the
        # desired state's problem types import dataclasses (~9 ms), which no replay needs.
        from reconciler.desired.problems import DesiredStateError

        if isinstance(exc, DesiredStateError):  # an empty selector: the load refuses it
            return None
        raise
    return os.path.realpath(found)
