"""Plans and outcomes as lines for people: names and counts, never values."""

from __future__ import annotations

from reconciler.apply.answer import rollback_result
from reconciler.apply.engine import Outcome
from reconciler.plan import Plan
from reconciler.report.values import free_text


def plan_lines(plan: Plan) -> list[str]:
    if plan.blocked:
        return [f"cannot converge: {reason}" for reason in plan.blocked]
    lines = [f"{i}. {step.title()}" for i, step in enumerate(plan.steps, 1)] or ["no changes"]
    for drift in plan.report_only:
        where = f" ({drift.source})" if drift.source else ""
        lines.append(f"not converged ({drift.action.value}): {drift.subject} {drift.path}{where}")
    return lines


def outcome_lines(out: Outcome) -> list[str]:
    if out.ok and not out.changed:
        return ["no changes"]
    if out.ok:
        return [f"converged, verified (snapshot {out.snapshot})"]
    lines = [f"FAILED: {free_text(out.failed or 'unknown')}"]
    rb = rollback_result(out.rollback)
    if rb is not None:
        if rb.ok:
            equal = (
                "containers as before"
                if rb.config_equal
                else ("containers NOT as before: " + ", ".join(rb.unequal))
            )
            restored = ", ".join(rb.files) or "nothing to restore"
            lines.append(f"rolled back to snapshot {rb.snapshot}: {restored}; {equal}")
        else:
            lines.append(f"ROLLBACK FAILED: {free_text(str(rb.failed))}")
    return lines
