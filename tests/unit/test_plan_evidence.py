"""What a converge tells people and leaves behind: plan lines, outcome lines, the evidence JSON
and the box payload. Names and digests only: a secret value never appears in any of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.apply.engine import Outcome
from reconciler.apply.evidence import write
from reconciler.apply.payload import MissingControllerSecret, converge_payload, managed_env
from reconciler.apply.summary import outcome_lines, plan_lines
from reconciler.compare.drift import Action, BoxResult, Drift, DriftReport, Kind, SecretValue
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import expectations
from reconciler.plan import plan_box

ROOT = Path(__file__).resolve().parents[2]
SECRET = SecretValue("hmac:" + "ab" * 32)
OTHER = SecretValue("hmac:" + "cd" * 32)  # as the collector masks a secret-named value


@pytest.fixture(scope="module")
def fleet():
    return load_fleet(ROOT, "hosts")


@pytest.fixture(scope="module")
def exp(fleet):
    return expectations(fleet, ["thor"])["thor"]


def _result() -> BoxResult:
    return BoxResult(
        "thor",
        True,
        (
            Drift("thor", Kind.ENVFILE, "file:.env", "GATEWAY_API_KEY", SECRET, OTHER,
                  Action.REWRITE_ENV),
            Drift("thor", Kind.SHELL_LEAK, "shell", "GATEWAY_API_KEY", None, SECRET,
                  Action.SCRUB_SHELL, source="~/.bashrc:6"),
            Drift("thor", Kind.AUTH, "gateway", "auth", 401, 200, Action.RECREATE_GATEWAY),
        ),
    )  # fmt: skip


def test_plan_lines_name_steps_and_what_is_left_to_a_person(exp):
    lines = plan_lines(plan_box(_result(), exp))
    assert lines == [
        "1. write .env (1 keys: GATEWAY_API_KEY)",
        "2. recreate gateway",
        "not converged (report-only:shell): shell GATEWAY_API_KEY (~/.bashrc:6)",
    ]


def test_the_evidence_record_hashes_secrets_and_keeps_the_actions(exp, tmp_path):
    plan = plan_box(_result(), exp)
    report = DriftReport((_result(),), "inventory/hosts.yaml", "2026-11-29T09:00:00Z", "run-1")
    out = Outcome("thor", ok=True, changed=True, plan=plan, started_at="2026-11-29T09:00:00Z")
    out.snapshot = "20261129T090000Z"
    out.events = [
        {"event": "step", "step": "write-env", "status": "done", "keys": ["GATEWAY_API_KEY"]},
        {"event": "wait", "service": "gateway", "elapsed": 1.0, "timeout": 120, "state": "x"},
    ]
    out.drift_before = report
    out.drift_after = DriftReport((BoxResult("thor", True),), "inventory/hosts.yaml", "t", "run-2")
    path = write(tmp_path, out, "inventory/hosts.yaml", "root@ctl pid 1 (test)")
    text = path.read_text()
    record = json.loads(text)
    assert record["outcome"] == "converged"
    assert [s["step"] for s in record["plan"]] == ["write-env", "recreate-gateway"]
    assert [a["event"] for a in record["actions"]] == ["step"]  # waits are progress, not actions
    assert record["drift_after"]["summary"]["drifts"] == 0
    assert "ab" * 32 not in text and "cd" * 32 not in text
    before = record["drift_before"]["boxes"][0]["drifts"]
    assert any(d["secret"] for d in before)


def test_outcome_lines_say_what_was_rolled_back(exp):
    out = Outcome("thor", ok=False, changed=True, plan=plan_box(_result(), exp), started_at="t")
    out.failed = "vllm-hand not healthy after 20s (running/starting)"
    out.rollback = {
        "ok": True,
        "snapshot": "20261130T101010Z",
        "files": [".env"],
        "config_equal": True,
    }
    assert outcome_lines(out) == [
        "FAILED: vllm-hand not healthy after 20s (running/starting)",
        "rolled back to snapshot 20261130T101010Z: .env; containers as before",
    ]


def test_the_payload_carries_secret_references_not_values(exp, fleet):
    spec = fleet.boxes["thor"]
    payload = converge_payload(exp, spec, plan_box(_result(), exp), None, "me", environ={})
    assert payload["managed_env"]["GATEWAY_API_KEY"] == {"secret": "gateway_api_key"}
    assert payload["box_secrets"]["gateway_api_key"]["key"] == "GATEWAY_API_KEY"
    assert payload["services"] == ["gateway"]
    assert set(payload["env_keys"]) == {e.key for e in exp.env}


def test_a_controller_env_secret_must_be_set_and_travels_in_the_payload(exp, fleet):
    from reconciler.desired.models import ControllerEnvSecret

    spec = fleet.boxes["thor"]
    box = spec.model_copy(
        update={"secrets": {**spec.secrets, "mesh_key": ControllerEnvSecret(
            source="controller_env", variable="FLEET_MESH_KEY")}}
    )  # fmt: skip
    with pytest.raises(MissingControllerSecret, match=r"\$FLEET_MESH_KEY"):
        managed_env(exp, box, {})
    env = managed_env(exp, box, {"FLEET_MESH_KEY": "from-the-controller"})
    assert env["LOBES_MESH_KEY"] == {"secret": "mesh_key", "value": "from-the-controller"}
