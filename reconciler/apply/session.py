"""One plan per box per process: what pyinfra's prepare showed is what its execute runs.

pyinfra does not cache facts and evaluates operation bodies twice (prepare, then execute,
without -y), so observing inside an operation would observe two or three times and could act
on a different plan than the one the operator approved. The deploy observes each box once here
(or `reconcile apply` seeds the observation it already printed); the operation only reads it.
The box program re-checks the plan's fingerprint under the lock, so a box that changed between
the prompt and the execution is refused, never converged from a stale plan.

The desired state is the one pyinfra's hosts came from: inventory.py puts its repository
(`fleet_root`) and inventory (`fleet_inventory`) in every host's data, and the fleet is loaded
from exactly those, never from $FLEET_ROOT or the working directory. A box that cannot be
planned (a controller secret unset, an invalid desired state, a connection pyinfra was told to
make elsewhere than the inventory says) gets a blocked plan saying why: its host fails while
planning (roles/box.py), with that one line, and the other boxes go on.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reconciler.apply.engine import Outcome, Prepared, prepare
from reconciler.compare.drift import BoxError, Part
from reconciler.desired.fleet import Fleet
from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError, Location, Problem
from reconciler.observe.controller_secrets import MissingControllerSecret
from reconciler.observe.fanout import settings_problem
from reconciler.plan import Plan, mesh_order

_fleet: list[Fleet] = []
_prepared: dict[str, Prepared] = {}
_blocked: dict[str, Plan] = {}
outcomes: dict[str, Outcome] = {}
command: list[str] = ["pyinfra"]
# pyinfra's CLI prepares hosts in greenlets (gevent's monkey patching makes ssh yield), so two
# may ask for one box's plan at once: one observes, the other waits. Made when first asked
# for, so that they are gevent's locks under the CLI.
_locks: dict[str | None, Any] = {}

# The ssh_* keys that are paths: compared as the files they name (ssh resolves them in the cwd).
_PATHS = ("ssh_key", "ssh_known_hosts_file")


def use(fleet: Fleet, prepared: dict[str, Prepared] | None = None, cmd: str = "") -> None:
    """Seed the session (reconcile apply): the fleet it loaded and the plans it printed."""
    _fleet[:] = [fleet]
    _prepared.clear()
    _prepared.update(prepared or {})
    _blocked.clear()
    outcomes.clear()
    if cmd:
        command[:] = [cmd]


def fleet(data: Mapping[str, Any] | None = None) -> Fleet:
    """The fleet of this process: the one `use` seeded, else the one a host's data names
    (inventory.py's own repository and inventory), loaded once."""
    with _lock(None):
        if not _fleet:
            _fleet.append(_load(data or {}))
    return _fleet[0]


def _load(data: Mapping[str, Any]) -> Fleet:
    root = data.get("fleet_root")
    if not root:
        where = Location(os.path.join(os.getcwd(), "inventory.py"), 1, 1)
        why = (
            "pyinfra's host data names no fleet_root: run pyinfra with the fleet repository's "
            "inventory.py (it names the repository and inventory the deploys load)"
        )
        raise DesiredStateError([Problem(where, "", why)])
    return load_fleet(Path(str(root)), data.get("fleet_inventory"))


ACCEPT_INTERRUPTED = "fleet_accept_interrupted"  # pyinfra --data fleet_accept_interrupted=true


def plan(box: str, data: Mapping[str, Any] | None = None) -> Plan:
    """`box`'s plan, observed once per process; a blocked plan if it cannot be planned.

    `data`: the box's pyinfra host data (host.data.dict()), which names the fleet and says
    where pyinfra connects; without it only a plan already made (or seeded) is returned."""
    with _lock(box):
        if box in _prepared:
            return _prepared[box].plan
        if box in _blocked:
            return _blocked[box]
        if data is None:
            raise KeyError(f"{box} was not planned in this process")
        return _plan(box, data)


def _plan(box: str, data: Mapping[str, Any]) -> Plan:
    try:
        f = fleet(data)
        differs = connection_overrides(f, box, data)
        if differs:
            why = (
                f"pyinfra connects with {', '.join(differs)} other than the inventory's "
                f"({f.inventory_file}), and the converge would act where the inventory says: "
                "drop the override (--user, --port, --key, --data ssh_*) or change the inventory"
            )
            return _block(box, Part.CONNECTION, "connection", why)
        accept = data.get(ACCEPT_INTERRUPTED, False)
        if type(accept) is not bool and accept not in ("true", "false"):  # 1 == True: exact
            why = f"--data {ACCEPT_INTERRUPTED}= must be true or false"
            return _block(box, Part.CONNECTION, ACCEPT_INTERRUPTED, why)
        problem = settings_problem()
        if problem:
            # A bad $FLEET_BOX_TIMEOUT or $FLEET_MAX_PARALLEL, read only once the box is
            # observed, raised out of the deploy file: pyinfra's "An exception occurred" and a
            # traceback. Its host fails here instead, with the variable's name on one line.
            variable, _, why = problem.partition(": ")
            return _block(box, Part.OBSERVATION, variable, why)
        _prepared[box] = prepare(f, box)
        # `reconcile apply --accept-interrupted` for the pyinfra route: converge from the state a
        # killed converge or rollback left (the box refuses otherwise, naming its snapshot).
        _prepared[box].accept_interrupted = accept is True or accept == "true"
    except MissingControllerSecret as exc:  # raised before any box is contacted
        return _block(
            box, Part.SECRET_SOURCE, "controller secret", "; ".join(str(exc).splitlines())
        )
    except DesiredStateError as exc:
        said = "; ".join(str(p) for p in exc.problems)
        return _block(box, Part.OBSERVATION, "invalid desired state", said)
    return _prepared[box].plan


def _lock(key: str | None) -> Any:
    return _locks.setdefault(key, threading.Lock())


def _block(box: str, part: Part, where: str, why: str) -> Plan:
    _blocked[box] = Plan(box, blocked=(BoxError(part, where, why),))
    return _blocked[box]


def prepared(box: str) -> Prepared:
    """The observation and plan `plan` made (or `use` seeded) for `box`."""
    return _prepared[box]


def connection_overrides(fleet: Fleet, box: str, data: Mapping[str, Any]) -> list[str]:
    """The ssh_* keys of pyinfra's host data that differ from what the inventory says for
    `box` (a `--user`, `--port`, `--key` or `--data ssh_hostname=...`): pyinfra would connect
    there while every observation and converge goes where the inventory says."""
    from reconciler.desired.pyinfra_data import host_data

    want = {k: v for k, v in host_data(fleet, box).items() if k.startswith("ssh_")}
    have = {k: v for k, v in data.items() if k.startswith("ssh_")}
    return sorted(
        key
        for key in want.keys() | have.keys()
        if _norm(key, want.get(key)) != _norm(key, have.get(key))
    )


def _norm(key: str, value: Any) -> str | None:
    if value is None or value == "":
        return None
    if key in _PATHS:
        return os.path.abspath(os.path.expanduser(str(value)))
    return str(value)


def mesh_boxes(data: Mapping[str, Any] | None = None) -> list[str]:
    """Every box, a role's host before the boxes that proxy it."""
    f = fleet(data)
    proxies = {
        name: [c.proxied_to for c in spec.contract.values() if c.proxied_to]
        for name, spec in f.boxes.items()
    }
    return mesh_order(proxies, list(f.boxes))
