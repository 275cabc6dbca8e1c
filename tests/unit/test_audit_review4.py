"""The audit after a fourth review: a box whose containers could not be read is not audited
(test_audit_hostile.py "docker unreadable"), and the HTML matrix fails a lane on the host
network as the verdict does."""

from __future__ import annotations

import copy

from reconciler.audit.report_html import audit_matrix
from reconciler.audit.run import audit_report
from reconciler.observe.observe import BoxObservation, load_snapshot
from tests.unit.test_audit_snapshots import FIXTURES, SCENARIOS, fleet

SCENARIO = "lane_port_published"


def test_a_lane_on_the_host_network_fails_its_cell_in_the_html_matrix() -> None:
    auth, verdicts, *_ = SCENARIOS[SCENARIO]
    index, found = load_snapshot(FIXTURES / SCENARIO)
    orin = found["orin"]
    collected = copy.deepcopy(orin.collected)
    assert collected is not None
    (embed,) = [c for c in collected["docker"]["containers"] if c["service"] == "vllm-embed"]
    embed["ports"] = {}  # on the host network docker publishes nothing
    collected["audit"]["host_network"] = {"containers": [embed["name"]]}
    found["orin"] = BoxObservation("orin", collected, None, orin.controller, complete=False)
    report = audit_report(fleet(auth), list(verdicts), found, index["run_id"])
    row = next(r for r in report.rows if r.box == "orin")
    assert row.published is not None and row.published.host_network == (embed["name"],)
    _, matrix = audit_matrix(report, {"orin": ["vllm-embed", "vllm-rerank"]})
    cell = matrix["orin"]["vllm-embed"]
    assert cell.state == "fail" and "host network" in cell.title, cell
    assert matrix["orin"]["vllm-rerank"].state == "ok"
