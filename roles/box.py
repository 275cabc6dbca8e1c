"""The converge role: plan one box from the drift engine, print it, converge it.

The plan is gathered here, in the deploy, once per box (see reconciler.apply.session for why
not inside the operation); `--dry` stops after this and shows it, without touching the box.
A box that cannot be planned (a controller secret unset, an invalid desired state, pyinfra
told to connect elsewhere than the inventory says) has a blocked plan: its host fails here,
while planning, with that reason on one line, so every run (`--dry` too) exits 1; the other
boxes go on as pyinfra's failed-host rule says (`-y`: they go on; without it pyinfra asks).
When no other box is left (`--limit orin` with orin blocked), the run ends there, saying so.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyinfra import host, logger, state
from pyinfra.api import deploy
from pyinfra.api.exceptions import PyinfraError

from reconciler.apply import session
from reconciler.apply.operation import converge
from reconciler.apply.progress import Reporter
from reconciler.apply.summary import plan_lines, summary_line


@deploy("Converge")
def converge_box() -> None:
    box = str(host.data.get("fleet_box") or host.name)
    plan = session.plan(box, host.data.dict())
    for line in plan_lines(plan):
        logger.info(f"{host.print_prefix}plan: {line}")
    if plan.blocked:
        _fail(box, summary_line(plan))
        return
    # The name is printed by pyinfra as it is: a blocked plan's reasons are the box's words.
    converge(name=f"{box}: {summary_line(plan)}", box=box)


def _fail(box: str, reason: str) -> None:
    """Fail this host now, while planning, as pyinfra fails a host whose fact cannot be read:
    an operation that refuses only when executed never fails `--dry`, which executes nothing,
    and raising here would end the run for every host. pyinfra exits 1 for a failed host;
    its rule for one decides whether the others go on: `-y` goes on, otherwise it asks."""
    Reporter(box).line(f"not converged: {reason}")  # summary_line cleaned the box's words
    try:
        # The Host itself: `host` is a proxy to whichever host the current greenlet prepares.
        state.fail_hosts({state.inventory.get_host(host.name)})
    except EOFError:  # pyinfra asked "continue?" (no -y) and no terminal can answer
        raise PyinfraError(
            f"{box} cannot be converged, and without -y pyinfra asks whether to go on with the "
            "other hosts; stdin gave no answer: stopped (pass -y to go on without asking)"
        ) from None
    except PyinfraError:
        if state.active_hosts:  # over pyinfra's fail percent (the operator answered no)
            raise
        # pyinfra's own words, "No hosts remaining!", read like a crash of this file: the
        # run ends here all the same (exit 1), before any operation, and says why.
        raise PyinfraError(
            f"{box} cannot be converged and no other box of this run is left: nothing converged"
        ) from None


def blocked(box: str) -> bool:
    """Whether `box`'s plan is blocked, so its host fails while planning and runs nothing.
    Any host may ask of any box of the run: a box not planned yet is planned here, from its
    own host's data, once for the whole process (its host then reads the same plan)."""
    try:
        plan = session.plan(box)  # made already: no host data to build (every host asks)
    except KeyError:
        plan = session.plan(box, state.inventory.get_host(box).data.dict())
    return bool(plan.blocked)


def converge_in_order(order: Sequence[str]) -> None:
    """This host's converge at its box's place in `order`: one operation per box, each at its
    own position (host.loop), so pyinfra's default run, one operation on all its hosts before
    the next, converges the boxes one at a time in that order, whatever order pyinfra keeps
    its hosts in (a set). --serial and --no-wait run host by host in that set's order."""
    for box in host.loop(order):
        if host.name == box:
            converge_box()
