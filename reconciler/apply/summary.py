"""Plans and outcomes as lines for people: names and counts, never values.

Every piece a box could have chosen (an error's text, a drift's subject, path or source, a
service or file name in its answer) goes through the drift report's cleaning
(reconciler/report/values.py): free text is scrubbed and cleaned, names are cleaned, so no
line here can carry a terminal escape to the operator's screen or pyinfra's log.
"""

from __future__ import annotations

from reconciler.apply.answer import RollbackResult, rollback_result
from reconciler.apply.engine import Outcome
from reconciler.plan import Plan
from reconciler.report.values import clean, free_text


def plan_lines(plan: Plan) -> list[str]:
    if plan.blocked:
        return [f"cannot converge: {free_text(reason)}" for reason in plan.blocked]
    lines = [f"{i}. {clean(step.title())}" for i, step in enumerate(plan.steps, 1)]
    lines = lines or ["no changes"]
    for drift in plan.report_only:
        where = f" ({clean(drift.source)})" if drift.source else ""
        what = f"{clean(drift.subject)} {clean(drift.path)}"
        lines.append(f"not converged ({drift.action.value}): {what}{where}")
    return lines


def summary_line(plan: Plan) -> str:
    """Plan.summary() for pyinfra's operation name and a refusal: a blocked plan's reasons are
    a box's own words (scrubbed and cleaned); step titles are names (cleaned, never cut)."""
    if plan.blocked:
        return "blocked: " + "; ".join(free_text(reason) for reason in plan.blocked)
    return clean(plan.summary())


def outcome_lines(out: Outcome) -> list[str]:
    if out.ok and not out.changed:
        return ["no changes"]
    if out.ok:
        return _verified_lines(out)
    lines = [f"FAILED: {free_text(out.failed or 'unknown')}"]
    rb = rollback_result(out.rollback)
    if rb is not None:
        lines.append(_rollback_line(rb))
    if out.state_unknown:
        lines.append(_unknown_line(out))
    return lines + _dropped_lines(out)


def _verified_lines(out: Outcome) -> list[str]:
    if out.marked_good:
        lines = [f"converged, verified, marked good (snapshot {out.snapshot})"]
    else:
        lines = [f"converged, verified (snapshot {out.snapshot}); NOT marked good"]
    lines += [f"WARNING: {free_text(w)}" for w in out.warnings]
    return lines + _dropped_lines(out)


def aside_words(rb: RollbackResult) -> str:
    """Where a file edited by hand since the snapshot went before the rollback restored over
    it (converge.py `edited_since`)."""
    return (
        f"edited by hand since the snapshot; restored over, the edit copied into the snapshot's "
        f"removed/ directory (.fleet/snapshots/{rb.snapshot}/removed/)"
    )


def _rollback_line(rb: RollbackResult) -> str:
    if not rb.ok:
        return f"ROLLBACK FAILED: {free_text(str(rb.failed))}"
    equal = (
        "containers as before"
        if rb.config_equal
        else ("containers NOT as before: " + ", ".join(clean(s) for s in rb.unequal))
    )
    restored = ", ".join(clean(f) for f in rb.restored)
    restored = restored or ("nothing to restore" if not rb.removed else "")
    if rb.removed:
        removed = f"removed {', '.join(clean(f) for f in rb.removed)} (created by the converge)"
        restored = "; ".join(x for x in (restored, removed) if x)
    if rb.removed_containers:
        equal += f"; containers removed: {', '.join(clean(s) for s in rb.removed_containers)}"
    if rb.started:
        equal += f"; stopped containers started again: {', '.join(clean(s) for s in rb.started)}"
    # A file kept is said with why: the box never removes a file a converge did not write.
    kept = "".join(f"; KEPT {clean(k.name)}: {free_text(k.why)}" for k in rb.kept)
    # Said in this tool's words: the box's (a path through the snapshot) would be scrubbed to ***.
    kept += "".join(f"; SET ASIDE {clean(k.name)}: {aside_words(rb)}" for k in rb.set_aside)
    return f"rolled back to snapshot {rb.snapshot}: {restored}; {equal}{kept}"


def _unknown_line(out: Outcome) -> str:
    if out.snapshot is None:
        # The payload was delivered and nothing came back: the box may have taken a snapshot
        # and converged without a word reaching us (BoxCall.may_have_run).
        return (
            f"STATE UNKNOWN: the payload was delivered but no snapshot was announced; once "
            f"`reconcile snapshots {out.box}` shows no lock, a snapshot it lists taken after "
            f"{out.started_at} is this converge's: check it, or roll back with "
            f"`reconcile rollback {out.box} --to SNAPSHOT`"
        )
    return (
        f"STATE UNKNOWN: once `reconcile snapshots {out.box}` shows no lock, check it or roll "
        f"back with `reconcile rollback {out.box} --to {out.snapshot}`"
    )


def _dropped_lines(out: Outcome) -> list[str]:
    if not out.events_dropped:
        return []
    return [f"{out.events_dropped} events of the box not kept (too many or too large)"]
