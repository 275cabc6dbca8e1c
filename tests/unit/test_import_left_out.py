"""`env: {KEY: null}`: a key the desired state leaves out of `.env` (issue 13's round trip).

lobes' own render leaves HAND_IMAGE (compose falls back to VLLM_NIGHTLY_IMAGE) and
CULTURE_VLLM_API_KEY out of `.env`. Import adopts both as `null`, every consumer agrees: the
desired `.env` holds no line for them (the collector's render, the converge program, the
compare), and the loader refuses a null that no converge could honour.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from reconciler.apply.payload import check
from reconciler.desired.envfile import box_env
from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError
from reconciler.desired.schema import layer_schema, layer_schema_json
from reconciler.observe.payload import collector_payload
from tests.unit.conftest import load_box_program
from tests.unit.test_import import PRISTINE, drift_of

REPO = Path(__file__).resolve().parents[2]
collector = load_box_program("box_collector_left_out", "reconciler/observe/remote/collector.py")
converge = load_box_program("box_converge_left_out", "reconciler/apply/remote/converge.py")
LEFT_OUT = {"HAND_IMAGE", "CULTURE_VLLM_API_KEY"}


def test_the_pristine_lab_adopts_the_keys_lobes_leaves_out_as_null(
    pristine_import: tuple[Path, int, str],
) -> None:
    out = pristine_import[0]
    everyone = (out / "group_vars" / "all.yaml").read_text(encoding="utf-8")
    assert "HAND_IMAGE: null # not in .env (compose runs VLLM_NIGHTLY_IMAGE)" in everyone
    assert "CULTURE_VLLM_API_KEY: null # not in .env" in everyone
    fleet = load_fleet(out, "lab")
    for box in fleet.boxes:
        entries = {e.key: e for e in box_env(fleet, box)}
        for key in LEFT_OUT:  # one entry each, wanted absent, decided by the null pin
            assert (entries[key].value, entries[key].origin) == (None, f"env.{key}")
        # The collector is told "absent" (JSON null), never an empty value.
        payload = collector_payload(fleet.boxes[box], list(entries.values()), "k" * 32)
        assert {k: payload["managed_env"][k] for k in LEFT_OUT} == dict.fromkeys(LEFT_OUT)
    # ... and nothing is left to report about them (test_import.py: the whole replay is zero).
    assert not [d for d in drift_of(out, PRISTINE) if d.path in LEFT_OUT]


def _adopted_copy(src: Path, dst: Path, edit: Callable[[Any], None]) -> Path:
    """The adopted repository with thor's layer edited (ruamel keeps the rest as written)."""
    shutil.copytree(src, dst)
    path = dst / "group_vars" / "thor.yaml"
    yaml = YAML()
    layer = yaml.load(path.read_text(encoding="utf-8"))
    edit(layer)
    with path.open("w", encoding="utf-8") as handle:
        yaml.dump(layer, handle)
    return dst


def test_a_null_image_variable_whose_lane_wants_another_image_is_refused(
    pristine_import: tuple[Path, int, str], tmp_path: Path
) -> None:
    other = "10.77.0.1:5000/vllm/vllm-openai@sha256:" + "e" * 64
    root = _adopted_copy(
        pristine_import[0],
        tmp_path / "r",
        lambda layer: layer.setdefault("lanes", {}).setdefault("hand", {}).update(image=other),
    )
    with pytest.raises(DesiredStateError) as err:
        load_fleet(root, "lab")
    message = str(err.value)
    assert "thor.yaml" in message and "lanes.hand.image" in message
    assert "env.HAND_IMAGE is null (left out of .env)" in message


def test_a_null_may_not_drop_a_key_the_state_derives_without_a_fallback(
    pristine_import: tuple[Path, int, str], tmp_path: Path
) -> None:
    root = _adopted_copy(
        pristine_import[0],
        tmp_path / "r",
        lambda layer: layer.setdefault("env", {}).update(MODEL_GEAR_VERSION=None),
    )
    with pytest.raises(DesiredStateError) as err:
        load_fleet(root, "lab")
    assert "MODEL_GEAR_VERSION is already set by lobes.version" in str(err.value)


def test_the_schema_allows_null_pins() -> None:
    env = layer_schema()["properties"]["env"]["patternProperties"]["^[A-Z_][A-Z0-9_]*$"]
    assert {"type": "null"} in env["anyOf"]
    committed = json.loads((REPO / "schema/desired-state.schema.json").read_text("utf-8"))
    assert committed == json.loads(layer_schema_json())  # regenerated: `reconcile schema -o`


# -- the box programs ---------------------------------------------------------------------------
CURRENT = (
    "# lobes' render\n"
    "HAND_IMAGE=reg/old@sha256:" + "1" * 64 + "\n"
    "KEEP=1\n"
    "export HAND_IMAGE=again   # an earlier line compose would otherwise fall back to\n"
    "# HAND_IMAGE=commented stays\n"
    "WORKER_MAX_MODEL_LEN=1024\n"
)


def test_the_collector_renders_drift_from_a_env_without_the_null_keys_lines() -> None:
    run = collector.Run(
        {"run_key": "k" * 32, "secret_patterns": [], "directory": "/nonexistent",
         "managed_env": {"HAND_IMAGE": None, "WORKER_MAX_MODEL_LEN": "2048", "NEW": None}}
    )  # fmt: skip
    text = collector.desired_envfile(run, CURRENT, {})
    assert text.splitlines() == [
        "# lobes' render",
        "KEEP=1",
        "# HAND_IMAGE=commented stays",
        "WORKER_MAX_MODEL_LEN=2048",
    ]


def test_converge_removes_every_assignment_of_a_null_key_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    (tmp_path / ".env").write_text(CURRENT)
    box = converge.Box({"directory": str(tmp_path), "project": "lobes", "compose_files": []})
    want = {"HAND_IMAGE": None, "WORKER_MAX_MODEL_LEN": "2048", "NEW": None}
    assert converge.write_env(box, list(want), want) == ["HAND_IMAGE", "WORKER_MAX_MODEL_LEN"]
    assert (tmp_path / ".env").read_text() == (
        "# lobes' render\nKEEP=1\n# HAND_IMAGE=commented stays\nWORKER_MAX_MODEL_LEN=2048\n"
    )
    assert (tmp_path / ".env").stat().st_mode & 0o777 == 0o600
    assert converge.write_env(box, list(want), want) == []  # absent already: nothing to do


def test_a_null_passes_both_payload_checks_and_a_non_string_still_does_not() -> None:
    base = {
        "action": "converge", "holder": "h", "directory": "~/.lobes", "project": "lobes",
        "compose_files": ["docker-compose.yml"], "env_keys": ["HAND_IMAGE"], "lane_specs": [],
        "gateway": {"timeout_s": 120}, "memory": {"floor_gib": 4.0},
        "verify": {"port": 8000, "version": "0.91.0", "auth": "open"},
    }  # fmt: skip
    good = {**base, "managed_env": {"HAND_IMAGE": None}}
    converge.validate_payload(good)
    check(good)
    bad = {**base, "managed_env": {"HAND_IMAGE": 5}}
    with pytest.raises(converge.Failed):
        converge.validate_payload(bad)
