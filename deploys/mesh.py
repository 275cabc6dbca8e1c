"""Converge every box, one at a time: `pyinfra inventory.py deploys/mesh.py`.

A role proxied to another box is converged on its host first (reconciler.plan.mesh_order), so
a box that proxies it verifies against a host that is already converged. Each box gets its own
operation at its own place in the order; pyinfra runs one operation on all its hosts before
the next, so boxes converge in that order and never at the same time. --serial and --no-wait
run host by host in no set order instead: refused. With --limit (or a box that could not be
connected) only the boxes of this run are converged, and only they are verified.

A last operation observes those boxes again until the mesh has re-formed around the gateway
restarts; it is a no-op when no box had anything to converge. It runs from the last box of the
run whose plan is not blocked, and verifies only the boxes whose plans are not: a blocked box's
host fails while planning and runs no operation (the verify, once given to the last box in
mesh order, never ran when that box was blocked, and the boxes before it went unverified).
"""

import sys

from pyinfra import host, state
from pyinfra.api.exceptions import PyinfraError

from reconciler.apply.operation import verify_mesh
from reconciler.apply.session import mesh_boxes
from reconciler.desired.problems import DesiredStateError
from roles.box import blocked, converge_in_order

# pyinfra keeps its flow flags to itself; its command line says them (click takes no
# abbreviations, and the deploy runs in a greenlet that cannot see click's context).
_args = sys.argv[1 : (sys.argv.index("--") if "--" in sys.argv else None)]
_flow = [flag for flag in ("--serial", "--no-wait") if flag in _args]
if _flow:
    raise PyinfraError(
        f"deploys/mesh.py converges boxes one at a time in mesh order; {' and '.join(_flow)} "
        "would run them host by host in no set order: run it without"
    )

try:
    order = mesh_boxes(host.data.dict())
except DesiredStateError as exc:
    raise PyinfraError("; ".join(str(p) for p in exc.problems)) from None
# This run's boxes: --limit, hosts that connected. Connected, not still active: a box whose
# plan is blocked fails its host while its greenlet prepares, and every host must see the
# same list (one operation per box at its place in it, the verify on the last).
running = {h.name for h in state.activated_hosts}
boxes = [b for b in order if b in running]
converge_in_order(boxes)

# Then this run's boxes once more (checks only), from the last one's place in the order.
# Every host decides alike: each box's plan is made once per process, whichever host asks.
verified = [b for b in boxes if not blocked(b)]
if verified and host.name == verified[-1]:
    verify_mesh(name=f"mesh: verify {', '.join(verified)} (no drift left)", boxes=verified)
