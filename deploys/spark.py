"""Converge spark: `pyinfra inventory.py deploys/spark.py` (add `--dry` for the plan only).

pyinfra runs a deploy file for every host of the inventory; this one acts on spark only. Run
with per-box deploy files only, inventory.py makes spark the only host: no other box is
connected, so one that is down does not fail this run (deploys/mesh.py connects to all).
"""

from pyinfra import host

from roles.box import converge_box

if host.name == "spark":
    converge_box()
