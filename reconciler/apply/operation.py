"""The pyinfra operation: converge one box by the plan its deploy gathered.

One operation per box, not one per step: the steps must run in one box-side process that holds
the box's lock and can roll back what it did, which pyinfra's per-operation commands cannot.
The operation is still honest about change: it is a no-op when the plan is empty (a second run
reports no changes), and `--dry` stops after prepare with the plan printed by the deploy. Its
only argument is the box name; the plan (names, never values) is in its `name=`.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host as current_host
from pyinfra.api import FunctionCommand, operation

from reconciler.apply import session
from reconciler.apply.engine import execute, holder, settle
from reconciler.apply.progress import Reporter
from reconciler.apply.summary import outcome_lines, summary_line
from reconciler.observe.controller_secrets import MissingControllerSecret
from reconciler.report.values import free_text


@operation(is_idempotent=False)
def converge(box: str) -> Any:
    plan = session.plan(box)
    if plan.blocked:
        # roles.box fails a blocked box's host while planning and adds no converge for it;
        # a caller that adds one anyway gets a refusal when it runs, never "no drift" (a
        # blocked plan has no steps).
        yield FunctionCommand(_refuse, (box, summary_line(plan)), {})
        return
    if plan.empty:
        current_host.noop(f"{box}: no drift to converge")
        return
    yield FunctionCommand(_execute, (box,), {})


def _execute(state: Any, host: Any, box: str) -> bool:
    reporter = Reporter(box)
    try:
        outcome = execute(session.prepared(box), holder(session.command[0]), reporter.on_event)
    finally:
        reporter.close()
    session.outcomes[box] = outcome
    for line in outcome_lines(outcome):
        reporter.line(line)
    return outcome.ok


def _failed(box: str) -> bool:
    out = session.outcomes.get(box)
    return bool(session.plan(box).blocked) or (out is not None and not out.ok)


def _refuse(state: Any, host: Any, box: str, reason: str) -> bool:
    Reporter(box).line(f"not converged: {free_text(reason)}")  # a box's words: clean here too
    return False


@operation(is_idempotent=False)
def verify_mesh(boxes: list[str]) -> Any:
    """After the last box: every box again, until the mesh has re-formed around the restarts.

    Each box verified itself right after its own converge; a later box's gateway restart can
    still hide a role that box proxies for the others for a few heartbeats. Checks only, and
    only when some box of `boxes` has something to converge in this run: a mesh in sync has
    nothing to re-form (no change reported, nothing to approve)."""
    if not any(_changes(b) for b in boxes):
        current_host.noop("mesh: nothing converged, nothing to verify")
        return
    yield FunctionCommand(_verify_mesh, (boxes,), {})


def _changes(box: str) -> bool:
    """Whether `box`'s converge operation changes anything in this run. Every box of the run
    is planned before any operation executes; a box not planned yet (pyinfra prepares hosts in
    no set order) is planned here, from its own host's data, once for the whole process."""
    from pyinfra import state

    try:
        plan = session.plan(box)
    except KeyError:
        plan = session.plan(box, state.inventory.get_host(box).data.dict())
    return not plan.blocked and not plan.empty


def _verify_mesh(state: Any, host: Any, boxes: list[str]) -> bool:
    reporter = Reporter("mesh")
    # A box whose converge failed or was refused said so already: only the others are checked.
    failed = {h.name for h in state.failed_hosts}
    checked = [b for b in boxes if b not in failed and not _failed(b)]
    if not checked:
        reporter.line("nothing to verify: no box of this run converged")
        return False
    try:
        _, left = settle(session.fleet(), checked)
    except MissingControllerSecret as exc:  # raised before any box is contacted
        reporter.line("not verified: " + "; ".join(str(exc).splitlines()))
        return False
    # `left` holds the boxes' own error text: scrubbed and cleaned, as every outcome line is
    said = "; ".join(free_text(line) for line in left)
    reporter.line("no drift left on " + ", ".join(checked) if not left else said)
    return not left
