"""Converge orin: `pyinfra inventory.py deploys/orin.py` (add `--dry` for the plan only).

pyinfra runs a deploy file for every host of the inventory; this one acts on orin only.
"""

from pyinfra import host

from roles.box import converge_box

if host.name == "orin":
    converge_box()
