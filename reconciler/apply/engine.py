"""Converge one box: plan from the drift engine, act on the box, verify, or roll back.

    prepare():  observe -> compare -> plan          (read-only; what `--dry` shows)
    execute():  box program: lock, snapshot, .env, files, images, lanes, gateway
                -> re-observe until no actionable drift remains (the verification)
                -> on failure: the box program has rolled back already, or `rollback` is
                   called with the snapshot it took; on success the chain is kept as
                   known-good (the copy a later restore of an unpinned file comes from)

pyinfra's operation (reconciler.apply.operation) and `reconcile apply` both call these, so the
CLI and `pyinfra inventory.py deploys/<box>.py` share one code path.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from reconciler.apply.answer import Interrupted, action_result, converge_result
from reconciler.apply.boxcall import BoxCall, OnEvent, call_box
from reconciler.apply.payload import MissingControllerSecret, base_payload, converge_payload
from reconciler.compare.containers import STOPPED
from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import BoxResult, DriftReport, Part
from reconciler.desired.fleet import Fleet
from reconciler.desired.models import BoxSpec
from reconciler.drift import DriftRun, run_drift
from reconciler.drift_inputs import expectations, targets
from reconciler.plan import TOLERATED, Plan, actionable, plan_box
from reconciler.scrub import scrub_text


@dataclass
class Prepared:
    fleet: Fleet
    box: str
    exp: BoxExpectation
    run: DriftRun
    plan: Plan
    # `reconcile apply --accept-interrupted`: converge even though the box's previous converge
    # was killed half way (the box refuses otherwise, naming its snapshot).
    accept_interrupted: bool = False

    @property
    def result(self) -> BoxResult:
        return self.run.report.boxes[0]

    @property
    def spec(self) -> BoxSpec:
        return self.fleet.boxes[self.box]


@dataclass
class Outcome:
    box: str
    ok: bool
    changed: bool
    plan: Plan
    started_at: str
    finished_at: str = ""
    snapshot: str | None = None
    failed: str | None = None
    rollback: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    drift_before: DriftReport | None = None
    drift_after: DriftReport | None = None
    # No answer came while the box may have been changing (the connection dropped, the deadline
    # passed): its program may still be running. `snapshot` is then the one to roll back to.
    state_unknown: bool = False
    marked_good: bool = False  # the verified snapshot is the box's known-good copy now
    warnings: list[str] = field(default_factory=list)
    events_dropped: int = 0  # read from the box but not kept (boxcall's bounds)


def holder(command: str) -> str:
    """Who holds a box's lock: user@host, pid and command, for the refusal message."""
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} ({command})"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def prepare(fleet: Fleet, box: str, run: DriftRun | None = None) -> Prepared:
    """Observe (unless `run` already did) and plan one box. Changes nothing anywhere."""
    run = run if run is not None else run_drift(fleet, [box])
    if len(run.report.boxes) != 1:
        run = _single(run, box)
    exp = expectations(fleet, [box])[box]
    return Prepared(fleet, box, exp, run, plan_box(run.report.boxes[0], exp))


def _single(run: DriftRun, box: str) -> DriftRun:
    report = run.report
    boxes = tuple(b for b in report.boxes if b.box == box)
    single = DriftReport(boxes, report.inventory, report.generated_at, report.run_id)
    return DriftRun(single, {box: run.observations[box]})


def _target(fleet: Fleet, box: str) -> Any:
    return targets(fleet, [box])[box]


def execute(prep: Prepared, who: str, on_event: OnEvent | None = None) -> Outcome:
    """Converge `prep.box` by its plan; verify; roll back on failure. Returns what happened."""
    out = Outcome(prep.box, ok=False, changed=False, plan=prep.plan, started_at=now())
    out.drift_before = prep.run.report
    if prep.plan.blocked:
        out.failed = "cannot converge: " + "; ".join(prep.plan.blocked)
        return _finish(out)
    if prep.plan.empty:
        out.ok = True
        out.drift_after = prep.run.report
        return _finish(out)
    observed = prep.run.observations[prep.box].document
    try:
        payload = converge_payload(
            prep.exp,
            prep.spec,
            prep.plan,
            observed,
            who,
            accept_interrupted=prep.accept_interrupted,
        )
    except MissingControllerSecret as exc:
        # Nothing was sent: the box is untouched, and the operator is told which variable.
        out.failed = f"cannot converge: {exc}"
        return _finish(out)
    call = call_box(_target(prep.fleet, prep.box), payload, on_event)
    _keep(out, call)
    # No result: unknown unless ssh proves the program never ran (BoxCall.may_have_run). A
    # payload delivered whose first event never came back may have converged the box all
    # the same; only a connect-phase failure or a payload ssh never took is "nothing changed".
    if call.may_have_run:
        return _finish(_unknown(out, prep, call))
    answer = converge_result(call.result)  # typed: a box's answer decides what happens next
    out.snapshot = answer.snapshot
    out.changed = out.snapshot is not None
    if answer.interrupted is not None:
        out.failed = interrupted_text(prep.box, answer.interrupted)
        return _finish(out)
    if not answer.ok:
        out.failed = scrub_text(answer.failed)  # the box's words: scrubbed here too
        raw_rollback = call.result.get("rollback")
        out.rollback = raw_rollback if answer.rollback and isinstance(raw_rollback, dict) else None
        out.drift_after = run_drift(prep.fleet, [prep.box]).report if out.changed else None
        return _finish(out)
    after, remaining = verify(prep, on_event, answer.strays)
    out.drift_after = after
    if remaining:
        return _finish(_roll_back(out, prep, who, remaining, on_event))
    _mark_good(out, prep, who, answer.strays)
    out.ok = True
    return _finish(out)


def interrupted_text(box: str, found: Interrupted) -> str:
    """The refusal of a converge whose previous converge or rollback was killed half way, or
    whose previous rollback failed after its first change, with both ways on."""
    said = scrub_text(f"started at {found.taken_at} by {found.holder}")
    rollback = f"`reconcile rollback {box} --to {found.snapshot}`"
    if found.kind == "converge":
        what = f"the previous converge of {box} (snapshot {found.snapshot}, {said}) did not finish"
        left, remedy = "converged", f"Roll it back with {rollback}"
    else:
        ended = "failed" if found.kind == "failed-rollback" else "did not finish"
        what = f"the previous rollback of {box} (to snapshot {found.snapshot}, {said}) {ended}"
        left, remedy = "restored", f"Run that rollback again ({rollback})"
    return (
        f"{what}: the box may be half {left}; nothing was changed. {remedy}, or converge from "
        f"the state it left with `reconcile apply {box} --accept-interrupted`"
    )


def _keep(out: Outcome, call: BoxCall) -> None:
    out.events += call.events
    out.events_dropped += call.dropped


def _unknown(out: Outcome, prep: Prepared, call: BoxCall) -> Outcome:
    """No result came after the payload was delivered: the program may have run, and may
    still be running (it ignores SIGHUP; it stops before its next change once it sees its
    output gone, and rolls back, but a connection gone silent is not seen). Nothing is rolled
    back from here (its lock would refuse it while it runs); the box is observed again, and the
    operator is told which snapshot holds the state before (the one it announced, or, when no
    event came back, to look for it with `reconcile snapshots`)."""
    out.state_unknown = True
    out.snapshot = call.snapshot
    out.changed = call.snapshot is not None
    why = scrub_text(str(call.result.get("failed") or "no result"))
    out.failed = f"{why}; the box's state is unknown: its converge may still be running"
    out.drift_after = run_drift(prep.fleet, [prep.box]).report
    return out


def _roll_back(
    out: Outcome, prep: Prepared, who: str, remaining: list[str], on_event: OnEvent | None
) -> Outcome:
    out.failed = "verification failed: " + "; ".join(remaining)
    reason = rollback_reason(remaining)
    rolled = rollback(prep.fleet, prep.box, out.snapshot, who, on_event, reason=reason)
    _keep(out, rolled)
    out.rollback = rolled.result
    # A rollback that may have run and never answered may still be running: as a converge.
    out.state_unknown = rolled.may_have_run
    out.drift_after = run_drift(prep.fleet, [prep.box]).report
    return out


# The rollback's reason names this many of what the verification left, each one scrubbed to one
# line of at most REASON_ENTRY_CHARS: at most ~1.1k characters, well within the box's payload
# rule (converge.py `_text("reason", ..., 4096)`), which refused the whole list of a box with
# many drifts, and the rollback was never sent. The operator's `failed` keeps every entry.
REASON_ENTRIES = 5
REASON_ENTRY_CHARS = 200
REASON_CHARS = 1500  # any reason rollback() sends: one line, cut there


def rollback_reason(remaining: list[str]) -> str:
    """The reason an automatic rollback carries: the first REASON_ENTRIES entries of what the
    verification left, one line each, then how many more."""
    shown = [scrub_text(entry, limit=REASON_ENTRY_CHARS) for entry in remaining[:REASON_ENTRIES]]
    more = len(remaining) - len(shown)
    if more > 0:
        shown.append(f"and {more} more")
    return "verification failed: " + "; ".join(shown)


def _mark_good(out: Outcome, prep: Prepared, who: str, strays: Collection[str] = ()) -> None:
    """Keep the verified chain as known-good, and have the box remove the strays the converge
    kept stopped (converge.py remove_strays). A refusal (another converge took the lock) does
    not undo a verified converge, but is said: later restores use the previous known-good, and
    the strays stay stopped (the next observation shows them, the next converge removes them).
    Strays removed: the box is observed once more, so drift_after is what it is now."""
    mark = base_payload(prep.exp, prep.spec, "mark-good", who) | {"snapshot": out.snapshot}
    marked = _call(prep, mark)
    _keep(out, marked)
    done = action_result(marked.result)
    out.marked_good = done.ok
    if not done.ok:
        why = scrub_text(done.failed or "no reason given")
        out.warnings.append(f"snapshot {out.snapshot} not marked good: {why}")
    left = [s for s in strays if s not in done.strays_removed]
    if left:
        out.warnings.append(
            f"the stopped stray containers of {', '.join(left)} were not removed (the box's "
            "notes say why): they stay stopped, and a next converge removes them"
        )
    if done.strays_removed:
        out.drift_after = run_drift(prep.fleet, [prep.box]).report


def verify(
    prep: Prepared, on_event: OnEvent | None = None, strays: Collection[str] = ()
) -> tuple[DriftReport, list[str]]:
    """Re-observe until the box shows no drift a converge acts on, or the mesh had its time.
    `strays`: the ones the converge stopped and keeps until mark-good (stopped_strays)."""
    report, left = settle(prep.fleet, [prep.box], {prep.box: strays})
    if on_event is not None:
        on_event({"event": "note", "message": _verdict(left, strays)})
    return report, left


# Errors a verification passes over: what plan.py tolerates and no converge changes.
UNFIXABLE = TOLERATED - {Part.GATEWAY_PROBE}


def settle(
    fleet: Fleet, boxes: list[str], strays: Mapping[str, Collection[str]] | None = None
) -> tuple[DriftReport, list[str]]:
    """Observe `boxes` until none shows actionable drift, errors included, or time is up.

    `strays`: per box, the stray services its converge stopped and keeps until mark-good
    removes them: their drift (the stray, its ports) is passed over while every container of
    that service is seen stopped (stopped_strays); one running again is drift.

    An error of a part the plan tolerates (the login-shell trace, the variable list) is not
    one a converge can fix, so it does not fail the verification; a gateway that does not
    answer is, and does.

    Proxied roles come back only after a few mesh heartbeats, so a drift that is still there
    right after a gateway's recreate is asked again, up to 6 heartbeats (at least 30 s).
    """
    beat = max(fleet.boxes[b].mesh.heartbeat_s for b in boxes)
    deadline = time.monotonic() + max(30, 6 * beat)
    while True:
        report = run_drift(fleet, boxes).report
        left: list[str] = []
        for result in report.boxes:
            prefix = f"{result.box}: " if len(boxes) > 1 else ""
            kept = stopped_strays(result, (strays or {}).get(result.box, ()))
            drifts = [d for d in actionable(result.drifts) if d.subject not in kept]
            left += [f"{prefix}{d.subject} {d.path}" for d in drifts]
            left += [f"{prefix}error: {e}" for e in result.errors if e.part not in UNFIXABLE]
            if not result.reachable:
                left.append(f"{prefix}not observed")
        if not left or time.monotonic() >= deadline:
            return report, left
        time.sleep(2)


def stopped_strays(result: BoxResult, strays: Collection[str]) -> set[str]:
    """The subjects (`lane:<service>`) of `strays` whose every stray container `result`
    shows stopped: drift the mark-good removes, not drift the converge left."""
    out = set()
    for service in strays:
        subject = f"lane:{service}"
        seen = [d for d in result.drifts if d.subject == subject and d.path == "container"]
        states = [d.observed for d in seen]
        if states and all(s in STOPPED for s in states):
            out.add(subject)
    return out


def _verdict(left: list[str], strays: Collection[str] = ()) -> str:
    if left:
        return f"still differs: {'; '.join(left)}"
    if strays:
        return f"verified: no drift left (the stopped {', '.join(strays)} go at mark-good)"
    return "verified: no drift left"


def rollback(
    fleet: Fleet,
    box: str,
    snapshot: str | None,
    who: str,
    on_event: OnEvent | None = None,
    reason: str = "operator rollback",
) -> BoxCall:
    exp = expectations(fleet, [box])[box]
    payload = base_payload(exp, fleet.boxes[box], "rollback", who) | {
        "snapshot": snapshot,
        # One clean line within the box's rule, whoever built it: refused, no rollback is sent.
        "reason": scrub_text(reason, limit=REASON_CHARS),
    }
    return call_box(_target(fleet, box), payload, on_event)


def snapshots(fleet: Fleet, box: str, who: str) -> BoxCall:
    exp = expectations(fleet, [box])[box]
    return call_box(_target(fleet, box), base_payload(exp, fleet.boxes[box], "snapshots", who))


def _call(prep: Prepared, payload: dict[str, Any]) -> BoxCall:
    return call_box(_target(prep.fleet, prep.box), payload)


def _finish(out: Outcome) -> Outcome:
    out.finished_at = now()
    return out
