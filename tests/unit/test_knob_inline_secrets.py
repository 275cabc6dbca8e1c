"""A lane knob whose desired value carries a secret inline (`WORKER_SPECULATIVE_CONFIG=
'--speculative-config={...}' --api-key sk-x`, `--hf-token=x`, a `Bearer x` inside a JSON
value): the render's command holds it hashed with the run's key, so the dead-knob check
(compare/composefiles.py) compares the render with the box's mask of the knob's words
(`knobs_desired`), and no drift ever shows the desired secret in clear.

The box is the lab's thor as captured (tests/fixtures/import/lab_desired): its worker's render
is the captured one with the knobs' words in place, as compose lexes them; the collector runs
with compose answering that render and docker, the gateway and the login shell stubbed.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.composefiles import compare_compose_files
from reconciler.compare.context import BoxExpectation, expectation
from reconciler.compare.drift import Drift, SecretValue
from reconciler.desired.entries import EnvEntry
from reconciler.desired.envfile import fleet_env
from reconciler.desired.facts import snapshot_facts
from reconciler.desired.load import load_fleet
from reconciler.observe.document import Observed
from reconciler.observe.document_c import read_snapshot_file
from reconciler.observe.observe import BoxObservation, load_snapshot, save_snapshot
from reconciler.observe.payload import collector_payload
from tests.unit.test_envfile_inline_secrets import (
    CAPTURED,
    LAB_DESIRED,
    MASKED,
    REPO,
    collector,
    reports,
    typed,
)

SPEC = (
    '--speculative-config={"method": "dflash", "num_speculative_tokens": 12, '
    '"model": "z-lab/Qwen3.6-35B-A3B-DFlash"}'
)
# Each knob's value as the desired state writes it, the secret it carries.
KNOBS = {
    "WORKER_SPECULATIVE_CONFIG": (f"'{SPEC}' --api-key sk-live-123", "sk-live-123"),
    "WORKER_QUANTIZATION": ("--quantization=modelopt --hf-token=hf_abcdef", "hf_abcdef"),
    "WORKER_HF_OVERRIDES": ('{"headers": {"Authorization": "Bearer xyz-7f3q"}}', "xyz-7f3q"),
}
DESIRED = {key: value for key, (value, _) in KNOBS.items()}
OTHER = {  # the same knobs with other secrets, the rest of each value as it was
    "WORKER_SPECULATIVE_CONFIG": f"'{SPEC}' --api-key sk-old-999",
    "WORKER_QUANTIZATION": "--quantization=modelopt --hf-token=hf_zzzzzz",
    "WORKER_HF_OVERRIDES": '{"headers": {"Authorization": "Bearer old-bearer-1"}}',
}
SECRETS = [secret for _, secret in KNOBS.values()] + ["sk-old-999", "hf_zzzzzz", "old-bearer-1"]
HASHED = '{"secret": "hmac:'
NO_MASK = "has no digest of the desired value's to compare it with"


def assert_no_clear_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, secret


def worker_command(knobs: dict[str, str]) -> list[str]:
    """The captured worker's command with `knobs` in place, as compose lexes the folded
    command after substitution (lobes' template: `--hf-overrides=${X}`, the others bare)."""
    words = []
    for word in CAPTURED["render"]["services"]["vllm-worker"]["command"]:
        if word.startswith("--speculative-config="):
            words += shlex.split(knobs["WORKER_SPECULATIVE_CONFIG"])
        elif word.startswith("--quantization="):
            words += shlex.split(knobs["WORKER_QUANTIZATION"])
        else:
            words.append(word)
    return [*words, "--hf-overrides=" + knobs["WORKER_HF_OVERRIDES"]]


def compose_config(knobs: dict[str, str]) -> str:
    """What `docker compose config --format json` prints (secrets in clear, on the box)."""
    services = {}
    for name, svc in CAPTURED["render"]["services"].items():
        env = {k: v for k, v in svc["environment"].items() if isinstance(v, str)}
        services[name] = dict(svc, environment=env)
    services["vllm-worker"]["command"] = worker_command(knobs)
    return json.dumps({"services": services})


def desired_env(knobs: dict[str, str]) -> list[EnvEntry]:
    fleet = load_fleet(REPO, "lab", facts=snapshot_facts(LAB_DESIRED))
    env = [e for e in fleet_env(fleet, ["thor"])["thor"] if e.key not in knobs]
    return env + [EnvEntry(k, v, "group_vars/thor.yaml:30") for k, v in knobs.items()]


def thor(knobs: dict[str, str]) -> tuple[BoxExpectation, dict[str, Any]]:
    """The lab's thor desiring `knobs` besides its own: its expectation and its payload."""
    fleet = load_fleet(REPO, "lab", facts=snapshot_facts(LAB_DESIRED))
    env = desired_env(knobs)
    box = fleet.boxes["thor"]
    return expectation(box, env, {}), collector_payload(box, env, "k" * 32)


def observe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rendered: dict[str, str], payload: Any
) -> dict[str, Any]:
    """collect() for `payload` on a box whose compose renders the knobs `rendered`; the answer
    as JSON carries it."""
    deploy = tmp_path / "deploy"
    deploy.mkdir(exist_ok=True)
    (deploy / ".env").write_text("", encoding="utf-8")
    (deploy / "docker-compose.yml").write_text("services: {}\n", encoding="utf-8")
    config = compose_config(rendered)
    monkeypatch.setattr(collector, "compose_cached", lambda *a: (0, config, ""))
    monkeypatch.setattr(collector, "variables", lambda *a: {"names": []})
    monkeypatch.setattr(collector, "containers", lambda run: {"containers": []})
    monkeypatch.setattr(collector, "gateway_probes", lambda run: {})
    monkeypatch.setattr(collector, "login_shell", lambda run: ({"exports": {}}, {}))
    payload = dict(payload, directory=str(deploy))
    return json.loads(collector.without_known_secrets(collector.collect(payload)))


def dead_knobs(exp: BoxExpectation, doc: Observed) -> dict[str, Drift]:
    return {
        d.path: d
        for d in compare_compose_files(exp, doc)
        if d.subject == "lane:vllm-worker" and d.note and "is dead" in d.note
    }


# -- on the box ------------------------------------------------------------------------------------
def test_the_box_masks_the_knobs_words_as_it_masks_the_render(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, payload = thor(DESIRED)
    assert sorted(payload["knob_argv"]) == sorted(KNOBS)  # only the knobs carrying one
    raw = observe(tmp_path, monkeypatch, DESIRED, payload)
    assert_no_clear_secret(json.dumps(raw))
    masks = raw["knobs_desired"]
    assert sorted(masks) == sorted(KNOBS)
    command = raw["render"]["services"]["vllm-worker"]["command"]
    for words in masks.values():
        at = command.index(words[0])
        assert command[at : at + len(words)] == words  # the render's own words, masked alike
    assert masks["WORKER_SPECULATIVE_CONFIG"][:2] == [SPEC, "--api-key"]  # no secret: as is


def test_a_fleet_whose_knobs_carry_no_secret_sends_and_answers_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp, payload = thor({})
    assert "knob_argv" not in payload and exp.lanes["vllm-worker"].knobs  # knobs, no secret
    raw = observe(tmp_path, monkeypatch, {**DESIRED, **_captured_knobs()}, payload)
    assert "knobs_desired" not in raw


def _captured_knobs() -> dict[str, str]:
    """thor's worker knobs as its group_vars set them (no secret)."""
    exp, _ = thor({})
    return {key: knob for key, (_, knob) in exp.lanes["vllm-worker"].knobs.items()} | {
        "WORKER_HF_OVERRIDES": "{}"
    }


# -- compared on the controller --------------------------------------------------------------------
def test_a_knob_the_render_carries_as_desired_is_no_drift(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp, payload = thor(DESIRED)
    raw = observe(tmp_path, monkeypatch, DESIRED, payload)
    assert dead_knobs(exp, typed(raw)) == {}


def test_a_changed_knob_secret_is_drift_shown_as_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp, payload = thor(DESIRED)
    raw = observe(tmp_path, monkeypatch, OTHER, payload)
    drifts = dead_knobs(exp, typed(raw))
    assert sorted(drifts) == ["--api-key", "--hf-overrides", "--hf-token"]
    for drift in drifts.values():
        assert isinstance(drift.desired, SecretValue) and isinstance(drift.observed, SecretValue)
        assert drift.secret_changed is True
        assert NO_MASK not in (drift.note or "")  # compared: the mask was at hand
    texts = reports(list(drifts.values()))
    for fmt, text in texts.items():
        assert_no_clear_secret(text)
        assert MASKED[fmt] in text, fmt
    assert "*** (changed)" in texts["text"]


def test_a_change_beside_the_secret_shows_what_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp, payload = thor(DESIRED)
    rendered = dict(DESIRED, WORKER_SPECULATIVE_CONFIG=f"'{SPEC.replace('12', '8')}' --api-key x")
    raw = observe(tmp_path, monkeypatch, rendered, payload)
    drifts = dead_knobs(exp, typed(raw))
    assert sorted(drifts) == ["--api-key", "--speculative-config"]
    assert drifts["--speculative-config"].desired == SPEC.partition("=")[2]  # no secret in it
    assert_no_clear_secret("".join(reports(list(drifts.values())).values()))


def test_a_saved_snapshot_replays_as_the_live_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp, payload = thor(DESIRED)
    raw = observe(tmp_path, monkeypatch, OTHER, payload)
    live = dead_knobs(exp, typed(raw))
    snapshot = tmp_path / "snapshot"
    save_snapshot(snapshot, {"thor": BoxObservation("thor", raw, None, complete=False)}, {})
    data = (snapshot / "thor.json").read_bytes()
    assert_no_clear_secret(data.decode("utf-8"))
    doc = load_snapshot(snapshot)[1]["thor"].document
    assert doc is not None and doc.knobs_desired and dead_knobs(exp, doc) == live
    fast = read_snapshot_file(data)  # a large replay's reader reads the new field alike
    assert fast is not None and fast.document.knobs_desired == doc.knobs_desired
    assert dead_knobs(exp, fast.document) == live


@pytest.mark.parametrize("how", ["older snapshot", "edited since"])
def test_an_uncomparable_knob_never_shows_its_desired_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A snapshot saved by a collector that sent no masks, or one replayed against a knob
    edited since (its mask no longer fits): the render's secret cannot be compared."""
    exp, payload = thor(DESIRED)
    raw = observe(tmp_path, monkeypatch, DESIRED, payload)
    if how == "older snapshot":
        del raw["knobs_desired"]
    else:
        edited = {  # the same secrets, written otherwise since the save
            **DESIRED,
            "WORKER_SPECULATIVE_CONFIG": f"'{SPEC}' --api-key=sk-live-123",
            "WORKER_HF_OVERRIDES": '{"headers": {"Authorization": "Bearer xyz-7f3q"}, "a": 1}',
        }
        exp, _ = thor(edited)
    drifts = dead_knobs(exp, typed(raw))
    assert "--api-key" in drifts and "--hf-overrides" in drifts
    for drift in drifts.values():
        assert isinstance(drift.desired, SecretValue), drift
        assert NO_MASK in (drift.note or ""), drift
    for fmt, text in reports(list(drifts.values())).items():
        assert_no_clear_secret(text)
        assert MASKED[fmt] in text, fmt
    assert_no_clear_secret(repr(drifts))
