"""Every compare rule on captured real data: examples/lab-incidents is what the collector saw on
the lab after the five field incidents (secrets already hashed on the boxes). Pure: no lab, no
network. Where a rule needs a state the capture does not show (a lane that exited, low memory),
the test edits the captured JSON, which is plain data."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.box import compare_box
from reconciler.compare.drift import Action, BoxResult, Drift, Kind, Part, SecretValue
from reconciler.compare.values import changed_keys, knob_tokens, parse_argv, value
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from reconciler.drift_inputs import expectations
from reconciler.observe.document import Observed, parse_collected, transport_fault
from reconciler.observe.observe import load_snapshot

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"


@pytest.fixture(scope="module")
def captured() -> tuple[Any, dict[str, Any]]:
    fleet = load_fleet(EXAMPLE, "lab")
    _, observations = load_snapshot(EXAMPLE / "snapshot")
    return fleet, observations


def compare(captured: tuple[Any, dict[str, Any]], box: str, edit: Any = None) -> BoxResult:
    """Compare one box of the capture, after `edit` changed its raw JSON (read again through
    the observation parser, as a live answer is: every field the collector writes)."""
    fleet, observations = captured
    obs = observations[box]
    raw = copy.deepcopy(obs.collected)
    if edit is not None:
        edit(raw)
    doc = parse_collected(raw, complete=True)
    assert isinstance(doc, Observed), doc
    return compare_box(expectations(fleet, [box])[box], doc, obs.probes)


def find(result: BoxResult, kind: Kind, subject: str, path: str) -> Drift:
    found = [d for d in result.drifts if (d.kind, d.subject, d.path) == (kind, subject, path)]
    assert len(found) == 1, [(d.kind, d.subject, d.path) for d in result.drifts]
    return found[0]


def test_envfile_window_edited_by_hand(captured: Any) -> None:
    d = find(compare(captured, "thor"), Kind.ENVFILE, "file:.env", "WORKER_MAX_MODEL_LEN")
    assert (d.desired, d.observed, d.action) == ("262144", "131072", Action.REWRITE_ENV)
    assert d.source is not None and d.source.startswith(".env:")
    assert d.note == "from lanes.worker.max_model_len"


def test_envfile_secret_is_a_digest_never_a_value(captured: Any) -> None:
    d = find(compare(captured, "thor"), Kind.ENVFILE, "file:.env", "GATEWAY_API_KEY")
    assert isinstance(d.desired, SecretValue) and d.observed is None
    assert d.secret_changed is True


def test_envfile_mode_must_be_owner_only(captured: Any) -> None:
    def world_readable(doc: dict[str, Any]) -> None:
        doc["files"][".env"]["mode"] = "0o644"

    d = find(compare(captured, "spark", world_readable), Kind.ENVFILE, "file:.env", "mode")
    assert (d.desired, d.observed) == ("0600", "0644")


def test_argv_the_lane_runs_another_window_than_the_desired_render(captured: Any) -> None:
    d = find(compare(captured, "thor"), Kind.ARGV, "lane:vllm-worker", "--max-model-len")
    assert (d.desired, d.observed, d.action) == ("262144", "131072", Action.RECREATE)


def test_env_of_the_lane_follows_its_env_file(captured: Any) -> None:
    d = find(compare(captured, "thor"), Kind.ENV, "lane:vllm-worker", "WORKER_MAX_MODEL_LEN")
    assert (d.desired, d.observed) == ("262144", "131072")


def test_shell_leak_names_the_file_and_line_and_the_carrier(captured: Any) -> None:
    d = find(compare(captured, "thor"), Kind.SHELL_LEAK, "shell", "GATEWAY_API_KEY")
    assert d.source is not None and d.source.startswith("~/.bashrc:")
    assert isinstance(d.observed, SecretValue) and d.desired is None
    assert "gateway.environment.GATEWAY_API_KEY" in (d.note or "")
    assert "model-gear-gateway carry the shell's value" in (d.note or "")
    assert d.action is Action.SCRUB_SHELL


def test_contract_gateway_restarted_with_the_hand_edited_window(captured: Any) -> None:
    """thor's gateway was recreated from the login shell after the window edit: it advertises
    the lane's 131072, which is not the contract's 262144."""
    d = find(compare(captured, "thor"), Kind.CONTRACT, "gateway", "capabilities.worker.context")
    assert (d.desired, d.observed, d.action) == (262144, 131072, Action.RECREATE_GATEWAY)


def test_contract_stale_window_after_a_lane_only_recreate(captured: Any) -> None:
    """spark's cortex lane runs a hard-coded 131072; its gateway still advertises 262144."""
    d = find(compare(captured, "spark"), Kind.CONTRACT, "gateway", "capabilities.cortex.context")
    assert (d.desired, d.observed) == (131072, 262144)
    assert "serves 131072 (docker inspect)" in (d.note or "")


def test_contract_a_proxied_role_whose_host_is_unreachable(captured: Any) -> None:
    """orin's gateway was republished on its loopback: thor can no longer proxy senses."""
    d = find(compare(captured, "thor"), Kind.CONTRACT, "gateway", "capabilities.senses.proxied")
    assert d.desired == "via orin"


def test_compose_file_hand_edit_and_the_dead_knob(captured: Any) -> None:
    result = compare(captured, "spark")
    digest = find(result, Kind.COMPOSE_FILE, "file:docker-compose.override.yml", "sha256")
    assert digest.action is Action.RESTORE_FILE
    dead = find(result, Kind.COMPOSE_FILE, "lane:vllm-primary", "--max-model-len")
    assert (dead.desired, dead.observed) == ("262144", "131072")
    assert dead.source == "docker-compose.override.yml"
    assert dead.note == ".env PRIMARY_MAX_MODEL_LEN is dead: the compose files render another value"


def test_image_digest_seen_only_in_docker_inspect(captured: Any) -> None:
    fleet, _ = captured
    d = find(compare(captured, "orin"), Kind.IMAGE, "lane:vllm-embed", "digest")
    assert d.desired == fleet.boxes["orin"].image_ref("vllm_nightly")
    assert d.observed == fleet.boxes["orin"].image_ref("vllm_nightly_alt")
    assert d.action is Action.PULL_RECREATE


def test_port_gateway_published_on_loopback_only(captured: Any) -> None:
    d = find(compare(captured, "orin"), Kind.PORT, "gateway", "8000/tcp")
    assert (d.desired, d.observed) == ("0.0.0.0:8000", "127.0.0.1:8000")


def test_port_a_lane_published_on_the_host(captured: Any) -> None:
    def publish(doc: dict[str, Any]) -> None:
        lane = next(c for c in doc["docker"]["containers"] if c["service"] == "vllm-hand")
        lane["ports"] = {"8000/tcp": [{"HostIp": "", "HostPort": "18000"}]}

    d = find(compare(captured, "spark", publish), Kind.PORT, "lane:vllm-hand", "8000/tcp")
    assert (d.desired, d.observed) == (None, "0.0.0.0:18000")
    assert d.note == "lanes are reached only through the gateway"


def test_auth_open_gateway_where_keyed_is_wanted(captured: Any) -> None:
    d = find(
        compare(captured, "orin"), Kind.AUTH, "gateway", "GET /v1/models without key (loopback)"
    )
    assert (d.desired, d.observed) == (401, 200)


def test_state_missing_exited_and_stray(captured: Any) -> None:
    def break_lanes(doc: dict[str, Any]) -> None:
        containers = doc["docker"]["containers"]
        hand = next(c for c in containers if c["service"] == "vllm-hand")
        hand.update(status="exited", health=None, exit_code=137)
        doc["docker"]["containers"] = [c for c in containers if c["service"] != "vllm-rerank"]
        stray = copy.deepcopy(hand)
        stray.update(name="model-gear-vllm-minor", service="vllm-minor", status="running")
        doc["docker"]["containers"].append(stray)

    result = compare(captured, "spark", break_lanes)
    exited = find(result, Kind.STATE, "lane:vllm-hand", "status")
    assert (exited.observed, exited.action, exited.note) == (
        "exited",
        Action.START,
        "exit code 137",
    )
    missing = find(result, Kind.STATE, "lane:vllm-rerank", "container")
    assert (missing.desired, missing.observed, missing.action) == ("running", None, Action.START)
    stray = find(result, Kind.STATE, "lane:vllm-minor", "container")
    assert stray.action is Action.REMOVE


def test_host_memory_below_what_the_biggest_lane_needs(captured: Any) -> None:
    def low_memory(doc: dict[str, Any]) -> None:
        doc["meminfo"]["MemAvailable_kib"] = 4 * 1024 * 1024
        # The lane must boot (missing): a lane running healthy already holds its share, and
        # only a boot is judged (test_review6_memory_check.py).
        doc["docker"]["containers"] = [
            c for c in doc["docker"]["containers"] if c.get("service") != "vllm-primary"
        ]

    d = find(compare(captured, "spark", low_memory), Kind.HOST, "host", "MemAvailable")
    assert d.action is Action.DROP_CACHES
    assert d.observed == "4.0 GiB"
    assert "vllm-primary needs 0.58 x MemTotal" in (d.note or "")


def test_a_box_that_could_not_be_observed_is_an_error_not_drift() -> None:
    fleet = load_fleet(EXAMPLE, "lab")
    fault = transport_fault("unreachable: refused")
    result = compare_box(expectations(fleet, ["thor"])["thor"], None, fault=fault)
    assert (result.reachable, result.errors, result.drifts) == (
        False,
        ("unreachable: refused",),
        (),
    )
    assert result.errors[0].part is Part.OBSERVATION


def test_docker_down_is_an_error_of_that_box(captured: Any) -> None:
    def no_engine(doc: dict[str, Any]) -> None:
        doc["docker"] = {"error": "Cannot connect to the Docker daemon"}

    result = compare(captured, "orin", no_engine)
    assert "docker: Cannot connect to the Docker daemon" in result.errors
    assert [e.part for e in result.errors] == [Part.DOCKER]
    assert not [d for d in result.drifts if d.kind in (Kind.STATE, Kind.IMAGE)]


def test_docker_down_as_a_live_collector_answers_is_no_missing_container(captured: Any) -> None:
    """A live collector with dockerd down answers an error AND an empty container list: that is
    no container listed, not every lane's container missing (5 false `state` entries on thor)."""

    def no_engine(doc: dict[str, Any]) -> None:
        doc["docker"] = {
            "error": "Cannot connect to the Docker daemon at unix:///var/run/docker.sock",
            "containers": [],
            "images": {},
        }

    result = compare(captured, "thor", no_engine)
    assert [e.part for e in result.errors] == [Part.DOCKER]
    assert not [d for d in result.drifts if d.kind in (Kind.STATE, Kind.IMAGE)]


def test_offline_replay_of_the_example_is_stable_and_exits_2() -> None:
    fleet = load_fleet(EXAMPLE, "lab")
    first = run_drift(fleet, list(fleet.boxes), from_snapshot=EXAMPLE / "snapshot").report
    second = run_drift(fleet, list(fleet.boxes), from_snapshot=EXAMPLE / "snapshot").report
    assert first.exit_code == 2
    assert first.drifts == second.drifts
    for box in first.boxes:
        assert list(box.drifts) == sorted(box.drifts, key=Drift.sort_key)


def test_captured_data_holds_no_clear_secret() -> None:
    """Every value of a secret-named variable in the snapshot is a keyed digest or empty."""
    for path in (EXAMPLE / "snapshot").glob("*.json"):
        if path.name == "index.json":
            continue
        doc = json.loads(path.read_text())["collected"]
        if doc is None:
            continue
        for e in doc["envfile"]:
            if e["key"] in ("GATEWAY_API_KEY", "LOBES_MESH_KEY", "HF_TOKEN"):
                assert e["value"] == "" or set(e["value"]) == {"secret"}, (path.name, e["key"])
        for c in doc["docker"]["containers"]:
            for key in ("GATEWAY_API_KEY", "LOBES_MESH_KEY", "HF_TOKEN"):
                v = c["env"].get(key)
                assert v in (None, "") or set(v) == {"secret"}, (path.name, c["name"], key)


@pytest.mark.parametrize(
    ("argv", "positionals", "flags"),
    [
        (["vllm", "serve", "m", "--a=1", "--b", "2", "--c"], ["vllm", "serve", "m"],
         {"--a": ["1"], "--b": ["2"], "--c": [True]}),
        (["--x=1", "--x=2"], [], {"--x": ["1", "2"]}),
        (["--api-key", SecretValue("hmac:ab")], [], {"--api-key": [SecretValue("hmac:ab")]}),
        (['--api-key={"secret": "hmac:ab"}'], [], {"--api-key": [SecretValue("hmac:ab")]}),
        ([], [], {}),
    ],
)  # fmt: skip
def test_parse_argv(argv: list[Any], positionals: list[Any], flags: dict[str, Any]) -> None:
    assert parse_argv(argv) == (positionals, flags)


@pytest.mark.parametrize(
    ("flag", "knob", "tokens"),
    [
        ("--max-model-len", "262144", ["--max-model-len=262144"]),
        ("--speculative-config", "'--speculative-config={\"method\": \"mtp\"}'",
         ['--speculative-config={"method": "mtp"}']),
    ],
)  # fmt: skip
def test_knob_tokens(flag: str, knob: str, tokens: list[str]) -> None:
    assert knob_tokens(flag, knob) == tokens


def test_changed_keys_of_an_environment() -> None:
    want = {"A": "1", "B": "2", "SAME": "x", "EMPTY": ""}
    got = {"A": "1", "B": "3", "SAME": "x", "NEW": "n"}
    assert changed_keys(want, got) == {"B": ("2", "3"), "EMPTY": ("", None), "NEW": (None, "n")}
    assert list(changed_keys(want, got)) == ["B", "EMPTY", "NEW"]  # stable order for the report
    assert changed_keys(want, dict(want)) == {}


def test_collector_digests_become_secret_values() -> None:
    digest = "hmac:" + "0" * 64
    doc = parse_collected(
        {"envfile": [{"key": "GATEWAY_API_KEY", "value": {"secret": digest}, "line": 1}]},
        complete=False,
        version=1,
    )
    assert isinstance(doc, Observed)
    assert doc.envfile_by_key()["GATEWAY_API_KEY"].value == SecretValue(digest)
    assert value(["a", SecretValue(digest)]) == ("a", SecretValue(digest))
    assert str(SecretValue(digest)) == "***"
