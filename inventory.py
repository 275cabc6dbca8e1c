"""pyinfra inventory: `pyinfra inventory.py deploys/thor.py`.

pyinfra exec()s this file and turns every public module-level list into a group. Group data in
YAML (group_vars/) is invisible to pyinfra, so the fleet's own loader validates the desired
state here (an invalid one stops the run, naming file:line:col). Pick the inventory with
FLEET_INVENTORY: `hosts` (the real mesh, default) or `lab` (the local lab); group_vars are the
same for both. host.data's `desired` is the deep-merged state as `reconcile show` prints it,
masked as it masks (debug-inventory prints host.data as it is).
The repository is always this file's own ($FLEET_ROOT is not read), and every host's data names
it (`fleet_root`, `fleet_inventory`): the deploys load the desired state from there.

Run with per-box deploy files only (`deploys/thor.py`), the inventory holds those boxes alone:
pyinfra connects to every host before it loads a deploy file, so an unreachable box elsewhere
in the mesh would fail a run that never acts on it. Any other run (deploys/mesh.py,
debug-inventory, exec, a fact) holds every box; --limit and --exclude apply as always.
"""

import sys as _sys
from pathlib import Path as _Path

_root = _Path(__file__).resolve().parent
# This repository's code first, before site-packages: pyinfra appends the working directory
# to sys.path (last), so run from here the check `not in sys.path` was false and an installed
# or editable fleet-reconciler of another checkout was imported instead of this one's.
if _sys.path[:1] != [str(_root)]:
    _sys.path[:] = [str(_root), *(p for p in _sys.path if p != str(_root))]

from reconciler.desired.load import load_fleet as _load_fleet  # noqa: E402
from reconciler.desired.problems import DesiredStateError as _DesiredStateError  # noqa: E402
from reconciler.desired.pyinfra_data import NoSuchBox as _NoSuchBox  # noqa: E402
from reconciler.desired.pyinfra_data import deploy_boxes as _deploy_boxes  # noqa: E402
from reconciler.desired.pyinfra_data import pyinfra_groups as _pyinfra_groups  # noqa: E402


def _operations() -> list[str] | None:
    """The OPERATIONS pyinfra's command line gave (deploy files, debug-inventory, ...), as
    click parsed them; None when this file is not loaded by pyinfra's CLI. Read from click's
    context rather than sys.argv: options that take a value (--limit thor) need click's own
    parse to be told from the operations."""
    try:
        import click
    except ImportError:  # not under pyinfra's CLI, which depends on click
        return None
    ctx = click.get_current_context(silent=True)
    operations = ctx.params.get("operations") if ctx is not None else None
    return [str(o) for o in operations] if isinstance(operations, (list, tuple)) else None


try:
    _fleet = _load_fleet(_root)
except _DesiredStateError as _exc:
    # pyinfra would print a traceback; the operator needs file:line:col instead. The loader
    # turns every hostile input (alias bombs, FIFOs, tags, ...) into this one error type.
    print(_exc, file=_sys.stderr)
    _count = len(_exc.problems)
    print(f"invalid desired state: {_count} problem{'s' if _count != 1 else ''}", file=_sys.stderr)
    raise SystemExit(1) from None

_ops = _operations()
if _ops is not None and any(_op.endswith(".py") for _op in _ops):
    from reconciler.observe.fanout import settings_problem as _settings_problem

    # A deploy observes every box it plans (reconciler/apply/session.py) with
    # $FLEET_BOX_TIMEOUT and $FLEET_MAX_PARALLEL; a bad one is refused here, before pyinfra
    # connects to any host, as `reconcile drift` and `apply` refuse it (debug-inventory, fact
    # and exec read neither).
    _problem = _settings_problem()
    if _problem:
        print(f"error: {_problem}; nothing changed", file=_sys.stderr)
        raise SystemExit(1)
try:
    _only = (
        None if _ops is None else _deploy_boxes(_ops, _root, _fleet.boxes, _fleet.inventory_file)
    )
except _NoSuchBox as _exc:
    # deploys/thor.py where the inventory has no thor: refused before pyinfra connects to any
    # host (it connected to every other box, converged nothing and exited 0).
    print(f"error: {_exc}; nothing changed", file=_sys.stderr)
    raise SystemExit(1) from None
_groups = _pyinfra_groups(_fleet, _only)
for _name, _data in _groups["boxes"]:
    # The deploys plan, converge and verify from exactly this repository and inventory
    # (reconciler/apply/session.py), never from $FLEET_ROOT or the working directory.
    _data["fleet_root"] = str(_fleet.root)
globals().update(_groups)
