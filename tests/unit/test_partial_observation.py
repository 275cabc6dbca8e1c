"""Issue 11 §3: a box that SSH cannot reach is still observed where it can be, and a box reached
only through a master connection that outlived its sshd says so.

Pure logic on real captures (examples/lab-incidents/snapshot for drift, the audit fixture
weakest_link_proven_live for the audit): the box's collector answer is taken away (SSH failed),
its controller probes (what its gateway answered the controller) are kept. The transport's
check of new connections runs against local sockets standing in for an sshd.
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from reconciler.audit.document import AuditReportDoc
from reconciler.audit.report import AuditReport
from reconciler.audit.report_json import render_json as audit_json
from reconciler.audit.report_md import render_markdown as audit_markdown
from reconciler.audit.report_text import render_text as audit_text
from reconciler.audit.run import audit_report
from reconciler.compare.box import compare_box
from reconciler.compare.drift import DriftReport, Kind, Part
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import expectations
from reconciler.observe import transport
from reconciler.observe.document import transport_fault
from reconciler.observe.observe import BoxObservation, load_snapshot, save_snapshot
from reconciler.report.document import DriftReportDoc
from reconciler.report.json_report import render_json
from reconciler.report.markdown import render_markdown
from reconciler.report.text import render_text
from tests.unit.test_audit_snapshots import FIXTURES, fleet

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"
REFUSED = transport_fault(
    "unreachable: ssh: connect to host 10.77.0.11 port 22: Connection refused"
)
MASTER_ONLY = (
    f"{transport.MASTER_ONLY} (connect to 10.77.0.11:22: Connection refused)"  # as the check says
)


@pytest.fixture(scope="module")
def captured() -> tuple[Any, dict[str, BoxObservation]]:
    fleet_ = load_fleet(EXAMPLE, "lab")
    _, observations = load_snapshot(EXAMPLE / "snapshot")
    return fleet_, observations


def report_of(*results: Any) -> DriftReport:
    return DriftReport(
        boxes=results, inventory="lab", generated_at="2026-11-30T18:00:00Z", run_id="r1"
    )


# -- drift -----------------------------------------------------------------------------------------
def test_an_unreachable_box_whose_gateway_answered_is_partial(captured: Any) -> None:
    fleet_, observations = captured
    obs = observations["thor"]
    exp = expectations(fleet_, ["thor"])["thor"]
    full = compare_box(exp, obs.document, obs.probes)
    part = compare_box(exp, None, obs.probes, REFUSED)

    assert (part.reachable, part.observation) == (False, "partial")
    assert (full.observation, full.partial) == ("full", None)
    assert part.errors == (str(REFUSED),) and part.errors[0].part is Part.OBSERVATION
    assert part.partial is not None and "GET /v1/models without a key 401 (keyed)" in part.partial
    assert part.facts["controller_models_noauth"] == 401
    # Only what the gateway shows the controller is compared, and what it shows is found: thor's
    # stale worker window (incident #208) is there with or without SSH.
    assert {d.kind for d in part.drifts} <= {Kind.CONTRACT, Kind.AUTH}
    stale = [d for d in part.drifts if d.path == "capabilities.worker.context"]
    assert [d.observed for d in stale] == [131072]
    assert {(d.kind, d.path) for d in part.drifts} <= {(d.kind, d.path) for d in full.drifts}
    assert report_of(part).exit_code == 1  # still a box not observed


def test_a_keyed_box_answering_without_a_key_is_auth_drift_from_the_mesh_side(
    captured: Any,
) -> None:
    fleet_, observations = captured
    controller = copy.deepcopy(observations["spark"].controller)
    controller["models_noauth"]["status"] = 200  # the gateway lost its key
    obs = BoxObservation("spark", None, str(REFUSED), controller, fault=REFUSED)
    part = compare_box(expectations(fleet_, ["spark"])["spark"], None, obs.probes, obs.failure)
    (auth,) = [d for d in part.drifts if d.kind is Kind.AUTH]
    assert (auth.path, auth.desired, auth.observed) == (
        "GET /v1/models without key (controller)",
        401,
        200,
    )
    assert part.partial is not None and "401" not in part.partial and "(open)" in part.partial


def test_no_answer_from_the_gateway_either_is_nothing_observed(captured: Any) -> None:
    fleet_, observations = captured
    exp = expectations(fleet_, ["thor", "orin"])
    # orin's capture has no controller probes; thor's are made to fail as a dead network would.
    dead = copy.deepcopy(observations["thor"].controller)
    for probe in ("health", "capabilities", "models_noauth"):
        dead[probe] = {"status": None, "error": "ConnectError: [Errno 113] No route to host"}
    thor = BoxObservation("thor", None, str(REFUSED), dead, fault=REFUSED)
    for name, probes in (("thor", thor.probes), ("orin", observations["orin"].probes)):
        result = compare_box(exp[name], None, probes, REFUSED)
        assert (result.observation, result.partial, result.drifts) == ("none", None, ())


def test_a_box_reached_only_through_an_old_connection_is_full_but_an_error(captured: Any) -> None:
    fleet_, observations = captured
    obs = observations["spark"]
    exp = expectations(fleet_, ["spark"])["spark"]
    result = compare_box(exp, obs.document, obs.probes, None, MASTER_ONLY)
    assert result.reachable and result.observation == "full"
    (error,) = [e for e in result.errors if e.part is Part.CONNECTION]
    assert error == f"ssh: {MASTER_ONLY}"
    assert report_of(result).exit_code == 1  # not healthy, whatever it answered
    healthy = compare_box(exp, obs.document, obs.probes)
    assert not [e for e in healthy.errors if e.part is Part.CONNECTION]


def test_every_format_marks_the_partial_box(captured: Any) -> None:
    fleet_, observations = captured
    exp = expectations(fleet_, ["thor", "spark", "orin"])
    thor = compare_box(exp["thor"], None, observations["thor"].probes, REFUSED)
    spark = observations["spark"]
    spark_result = compare_box(exp["spark"], spark.document, spark.probes, None, MASTER_ONLY)
    orin = compare_box(exp["orin"], None, observations["orin"].probes, REFUSED)
    report = report_of(thor, spark_result, orin)

    doc = DriftReportDoc.model_validate_json(render_json(report))
    by_box = {b.box: b for b in doc.boxes}
    assert [by_box[b].observation for b in ("thor", "spark", "orin")] == ["partial", "full", "none"]
    assert by_box["thor"].partial == thor.partial and by_box["orin"].partial is None
    assert not by_box["thor"].reachable and by_box["thor"].drifts
    assert any(MASTER_ONLY in e for e in by_box["spark"].errors)

    text = render_text(report, color=False)
    assert "thor: not observed (its gateway answered the controller)" in text
    assert "GET /v1/models without a key 401 (keyed)" in text
    assert "reachable only through an existing connection" in text
    assert "seen from the gateway only" in text
    markdown = render_markdown(report)
    assert "Partial: " in markdown and "GET /v1/models without a key 401 (keyed)" in markdown


def test_a_snapshot_keeps_the_connection_note(tmp_path: Path, captured: Any) -> None:
    _, observations = captured
    spark = observations["spark"]
    kept = BoxObservation(
        "spark", spark.collected, None, spark.controller, 0.5, MASTER_ONLY, complete=False
    )
    save_snapshot(tmp_path, {"spark": kept}, {"run_id": "r1"})
    _, back = load_snapshot(tmp_path)
    assert back["spark"].connection == MASTER_ONLY and back["spark"].document is not None
    raw = json.loads((tmp_path / "spark.json").read_text())
    raw["connection"] = "\x1b[31mred\x1b[0m"  # a snapshot is not trusted to be printable
    (tmp_path / "spark.json").write_text(json.dumps(raw))
    _, back = load_snapshot(tmp_path)
    assert back["spark"].connection is not None and "\x1b" not in back["spark"].connection


# -- audit -----------------------------------------------------------------------------------------
AUDIT_SCENARIO = "weakest_link_proven_live"  # thor open; spark and orin keyed; one mesh


def audit_with_spark_unreachable(edit: Any = None) -> AuditReport:
    _, found = load_snapshot(FIXTURES / AUDIT_SCENARIO)
    controller = copy.deepcopy(found["spark"].controller)
    if edit is not None:
        edit(controller)
    found["spark"] = BoxObservation("spark", None, str(REFUSED), controller, fault=REFUSED)
    return audit_report(fleet({"thor": "open"}), ["orin", "spark", "thor"], found, "r1")


def test_audit_says_keyed_from_the_mesh_side_for_an_unreachable_box() -> None:
    report = audit_with_spark_unreachable()
    row, verdict = report.row_of("spark"), report.verdict_of("spark")
    assert not row.audited and row.partial and row.posture == "keyed"
    assert row.mesh_side is not None and row.mesh_side.models.status == 401
    assert not verdict.audited and verdict.verdict.value == "fail"
    assert [f.code for f in verdict.findings] == ["audit.unobserved"]  # keyed, as desired
    assert verdict.reasons[0].startswith("seen from the mesh side only: desired keyed, live keyed")
    # The mesh still lists it as keyed (it said "keyed: orin" before) and is still incomplete.
    assert "spark" in report.mesh.with_posture("keyed")
    assert "spark" in report.mesh.unaudited and "spark" not in report.mesh.mesh_keys
    codes = {f.code for f in report.mesh_verdict.findings}
    assert {"mesh.incomplete", "mesh.weakest-link"} <= codes and "mesh.keys-differ" not in codes
    (incomplete,) = [f for f in report.mesh_verdict.findings if f.code == "mesh.incomplete"]
    assert incomplete.message.endswith("the mesh is only as closed as its weakest member")

    doc = AuditReportDoc.model_validate_json(audit_json(report))
    spark = next(b for b in doc.boxes if b.box == "spark")
    assert spark.observation == "partial" and spark.evidence is None
    assert spark.partial is not None and spark.partial.posture == "keyed"
    assert spark.partial.mesh_side.models.status == 401
    assert "spark" in doc.mesh.keyed
    assert {b.observation for b in doc.boxes if b.box != "spark"} == {"full"}
    text = audit_text(report, width=160)
    spark_line = next(
        x for x in text.splitlines() if x.startswith(" spark") or x.startswith("spark")
    )
    assert (
        "keyed" in spark_line and "401" in spark_line and "not audited (unreachable)" in spark_line
    )
    assert "keyed: " in text and "keyed: none" not in text
    assert "seen from the mesh side only" in audit_markdown(report)


def test_audit_finds_a_keyed_box_open_from_the_mesh_side_without_ssh() -> None:
    def open_gateway(controller: dict[str, Any]) -> None:
        controller["models_noauth"]["status"] = 200
        controller["audit"]["chat_noauth"]["status"] = 200

    verdict = audit_with_spark_unreachable(open_gateway).verdict_of("spark")
    assert {f.code for f in verdict.findings} == {"audit.unobserved", "posture.keyed-but-open"}


def test_audit_without_any_gateway_answer_stays_not_audited() -> None:
    def dead(controller: dict[str, Any]) -> None:
        for key in ("health", "capabilities", "models_noauth"):
            controller[key] = {"status": None, "error": "ConnectError"}
        for key in ("chat_noauth", "mesh_detect"):
            controller["audit"][key] = {"status": None, "error": "ConnectError"}

    report = audit_with_spark_unreachable(dead)
    row = report.row_of("spark")
    assert not row.audited and not row.partial and row.mesh_side is None
    assert "spark" not in report.mesh.with_posture("keyed")
    assert report.verdict_of("spark").reasons == ()


def test_audit_warns_when_a_box_answered_only_through_an_old_connection() -> None:
    _, found = load_snapshot(FIXTURES / AUDIT_SCENARIO)
    orin = found["orin"]
    found["orin"] = BoxObservation(
        "orin", orin.collected, None, orin.controller, 0.0, MASTER_ONLY, complete=False
    )
    verdict = audit_report(fleet({"thor": "open"}), ["orin", "spark", "thor"], found, "r1")
    orin_verdict = verdict.verdict_of("orin")
    assert orin_verdict.audited
    (finding,) = [f for f in orin_verdict.findings if "existing connection" in f.message]
    assert (finding.code, finding.severity.value) == ("audit.unobserved", "warn")


# -- the transport's check: does the box take a NEW connection? ------------------------------------
@pytest.fixture
def server() -> Iterator[tuple[socket.socket, list[bytes]]]:
    """A listening socket on the loopback; what the test makes it send, and what it received."""
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []
    yield listener, received
    listener.close()


def serve_once(
    listener: socket.socket, greeting: bytes | None, received: list[bytes]
) -> threading.Thread:
    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            if greeting is not None:
                conn.sendall(greeting)
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    received.append(conn.recv(256))
            else:
                threading.Event().wait(1.0)  # say nothing

    server = threading.Thread(target=run, daemon=True)
    server.start()
    return server


def test_an_ssh_greeting_is_a_box_that_takes_new_connections(server: Any) -> None:
    listener, received = server
    server = serve_once(listener, b"some banner line\r\nSSH-2.0-OpenSSH_9.2p1\r\n", received)
    assert transport.greets("127.0.0.1", listener.getsockname()[1]) is None
    server.join(5)
    # It said who it is, so sshd logs a plain "Connection closed" (no kex error).
    assert received == [transport.IDENT]


def test_a_refused_or_silent_port_is_not_a_new_connection(server: Any) -> None:
    listener, received = server
    port = listener.getsockname()[1]
    serve_once(listener, None, received)
    assert transport.greets("127.0.0.1", port, timeout=0.3) == (
        f"127.0.0.1:{port} sent no SSH greeting within 0.3 s"
    )
    listener.close()
    assert transport.greets("127.0.0.1", port, timeout=0.3) == (
        f"connect to 127.0.0.1:{port}: Connection refused"
    )


def test_without_a_master_the_commands_own_connection_is_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    transport.private_dir.cache_clear()
    try:
        # A closed port: a check that ran would say "refused"; with no master it must not run.
        target = transport.Target("thor", "127.0.0.1", "lobes", 9, None, None)
        assert transport.master_running(target) is False
        assert transport.new_connections_refused(target) is None
    finally:
        transport.private_dir.cache_clear()


def test_a_running_command_hands_back_the_checks_answer() -> None:
    done: Future[str | None] = Future()
    done.set_result(MASTER_ONLY)
    assert transport.Running("thor", None, fresh=done).refused_anew() == MASTER_ONLY
    broken: Future[str | None] = Future()
    broken.set_exception(OSError("ssh vanished"))
    assert transport.Running("thor", None, fresh=broken).refused_anew() is None
    assert transport.Running("thor", None).refused_anew() is None


def test_a_converge_is_blocked_for_a_box_reached_only_through_an_old_connection(
    captured: Any,
) -> None:
    from reconciler.plan import plan_box

    fleet_, observations = captured
    obs = observations["thor"]
    exp = expectations(fleet_, ["thor"])["thor"]
    healthy = plan_box(compare_box(exp, obs.document, obs.probes), exp)
    assert not healthy.blocked and healthy.steps  # thor's incidents call for a converge
    stale = plan_box(compare_box(exp, obs.document, obs.probes, None, MASTER_ONLY), exp)
    assert [e.part for e in stale.blocked] == [Part.CONNECTION] and not stale.steps
    partial = plan_box(compare_box(exp, None, obs.probes, REFUSED), exp)
    assert partial.blocked == (str(REFUSED),) and not partial.steps
