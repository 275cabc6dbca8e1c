"""The incident helpers reproduce what the seeds report, by hand, and reset cleanly."""

from __future__ import annotations

import json

import httpx
import pytest

import lab as labpkg

pytestmark = pytest.mark.lab


def _lane_window(on_box, box, service):
    out = on_box(box, f"docker exec model-gear-{service} curl -fsS localhost:8000/v1/models").stdout
    return json.loads(out)["data"][0]["max_model_len"]


def test_window_change_lane_only_leaves_the_gateway_stale(lab, on_box, http, pristine):
    pristine("spark")
    did = labpkg.incidents.window_change_lane_only("spark", "PRIMARY_MAX_MODEL_LEN", 131072)
    assert did["old"] == "262144" and did["service"] == "vllm-primary"
    assert _lane_window(on_box, "spark", "vllm-primary") == 131072
    caps = http.get(f"{lab['boxes']['spark']['gateway_url']}/capabilities").json()
    assert caps["cortex"]["context"] == 262144  # the gateway kept its start-time env (#208)


def test_shell_exported_key_arms_the_gateway(lab, on_box, http, pristine):
    pristine("thor")
    url = lab["boxes"]["thor"]["gateway_url"]
    assert http.get(f"{url}/v1/models").status_code == 200
    did = labpkg.incidents.shell_exported_key("thor", "GATEWAY_API_KEY")
    assert did["line"] == 6
    assert http.get(f"{url}/v1/models").status_code == 401
    assert http.get(f"{url}/capabilities").status_code == 200
    assert (
        on_box("thor", "grep -c '^GATEWAY_API_KEY=' ~/.lobes/.env", check=False).stdout.strip()
        == "0"
    )
    labpkg.incidents.reset("thor")
    assert http.get(f"{url}/v1/models").status_code == 200


def test_hardcoded_flag_makes_the_env_knob_dead(lab, on_box, pristine):
    pristine("thor")
    did = labpkg.incidents.hardcoded_flag("thor", "vllm-worker", "--max-model-len=65536")
    assert "--max-model-len=65536" in did["command_after"]
    assert _lane_window(on_box, "thor", "vllm-worker") == 65536
    env = on_box("thor", "grep -E '^WORKER_MAX_MODEL_LEN=' ~/.lobes/.env").stdout
    assert env.strip() == "WORKER_MAX_MODEL_LEN=262144"
    cmd = json.loads(on_box("thor", "docker inspect model-gear-vllm-worker "
                                    "--format '{{json .Config.Cmd}}'").stdout)  # fmt: skip
    assert "--max-model-len=65536" in cmd
    assert any(t.startswith("--speculative-config=") for t in cmd)  # other knobs still live


def test_other_image_digest_runs_a_lane_from_the_alt_build(lab, on_box, pristine):
    pristine("thor")
    alt = lab["images"]["vllm_nightly_alt"]
    labpkg.incidents.other_image_digest("thor", "vllm-worker", alt)
    image = on_box("thor", "docker inspect model-gear-vllm-worker --format '{{.Config.Image}}'")
    assert image.stdout.strip() == alt
    env = on_box("thor", "grep -E '^WORKER_IMAGE=' ~/.lobes/.env").stdout.strip()
    assert env == f"WORKER_IMAGE={lab['images']['vllm_nightly']}"
    version = on_box("thor", "docker exec model-gear-vllm-worker curl -fsS localhost:8000/version")
    assert "alt" in json.loads(version.stdout)["version"]


def test_gateway_published_on_loopback_is_gone_from_the_bridge(lab, on_box, pristine):
    pristine("orin")
    url = lab["boxes"]["orin"]["gateway_url"]
    labpkg.incidents.gateway_published_on("orin", "127.0.0.1")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/health", timeout=2, trust_env=False)
    inside = on_box("orin", "curl -fsS 127.0.0.1:8000/health").stdout
    assert json.loads(inside)["version"] == "0.91.0"


def test_reset_restores_pristine(lab, on_box, http, pristine):
    pristine("thor")  # reset again afterwards if anything below fails before the reset
    labpkg.incidents.window_change_lane_only("thor", "WORKER_MAX_MODEL_LEN", 131072)
    result = labpkg.incidents.reset("thor")
    assert ".lobes/.env" in result["changed"]["thor"]
    assert _lane_window(on_box, "thor", "vllm-worker") == 262144


def test_docker_run_with_copied_labels_fools_compose_not_inspect(lab, on_box, pristine):
    pristine("thor")
    alt = lab["images"]["vllm_nightly_alt"]
    did = labpkg.incidents.other_image_digest("thor", "vllm-worker", alt, method="docker-run")
    assert did["commands"][1].startswith("docker run ")
    up = on_box("thor", "cd ~/.lobes && docker compose up -d vllm-worker 2>&1").stdout
    assert "Recreate" not in up  # compose believes the lane is current
    image = on_box("thor", "docker inspect model-gear-vllm-worker --format '{{.Config.Image}}'")
    assert image.stdout.strip() == alt
