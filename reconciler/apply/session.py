"""One plan per box per process: what pyinfra's prepare showed is what its execute runs.

pyinfra does not cache facts and evaluates operation bodies twice (prepare, then execute,
without -y), so observing inside an operation would observe two or three times and could act
on a different plan than the one the operator approved. The deploy observes each box once here
(or `reconcile apply` seeds the observation it already printed); the operation only reads it.
The box program re-checks the plan's fingerprint under the lock, so a box that changed between
the prompt and the execution is refused, never converged from a stale plan.
"""

from __future__ import annotations

import os

from reconciler.apply.engine import Outcome, Prepared, prepare
from reconciler.desired.fleet import Fleet
from reconciler.desired.load import find_root, load_fleet
from reconciler.plan import mesh_order

_fleet: list[Fleet] = []
_prepared: dict[str, Prepared] = {}
outcomes: dict[str, Outcome] = {}
command: list[str] = ["pyinfra"]


def use(fleet: Fleet, prepared: dict[str, Prepared] | None = None, cmd: str = "") -> None:
    """Seed the session (reconcile apply): the fleet it loaded and the plans it printed."""
    _fleet[:] = [fleet]
    _prepared.clear()
    _prepared.update(prepared or {})
    outcomes.clear()
    if cmd:
        command[:] = [cmd]


def fleet(inventory: str | None = None) -> Fleet:
    if not _fleet:
        _fleet.append(load_fleet(find_root(), inventory or os.environ.get("FLEET_INVENTORY")))
    return _fleet[0]


def prepared(box: str, inventory: str | None = None) -> Prepared:
    if box not in _prepared:
        _prepared[box] = prepare(fleet(inventory), box)
    return _prepared[box]


def mesh_boxes(inventory: str | None = None) -> list[str]:
    """Every box, a role's host before the boxes that proxy it."""
    f = fleet(inventory)
    proxies = {
        name: [c.proxied_to for c in spec.contract.values() if c.proxied_to]
        for name, spec in f.boxes.items()
    }
    return mesh_order(proxies, list(f.boxes))
