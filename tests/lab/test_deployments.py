"""Each ~/.lobes is lobes' own render plus the lab edits, and compose sees what lobes sees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab


def _env(lab, box, key):
    """The value compose uses (last active line, inline comment dropped); read as root."""
    found = None
    for line in (Path(lab["boxes"][box]["lobes_dir"]) / ".env").read_text().splitlines():
        if line.startswith(f"{key}="):
            found = line.split("=", 1)[1].split(" #")[0].strip()
    return found


def test_compose_file_is_lobes_own_chain(lab, on_box):
    for name, box in lab["boxes"].items():
        files = on_box(name, "cd ~/.lobes && /opt/fleet-lab/lobes-venv/bin/lobes fleet files")
        chain = [t for t in files.stdout.split() if t != "-f"]
        assert chain[-1] == "docker-compose.override.yml"
        assert _env(lab, name, "COMPOSE_FILE") == ":".join(chain) == ":".join(box["compose_files"])


def test_shapes_render_what_the_brief_says(lab):
    services = {name: set(b["services"]) for name, b in lab["boxes"].items()}
    assert {"vllm-worker", "vllm-embed", "vllm-rerank", "gateway"} <= services["thor"]
    assert "vllm-primary" not in services["thor"]
    assert {"vllm-primary", "vllm-embed", "vllm-rerank", "gateway"} <= services["spark"]
    assert {"vllm-multimodal", "vllm-embed", "vllm-rerank", "gateway"} <= services["orin"]
    assert "docker-compose.gpu.yml" in lab["boxes"]["orin"]["compose_files"]


def test_env_points_images_and_mesh_at_the_lab(lab, on_box):
    nightly = lab["images"]["vllm_nightly"]
    for name, box in lab["boxes"].items():
        assert _env(lab, name, "VLLM_NIGHTLY_IMAGE") == nightly
        assert _env(lab, name, "LOBES_MESH_NAME") == name
        assert _env(lab, name, "GATEWAY_SELF_ORIGIN") == box["gateway_url"]
        assert _env(lab, name, "LOBES_MESH_HEARTBEAT_S") == "5"
        assert _env(lab, name, "MODEL_GEAR_VERSION") == "0.91.0"
        assert on_box(name, "stat -c %a ~/.lobes/.env").stdout.strip() == "600"
        assert on_box(name, "stat -c %u ~/.lobes/mesh").stdout.strip() == "10001"
    assert _env(lab, "thor", "WORKER_IMAGE") == nightly
    assert _env(lab, "spark", "PRIMARY_MAX_MODEL_LEN") == "262144"
    assert _env(lab, "thor", "GATEWAY_API_KEY") is None


def test_orin_gpu_chain_runs_on_the_nvidia_runtime_name(lab, on_box):
    rt = on_box(
        "orin", "docker inspect model-gear-vllm-multimodal --format '{{.HostConfig.Runtime}}'"
    )
    assert rt.stdout.strip() == "nvidia"
    img = on_box("orin", "docker inspect model-gear-vllm-multimodal --format '{{.Config.Image}}'")
    assert img.stdout.strip() == lab["images"].get("vllm_gemma4", lab["images"]["vllm_nightly"])


def test_gateway_runs_with_an_init_and_lanes_without_gpu_reservations(lab, on_box):
    out = on_box("thor", "docker inspect model-gear-gateway model-gear-vllm-worker")
    gateway, worker = json.loads(out.stdout)
    assert gateway["HostConfig"]["Init"] is True
    assert not worker["HostConfig"].get("DeviceRequests")
    assert worker["HostConfig"]["IpcMode"] == "host"


def test_worker_started_after_embed_and_rerank_were_healthy(lab, on_box):
    label = '{{index .Config.Labels "com.docker.compose.depends_on"}}'
    out = on_box("thor", f"docker inspect model-gear-vllm-worker --format '{label}'")
    deps = out.stdout.strip()
    assert "vllm-embed:service_healthy" in deps
    assert "vllm-rerank:service_healthy" in deps


def test_every_lane_is_healthy(lab, on_box):
    for name, box in lab["boxes"].items():
        out = on_box(name, "docker ps --format '{{.Names}} {{.Status}}'").stdout.splitlines()
        assert len(out) == len(box["services"])
        assert all("(healthy)" in line for line in out), out


def test_second_up_is_warm_and_changes_nothing():
    import lab as labpkg

    data = labpkg.up()
    # Warm and nothing changed is the invariant; how fast is for the benchmarks, not a test.
    assert data["timings"]["last_up_kind"] == "warm"
    assert all(not changes for changes in data["timings"]["changed"].values())
