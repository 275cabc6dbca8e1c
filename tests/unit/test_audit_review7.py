"""The audit's report formats after review 7 (the HTML review), on copies of lab scenarios edited
as the box would have answered:

1. a box whose host-network listing failed (`audit.host_network.error`) never shows a lane as
   "no host port": its HTML lane cells are not observed, text and markdown say `HOST-NET ?`,
   the JSON carries the error in `published.host_network_error`;
2. a container's name is shown as a name in every format (as the drift report shows one: no
   key-shaped-run masking), while a secret-looking value elsewhere in a finding stays masked;
3. a long unbroken error never makes the page scroll sideways on a phone (drift and audit).
"""

from __future__ import annotations

from typing import Any

from reconciler.audit.document import AuditReportDoc
from reconciler.audit.report_html import audit_matrix, render_html
from reconciler.audit.report_json import naming, render_json
from reconciler.audit.report_md import render_markdown
from reconciler.audit.report_text import render_text
from reconciler.report.values import clean
from tests.chromium import chromium
from tests.unit.history_helpers import edited_snapshot
from tests.unit.history_helpers import reconcile as run_cli
from tests.unit.test_audit_review2_published import STRAY, lane_probe, running
from tests.unit.test_audit_review_fixes import judge, on, snapshot
from tests.unit.test_audit_snapshots import fleet

Box = dict[str, Any]
PHONE = {"width": 390, "height": 844, "mobile": True}


def _everything(report: Any) -> dict[str, str]:
    return {
        "text": render_text(report, width=400),  # a finding on one line
        "markdown": render_markdown(report),
        "json": render_json(report),
        "html": render_html(report, {"orin": ["vllm-embed", "vllm-rerank"]}),
    }


# -- 1. the host network not listed ---------------------------------------------------------------
def _host_network_failed(doc: Box) -> None:
    doc["collected"]["audit"]["host_network"] = {"error": "docker ps timed out"}


def test_a_host_network_not_listed_is_never_no_host_port(tmp_path):
    lanes = {"orin": ["vllm-embed", "vllm-rerank"]}
    listed, _ = judge(snapshot(tmp_path / "a", "lane_port_published", lambda f: None), fleet({}))
    _, matrix = audit_matrix(listed, lanes)
    assert matrix["orin"]["vllm-rerank"].state == "ok"  # listed: the cell this test is about
    assert "HOST-NET ?" not in render_text(listed)

    path = snapshot(tmp_path / "b", "lane_port_published", on("orin", _host_network_failed))
    report, doc = judge(path, fleet({}))
    assert report.row_of("orin").audited  # the edit parses: judged, not refused
    _, matrix = audit_matrix(report, lanes)
    rerank = matrix["orin"]["vllm-rerank"]
    assert (rerank.state, rerank.title) == ("unobserved", "host network not listed")
    assert matrix["orin"]["vllm-embed"].state == "fail"  # what it publishes is still known
    published = doc["boxes"][0]["evidence"]["published"]
    assert published["host_network"] == []
    assert published["host_network_error"] == "docker ps timed out"
    AuditReportDoc.model_validate_json(render_json(report))
    text, markdown = render_text(report), render_markdown(report)
    assert "HOST-NET ?" in text and "HOST-NET ?" in markdown
    # the HTML page: the lane cell grey, saying why
    html = render_html(report, lanes)
    cell = 'data-lane="vllm-rerank" title="host network not listed"'
    assert f'<td class="cell unobserved" {cell}>' in html


# -- 2. names shown as names ---------------------------------------------------------------------
LANE = "qwen3-8b-eval-run-20261206"  # 26 characters mixing letters and digits: key-shaped
EXPORTER = "node-exporter-v1-8-2-gpu01"
KEY = "Zq8Lm3Np7Rt2Vx6Bc9Df4Gh1Jk5"  # a key-shaped word a box's answer puts in a finding


def _strays(doc: Box) -> None:
    lane = {**STRAY, "name": LANE, "image": "vllm/vllm-openai:v0.11.0"}
    exporter = {**STRAY, "name": EXPORTER, "image": "prom/node-exporter:v1.8.2"}
    running(doc, lane, {**exporter, "host_network": True, "ports": {}})
    # The controller's request to it got no status, the error (box words) holding a key.
    lane_probe(doc, LANE, "18001", 200)
    probe = doc["controller"]["audit"]["lane_ports"][-1]
    probe.update(status=None, error=f"refused by {LANE}: token {KEY}")


def test_container_names_are_shown_and_other_secrets_stay_masked(tmp_path):
    report, doc = judge(snapshot(tmp_path, "fully_keyed_mesh", on("thor", _strays)), fleet({}))
    thor = next(b for b in doc["boxes"] if b["box"] == "thor")
    published = thor["evidence"]["published"]
    assert [b["container"] for b in published["stray"]] == [LANE]
    assert published["stray_host_network"] == [EXPORTER]
    messages = [f["message"] for f in thor["findings"] if f["code"] == "publish.stray"]
    assert any(m.startswith(f"{LANE} (vllm/vllm-openai:v0.11.0), outside") for m in messages)
    assert any(f"(name: {EXPORTER})" in m for m in messages), messages
    said = next(m for m in messages if "refused by" in m)
    assert f"refused by {LANE}: token ***" in said  # the name kept, the key beside it masked
    for fmt, out in _everything(report).items():
        assert KEY not in out, fmt
        for name in (LANE, EXPORTER):
            assert f"{name}, outside" in out or f"{name} (vllm" in out, (fmt, name)
        assert f"(name: {EXPORTER})" in out.replace("\\", ""), fmt  # markdown escapes `(`
    assert f"<code>publish.stray</code> {LANE} (vllm" in _everything(report)["html"]


def test_a_name_is_kept_only_whole_and_never_unmasks_its_context():
    names = {LANE}
    assert naming(f"{LANE} publishes; key {KEY}", names) == f"{LANE} publishes; key ***"
    # a name inside a longer key-shaped run is no name: the run is masked whole
    assert naming(f"key x{LANE}9", names) == "key ***"
    # a secret assignment or a bearer credential is masked whatever its value
    assert naming(f"HF_TOKEN={LANE} set", names) == "HF_TOKEN=*** set"
    assert LANE not in naming(f"Authorization: Bearer {LANE}", names)
    # the drift report's way for a name (values.clean), also for one shaped like a token:
    # a box names its containers, a name is not where a secret's value is kept
    token_like = "hf_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7"
    assert naming(f"{token_like}, outside", {token_like}) == f"{clean(token_like)}, outside"


# -- 3. a long unbroken word on a phone -----------------------------------------------------------
LONG_ERROR = "Cannot connect: unix:///run/" + "docker" * 100 + ".sock"


def _docker_broken(doc: Box) -> None:
    doc["collected"]["docker"] = {"error": LONG_ERROR}


def test_a_long_error_never_scrolls_the_page_sideways(capsys, tmp_path):
    drift_snapshot = edited_snapshot(tmp_path, "drift", lambda docs: _docker_broken(docs["thor"]))
    drift = tmp_path / "drift.html"
    code, _, err = run_cli(
        capsys, "drift", "--from-snapshot", str(drift_snapshot), "--no-history",
        "--format", "html", "-o", str(drift),
    )  # fmt: skip
    assert code in (1, 2), err
    path = snapshot(tmp_path, "fully_keyed_mesh", on("thor", _docker_broken))
    report, _ = judge(path, fleet({}))
    audit = tmp_path / "audit.html"
    audit.write_text(render_html(report))
    with chromium() as b:
        for page in (drift, audit):
            b.load(page, **PHONE)
            assert "docker" * 20 in b.value("document.body.innerText"), page.name  # shown
            # Against the phone's width: a mobile layout viewport widens to what overflows it.
            width = b.value("document.documentElement.scrollWidth")
            assert width <= PHONE["width"], (page.name, width)
