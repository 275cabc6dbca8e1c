"""Converge thor: `pyinfra inventory.py deploys/thor.py` (add `--dry` for the plan only).

pyinfra runs a deploy file for every host of the inventory; this one acts on thor only.
"""

from pyinfra import host

from roles.box import converge_box

if host.name == "thor":
    converge_box()
