"""Review 3 of the audit: the exporters every real GPU box runs beside the compose project.

`publish.stray` failed every box running node-exporter (host network) and dcgm-exporter
(0.0.0.0:9400), and nothing in the desired state could allow them. Now:

1. `audit.expected_containers` (group_vars, layered) declares them: listed as expected, no
   finding, the box is ok;
2. a declared name publishing a port it does not declare is still a finding;
3. an undeclared one that does not answer as an LLM API is a warning saying how to declare it;
4. any stray whose GET /v1/models without a key answers 2xx fails, declared or not;
5. a bad setting (a name with a space or `;`, port 0) is refused at its file:line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reconciler import cli
from reconciler.audit.report_text import render_text
from reconciler.audit.verdict import Severity
from reconciler.desired.fleet import Fleet
from reconciler.desired.load import load_fleet
from reconciler.records import replace
from tests.unit.test_audit_review2_published import lane_probe, running
from tests.unit.test_audit_review_fixes import judge, on, snapshot
from tests.unit.test_audit_snapshots import fleet

Box = dict[str, Any]

NODE_EXPORTER = {
    "name": "node-exporter",
    "image": "quay.io/prometheus/node-exporter:v1.8.2",
    "project": None,
    "service": None,
    "host_network": True,
    "ports": {},
}
DCGM_EXPORTER = {
    "name": "dcgm-exporter",
    "image": "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.7-3.5.0-ubuntu22.04",
    "project": None,
    "service": None,
    "host_network": False,
    "ports": {
        "9400/tcp": [
            {"HostIp": "0.0.0.0", "HostPort": "9400"},
            {"HostIp": "::", "HostPort": "9400"},
        ]
    },
}

SETTING = """
audit:
  expected_containers:
    - name: node-exporter
    - name: dcgm-*
      ports: [9400]
"""


def exporters(status: int = 404) -> Any:
    """thor runs both exporters; dcgm-exporter's :9400 answers /v1/models with `status`."""

    def edit(doc: Box) -> None:
        running(doc, NODE_EXPORTER, DCGM_EXPORTER)
        lane_probe(doc, "dcgm-exporter", "9400", status)

    return on("thor", edit)


def declaring(desired: Fleet, box: str, *entries: dict[str, Any]) -> Fleet:
    """`desired` with box's audit.expected_containers set to `entries`, validated as loaded."""
    from reconciler.desired.models import AuditPolicy

    policy = AuditPolicy.model_validate(
        {
            "expected_containers": tuple(
                {**e, "ports": tuple(e["ports"])} if "ports" in e else e for e in entries
            )
        }
    )
    spec = desired.boxes[box].model_copy(update={"audit": policy})
    return replace(desired, boxes={**desired.boxes, box: spec})


def worst(report: Any, box: str = "thor") -> dict[str, Severity]:
    """Each finding code's worst severity (`codes` keeps the last one's)."""
    out: dict[str, Severity] = {}
    for f in report.verdict_of(box).findings:
        if out.get(f.code) != Severity.FAIL:
            out[f.code] = f.severity
    return out


def stray_messages(report: Any, box: str = "thor") -> list[str]:
    return [f.message for f in report.verdict_of(box).findings if f.code == "publish.stray"]


# -- 1. declared in group_vars: expected, no finding ---------------------------------------------
def test_declared_exporters_add_no_finding_and_the_box_is_ok(tmp_path, repo):
    # the usual place: one group's layer (every GPU box), loaded as an operator's run loads it
    (repo / "group_vars" / "gpu.yaml").write_text(
        (repo / "group_vars" / "gpu.yaml").read_text("utf-8") + SETTING, "utf-8"
    )
    desired = load_fleet(repo, "hosts")
    assert [e.name for e in desired.boxes["thor"].audit.expected_containers] == [
        "node-exporter",
        "dcgm-*",
    ]
    base = fleet({})
    desired = replace(base, boxes={**base.boxes, "thor": desired.boxes["thor"]})

    clean, _ = judge(snapshot(tmp_path / "a", "fully_keyed_mesh", on("thor", running)), desired)
    report, doc = judge(snapshot(tmp_path / "b", "fully_keyed_mesh", exporters()), desired)
    assert worst(report) == worst(clean) == {}
    assert report.verdict_of("thor").verdict == Severity.OK
    assert report.exit_code == clean.exit_code == 0
    published = next(b for b in doc["boxes"] if b["box"] == "thor")["evidence"]["published"]
    assert {(s["container"], s["address"], s["expected_by"]) for s in published["stray"]} == {
        ("dcgm-exporter", "0.0.0.0:9400", "dcgm-*"),
        ("dcgm-exporter", "[::]:9400", "dcgm-*"),
    }
    assert published["expected_host_network"] == ["node-exporter"]
    text = render_text(report, width=200)
    assert "expected dcgm-exporter 0.0.0.0:9400" in text
    assert "expected HOST-NET node-exporter" in text
    assert (
        "expected (audit.expected_containers): dcgm-exporter (0.0.0.0:9400, [::]:9400), "
        "node-exporter (host network)"
    ) in text


def test_without_the_setting_the_exporters_only_warn(tmp_path):
    """The reviewer's repro: before, {'publish.stray': FAIL} on every real GPU box."""
    report, _ = judge(snapshot(tmp_path, "fully_keyed_mesh", exporters()), fleet({}))
    assert worst(report) == {"publish.stray": Severity.WARN}
    assert report.verdict_of("thor").verdict == Severity.WARN
    messages = stray_messages(report)
    assert len(messages) == 3  # dcgm-exporter's two bindings and node-exporter
    assert all("declare it under audit.expected_containers" in m for m in messages)
    assert any("(name: dcgm-exporter, ports: [9400])" in m for m in messages)
    assert any("node-exporter" in m and "(name: node-exporter)" in m for m in messages)


# -- 2. a declared name, an undeclared port --------------------------------------------------------
def test_a_declared_name_publishing_an_undeclared_port_is_a_finding(tmp_path):
    desired = declaring(
        fleet({}), "thor", {"name": "node-exporter"}, {"name": "dcgm-exporter", "ports": [9401]}
    )
    report, doc = judge(snapshot(tmp_path, "fully_keyed_mesh", exporters()), desired)
    assert worst(report) == {"publish.stray": Severity.WARN}
    messages = stray_messages(report)
    assert messages and all("dcgm-exporter" in m for m in messages)
    assert (
        "declared under audit.expected_containers (dcgm-exporter) without port 9400"
        in (messages[0])
    )
    published = next(b for b in doc["boxes"] if b["box"] == "thor")["evidence"]["published"]
    assert {s["expected_by"] for s in published["stray"]} == {None}
    assert "STRAY dcgm-exporter 0.0.0.0:9400" in render_text(report, width=200)


def test_an_empty_ports_list_declares_no_port(tmp_path):
    desired = declaring(
        fleet({}), "thor", {"name": "node-exporter"}, {"name": "dcgm-exporter", "ports": []}
    )
    report, _ = judge(snapshot(tmp_path, "fully_keyed_mesh", exporters()), desired)
    assert worst(report) == {"publish.stray": Severity.WARN}


# -- 4. an open LLM API fails, declared or not ---------------------------------------------------
def test_an_undeclared_stray_answering_v1_models_fails(tmp_path):
    report, _ = judge(snapshot(tmp_path, "fully_keyed_mesh", exporters(status=200)), fleet({}))
    assert worst(report)["publish.stray"] == Severity.FAIL
    assert report.verdict_of("thor").verdict == Severity.FAIL
    failed = [
        f.message
        for f in report.verdict_of("thor").findings
        if f.code == "publish.stray" and f.severity == Severity.FAIL
    ]
    assert failed and all("dcgm-exporter" in m for m in failed)
    assert "answers as an LLM API without a key" in failed[0]
    assert "/v1/models without a key: 200" in failed[0]


def test_a_declared_container_answering_v1_models_still_fails(tmp_path):
    desired = declaring(
        fleet({}), "thor", {"name": "node-exporter"}, {"name": "dcgm-*", "ports": [9400]}
    )
    report, _ = judge(snapshot(tmp_path, "fully_keyed_mesh", exporters(status=200)), desired)
    assert worst(report) == {"publish.stray": Severity.FAIL}
    assert report.exit_code != 0
    message = stray_messages(report)[0]
    assert "answers as an LLM API without a key" in message
    assert "declared under audit.expected_containers (dcgm-*)" in message
    assert "never expected" in message


def test_a_2xx_other_than_200_is_an_open_llm_api_too(tmp_path):
    desired = declaring(fleet({}), "thor", {"name": "node-exporter"}, {"name": "dcgm-exporter"})
    report, _ = judge(snapshot(tmp_path, "fully_keyed_mesh", exporters(status=203)), desired)
    assert worst(report) == {"publish.stray": Severity.FAIL}


def test_an_undeclared_vllm_on_the_host_network_fails_an_exporter_there_warns(tmp_path):
    vllm = {**NODE_EXPORTER, "name": "my-vllm", "image": "vllm/vllm-openai:v0.9.0"}
    path = snapshot(tmp_path, "fully_keyed_mesh", on("thor", lambda d: running(d, vllm)))
    report, _ = judge(path, fleet({}))
    assert worst(report) == {"publish.stray": Severity.FAIL}
    path = snapshot(
        tmp_path / "b", "fully_keyed_mesh", on("thor", lambda d: running(d, NODE_EXPORTER))
    )
    report, _ = judge(path, fleet({}))
    assert worst(report) == {"publish.stray": Severity.WARN}


# -- 5. a bad setting is refused at its line -----------------------------------------------------
BAD = """
audit:
  expected_containers:
    - name: node exporter
    - name: "dcgm;rm -rf"
      ports: [9400]
    - name: fine
      ports: [0]
"""


def test_a_bad_setting_is_refused_at_its_file_and_line(repo, capsys):
    thor = repo / "group_vars" / "thor.yaml"
    before = thor.read_text("utf-8")
    first = len(before.splitlines()) + 1  # BAD's leading newline: its first line is blank
    thor.write_text(before + BAD, "utf-8")
    assert cli.main(["--root", str(repo), "validate"]) == 1
    said = capsys.readouterr()
    out = said.out + said.err
    assert f"group_vars/thor.yaml:{first + 3}:7: audit.expected_containers[0].name" in out
    assert f"group_vars/thor.yaml:{first + 4}:7: audit.expected_containers[1].name" in out
    assert f"group_vars/thor.yaml:{first + 7}:" in out
    assert "audit.expected_containers[2].ports[0]" in out
    assert "greater than or equal to 1" in out
    assert "3 problems" in out


def test_a_good_setting_validates_and_a_wildcard_only_name_does_not(repo, capsys):
    gpu = repo / "group_vars" / "gpu.yaml"
    before = gpu.read_text("utf-8")
    gpu.write_text(before + SETTING, "utf-8")
    assert cli.main(["--root", str(repo), "validate"]) == 0
    capsys.readouterr()
    gpu.write_text(before + "\naudit:\n  expected_containers:\n    - name: '*'\n", "utf-8")
    assert cli.main(["--root", str(repo), "validate"]) == 1
    said = capsys.readouterr()
    assert "audit.expected_containers[0].name" in said.out + said.err
    assert "names no container" in said.out + said.err


def test_the_layer_schema_offers_the_setting():
    schema = json.loads(
        (Path(__file__).resolve().parents[2] / "schema" / "desired-state.schema.json").read_text(
            "utf-8"
        )
    )
    assert "audit" in schema["properties"]


def test_show_prints_the_setting_one_entry_a_line_and_as_yaml(repo):
    """The first list of mappings in the desired state: in flow style, each key's source comment
    ended the line inside a mapping (`, ports: null # default` on a line of its own, `},` on the
    next): one entry a line, in block style, as every other mapping shows."""
    from ruamel.yaml import YAML

    from reconciler.desired.show import show_text

    (repo / "group_vars" / "gpu.yaml").write_text(
        (repo / "group_vars" / "gpu.yaml").read_text("utf-8") + SETTING, "utf-8"
    )
    text = show_text(load_fleet(repo, "hosts"), "thor")
    yaml_part = text.split("\n# .env keys managed", 1)[0]
    shown = YAML(typ="safe").load(yaml_part)
    assert shown["audit"]["expected_containers"] == [
        {"name": "node-exporter", "ports": None},
        {"name": "dcgm-*", "ports": [9400]},
    ]
    lines = yaml_part.splitlines()
    assert any(
        line.startswith("    - name: node-exporter # group_vars/gpu.yaml:") for line in lines
    )
    assert not [line for line in lines if line.lstrip().startswith((",", "}"))]
