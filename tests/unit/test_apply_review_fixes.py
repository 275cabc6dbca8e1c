"""The controller side of apply and rollback after review (/tmp/review-apply's repros): every
box failing ends in outcomes and evidence, not pyinfra's traceback; a converge whose answer
never comes names its snapshot and says the state is unknown; a deadline ends a box that
streams for ever; verification passes over what the plan tolerates; no actionable drift leaves
a plan silently; a box's words are cleaned in plan and outcome lines; the events kept are
bounded in bytes; the evidence directory is checked before the prompt; a refused mark-good is
said; a snapshot id is the box's own shape.

The boxes are the lab-incidents example replayed from its snapshot; SSH is a local process
speaking as sshd relays the box program (test_box_answer_stream), pyinfra's connect is faked.
"""

from __future__ import annotations

import io
import itertools
import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import answer, boxcall, engine, summary
from reconciler.apply.answer import converge_result, rollback_result
from reconciler.apply.evidence import record
from reconciler.apply.payload import base_payload, converge_payload
from reconciler.apply.summary import outcome_lines, plan_lines
from reconciler.compare.context import GATEWAY, BoxExpectation
from reconciler.compare.drift import Action, BoxError, BoxResult, Drift, DriftReport, Kind, Part
from reconciler.desired.load import load_fleet
from reconciler.drift import DriftRun, run_drift_on
from reconciler.drift_inputs import drift_inputs
from reconciler.plan import StepKind, plan_box
from tests.unit.test_box_words_shown_safely import CONTROL, TOKEN, shown_safely

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"
SID = "20261129T100000Z"


@pytest.fixture(scope="module")
def fleet() -> Any:
    return load_fleet(EXAMPLE, "lab")


def observed(fleet: Any, boxes: list[str], *_a: object, **_k: object) -> DriftRun:
    """What `reconcile drift` sees of the lab-incidents boxes (thor's incidents: a converge)."""
    return run_drift_on(drift_inputs(fleet), boxes, from_snapshot=EXAMPLE / "snapshot")


@pytest.fixture
def prep(fleet: Any, monkeypatch: pytest.MonkeyPatch) -> engine.Prepared:
    monkeypatch.setattr(engine, "run_drift", observed)
    monkeypatch.setattr(engine.time, "sleep", lambda _s: None)
    return engine.prepare(fleet, "thor", observed(fleet, ["thor"]))


def answering(monkeypatch: pytest.MonkeyPatch, program: str) -> None:
    """Every box call runs `program` (reading the payload first) in place of ssh."""
    monkeypatch.setattr(
        boxcall, "ssh_argv", lambda *a, **k: [sys.executable, "-c", "import sys\n" + program]
    )


def faked_calls(monkeypatch: pytest.MonkeyPatch, **results: dict[str, Any]) -> list[str]:
    """engine's box calls answered by action (`mark_good=` for mark-good); the actions asked."""
    asked: list[str] = []

    def call(_target: object, payload: dict[str, Any], _on: object = None) -> boxcall.BoxCall:
        asked.append(payload["action"])
        result = {"event": "result", **results[payload["action"].replace("-", "_")]}
        return boxcall.BoxCall(result=result, events=[result])

    monkeypatch.setattr(engine, "call_box", call)
    return asked


# -- 1. every box failing: outcomes and evidence, no traceback --------------------------------
def apply_main(monkeypatch: pytest.MonkeyPatch, *args: str, connect: Any = None) -> int:
    """`reconcile --root lab-incidents -i lab apply ARGS`, pyinfra's connect faked."""
    from reconciler import drift
    from reconciler.cli import main
    from reconciler.observe.openssh_connector import OpenSSHConnector

    monkeypatch.setattr(drift, "run_drift", observed)
    monkeypatch.setattr(engine, "run_drift", observed)
    monkeypatch.setattr(engine.time, "sleep", lambda _s: None)
    monkeypatch.setattr(OpenSSHConnector, "connect", connect or (lambda self: None))
    return main(["--root", str(EXAMPLE), "-i", "lab", "apply", *args])


def test_a_single_box_whose_converge_fails_is_reported_and_recorded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    faked_calls(monkeypatch, converge={"ok": False, "failed": "the box changed since"})
    assert apply_main(monkeypatch, "thor", "--yes", "--evidence", str(tmp_path)) == 1
    said = capsys.readouterr()
    assert "thor: FAILED; evidence" in said.out and "Traceback" not in said.err
    (written,) = tmp_path.glob("*-thor.json")
    assert json.loads(written.read_text())["failed"] == "the box changed since"


def test_a_box_that_cannot_be_connected_reads_as_not_converged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyinfra.api.exceptions import ConnectError

    def refused(self: object) -> None:
        raise ConnectError("connection refused")

    asked = faked_calls(monkeypatch)
    assert (
        apply_main(monkeypatch, "thor", "--yes", "--evidence", str(tmp_path), connect=refused) == 1
    )
    assert asked == []
    assert "thor: not converged (pyinfra did not run it)" in capsys.readouterr().err


# -- 2. the connection lost mid-converge ------------------------------------------------------
SNAPSHOT_EVENT = json.dumps({"event": "snapshot", "id": SID})
STEPS = [
    SNAPSHOT_EVENT,
    json.dumps({"event": "step", "step": "write-env", "subject": ".env", "status": "start"}),
    json.dumps({"event": "step", "step": "recreate", "subject": "vllm-embed", "status": "start"}),
]
LOST = f"""
sys.stdin.read()
for line in {STEPS!r}:
    print(line, flush=True)
sys.stderr.write("Connection to 10.77.0.11 closed by remote host.\\n")
sys.exit(255)
"""


def test_a_converge_whose_connection_drops_names_its_snapshot_and_an_unknown_state(
    prep: engine.Prepared, monkeypatch: pytest.MonkeyPatch
) -> None:
    answering(monkeypatch, LOST)
    seen: list[list[str]] = []
    monkeypatch.setattr(engine, "run_drift", lambda f, b, *a, **k: seen.append(b) or prep.run)
    out = engine.execute(prep, "test")
    assert not out.ok and out.changed and out.state_unknown and out.snapshot == SID
    assert seen == [["thor"]] and out.drift_after is prep.run.report  # observed again
    lines = outcome_lines(out)
    assert "closed by remote host" in lines[0] and "state is unknown" in lines[0]
    assert f"reconcile rollback thor --to {SID}" in lines[-1]
    kept = record(out, "inventory/lab.yaml", "me")
    assert kept["state_unknown"] is True and kept["snapshot"] == SID
    assert kept["rollback"] is None and kept["drift_after"] is not None


def test_a_box_that_never_started_is_still_a_plain_failure(
    prep: engine.Prepared, monkeypatch: pytest.MonkeyPatch
) -> None:
    answering(monkeypatch, "sys.stderr.write('ssh: connect: refused\\n'); sys.exit(255)")
    out = engine.execute(prep, "test")
    assert not out.state_unknown and not out.changed and out.snapshot is None
    assert out.failed == "unreachable: ssh: connect: refused"


# -- 3. verification passes over what the plan tolerates --------------------------------------
def _settled(fleet: Any, monkeypatch: pytest.MonkeyPatch, error: BoxError) -> list[str]:
    after = DriftReport((BoxResult("thor", True, (), (error,)),), "inventory/lab.yaml", "t", "r")
    monkeypatch.setattr(engine, "run_drift", lambda *a, **k: DriftRun(after, {}))
    monkeypatch.setattr(engine.time, "sleep", lambda _s: None)
    clock = itertools.count(0, 1000.0)  # gives up at once, not after 30 s
    monkeypatch.setattr(engine.time, "monotonic", lambda: next(clock))
    return engine.settle(fleet, ["thor"])[1]


@pytest.mark.parametrize("part", [Part.LOGIN_SHELL, Part.VARIABLES])
def test_an_error_the_plan_tolerates_does_not_fail_verification(
    fleet: Any, monkeypatch: pytest.MonkeyPatch, part: Part
) -> None:
    assert _settled(fleet, monkeypatch, BoxError(part, "login_shell", "bash exited 1")) == []


def test_a_gateway_that_still_does_not_answer_fails_verification(
    fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = BoxError(Part.GATEWAY_PROBE, "gateway health (loopback)", "refused")
    assert _settled(fleet, monkeypatch, refused) == ["error: gateway health (loopback): refused"]


# -- 4. no actionable drift leaves a plan silently --------------------------------------------
@pytest.fixture(scope="module")
def thor(fleet: Any) -> BoxExpectation:
    from reconciler.drift_inputs import expectations

    return expectations(fleet, ["thor"])["thor"]


def one(exp: BoxExpectation, subject: str, path: str, action: Action, **kw: Any) -> Any:
    d = Drift("thor", kw.pop("kind", Kind.STATE), subject, path, "want", "got", action, **kw)
    return d, plan_box(BoxResult("thor", True, (d,)), exp)


def test_a_mode_only_drift_of_env_plans_the_write(thor: BoxExpectation) -> None:
    _, plan = one(thor, "file:.env", "mode", Action.REWRITE_ENV, kind=Kind.ENVFILE)
    assert [(s.kind, s.keys) for s in plan.steps] == [(StepKind.WRITE_ENV, ())]


def test_a_created_gateway_is_recreated(thor: BoxExpectation) -> None:
    _, plan = one(thor, "gateway", "status", Action.START, source="model-gear-gateway")
    assert [s.kind for s in plan.steps] == [StepKind.RECREATE_GATEWAY]
    assert plan.steps[0].timeout_s == thor.gateway.health_timeout_s


def test_a_strays_port_is_fixed_by_its_removal(thor: BoxExpectation) -> None:
    drifts = (
        Drift("thor", Kind.STATE, "lane:old", "container", None, "running", Action.REMOVE),
        Drift("thor", Kind.PORT, "lane:old", "8000/tcp", None, "0.0.0.0:9", Action.RECREATE),
    )
    plan = plan_box(BoxResult("thor", True, drifts), thor)
    assert [(s.kind, s.subject) for s in plan.steps] == [(StepKind.REMOVE, "old")]


SUBJECTS = ["lane:vllm-worker", "lane:unknown", GATEWAY, "file:.env", "file:x.yml", "shell"]


@pytest.mark.parametrize("subject", SUBJECTS)
@pytest.mark.parametrize("action", list(Action))
def test_every_action_becomes_a_step_a_report_or_a_block(
    thor: BoxExpectation, action: Action, subject: str
) -> None:
    assert "vllm-worker" in thor.lanes
    for path in ("mode", "(file)", "WORKER_MAX_MODEL_LEN", "status"):
        drift, plan = one(thor, subject, path, action, source="x.yml")
        assert plan.steps or drift in plan.report_only or plan.blocked, (action, subject, path)


# -- 5. a box's words are cleaned on every line -----------------------------------------------
HOSTILE = f"HF_TOKEN={TOKEN}{CONTROL}"


def test_plan_lines_and_the_operation_name_are_cleaned(thor: BoxExpectation) -> None:
    leak = Drift(
        "thor", Kind.SHELL_LEAK, "shell", f"X{CONTROL}", None, "v", Action.SCRUB_SHELL,
        source=f"~/.bashrc:6 {HOSTILE}",
    )  # fmt: skip
    said = "\n".join(plan_lines(plan_box(BoxResult("thor", True, (leak,)), thor)))
    assert "\x1b" not in said and "\x07" not in said  # a name: cleaned, as the report does
    error = BoxError(Part.BOX_FILE, "file .env", HOSTILE)
    blocked = plan_box(BoxResult("thor", True, errors=(error,)), thor)
    for said in ("\n".join(plan_lines(blocked)), summary.summary_line(blocked)):
        shown_safely(said)
        assert "file .env: HF_TOKEN=***" in said


def test_a_refusal_and_a_failed_rollback_are_cleaned(
    prep: engine.Prepared, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler.apply import operation, progress

    err = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", err)
    operation._refuse(None, None, "thor", HOSTILE)
    shown_safely(err.getvalue())
    out = engine.Outcome("thor", ok=False, changed=True, plan=prep.plan, started_at="t")
    out.rollback = {"ok": True, "snapshot": SID, "files": [".env"], "unequal": ["gw"]}
    out.failed, out.warnings = HOSTILE, [HOSTILE]
    shown_safely("\n".join(outcome_lines(out)))


# -- 6. the events kept are bounded in bytes --------------------------------------------------
def test_the_events_kept_are_bounded_in_size_and_the_rest_counted(
    prep: engine.Prepared, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(boxcall, "MAX_KEPT_CHARS", 50_000)
    note = json.dumps({"event": "note", "message": "A" * 1000})
    answering(
        monkeypatch,
        f"sys.stdin.read()\nfor _ in range(200): print({note!r})\n"
        'print(\'{"event": "result", "ok": false, "failed": "x"}\')',
    )
    monkeypatch.setattr(boxcall, "check", lambda payload: None)
    call = boxcall.call_box(None, {"action": "snapshots"})  # type: ignore[arg-type]
    assert call.answered and call.result["failed"] == "x"
    assert sum(len(json.dumps(e)) for e in call.events) <= 50_000
    assert call.heard == 201 and call.dropped == 201 - len(call.events) > 100
    out = engine.Outcome("thor", ok=False, changed=False, plan=prep.plan, started_at="t")
    engine._keep(out, call)
    assert record(out, "inv", "me")["events_dropped"] == call.dropped
    assert (
        outcome_lines(out)[-1]
        == f"{call.dropped} events of the box not kept (too many or too large)"
    )


# -- 7. a deadline from the plan's timeouts ---------------------------------------------------
WAIT = {"event": "wait", "service": "vllm-worker", "state": "starting", "elapsed": 1}
FOREVER = f"""
sys.stdin.read()
import time
print({SNAPSHOT_EVENT!r}, flush=True)
while True:
    print({json.dumps(WAIT | {"timeout": 900})!r}, flush=True)
    time.sleep(0.2)
"""


def test_a_box_that_waits_for_ever_meets_the_deadline_and_its_state_is_unknown(
    prep: engine.Prepared, monkeypatch: pytest.MonkeyPatch
) -> None:
    answering(monkeypatch, FOREVER)
    monkeypatch.setattr(boxcall, "deadline_s", lambda payload: 1)
    done: list[engine.Outcome] = []
    worker = threading.Thread(target=lambda: done.append(engine.execute(prep, "t")), daemon=True)
    worker.start()
    worker.join(30)
    assert done, "the call did not end at its deadline"
    (out,) = done
    assert out.state_unknown and out.snapshot == SID and out.changed
    assert "no result within 1s" in (out.failed or "")


def test_the_deadline_comes_from_the_payloads_timeouts(prep: engine.Prepared) -> None:
    converge = converge_payload(prep.exp, prep.spec, prep.plan, None, "me", environ={"X": "1"})
    waits = sum(lane.boot_timeout_s for lane in prep.exp.lanes.values())
    waits += prep.exp.gateway.health_timeout_s
    assert boxcall.deadline_s(converge) > 2 * waits  # forward, then a rollback of all of it
    slower = json.loads(json.dumps(converge))
    slower["lane_specs"][0]["timeout_s"] += 1000
    assert boxcall.deadline_s(slower) == boxcall.deadline_s(converge) + 2000
    rollback = base_payload(prep.exp, prep.spec, "rollback", "me")
    assert waits < boxcall.deadline_s(rollback) < boxcall.deadline_s(converge)
    listing = base_payload(prep.exp, prep.spec, "snapshots", "me")
    assert boxcall.deadline_s(listing) == boxcall.BASE_S


# -- 8. the evidence directory -----------------------------------------------------------------
def test_an_evidence_directory_that_cannot_be_is_refused_before_anything_changes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = faked_calls(monkeypatch)
    assert apply_main(monkeypatch, "thor", "--yes", "--evidence", "/proc/fleet-evidence") == 1
    assert asked == []
    assert "error: --evidence /proc/fleet-evidence:" in capsys.readouterr().err


def test_an_evidence_write_that_fails_is_said_per_box(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from reconciler.apply import evidence

    def full(*_a: object) -> Path:
        raise OSError(28, "No space left on device")

    faked_calls(monkeypatch, converge={"ok": False, "failed": "refused"})
    monkeypatch.setattr(evidence, "write", full)
    assert apply_main(monkeypatch, "thor", "--yes", "--evidence", str(tmp_path)) == 1
    err = capsys.readouterr().err
    assert f"thor: FAILED; evidence NOT written to {tmp_path}: No space left on device" in err


# -- 9. a refused mark-good is said -----------------------------------------------------------
def test_a_refused_mark_good_keeps_the_converge_and_says_so(
    prep: engine.Prepared, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "verify", lambda p, on_event=None, strays=(): (p.run.report, []))
    held = "lock held by bob@ctl pid 42 (reconcile apply)"
    asked = faked_calls(
        monkeypatch, converge={"ok": True, "snapshot": SID}, mark_good={"ok": False, "failed": held}
    )
    out = engine.execute(prep, "test")
    assert asked == ["converge", "mark-good"] and out.ok and not out.marked_good
    lines = outcome_lines(out)
    assert lines[0] == f"converged, verified (snapshot {SID}); NOT marked good"
    assert lines[1] == f"WARNING: snapshot {SID} not marked good: {held}"
    kept = record(out, "inv", "me")
    assert kept["outcome"] == "converged" and kept["marked_good"] is False
    assert kept["warnings"] == [f"snapshot {SID} not marked good: {held}"]


# -- 10. a snapshot id is the box's own shape -------------------------------------------------
@pytest.mark.parametrize("sid", [f"{SID}\n", "٢٠٢٦١١٢٩T100000Z", f"{SID}-12345", f" {SID}"])
def test_a_snapshot_id_the_box_would_refuse_is_refused(sid: str) -> None:
    assert not converge_result({"ok": False, "snapshot": sid}).snapshot
    rolled = rollback_result({"ok": True, "snapshot": sid})
    assert rolled is not None and not rolled.ok
    assert answer.taken_snapshot({"event": "snapshot", "id": sid}) is None


def test_the_boxs_own_ids_are_taken() -> None:
    for sid in (SID, f"{SID}-1", f"{SID}-9999"):
        assert converge_result({"ok": True, "snapshot": sid}).snapshot == sid
        assert answer.taken_snapshot({"event": "snapshot", "id": sid}) == sid
