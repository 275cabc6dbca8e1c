"""Converge every box, one at a time: `pyinfra inventory.py deploys/mesh.py`.

A role proxied to another box is converged on its host first (reconciler.plan.mesh_order), so
a box that proxies it verifies against a host that is already converged. Each box gets its own
operation at its own place in the order; pyinfra runs one operation on all its hosts before
the next, so boxes converge in that order and never at the same time.
"""

from pyinfra import host

from reconciler.apply.session import mesh_boxes
from roles.box import converge_box

for box in host.loop(mesh_boxes(host.data.get("fleet_inventory"))):
    if host.name == box:
        converge_box()
