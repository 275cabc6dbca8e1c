"""The audit review's defects, each on a copy of a lab scenario (tests/fixtures/audit/<scenario>/)
edited in tmp_path the way the box or the gateway would have answered:

1. an unreadable `.env` or a failed audit section is unknown, not "absent" / "no .env";
2. a gateway published wider than a desired loopback bind fails (::, "", another IP);
3. a mixed member (some gated route answers without a key) is on the weakest link's open side;
4. proofs made through a box seen from the mesh side only are kept;
5. a subset run names the desired members it did not audit, and the mesh is not ok;
6. a desired loopback bind is never "unreachable from the mesh side" (a mesh member so bound is
   its own finding);
7. a whitespace-only key is no key, as lobes reads it (collector and audit);
8. what a hostile gateway puts in a proof, a probe or the index reaches no report unscrubbed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.audit.mesh import proof_attempts
from reconciler.audit.report import AuditReport
from reconciler.audit.report_html import render_html
from reconciler.audit.report_json import render_json
from reconciler.audit.run import audit_report
from reconciler.audit.verdict import Severity
from reconciler.desired.fleet import Fleet
from reconciler.observe.observe import load_snapshot
from reconciler.records import replace
from tests.unit.test_audit_snapshots import FIXTURES, _collector, fleet

Box = dict[str, Any]
Edit = Callable[[dict[str, Box]], None]
EVERY = ["orin", "spark", "thor"]
OPEN_THOR = {"thor": "open"}  # weakest_link_proven_live's desired auth


# -- inputs: a scenario's snapshot, copied and edited -------------------------------------------
def snapshot(tmp_path: Path, scenario: str, edit: Edit, run_id: str | None = None) -> Path:
    """A copy of the scenario's snapshot with `edit` applied to its box files (box -> file
    document) and the index's sha256 (if it keeps them) recomputed, as the reviewer's mk.py."""
    dst = tmp_path / scenario
    shutil.copytree(FIXTURES / scenario, dst)
    index = json.loads((dst / "index.json").read_text())
    files = {b: json.loads((dst / f"{b}.json").read_text()) for b in index["boxes"]}
    edit(files)
    for name, doc in files.items():
        (dst / f"{name}.json").write_text(json.dumps(doc, indent=1))
    if "sha256" in index:
        index["sha256"] = {b: _sha256(dst / f"{b}.json") for b in files}
    if run_id is not None:
        index["run_id"] = run_id
    (dst / "index.json").write_text(json.dumps(index, indent=1))
    return dst


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def judge(
    path: Path, desired: Fleet, boxes: list[str] | None = None
) -> tuple[AuditReport, dict[str, Any]]:
    index, observations = load_snapshot(path)
    report = audit_report(desired, boxes or list(index["boxes"]), observations, index["run_id"])
    return report, json.loads(render_json(report))


def codes(report: AuditReport, subject: str) -> dict[str, Severity]:
    v = report.mesh_verdict if subject == "mesh" else report.verdict_of(subject)
    return {f.code: f.severity for f in v.findings}


def with_gateway(desired: Fleet, box: str, **update: Any) -> Fleet:
    spec = desired.boxes[box]
    gateway = spec.gateway.model_copy(update=update)
    return replace(
        desired, boxes={**desired.boxes, box: spec.model_copy(update={"gateway": gateway})}
    )


def on(box: str, change: Callable[[Box], None]) -> Edit:
    return lambda files: change(files[box])


def gateway_env(doc: Box) -> dict[str, Any]:
    return next(c for c in doc["collected"]["docker"]["containers"] if c["service"] == "gateway")[
        "env"
    ]


# -- 1. .env unread, or the audit section failed -------------------------------------------------
def audit_failed(doc: Box) -> None:
    doc["collected"]["audit"] = {"error": "RuntimeError: the audit part broke"}


def env_unreadable(doc: Box) -> None:
    # As the collector answers a .env over its size limit: file_errors names it, its keys read
    # "no-file" (and a collector that knows says so in its audit section too).
    doc["collected"]["file_errors"] = {".env": "larger than 1048576 bytes"}
    for state in doc["collected"]["audit"]["envfile_keys"].values():
        state.clear()
        state["state"] = "no-file"


def env_unreadable_said(doc: Box) -> None:
    env_unreadable(doc)
    doc["collected"]["audit"]["error"] = "file .env: larger than 1048576 bytes"


@pytest.mark.parametrize("broken", [audit_failed, env_unreadable, env_unreadable_said])
def test_an_unread_env_is_unknown_not_absent(tmp_path, broken):
    path = snapshot(tmp_path, "fully_keyed_mesh", on("spark", broken))
    report, doc = judge(path, fleet({}))
    found = codes(report, "spark")
    # Not "`.env` declares the gateway open", not "recreate it": .env was never read.
    assert not {"envfile.other-posture", "key.stale", "key.from-login-shell"} & set(found)
    spark = next(b for b in doc["boxes"] if b["box"] == "spark")["evidence"]
    assert {line["state"] for line in spark["envfile"].values()} == {"unknown"}
    assert spark["gateway"]["carries"]["GATEWAY_API_KEY"]["origin"] == "unknown"
    assert any(".env" in e or "audit" in e for e in report.row_of("spark").errors)
    if broken is audit_failed:  # no keyed probe came back: the key is not proven
        assert found["key.unproven"] == Severity.WARN


# -- 2. published wider than a desired loopback bind ---------------------------------------------
@pytest.mark.parametrize(
    ("bind", "host_ip", "severity"),
    [
        ("127.0.0.1", "::", Severity.FAIL),  # every interface, IPv6 spelling
        ("127.0.0.1", "", Severity.FAIL),  # Docker's every interface
        ("127.0.0.1", "0.0.0.0", Severity.FAIL),
        ("127.0.0.1", "10.77.0.12", Severity.FAIL),  # another box's network
        ("127.0.0.1", "fe80::1", Severity.FAIL),
        # Another loopback address, but the fixture's mesh side gets answers (401): reached
        # from the mesh while the box alone should reach it.
        ("127.0.0.1", "::1", Severity.FAIL),
        ("10.77.0.12", "::", Severity.FAIL),
        ("10.77.0.12", "10.77.0.13", Severity.WARN),
        ("0.0.0.0", "", None),  # as desired
        ("0.0.0.0", "::", None),  # every interface too (Docker's IPv6 spelling)
    ],
)
def test_a_gateway_published_wider_than_desired_fails(tmp_path, bind, host_ip, severity):
    def publish(doc: Box) -> None:
        gateway = doc["collected"]["docker"]["containers"][0]
        gateway["ports"] = {"8000/tcp": [{"HostIp": host_ip, "HostPort": "8000"}]}

    desired = with_gateway(fleet({}), "spark", bind=bind)
    report, _ = judge(snapshot(tmp_path, "fully_keyed_mesh", on("spark", publish)), desired)
    assert codes(report, "spark").get("publish.gateway") == severity


# -- 3. a mixed member is on the open side of the weakest link ---------------------------------
def mixed(doc: Box) -> None:
    """GET /v1/models refused without a key, POST chat answered: some gated route is open."""
    doc["collected"]["gateway"]["models_noauth"] = {"status": 401, "error_type": "invalid_api_key"}
    doc["controller"]["models_noauth"] = {"status": 401, "error_type": "invalid_api_key"}


def test_a_mixed_member_is_the_weakest_link(tmp_path):
    path = snapshot(tmp_path, "weakest_link_proven_live", on("thor", mixed))
    report, doc = judge(path, fleet(OPEN_THOR))
    assert report.row_of("thor").posture == "mixed"
    assert codes(report, "mesh")["mesh.weakest-link"] == Severity.FAIL
    assert doc["mesh"]["open"] == ["thor"]
    # and phase 2 sends the proof through it
    desired = fleet(OPEN_THOR)
    bases = {b: f"http://{b}:8000" for b in EVERY}
    attempts = proof_attempts(dict(desired.boxes), list(report.rows), bases)
    assert {(a.via, a.host) for a in attempts} >= {("thor", "spark")}


# -- 4. proofs through a box seen from the mesh side only ---------------------------------------
def ssh_failed(doc: Box) -> None:
    doc["collected"] = None
    doc["error"] = "ssh: connect to host thor port 22: Connection timed out"


def test_proofs_through_a_box_seen_from_the_mesh_side_are_kept(tmp_path):
    path = snapshot(tmp_path, "weakest_link_proven_live", on("thor", ssh_failed))
    report, doc = judge(path, fleet(OPEN_THOR))
    assert report.row_of("thor").partial
    assert [p["proven"] for p in doc["mesh"]["proofs"]] == [True, True]
    weakest = next(f for f in report.mesh_verdict.findings if f.code == "mesh.weakest-link")
    assert "; proven: POST" in weakest.message


# -- 5. a subset run ----------------------------------------------------------------------------
def test_a_subset_run_names_the_members_it_did_not_audit(tmp_path):
    path = snapshot(tmp_path, "weakest_link_proven_live", lambda files: None)
    report, doc = judge(path, fleet(OPEN_THOR), ["spark", "orin"])
    assert report.mesh_verdict.verdict != Severity.OK
    assert codes(report, "mesh")["mesh.not-in-run"] == Severity.WARN
    [finding] = [f for f in report.mesh_verdict.findings if f.code == "mesh.not-in-run"]
    assert "thor" in finding.message
    assert "thor" in doc["mesh"]["members"] and doc["mesh"]["not_in_run"] == ["thor"]
    # the whole mesh audited: nothing missing
    full, _ = judge(path, fleet(OPEN_THOR))
    assert "mesh.not-in-run" not in codes(full, "mesh")


# -- 6. a desired loopback bind -----------------------------------------------------------------
def loopback_only(doc: Box) -> None:
    """Published on 127.0.0.1 as desired: the controller's requests find nothing."""
    doc["collected"]["docker"]["containers"][0]["ports"] = {
        "8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8000"}]
    }
    refused = {"status": None, "error": "connection refused"}
    controller = doc["controller"]
    for probe in ("health", "capabilities", "models_noauth"):
        controller[probe] = dict(refused)
    controller["audit"]["chat_noauth"] = dict(refused)
    controller["audit"].pop("mesh_detect", None)


def test_a_desired_loopback_bind_is_not_unreachable_from_the_mesh_side(tmp_path):
    path = snapshot(tmp_path, "fully_keyed_mesh", on("spark", loopback_only))
    report, _ = judge(path, with_gateway(fleet({}), "spark", bind="127.0.0.1"))
    found = codes(report, "spark")
    assert "gateway.mesh-side-unreachable" not in found
    assert "publish.gateway" not in found
    # spark is a desired mesh member: no other member can reach a loopback-bound gateway
    assert found["mesh.member-loopback"] == Severity.WARN
    # a gateway desired on every interface that the controller cannot reach still warns
    report, _ = judge(path, fleet({}))
    assert codes(report, "spark")["gateway.mesh-side-unreachable"] == Severity.WARN


# -- 7. a whitespace-only key is no key ----------------------------------------------------------
def test_the_collector_sends_a_whitespace_only_secret_as_empty():
    run = _collector().Run(
        {"directory": "/nonexistent", "secret_patterns": ["*_KEY"], "run_key": "k" * 64}
    )
    assert run.masked("GATEWAY_API_KEY", " \t ") == ""
    assert run.mask_env_list(["GATEWAY_API_KEY=  ", "CULTURE_VLLM_API_KEY=k1"]) == {
        "GATEWAY_API_KEY": "",
        "CULTURE_VLLM_API_KEY": {"secret": run.digest("k1")},
    }


@pytest.mark.parametrize("blank", ["", "   "])  # "   ": a box whose collector predates the fix
def test_a_blank_gateway_key_falls_back_as_lobes_does(tmp_path, blank):
    def fallback(doc: Box) -> None:
        env = gateway_env(doc)
        env["CULTURE_VLLM_API_KEY"], env["GATEWAY_API_KEY"] = env["GATEWAY_API_KEY"], blank
        keys = doc["collected"]["audit"]["envfile_keys"]
        keys["CULTURE_VLLM_API_KEY"] = {**keys["GATEWAY_API_KEY"], "line": 846}
        keys["GATEWAY_API_KEY"] = {"state": "empty", "line": 1194}

    report, _ = judge(snapshot(tmp_path, "fully_keyed_mesh", on("spark", fallback)), fleet({}))
    row = report.row_of("spark")
    assert row.audited and row.inbound is not None
    assert row.inbound.name == "CULTURE_VLLM_API_KEY"
    assert not {"key.not-desired", "key.stale", "audit.unobserved"} & set(codes(report, "spark"))


# -- 8. a hostile gateway's words in the reports --------------------------------------------------
EVIL = "\x1b]0;PWN\x07\x9b31m\u202eevil\u2028x\r\nX-Inject: 1 hmac:" + "ab" * 32
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\u2028", "\r", "hmac:")


def hostile(files: dict[str, Box]) -> None:
    thor = files["thor"]
    for proof in thor["controller"]["audit"]["weakest_link"]:
        proof["url"] += EVIL
        for header in ("X-Lobes-Mesh-Member", "X-Lobes-Proxied-By"):
            proof["headers"][header] += EVIL
    for doc in files.values():
        gateway_env(doc)["LOBES_MESH_NAME"] += EVIL
        probes = doc["collected"]["audit"]["probes"]
        probes["chat_noauth"]["model"] += EVIL
        doc["controller"]["audit"]["chat_noauth"]["model"] += EVIL
        for keyed in ("models_key", "models_mesh_key"):
            if probes[keyed].get("key_from"):
                probes[keyed]["key_from"] += EVIL


def strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for v in node.values() for s in strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in strings(v)]
    return [node] if isinstance(node, str) else []


def test_a_hostile_gateways_words_are_scrubbed_in_json_and_html(tmp_path):
    path = snapshot(tmp_path, "weakest_link_proven_live", hostile, run_id="r1" + EVIL)
    report, doc = judge(path, fleet(OPEN_THOR))
    for name, text in (("json", "\n".join(strings(doc))), ("html", render_html(report))):
        assert not [c for c in RAW if c in text], name
    assert doc["mesh"]["proofs"][0]["mesh_member"].startswith("spark")  # kept, only cleaned
    assert doc["run_id"].startswith("r1")


def test_findings_are_unchanged_for_a_sound_scenario():
    # the fixes change nothing where nothing was wrong
    index, observations = load_snapshot(FIXTURES / "weakest_link_proven_live")
    report = audit_report(fleet(OPEN_THOR), EVERY, observations, index["run_id"])
    assert {v.subject: v.verdict for v in report.verdicts} == dict.fromkeys(EVERY, Severity.OK)
    assert codes(report, "mesh") == {"mesh.weakest-link": Severity.FAIL}
