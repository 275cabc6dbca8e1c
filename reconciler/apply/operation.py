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
from reconciler.report.values import free_text


@operation(is_idempotent=False)
def converge(box: str) -> Any:
    prep = session.prepared(box)
    if prep.plan.blocked:
        # Fails this host at execute time, with the reason; the other boxes go on.
        yield FunctionCommand(_refuse, (box, summary_line(prep.plan)), {})
        return
    if prep.plan.empty:
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


def _refuse(state: Any, host: Any, box: str, reason: str) -> bool:
    Reporter(box).line(f"not converged: {free_text(reason)}")  # a box's words: clean here too
    return False


@operation(is_idempotent=False)
def verify_mesh(boxes: list[str]) -> Any:
    """After the last box: every box again, until the mesh has re-formed around the restarts.

    Each box verified itself right after its own converge; a later box's gateway restart can
    still hide a role that box proxies for the others for a few heartbeats. Checks only."""
    yield FunctionCommand(_verify_mesh, (boxes,), {})


def _verify_mesh(state: Any, host: Any, boxes: list[str]) -> bool:
    _, left = settle(session.fleet(), boxes)
    reporter = Reporter("mesh")
    # `left` holds the boxes' own error text: scrubbed and cleaned, as every outcome line is
    said = "; ".join(free_text(line) for line in left)
    reporter.line("no drift left on " + ", ".join(boxes) if not left else said)
    return not left
