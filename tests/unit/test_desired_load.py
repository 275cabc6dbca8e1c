"""Loading the real fleet repository: layering, deep merge, provenance, and both inventories."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.desired.envfile import box_env
from reconciler.desired.load import load_fleet
from reconciler.desired.merge import merge_layers
from reconciler.desired.problems import Location
from reconciler.desired.schema import layer_schema_json
from reconciler.desired.yaml_source import SourceDoc

ROOT = Path(__file__).resolve().parents[2]


def _doc(name: str, data: dict) -> SourceDoc:
    positions = {(): Location(name, 1, 1)}

    def walk(node: dict, path: tuple) -> None:
        for key, value in node.items():
            positions[(*path, key)] = Location(name, len(positions), 1)
            if isinstance(value, dict):
                walk(value, (*path, key))

    walk(data, ())
    return SourceDoc(name, data, positions)


def test_merge_is_deep_for_mappings_and_replaces_lists() -> None:
    base = _doc("all.yaml", {"images": {"a": "1", "b": "2"}, "chain": ("x", "y")})
    box = _doc("thor.yaml", {"images": {"b": "3"}, "chain": ("z",)})
    merged, where = merge_layers([base, box])
    assert merged == {"images": {"a": "1", "b": "3"}, "chain": ("z",)}
    assert where[("images", "a")].file == "all.yaml"
    assert where[("images", "b")].file == "thor.yaml"


def test_replacing_a_subtree_forgets_the_positions_it_replaced() -> None:
    base = _doc("all.yaml", {"lanes": {"w": {"env": {"A": "1"}}}})
    box = _doc("thor.yaml", {"lanes": {"w": "off"}})
    merged, where = merge_layers([base, box])
    assert merged == {"lanes": {"w": "off"}}
    assert ("lanes", "w", "env", "A") not in where


def test_a_shared_prefix_merged_once_gives_each_chain_what_merging_it_alone_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SharedPrefixes (one merge of all.yaml + groups for every box of those groups): the same
    data and positions, in the same order, and no chain sees what another one changed."""
    from reconciler.desired.merge import SharedPrefixes

    base = _doc("all.yaml", {"lanes": {"w": {"env": {"A": "1"}, "on": True}}, "x": "1"})
    group = _doc("gpu.yaml", {"lanes": {"w": {"env": {"B": "2"}}}, "y": {"z": "3"}})
    thor = _doc("thor.yaml", {"lanes": {"w": "off"}, "y": "flat"})
    spark = _doc("spark.yaml", {"lanes": {"w": {"env": {"A": "9"}}}, "x": {"now": "a map"}})
    merges = SharedPrefixes()
    calls: list[int] = []
    real = merge_layers

    def counted(layers: list[SourceDoc]) -> tuple[dict, dict]:
        calls.append(len(layers))
        return real(layers)

    monkeypatch.setattr("reconciler.desired.merge.merge_layers", counted)
    got = [merges.merge([base, group, box], 2) for box in (thor, spark, thor, spark)]
    monkeypatch.undo()
    assert calls == [2]  # the prefix, once
    for box, (data, where) in zip((thor, spark, thor, spark), got, strict=True):
        alone_data, alone_where = merge_layers([base, group, box])
        assert data == alone_data
        assert list(where.items()) == list(alone_where.items())
    assert got[0][0]["lanes"] == {"w": "off"}
    assert got[1][0]["lanes"]["w"] == {"env": {"A": "9", "B": "2"}, "on": True}
    assert base.data["lanes"]["w"]["env"] == {"A": "1"}  # the layers themselves untouched


def test_real_fleet_layers_all_then_groups_in_order_then_box() -> None:
    fleet = load_fleet(ROOT, "hosts")
    assert list(fleet.boxes) == ["thor", "spark", "orin"]
    assert fleet.layers["thor"] == (
        "group_vars/all.yaml",
        "group_vars/gpu.yaml",
        "group_vars/jetson.yaml",
        "group_vars/thor.yaml",
    )
    assert fleet.layers["spark"][2] == "group_vars/dgx.yaml"
    thor = fleet.boxes["thor"]
    # Deep merge: thor adds a lane; all.yaml's lanes stay; gpu.yaml's boot timeout reaches them.
    assert set(thor.lanes) == {"embed", "rerank", "hand", "worker"}
    assert thor.lanes["embed"].boot_timeout_s == 900
    assert thor.env["VLLM_GDN_DECODE_KERNEL"] == "triton"
    assert thor.contract["hand"].feasible is False
    assert fleet.boxes["spark"].lanes["cortex"].max_model_len == 262144


def test_managed_env_of_thor_carries_the_seed_pins_and_no_secret_value() -> None:
    fleet = load_fleet(ROOT, "hosts")
    env = {e.key: e for e in box_env(fleet, "thor")}
    assert env["VLLM_GDN_DECODE_KERNEL"].value == "triton"
    assert env["WORKER_MAX_MODEL_LEN"].value == "262144"
    assert env["WORKER_MAX_MODEL_LEN"].origin == "lanes.worker.max_model_len"
    assert env["WORKER_SPECULATIVE_CONFIG"].value.startswith("'--speculative-config={")
    assert env["GATEWAY_API_KEY"].is_secret and env["LOBES_MESH_KEY"].is_secret
    assert env["LOBES_MESH_SEEDS"].value == "http://orin.lan:8000,http://spark.lan:8000"
    assert env["COMPOSE_FILE"].value.endswith("docker-compose.override.yml")


def test_show_masks_secrets_and_names_the_layer_of_each_value(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--root", str(ROOT), "-i", "hosts", "show", "thor"]) == 0
    out = capsys.readouterr().out
    assert "GATEWAY_API_KEY=***   # secret gateway_api_key" in out
    assert "VLLM_GDN_DECODE_KERNEL: triton # group_vars/thor.yaml:" in out
    assert "mem_available_floor_gib: 4.0 # group_vars/jetson.yaml:" in out


def test_show_json_is_machine_readable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--root", str(ROOT), "-i", "hosts", "show", "spark", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["env"]["PRIMARY_MAX_MODEL_LEN"] == {
        "value": "262144",
        "origin": "lanes.cortex.max_model_len",
    }
    assert doc["env"]["LOBES_MESH_KEY"]["value"] == "***"


def test_show_unknown_box_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--root", str(ROOT), "-i", "hosts", "show", "thro"]) == 1
    assert "unknown box 'thro'" in capsys.readouterr().err


def test_committed_schema_is_current() -> None:
    committed = (ROOT / "schema" / "desired-state.schema.json").read_text(encoding="utf-8")
    assert committed == layer_schema_json(), (
        "run: reconcile schema -o schema/desired-state.schema.json"
    )


def test_lab_inventory_differs_only_in_connection_data_and_lab_facts(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    for part in ("inventory", "group_vars"):
        shutil.copytree(ROOT / part, root / part)
    overlay = root / ".lab" / "images.yaml"
    overlay.parent.mkdir()
    lab_ref = "10.77.0.1:5000/vllm/vllm-openai@sha256:" + "ab" * 32
    overlay.write_text(f"vllm_nightly: {lab_ref}\n", encoding="utf-8")
    (root / ".lab" / "overlay").mkdir()
    override_digest = "cd" * 32
    for name in ("thor", "spark", "orin"):
        (root / ".lab" / "overlay" / f"{name}.yaml").write_text(
            f"deployment:\n  file_digests:\n    docker-compose.override.yml: {override_digest}\n",
            encoding="utf-8",
        )
    prod, lab = load_fleet(root, "hosts"), load_fleet(root, "lab")
    for name in prod.boxes:
        p = prod.boxes[name].model_dump()
        q = lab.boxes[name].model_dump()
        assert q["images"].pop("vllm_nightly") == lab_ref
        p["images"].pop("vllm_nightly")
        lab_digests = q["deployment"]["file_digests"]
        assert lab_digests.pop("docker-compose.override.yml") == override_digest
        assert p == q
        assert prod.connection(name).ssh_hostname != lab.connection(name).ssh_hostname


def test_pyinfra_debug_inventory_lists_three_boxes_with_merged_data() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pyinfra", "inventory.py", "debug-inventory"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "FLEET_INVENTORY": "hosts", "HOME": str(ROOT)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr  # pyinfra prints its report on stderr
    for box in ("[thor]", "[spark]", "[orin]"):
        assert box in out
    assert '"ssh_hostname": "thor.lan"' in out
    # Deep-merged: thor's own lane next to all.yaml's lanes, gpu.yaml's timeout inside them.
    thor = out[out.index("[thor]") : out.index("[spark]")]
    assert '"worker": {' in thor and '"embed": {' in thor and '"boot_timeout_s": 900' in thor
    assert '"VLLM_GDN_DECODE_KERNEL": "triton"' in thor
    assert '"GATEWAY_API_KEY": {\n' in thor  # a reference, never a value
