"""The converge role: plan one box from the drift engine, print it, converge it.

The plan is gathered here, in the deploy, once per box (see reconciler.apply.session for why
not inside the operation); `--dry` stops after this and shows it, without touching the box.
A box that cannot be planned (a controller secret unset, an invalid desired state, pyinfra
told to connect elsewhere than the inventory says) has a blocked plan: its operation fails
with that reason on one line, and the other boxes go on.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyinfra import host, logger
from pyinfra.api import deploy

from reconciler.apply import session
from reconciler.apply.operation import converge
from reconciler.apply.summary import plan_lines, summary_line


@deploy("Converge")
def converge_box() -> None:
    box = str(host.data.get("fleet_box") or host.name)
    plan = session.plan(box, host.data.dict())
    for line in plan_lines(plan):
        logger.info(f"{host.print_prefix}plan: {line}")
    # The name is printed by pyinfra as it is: a blocked plan's reasons are the box's words.
    converge(name=f"{box}: {summary_line(plan)}", box=box)


def converge_in_order(order: Sequence[str]) -> None:
    """This host's converge at its box's place in `order`: one operation per box, each at its
    own position (host.loop), so pyinfra's default run, one operation on all its hosts before
    the next, converges the boxes one at a time in that order, whatever order pyinfra keeps
    its hosts in (a set). --serial and --no-wait run host by host in that set's order."""
    for box in host.loop(order):
        if host.name == box:
            converge_box()
