"""Converge every box, one at a time: `pyinfra inventory.py deploys/mesh.py`.

A role proxied to another box is converged on its host first (reconciler.plan.mesh_order), so
a box that proxies it verifies against a host that is already converged. Each box gets its own
operation at its own place in the order; pyinfra runs one operation on all its hosts before
the next, so boxes converge in that order and never at the same time. --serial and --no-wait
run host by host in no set order instead: refused. With --limit (or a box that could not be
connected) only the boxes of this run are converged, and only they are verified.

A last operation observes those boxes again until the mesh has re-formed around the gateway
restarts; it is a no-op when no box had anything to converge. Every box of the run whose plan
is not blocked gets it (a blocked box's host fails while planning and runs no operation), and
it verifies those boxes; when it runs, only the last of them still active does the check.
pyinfra runs nothing more on a host once an operation failed on it: given to one box only, the
verify never ran when that box's converge failed, and the boxes before it went unverified
without a word. When every box of the run failed, nothing is left to verify from: it says so.
"""

import sys
from typing import Any

from pyinfra import host, state
from pyinfra.api import BaseStateCallback
from pyinfra.api.exceptions import PyinfraError

from reconciler.apply.operation import verify_mesh
from reconciler.apply.progress import Reporter
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
# same list (one operation per box at its place in it; the verify on each).
running = {h.name for h in state.activated_hosts}
boxes = [b for b in order if b in running]
converge_in_order(boxes)

# Then this run's boxes once more (checks only), after the last one's converge. Every host
# decides alike: each box's plan is made once per process, whichever host asks.
verified = [b for b in boxes if not blocked(b)]
verify = f"mesh: verify {', '.join(verified)} (no drift left)"


def _checks_the_mesh(me: str = host.name) -> bool:  # `me`: this host, named while it prepares
    """Whether this host does the check, asked when the verify runs: the last box of the run
    still active. pyinfra drops a host from its active hosts when the operation it failed
    ends, so every host of the verify reads the same set and exactly one of them checks (this
    host is active: it is running the verify)."""
    active = {h.name for h in state.active_hosts}
    return me == [b for b in verified if b in active][-1]


class _NoBoxLeft(BaseStateCallback):
    """Says so when the converge of the last box still active fails: pyinfra then ends the run
    ("No hosts remaining!") before the verify, and no host is left to run it."""

    @staticmethod
    def operation_host_error(
        run: Any, failed: Any, op_hash: str, retry_count: int = 0, max_retries: int = 0
    ) -> None:
        if verify in run.get_op_meta(op_hash).names:  # the check itself failed: it said why
            return
        left = {h.name for h in run.active_hosts} - {failed.name}  # `failed` is still in it
        if not left.intersection(verified):
            Reporter("mesh").line(
                f"not verified: every box of this run failed ({', '.join(boxes)})"
            )


if host.name in verified:
    verify_mesh(name=verify, boxes=verified, _if=_checks_the_mesh)
if verified and host.name == verified[0]:  # one host adds it: one handler for the run
    state.add_callback_handler(_NoBoxLeft())
