"""The converge role: plan one box from the drift engine, print it, converge it.

The plan is gathered here, in the deploy, once per box (see reconciler.apply.session for why
not inside the operation); `--dry` stops after this and shows it, without touching the box.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy

from reconciler.apply import session
from reconciler.apply.operation import converge
from reconciler.apply.summary import plan_lines, summary_line


@deploy("Converge")
def converge_box() -> None:
    box = str(host.data.get("fleet_box") or host.name)
    prep = session.prepared(box, host.data.get("fleet_inventory"))
    for line in plan_lines(prep.plan):
        logger.info(f"{host.print_prefix}plan: {line}")
    # The name is printed by pyinfra as it is: a blocked plan's reasons are the box's words.
    converge(name=f"{box}: {summary_line(prep.plan)}", box=box)
