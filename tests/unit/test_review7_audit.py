"""Review 7 of `reconcile audit`, on lab snapshots (tests/unit/data/review7_audit/, trimmed with
tests/lab/audit_scenarios.trim_snapshot) and the collector against a local gateway:

1. a box whose gateway answers nothing (thor's stopped, the controller refused) while a lane
   publishes 0.0.0.0:18001 and answers the controller 200: still judged on what it publishes,
   in every format, and never "unreachable" (SSH worked);
2. the box asks its gateway at the desired `gateway.bind` (Docker publishes only there), and a
   keyed probe that was sent but got no answer says so, not "not tried";
3. a stopped container of the project on the host network opens nothing: no
   `publish.host-network`.
"""

from __future__ import annotations

import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest

from reconciler.audit.document import AuditReportDoc
from reconciler.audit.report import AuditReport
from reconciler.audit.report_html import render_html
from reconciler.audit.report_json import render_json
from reconciler.audit.report_md import render_markdown
from reconciler.audit.report_text import render_text
from reconciler.audit.run import audit_report
from reconciler.desired.envfile import box_env
from reconciler.desired.fleet import Fleet
from reconciler.observe.document import FaultKind
from reconciler.observe.observe import load_snapshot
from reconciler.observe.payload import collector_payload
from reconciler.records import replace
from tests.unit.conftest import load_box_program
from tests.unit.test_audit_snapshots import fleet

DATA = Path(__file__).resolve().parent / "data" / "review7_audit"
KEY = "review7-desired-gateway-key-0123456789"  # the stub gateway's key (not a real one)


def _with_bind(bind: str) -> Fleet:
    base = fleet({})
    spark = base.boxes["spark"]
    gateway = spark.gateway.model_copy(update={"bind": bind})
    return replace(
        base, boxes={**base.boxes, "spark": spark.model_copy(update={"gateway": gateway})}
    )


def _judged(
    snapshot: str, box: str, desired: Fleet | None = None, edit: Any = None, tmp: Path | None = None
) -> AuditReport:
    """The snapshot judged under `desired` (the repository's); `edit` changes the box's file
    first (in a copy under `tmp`)."""
    where = DATA / snapshot
    if edit is not None:
        assert tmp is not None
        where = tmp / snapshot
        shutil.copytree(DATA / snapshot, where)
        raw = json.loads((where / f"{box}.json").read_text())
        edit(raw)
        (where / f"{box}.json").write_text(json.dumps(raw))
    index, observations = load_snapshot(where)
    return audit_report(desired or fleet({}), [box], observations, index["run_id"])


# -- 1. a silent gateway hides no lane ----------------------------------------------------------
def test_a_box_whose_gateway_is_silent_is_still_judged_on_what_it_publishes():
    report = _judged("gateway_down", "thor")
    row, verdict = report.row_of("thor"), report.verdict_of("thor")
    lane = [f for f in verdict.findings if f.code == "publish.lane"]
    assert [f.severity.value for f in lane] == ["fail"]
    assert "0.0.0.0:18001" in lane[0].message and "without a key: 200" in lane[0].message
    assert not verdict.audited and report.exit_code == 1  # as severe as before
    # SSH worked and the collector answered: the fault is the gateway's, not "unreachable".
    assert row.fault is not None and row.fault.kind is not FaultKind.UNREACHABLE
    assert row.fault.path == "gateway"

    text = render_text(report)
    assert "unreachable" not in text
    assert "publish.lane" in text and "LANE vllm-worker" in text and "0.0.0.0:18001" in text
    markdown = render_markdown(report)
    assert "publish.lane" in markdown and "0.0.0.0:18001" in markdown
    html = render_html(report, {"thor": ["vllm-worker"]})
    assert 'data-finding="publish.lane"' in html and "0.0.0.0:18001" in html

    rendered = render_json(report)
    AuditReportDoc.model_validate_json(rendered)  # the schema allows what it says
    thor = json.loads(rendered)["boxes"][0]
    assert (thor["audited"], thor["observation"]) == (False, "full")
    assert thor["fault"]["kind"] != "unreachable"
    published = thor["evidence"]["published"]
    assert [b["address"] for b in published["lanes"]] == ["0.0.0.0:18001"]
    assert [(p["container"], p["status"]) for p in published["lane_probes"]] == [
        ("model-gear-vllm-worker", 200)
    ]
    assert "publish.lane" in {f["code"] for f in thor["findings"]}


def test_the_html_matrix_shows_the_published_lane_of_a_box_whose_gateway_is_silent():
    from reconciler.audit.report_html import audit_matrix
    from reconciler.report.html import GATEWAY

    report = _judged("gateway_down", "thor")
    _, matrix = audit_matrix(report, {"thor": ["vllm-worker", "vllm-hand"]})
    assert matrix["thor"][GATEWAY].state == "unobserved"  # who can call it is unknown
    assert matrix["thor"]["vllm-worker"].state == "fail"
    assert matrix["thor"]["vllm-hand"].state == "ok"


def test_a_gateway_bound_to_another_loopback_address_is_not_read_as_unreachable():
    # spark's gateway published on 127.0.0.2 as desired; the old collector asked 127.0.0.1.
    report = _judged("bind_127_0_0_2", "spark", _with_bind("127.0.0.2"))
    row, verdict = report.row_of("spark"), report.verdict_of("spark")
    assert row.fault is not None and row.fault.kind is not FaultKind.UNREACHABLE
    assert not verdict.audited and report.exit_code == 1
    assert row.published is not None
    assert [b.address for b in row.published.gateway] == ["127.0.0.2:8000"]
    assert "publish.gateway" not in {f.code for f in verdict.findings}  # the desired bind:port
    thor = json.loads(render_json(report))["boxes"][0]
    assert thor["evidence"]["published"]["gateway"][0]["address"] == "127.0.0.2:8000"


# -- 2. the box asks its gateway where it is published ----------------------------------------
def test_a_keyed_probe_that_was_sent_but_got_no_answer_is_not_called_untried():
    report = _judged("bind_10_77_0_12", "spark", _with_bind("10.77.0.12"))
    unproven = [f for f in report.verdict_of("spark").findings if f.code == "key.unproven"]
    assert len(unproven) == 1
    message = unproven[0].message
    assert "not tried" not in message
    assert "tried" in message and "connection refused" in message
    assert "secret:gateway_api_key" in message


def test_a_keyed_probe_that_was_never_sent_still_says_not_tried(tmp_path):
    def skipped(raw: dict[str, Any]) -> None:
        raw["collected"]["audit"]["probes"]["models_key"] = {
            "status": None,
            "skipped": "no key in the desired source or .env",
        }

    report = _judged("bind_10_77_0_12", "spark", _with_bind("10.77.0.12"), skipped, tmp_path)
    unproven = [f for f in report.verdict_of("spark").findings if f.code == "key.unproven"]
    assert [f.message for f in unproven] == [
        "keyed access was not tried: no key in the desired source or .env"
    ]


class _Gateway(http.server.BaseHTTPRequestHandler):
    """lobes' gate in miniature: /health and /capabilities open, /v1/* 401 without KEY."""

    seen: ClassVar[list[tuple[str, str]]] = []  # each served subclass has its own

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.seen.append((self.command, self.path))
        if self.path in ("/health", "/capabilities"):
            self._answer(200, {"status": "ok"})
        elif self.headers.get("Authorization") == f"Bearer {KEY}":
            self._answer(200, {"data": []})
        else:
            self._answer(401, {"error": {"type": "invalid_api_key"}})

    def do_POST(self) -> None:
        self.seen.append((self.command, self.path))
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(401, {"error": {"type": "invalid_api_key"}})

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def _serve(address: str) -> Iterator[tuple[int, list[tuple[str, str]]]]:
    handler = type("Handler", (_Gateway,), {"seen": []})
    server = http.server.ThreadingHTTPServer((address, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler.seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def gateway_on_127_0_0_2() -> Iterator[tuple[int, list[tuple[str, str]]]]:
    """A gateway published on 127.0.0.2 only, as Docker publishes `127.0.0.2:PORT:8000`."""
    with _serve("127.0.0.2") as served:
        yield served


def _collector_run(tmp_path: Path, bind: str | None, port: int) -> tuple[Any, Any]:
    collector = load_box_program(
        "fleet_collector_review7", "reconciler/observe/remote/collector.py"
    )
    desired = _with_bind(bind or "0.0.0.0")
    payload = collector_payload(
        desired.boxes["spark"], box_env(desired, "spark"), run_key="k" * 32, audit=True
    )
    payload.pop("gateway_bind", None)  # None: an older controller's payload
    if bind is not None:
        payload["gateway_bind"] = bind
    payload.update(directory=str(tmp_path), gateway_port=port, probe_timeout_s=2)
    return collector, collector.Run(payload)


def test_the_box_asks_its_gateway_at_the_desired_bind_address(tmp_path, gateway_on_127_0_0_2):
    port, seen = gateway_on_127_0_0_2
    collector, run = _collector_run(tmp_path, "127.0.0.2", port)
    probes = collector.gateway_probes(run)
    assert probes["health"]["status"] == 200
    assert probes["models_noauth"]["status"] == 401
    section = collector.audit_section(run, {"gateway_api_key": KEY})
    keyed = section["probes"]["models_key"]
    assert (keyed["status"], keyed["key_from"]) == (200, "secret:gateway_api_key")
    assert section["probes"]["chat_noauth"]["status"] == 401
    assert ("GET", "/v1/models") in seen and ("POST", "/v1/chat/completions") in seen


def test_the_controller_sends_the_desired_bind_address():
    desired = _with_bind("10.77.0.12")
    spark = desired.boxes["spark"]
    for audit in (True, False):  # drift's collector asks its gateway at the same address
        payload = collector_payload(spark, box_env(desired, "spark"), "k" * 32, audit=audit)
        assert payload["gateway_bind"] == "10.77.0.12"


@pytest.mark.parametrize("bind", ["0.0.0.0", None])
def test_every_interface_or_an_older_payload_asks_127_0_0_1(tmp_path, bind):
    with _serve("127.0.0.1") as (port, seen):
        collector, run = _collector_run(tmp_path, bind, port)
        assert collector.gateway_probes(run)["models_noauth"]["status"] == 401
    assert ("GET", "/v1/models") in seen


def test_a_bind_address_that_is_not_the_boxs_own_is_never_requested(tmp_path, monkeypatch):
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: the keys must not go there.
    collector, run = _collector_run(tmp_path, "192.0.2.1", 8000)
    asked: list[str] = []

    def refuse(host: str, port: int, timeout: float) -> Any:
        asked.append(host)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(collector, "tcp_connect", refuse)
    probes = collector.gateway_probes(run)
    section = collector.audit_section(run, {"gateway_api_key": KEY})
    assert asked == []
    assert probes["models_noauth"]["status"] is None
    assert "not an address of this box" in probes["models_noauth"]["error"]
    keyed = section["probes"]["models_key"]
    assert keyed["status"] is None and "key_from" not in keyed and "key" not in keyed
    assert "not an address of this box" in keyed["skipped"]
    assert KEY not in json.dumps(section)


# -- 3. a stopped container on the host network ------------------------------------------------
def test_a_stopped_host_network_container_opens_nothing():
    report = _judged("host_network_stopped", "spark")
    verdict = report.verdict_of("spark")
    assert "publish.host-network" not in {f.code for f in verdict.findings}
    assert report.row_of("spark").published.host_network == ()  # type: ignore[union-attr]
    spark = json.loads(render_json(report))["boxes"][0]
    assert spark["evidence"]["published"]["host_network"] == []
    assert "HOST-NET" not in render_text(report)


def test_a_running_host_network_container_still_fails(tmp_path):
    def running(raw: dict[str, Any]) -> None:
        for c in raw["collected"]["docker"]["containers"]:
            if c["name"] == "model-gear-vllm-hand":
                c["status"] = "running"

    report = _judged("host_network_stopped", "spark", edit=running, tmp=tmp_path)
    found = [f for f in report.verdict_of("spark").findings if f.code == "publish.host-network"]
    assert [(f.severity.value, f.message.split(" ")[0]) for f in found] == [
        ("fail", "model-gear-vllm-hand")
    ]
