"""The audit on observations captured from the lab scenarios (tests/fixtures/audit/<scenario>/,
written by `AUDIT_FIXTURES=DIR pytest tests/lab/test_audit.py` and trimmed to what the audit
reads): each scenario's verdicts under the desired state the lab test used, the JSON against
its schema, and the collector's `.env` line states on a real file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler.audit.document import AuditReportDoc, json_schema
from reconciler.audit.report_json import SCHEMA_ID, VERSION, render_json
from reconciler.audit.report_md import render_markdown
from reconciler.audit.report_text import render_text
from reconciler.audit.run import audit_report
from reconciler.desired.fleet import Fleet
from reconciler.desired.load import load_fleet
from reconciler.observe.observe import load_snapshot
from reconciler.records import replace
from tests.unit.conftest import load_box_program

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "audit"

# scenario -> (desired auth per box, expected verdicts, mesh verdict, exit code, codes per box)
SCENARIOS: dict[str, tuple[dict[str, str], dict[str, str], str, int, dict[str, set[str]]]] = {
    "open_mesh": (
        {"thor": "open", "spark": "open", "orin": "open"},
        {"thor": "ok", "spark": "ok", "orin": "ok"},
        "ok",
        0,
        {},
    ),
    "fully_keyed_mesh": ({}, {"thor": "ok", "spark": "ok", "orin": "ok"}, "ok", 0, {}),
    "key_armed_from_login_shell": (
        {"thor": "open"},
        {"thor": "fail"},
        "warn",  # one box of a three-member mesh: mesh.not-in-run
        2,
        {"thor": {"posture.open-but-keyed", "key.from-login-shell", "shell.secret-export"}},
    ),
    "stale_key": (
        {},
        {"thor": "fail"},
        "warn",
        2,
        {"thor": {"posture.keyed-but-open", "key.stale"}, "mesh": {"mesh.not-in-run"}},
    ),
    "weakest_link_proven_live": (
        {"thor": "open"},
        {"thor": "ok", "spark": "ok", "orin": "ok"},
        "fail",
        2,
        {"mesh": {"mesh.weakest-link"}},
    ),
    "lane_port_published": ({}, {"orin": "fail"}, "warn", 2, {"orin": {"publish.lane"}}),
}


def fleet(auth: dict[str, str]) -> Fleet:
    """The repository's desired state with the scenario's gateway.auth per box."""
    base = load_fleet(REPO, "hosts")
    boxes = {}
    for name, spec in base.boxes.items():
        if auth.get(name, "keyed") == "open":
            gateway = spec.gateway.model_copy(update={"auth": "open", "api_key": None})
            spec = spec.model_copy(update={"gateway": gateway})
        boxes[name] = spec
    return replace(base, boxes=boxes)


def judged(scenario: str) -> Any:
    auth, verdicts, *_ = SCENARIOS[scenario]
    index, observations = load_snapshot(FIXTURES / scenario)
    return audit_report(fleet(auth), list(verdicts), observations, index["run_id"])


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario_verdicts(scenario):
    _, verdicts, mesh, exit_code, codes = SCENARIOS[scenario]
    report = judged(scenario)
    got = {v.subject: v.verdict.value for v in report.verdicts}
    assert got == verdicts, {v.subject: [f.code for f in v.findings] for v in report.verdicts}
    assert report.mesh_verdict.verdict.value == mesh
    for subject, expected in codes.items():
        v = report.mesh_verdict if subject == "mesh" else report.verdict_of(subject)
        assert expected <= {f.code for f in v.findings}
    assert report.exit_code == exit_code


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_renders_validate_and_show_no_wire_digest(scenario):
    report = judged(scenario)
    text = render_json(report)
    doc = AuditReportDoc.model_validate_json(text)
    assert (doc.schema_, doc.version) == (SCHEMA_ID, VERSION)
    raw = (FIXTURES / scenario).glob("*.json")
    wire = {
        s["digest"]
        for path in raw
        for s in _secrets(json.loads(path.read_text()))
        if isinstance(s.get("digest"), str)
    }
    for out in (text, render_text(report), render_markdown(report)):
        assert "hmac:" not in out
        assert not any(d[5:] in out for d in wire)


def _secrets(node: Any) -> list[dict[str, Any]]:
    """Every `{"secret": "hmac:..."}` (and `"digest": "hmac:..."`) in a collector document."""
    out: list[dict[str, Any]] = []
    if isinstance(node, dict):
        for key in ("secret", "digest", "key"):
            if isinstance(node.get(key), str) and node[key].startswith("hmac:"):
                out.append({"digest": node[key]})
        for value in node.values():
            out += _secrets(value)
    elif isinstance(node, list):
        for value in node:
            out += _secrets(value)
    return out


def test_shell_armed_key_is_traced_to_its_line():
    row = judged("key_armed_from_login_shell").row_of("thor")
    carried = row.carried["GATEWAY_API_KEY"]
    assert carried.origin == "shell" and carried.where.startswith("~/.bashrc:")
    assert row.envfile["GATEWAY_API_KEY"].state == "commented-out"


def test_weakest_link_is_proven_through_the_open_member():
    report = judged("weakest_link_proven_live")
    proofs = [p for p in report.mesh.proofs if p.proven]
    assert proofs and all(p.via == "thor" and p.mesh_member == p.host for p in proofs)


def test_committed_schema_is_the_generated_one():
    committed = json.loads((REPO / "schema" / "audit-report.schema.json").read_text())
    assert committed == json.loads(json.dumps(json_schema()))


def test_the_cli_parser_does_not_import_the_audit():
    code = (
        "import sys, reconciler.cli as c; c.build_parser(); "
        "print(sorted(m for m in sys.modules if m.startswith('reconciler.audit')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['reconciler.audit', 'reconciler.audit.cli']"


# -- the collector's audit section, run locally on a real .env ----------------------------------
def _collector() -> Any:
    return load_box_program("fleet_collector", "reconciler/observe/remote/collector.py")


def test_collector_reads_env_line_states_as_digests(tmp_path):
    collector = _collector()
    (tmp_path / ".env").write_text(
        "# GATEWAY_API_KEY=old-secret-value   # an operator's commented-out key\n"
        "CULTURE_VLLM_API_KEY=\n"
        "LOBES_MESH_KEY=mesh-secret-value  # inline comment\n"
        "# prose that mentions GATEWAY_API_KEY=is not an assignment\n"
    )
    run = collector.Run({"run_key": "k", "secret_patterns": ["*_KEY"], "directory": str(tmp_path)})
    names = ["GATEWAY_API_KEY", "CULTURE_VLLM_API_KEY", "LOBES_MESH_KEY", "HF_TOKEN"]
    states, active = collector.audit_envfile_keys(run, names)
    assert {n: s["state"] for n, s in states.items()} == {
        "GATEWAY_API_KEY": "commented-out",
        "CULTURE_VLLM_API_KEY": "empty",
        "LOBES_MESH_KEY": "set",
        "HF_TOKEN": "absent",
    }
    assert states["GATEWAY_API_KEY"]["line"] == 1
    assert states["GATEWAY_API_KEY"]["digest"] == run.digest("old-secret-value")
    assert states["LOBES_MESH_KEY"]["digest"] == run.digest("mesh-secret-value")
    assert "secret-value" not in json.dumps(states)
    assert active == {"CULTURE_VLLM_API_KEY": "", "LOBES_MESH_KEY": "mesh-secret-value"}


@pytest.mark.parametrize("width", [80, 100, 160])
def test_no_matrix_column_is_dropped_on_a_narrow_terminal(width):
    # rich drops a column it cannot fit rather than squeeze it: every header must survive.
    text = render_text(judged("lane_port_published"), width=width)
    for header in ("want", "live", "no key", "published", "verdict", ".env", "key use"):
        assert header in text, (width, header)
    assert "LANE" in text
