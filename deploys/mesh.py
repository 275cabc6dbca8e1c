"""Converge every box, one at a time: `pyinfra inventory.py deploys/mesh.py`.

A role proxied to another box is converged on its host first (reconciler.plan.mesh_order), so
a box that proxies it verifies against a host that is already converged. Each box gets its own
operation at its own place in the order; pyinfra runs one operation on all its hosts before
the next, so boxes converge in that order and never at the same time. A last operation
observes every box again until the mesh has re-formed around the gateway restarts.
"""

from pyinfra import host

from reconciler.apply.operation import verify_mesh
from reconciler.apply.session import mesh_boxes
from roles.box import converge_box

order = mesh_boxes(host.data.get("fleet_inventory"))
for box in host.loop(order):
    if host.name == box:
        converge_box()

# Then the whole mesh once more (checks only), from the last box's place in the order.
if host.name == order[-1]:
    verify_mesh(name=f"mesh: verify {', '.join(order)} (no drift left)", boxes=order)
