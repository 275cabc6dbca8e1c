"""Converge spark: `pyinfra inventory.py deploys/spark.py` (add `--dry` for the plan only).

pyinfra runs a deploy file for every host of the inventory; this one acts on spark only.
"""

from pyinfra import host

from roles.box import converge_box

if host.name == "spark":
    converge_box()
