"""controller_env secrets are checked like box_file ones (issue 11 §1).

The controller reads each value from its environment when the collectors start and sends it on
stdin; the box hashes it with the run's key exactly as it hashes a value read from its own
file. So the comparisons are tested on real captures (examples/lab-incidents, the audit
fixtures) where a box_file source is relabelled as the controller source the collector now
reports for the same value, and the collector's half is tested on the box program itself.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest

from reconciler.audit.report_json import render_json
from reconciler.audit.run import audit_report
from reconciler.compare.drift import SecretValue
from reconciler.desired.fleet import Fleet
from reconciler.desired.load import load_fleet
from reconciler.desired.models import ControllerEnvSecret
from reconciler.drift import run_drift_on
from reconciler.drift_inputs import drift_inputs, remembered_inputs
from reconciler.observe import collectors
from reconciler.observe.controller_secrets import MissingControllerSecret, controller_values
from reconciler.observe.observe import load_snapshot
from reconciler.records import replace
from reconciler.scrub import scrub_text
from tests.unit.conftest import load_box_program
from tests.unit.test_audit_snapshots import FIXTURES, fleet

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "lab-incidents"
CANARY = "canary-controller-value-7f3a9c21d4"


def _collector() -> Any:
    return load_box_program("fleet_collector_ctl", "reconciler/observe/remote/collector.py")


@pytest.fixture
def controller_root(tmp_path: Path) -> Path:
    """The lab-incidents example whose gateway key (and mesh key) come from the controller."""
    root = tmp_path / "fleet"
    shutil.copytree(EXAMPLE, root)
    layer = root / "group_vars" / "all.yaml"
    text = layer.read_text(encoding="utf-8")
    for name, key in (("gateway_api_key", "GATEWAY_API_KEY"), ("mesh_key", "LOBES_MESH_KEY")):
        start = text.index(f"  {name}:")
        end = text.index(f"key: {key}\n", start) + len(f"key: {key}\n")
        text = (
            text[:start]
            + (f"  {name}:\n    source: controller_env\n    variable: FLEET_TEST_{key}\n")
            + text[end:]
        )
    layer.write_text(text, encoding="utf-8")
    return root


def relabel(snapshot: Path, box: str, names: dict[str, str], status: str = "ok") -> None:
    """What the collector now answers for a controller secret holding the same value as the
    captured box file: the same keyed digest, its source named by the variable."""
    path = snapshot / f"{box}.json"
    raw = json.loads(path.read_text())
    sources = raw["collected"]["secret_sources"]
    for name, variable in names.items():
        entry = {"status": status, "path": f"${variable} on the controller"}
        if status == "ok":
            entry["digest"] = sources[name]["digest"]
        sources[name] = entry
    path.write_text(json.dumps(raw))


# -- the payload and the controller's side -----------------------------------------------------
def test_the_payload_names_the_secrets_and_variables_and_never_holds_a_value(
    controller_root: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLEET_TEST_GATEWAY_API_KEY", CANARY)
    monkeypatch.setenv("FLEET_TEST_LOBES_MESH_KEY", CANARY + "-mesh")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fleet_ = load_fleet(controller_root, "lab")
    inputs = remembered_inputs(fleet_, controller_root / "inventory" / "lab.yaml")
    assert inputs.payloads["thor"]["controller_secrets"] == {
        "gateway_api_key": "FLEET_TEST_GATEWAY_API_KEY",
        "mesh_key": "FLEET_TEST_LOBES_MESH_KEY",
    }
    assert CANARY.encode() not in pickle.dumps(inputs)
    cached = [p.read_bytes() for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert cached and not any(CANARY.encode() in data for data in cached)


def test_a_missing_variable_is_one_error_naming_it_and_the_secret_and_nothing_starts(
    controller_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = drift_inputs(load_fleet(controller_root, "lab"))
    payloads = {box: inputs.payload(box, "k" * 32) for box in inputs.boxes}
    started: list[str] = []
    monkeypatch.setattr(collectors, "spawn", lambda target, *_a: started.append(target.box))
    environ = {"FLEET_TEST_GATEWAY_API_KEY": CANARY, "FLEET_TEST_LOBES_MESH_KEY": "  "}
    with pytest.raises(MissingControllerSecret) as raised:
        collectors.start_collectors(inputs.targets, payloads, environ)
    assert started == []
    lines = str(raised.value).splitlines()
    assert lines == [
        "secret mesh_key: $FLEET_TEST_LOBES_MESH_KEY is not set on this controller "
        "(needed to check thor, spark, orin); no box was contacted"
    ]
    assert isinstance(raised.value, ValueError)  # the commands' "bad input" handling


def test_values_go_on_stdin_only_and_are_masked_in_later_text(
    controller_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = drift_inputs(load_fleet(controller_root, "lab"))
    payloads = {"thor": inputs.payload("thor", "k" * 32)}
    sent: dict[str, tuple[str, bytes | None]] = {}
    monkeypatch.setattr(
        collectors,
        "spawn",
        lambda target, cmd, stdin=None: sent.setdefault(target.box, (cmd, stdin)),
    )
    environ = {"FLEET_TEST_GATEWAY_API_KEY": CANARY, "FLEET_TEST_LOBES_MESH_KEY": CANARY + "-m"}
    collectors.start_collectors(inputs.targets, payloads, environ)
    command, stdin = sent["thor"]
    assert stdin is not None and json.loads(stdin) == {
        "payload": payloads["thor"],
        "sent": {"gateway_api_key": CANARY, "mesh_key": CANARY + "-m"},
    }
    assert command.endswith(" -")  # the payload (its run key too) is on stdin, not here
    assert CANARY not in command and "k" * 32 not in command
    assert CANARY not in scrub_text(f"ssh said: {CANARY} was refused")


def test_a_box_without_controller_secrets_gets_its_payload_alone_on_stdin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs = drift_inputs(load_fleet(EXAMPLE, "lab"))
    sent: dict[str, bytes | None] = {}
    monkeypatch.setattr(
        collectors, "spawn", lambda target, cmd, stdin=None: sent.setdefault(target.box, stdin)
    )
    collectors.start_collectors(inputs.targets, {"thor": inputs.payload("thor", "k" * 32)}, {})
    assert json.loads(sent["thor"] or b"") == {
        "payload": inputs.payload("thor", "k" * 32),
        "sent": {},
    }
    assert controller_values({"thor": inputs.payloads["thor"]}, {}) == {}


# -- the box's side ---------------------------------------------------------------------------
def test_the_box_hashes_a_sent_value_as_it_hashes_its_own_file(tmp_path: Path) -> None:
    module = _collector()
    home = tmp_path / "home"
    (home / ".lobes").mkdir(parents=True)
    (home / ".lobes" / ".secrets.env").write_text(f"GATEWAY_API_KEY={CANARY}\n")
    payload = {
        "run_key": "r" * 32,
        "directory": str(home / ".lobes"),
        "box_secrets": {
            "file_key": {"path": str(home / ".lobes/.secrets.env"), "key": "GATEWAY_API_KEY"}
        },
        "controller_secrets": {"sent_key": "FLEET_KEY", "lost_key": "FLEET_LOST"},
    }
    shown, values = module.secret_sources(module.Run(payload), {"sent_key": CANARY})
    assert shown["sent_key"] == {
        "status": "ok",
        "path": "$FLEET_KEY on the controller",
        "digest": shown["file_key"]["digest"],
        "source": {"variable": "FLEET_KEY"},
    }
    assert shown["lost_key"] == {
        "status": "not-sent",
        "path": "$FLEET_LOST on the controller",
        "source": {"variable": "FLEET_LOST"},
    }
    assert values["sent_key"] == CANARY  # rendered into the desired .env, used by the probe
    assert CANARY not in module.without_known_secrets({"shown": shown, "echo": f"x {CANARY}"})


def test_the_box_reads_stdin_only_when_the_payload_names_controller_secrets() -> None:
    module = _collector()
    named = {"controller_secrets": {"k": "V"}}
    for payload, taken in ((named, {"k": CANARY}), ({}, {})):  # unnamed: never taken
        read, write = os.pipe()
        os.write(write, json.dumps({"payload": payload, "sent": {"k": CANARY, "bad": 3}}).encode())
        os.close(write)
        with os.fdopen(read, "rb") as stream:
            assert module.read_input(stream) == (payload, taken)
    read, write = os.pipe()
    os.write(write, json.dumps({"payload": named}).encode())
    os.close(write)
    with os.fdopen(read, "rb") as stream:  # nothing sent beside the payload
        assert module.read_input(stream) == (named, {})


# -- drift: the comparisons ----------------------------------------------------------------------
def test_a_env_that_lost_a_controller_key_is_an_envfile_entry(controller_root: Path) -> None:
    snapshot = controller_root / "snapshot"
    names = {
        "gateway_api_key": "FLEET_TEST_GATEWAY_API_KEY",
        "mesh_key": "FLEET_TEST_LOBES_MESH_KEY",
    }
    relabel(snapshot, "thor", names)
    want = json.loads((snapshot / "thor.json").read_text())["collected"]["secret_sources"]
    inputs = drift_inputs(load_fleet(controller_root, "lab"))
    result = run_drift_on(inputs, ["thor"], from_snapshot=snapshot).report.boxes[0]
    assert not result.errors, result.errors
    lost = [d for d in result.drifts if (d.kind.value, d.path) == ("envfile", "GATEWAY_API_KEY")]
    assert len(lost) == 1 and lost[0].observed is None and lost[0].source == "absent"
    assert lost[0].desired == SecretValue(want["gateway_api_key"]["digest"])


def test_a_controller_secret_the_box_was_not_sent_is_an_error_of_the_box(
    controller_root: Path,
) -> None:
    snapshot = controller_root / "snapshot"
    relabel(snapshot, "thor", {"gateway_api_key": "FLEET_TEST_GATEWAY_API_KEY"}, "not-sent")
    inputs = drift_inputs(load_fleet(controller_root, "lab"))
    result = run_drift_on(inputs, ["thor"], from_snapshot=snapshot).report.boxes[0]
    assert [str(e) for e in result.errors if "gateway_api_key" in e] == [
        "secret gateway_api_key: not-sent ($FLEET_TEST_GATEWAY_API_KEY on the controller)"
    ]


# -- audit -----------------------------------------------------------------------------------------
def controller_fleet(variables: dict[str, str]) -> Fleet:
    """The repository's fully keyed desired state, each box's gateway key from `variables`."""
    base = fleet({})
    boxes = {}
    for name, spec in base.boxes.items():
        secret = ControllerEnvSecret(source="controller_env", variable=variables[name])
        mesh = ControllerEnvSecret(source="controller_env", variable="FLEET_MESH_KEY")
        secrets = {**spec.secrets, "gateway_api_key": secret, "mesh_key": mesh}
        boxes[name] = spec.model_copy(update={"secrets": secrets})
    return replace(base, boxes=boxes)


def audited(tmp_path: Path, variables: dict[str, str], status: str = "ok") -> Any:
    snapshot = tmp_path / "snapshot"
    shutil.copytree(FIXTURES / "fully_keyed_mesh", snapshot)
    for box, variable in variables.items():
        relabel(snapshot, box, {"gateway_api_key": variable, "mesh_key": "FLEET_MESH_KEY"}, status)
    index, observations = load_snapshot(snapshot)
    return audit_report(controller_fleet(variables), list(variables), observations, index["run_id"])


def codes(report: Any, box: str) -> set[str]:
    return {f.code for f in report.verdict_of(box).findings}


def test_a_keyed_mesh_with_one_variable_per_box_audits_ok_with_proven_keys(tmp_path: Path) -> None:
    variables = {b: f"FLEET_{b.upper()}_KEY" for b in ("thor", "spark", "orin")}
    report = audited(tmp_path, variables)
    for row in report.rows:
        assert report.verdict_of(row.box).verdict.value == "ok", codes(report, row.box)
        assert row.intent.api_key_status == row.intent.mesh_key_status == "ok"
        assert row.intent.api_key_where == f"${variables[row.box]} on the controller"
        assert row.keyed is not None and row.keyed.status == 200
        assert row.keyed.key_from == "secret:gateway_api_key"
        assert not row.intent.api_key_shared  # a variable per box: one key per box
    intents = {b["box"]: b["intent"]["api_key"] for b in json.loads(render_json(report))["boxes"]}
    assert all(i["one_per_box"] and i["status"] == "ok" for i in intents.values()), intents


def test_one_variable_for_every_box_must_be_one_key_everywhere(tmp_path: Path) -> None:
    # The lab's three boxes carry three keys: named by one shared variable, that is a finding.
    report = audited(tmp_path, dict.fromkeys(("thor", "spark", "orin"), "FLEET_SHARED_KEY"))
    for box in ("thor", "spark", "orin"):
        assert "key.not-shared" in codes(report, box)
        assert "key.reused" not in codes(report, box)
        assert report.row_of(box).intent.api_key_shared


def test_a_controller_secret_not_sent_leaves_the_right_key_unknown(tmp_path: Path) -> None:
    variables = {b: f"FLEET_{b.upper()}_KEY" for b in ("thor", "spark", "orin")}
    report = audited(tmp_path, variables, status="not-sent")
    assert "secret.unreadable" in codes(report, "thor")
    assert report.row_of("thor").intent.api_key_status == "not-sent"


def test_the_cli_says_it_once_and_exits_1_on_a_fresh_and_on_a_remembered_run(
    controller_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from reconciler.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("FLEET_TEST_GATEWAY_API_KEY", CANARY)
    monkeypatch.delenv("FLEET_TEST_LOBES_MESH_KEY", raising=False)
    monkeypatch.setattr(collectors, "spawn", lambda *_a, **_k: pytest.fail("a box was contacted"))
    for command in ("drift", "drift", "audit"):  # the second drift starts from the cache
        assert main(["--root", str(controller_root), "-i", "lab", command, "thor"]) == 1
        out, err = capsys.readouterr()
        assert out == "" and CANARY not in err
        assert err.splitlines() == [
            "error: secret mesh_key: $FLEET_TEST_LOBES_MESH_KEY is not set on this controller "
            "(needed to check thor); no box was contacted"
        ]
