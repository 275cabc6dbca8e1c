"""`reconcile import` of a lane whose knob carries a secret inline: never adopted.

The box is thor as the lab captured it (tests/fixtures/import/lab_desired), its worker's
WORKER_SPECULATIVE_CONFIG given a secret: in its `.env` line, in every lane's environment
(lanes read `.env` through env_file), in the worker's command line and in compose's renders.
The box-side masking is the collector's own, run here with a run key; "clear" is a snapshot
saved before the box hashed such secrets.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare import render_basis
from reconciler.desired.load import load_fleet
from reconciler.observe.document import parse_collected
from tests.unit.conftest import import_snapshot, load_box_program
from tests.unit.test_import import drift_of

REPO = Path(__file__).resolve().parents[2]
LAB_DESIRED = REPO / "tests/fixtures/import/lab_desired"
collector = load_box_program("box_collector_knob_import", "reconciler/observe/remote/collector.py")

KNOB = "WORKER_SPECULATIVE_CONFIG"
PATH = f"lanes.worker.env.{KNOB}"
CAPTURED = json.loads((LAB_DESIRED / "thor.json").read_text(encoding="utf-8"))["collected"]
# The worker's word as the lab runs it (its `.env` value is this word in single quotes).
WORD = next(
    w
    for c in CAPTURED["docker"]["containers"]
    if c["service"] == "vllm-worker"
    for w in c["cmd"]
    if w.startswith("--speculative-config=")
)
BEARER = "hf_live_Q7pLm2xVb9"
API_KEY = "sk-live-4f8a0c2e"
CARRIERS = {  # the knob's value (as `.env` holds it) with a secret inside, and that secret
    "bearer": (
        "'" + WORD[:-1] + f', "headers": {{"Authorization": "Bearer {BEARER}"}}}}' + "'",
        BEARER,
    ),
    "api-key": (f"'{WORD} --api-key {API_KEY}'", API_KEY),
}


def _with_knob(target: Path, value: str, hashed: bool, env_line: bool = True) -> Path:
    """lab_desired copied to `target`, thor's worker knob set to `value` everywhere the box
    shows it (hashed with the collector's masking when `hashed`); `env_line`: whether `.env`
    holds it too, else only the running lanes carry it (a line removed after their start)."""
    shutil.copytree(LAB_DESIRED, target)
    saved = json.loads((target / "thor.json").read_text(encoding="utf-8"))
    collected: dict[str, Any] = saved["collected"]
    run = collector.Run({"run_key": "k" * 64, "secret_patterns": [], "directory": str(target)})
    words = shlex.split(value)

    def env_value(text: str) -> Any:
        return run.masked_value(KNOB, text) if hashed else text

    def argv(command: list[str]) -> list[Any]:
        at = command.index(WORD)
        out = command[:at] + words + command[at + 1 :]
        return run.mask_argv(out) if hashed else out

    if env_line:
        for line in collected["envfile"]:
            if line["key"] == KNOB:
                line["value"] = env_value(value)
    for container in collected["docker"]["containers"]:
        if KNOB in container["env"]:
            container["env"][KNOB] = env_value(value)
        if WORD in (container.get("cmd") or []):
            container["cmd"] = argv(container["cmd"])
    for name in ("render", "render_current", "render_login", "render_login_current"):
        for spec in collected[name]["services"].values():
            if KNOB in spec.get("environment", {}):
                spec["environment"][KNOB] = env_value(value)
            if WORD in (spec.get("command") or []):
                spec["command"] = argv(spec["command"])
    # The box's own render is of its `.env` as it now reads (compare/render_basis.py).
    basis = render_basis.env_basis(render_basis.current_pairs(parse_collected(collected)) or {})
    collected["render_current"]["basis"] = collected["render_login_current"]["basis"] = basis
    data = (json.dumps(saved, indent=1, sort_keys=True) + "\n").encode("utf-8")
    (target / "thor.json").write_bytes(data)
    index = json.loads((target / "index.json").read_text(encoding="utf-8"))
    if "sha256" in index:
        index["sha256"]["thor"] = hashlib.sha256(data).hexdigest()
        (target / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return target


def _written(root: Path) -> str:
    return "".join(
        p.read_text(encoding="utf-8") for p in sorted((root / "group_vars").rglob("*.yaml"))
    )


def _found(printed: str) -> list[str]:
    return [line.strip() for line in printed.split("found while importing:", 1)[-1].splitlines()]


def test_the_captured_knob_is_adopted_when_it_carries_no_secret(tmp_path: Path) -> None:
    """The control: the same lane with its captured value pins the knob, so the cases below
    leave it out for the secret alone."""
    root, code, printed = import_snapshot(LAB_DESIRED, tmp_path / "adopted")
    assert code in (0, 2), printed
    worker = load_fleet(root, "lab").boxes["thor"].lanes["worker"]
    assert worker.env[KNOB] == CAPTURED_VALUE


CAPTURED_VALUE = next(line["value"] for line in CAPTURED["envfile"] if line["key"] == KNOB)


@pytest.mark.parametrize("hashed", [True, False], ids=["hashed", "clear"])
@pytest.mark.parametrize("carrier", sorted(CARRIERS))
def test_a_knob_carrying_a_secret_is_left_out_with_a_finding(
    tmp_path: Path, carrier: str, hashed: bool
) -> None:
    value, secret = CARRIERS[carrier]
    snapshot = _with_knob(tmp_path / "snapshot", value, hashed)
    thor = json.loads((snapshot / "thor.json").read_text(encoding="utf-8"))["collected"]
    line = next(line["value"] for line in thor["envfile"] if line["key"] == KNOB)
    assert ('"hmac:' in line) is hashed and (secret in line) is not hashed  # as the box says
    root, code, printed = import_snapshot(snapshot, tmp_path / "adopted")
    assert code in (0, 2), printed
    written = _written(root)
    assert "hmac:" not in written and secret not in written and KNOB not in written
    assert "hmac:" not in printed and secret not in printed
    # Named with its lane and the path the operator must fill in, the value as ***.
    said = [line for line in _found(printed) if KNOB in line]
    assert said == [
        f"thor: lane worker: {KNOB} carries a secret inside its value (***): not adopted; "
        f"it stays as the box has it (the adopted state does not set {PATH}: "
        "the operator must set it)"
    ]
    # The written repository validates, and its drift is honest: the knob is not managed,
    # so nothing compares it (no dead knob, no digest shown as a value).
    fleet = load_fleet(root, "lab")
    assert KNOB not in fleet.boxes["thor"].lanes["worker"].env
    drifts = drift_of(root, snapshot)
    assert not [d for d in drifts if KNOB in d.path or "speculative" in d.path]
    assert secret not in repr(drifts)


@pytest.mark.parametrize("hashed", [True, False], ids=["hashed", "clear"])
def test_a_lane_running_a_secret_its_env_line_lacks_is_not_said_adopted(
    tmp_path: Path, hashed: bool
) -> None:
    """`.env` holds the captured value, the lanes run one carrying a secret (created from an
    older `.env`): what runs wins, yet cannot be adopted, and no finding may say it was."""
    value, secret = CARRIERS["api-key"]
    snapshot = _with_knob(tmp_path / "snapshot", value, hashed, env_line=False)
    root, code, printed = import_snapshot(snapshot, tmp_path / "adopted")
    assert code in (0, 2), printed
    assert KNOB not in _written(root) and secret not in printed and "hmac:" not in printed
    said = [line for line in _found(printed) if KNOB in line]
    assert said and not [line for line in said if "adopted what runs" in line], said
    assert any("what runs is not adopted" in line for line in said), said
    assert any(f"lane worker: {KNOB}" in line and PATH in line for line in said), said


@pytest.mark.parametrize("hashed", [True, False], ids=["hashed", "clear"])
def test_a_knob_only_the_lanes_carry_is_not_said_adopted(tmp_path: Path, hashed: bool) -> None:
    """No `.env` line, the lanes carry a value with a secret: the "not in .env" finding must
    not say it was adopted from the container."""
    value, secret = CARRIERS["bearer"]
    snapshot = _with_knob(tmp_path / "snapshot", value, hashed)
    saved = json.loads((snapshot / "thor.json").read_text(encoding="utf-8"))
    saved["collected"]["envfile"] = [
        line for line in saved["collected"]["envfile"] if line["key"] != KNOB
    ]
    (snapshot / "thor.json").write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")
    index = json.loads((snapshot / "index.json").read_text(encoding="utf-8"))
    index.pop("sha256", None)
    (snapshot / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    root, code, printed = import_snapshot(snapshot, tmp_path / "adopted")
    assert code in (0, 2), printed
    assert KNOB not in _written(root) and secret not in printed and "hmac:" not in printed
    said = [line for line in _found(printed) if KNOB in line]
    assert said and not [line for line in said if "adopted a value" in line], said
    assert any("what runs is not adopted" in line for line in said), said
