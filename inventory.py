"""pyinfra inventory: `pyinfra inventory.py deploys/thor.py`.

pyinfra exec()s this file and turns every public module-level list into a group. Group data in
YAML (group_vars/) is invisible to pyinfra, and its host.data lookup is shallow, so the fleet's
own loader builds the deep-merged, validated data here. Pick the inventory with FLEET_INVENTORY:
`hosts` (the real mesh, default) or `lab` (the local lab); group_vars are the same for both.
The repository is always this file's own ($FLEET_ROOT is not read), and every host's data names
it (`fleet_root`, `fleet_inventory`): the deploys load the desired state from there.
"""

import sys as _sys
from pathlib import Path as _Path

_root = _Path(__file__).resolve().parent
if str(_root) not in _sys.path:
    _sys.path.insert(0, str(_root))

from reconciler.desired.load import load_fleet as _load_fleet  # noqa: E402
from reconciler.desired.problems import DesiredStateError as _DesiredStateError  # noqa: E402
from reconciler.desired.pyinfra_data import pyinfra_groups as _pyinfra_groups  # noqa: E402

try:
    _fleet = _load_fleet(_root)
except _DesiredStateError as _exc:
    # pyinfra would print a traceback; the operator needs file:line:col instead. The loader
    # turns every hostile input (alias bombs, FIFOs, tags, ...) into this one error type.
    print(_exc, file=_sys.stderr)
    _count = len(_exc.problems)
    print(f"invalid desired state: {_count} problem{'s' if _count != 1 else ''}", file=_sys.stderr)
    raise SystemExit(1) from None

_groups = _pyinfra_groups(_fleet)
for _name, _data in _groups["boxes"]:
    # The deploys plan, converge and verify from exactly this repository and inventory
    # (reconciler/apply/session.py), never from $FLEET_ROOT or the working directory.
    _data["fleet_root"] = str(_fleet.root)
globals().update(_groups)
