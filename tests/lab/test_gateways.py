"""The real lobes gateway on each box: version, auth posture, roles, the mesh."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.lab


def test_health_reports_the_lobes_version_from_the_host(lab, http):
    for box in lab["boxes"].values():
        r = http.get(f"{box['gateway_url']}/health")
        assert r.status_code == 200
        assert r.json() == {"status": "ok", "service": "model-gear-gateway", "version": "0.91.0"}


def test_capabilities_show_the_roles_of_each_shape(lab, http):
    for box in lab["boxes"].values():
        caps = http.get(f"{box['gateway_url']}/capabilities").json()
        for role in box["roles"]:
            assert caps[role]["ready"] is True, (box["shape"], role)
            assert not caps[role].get("proxied"), (box["shape"], role)


def test_keyed_gateway_answers_401_on_models_and_200_on_capabilities(lab, http):
    spark = lab["boxes"]["spark"]
    assert spark["gateway_api_key"]
    r = http.get(f"{spark['gateway_url']}/v1/models")
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "invalid_api_key"
    assert http.get(f"{spark['gateway_url']}/capabilities").status_code == 200
    ok = http.get(f"{spark['gateway_url']}/v1/models",
                  headers={"Authorization": f"Bearer {spark['gateway_api_key']}"})  # fmt: skip
    assert ok.status_code == 200


def test_unkeyed_gateway_serves_models_without_credentials(lab, http):
    assert http.get(f"{lab['boxes']['thor']['gateway_url']}/v1/models").status_code == 200


def test_spark_reaches_thors_worker_through_the_mesh(lab, http):
    spark, thor = lab["boxes"]["spark"], lab["boxes"]["thor"]
    worker = http.get(f"{spark['gateway_url']}/capabilities").json()["worker"]
    assert worker["proxied"] is True
    assert worker["hosted_by"] == thor["gateway_url"]
    r = http.post(
        f"{spark['gateway_url']}/v1/chat/completions",
        headers={"Authorization": f"Bearer {spark['gateway_api_key']}"},
        json={"model": "worker", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.headers["X-Lobes-Mesh-Member"] == "thor"


def test_gateway_publishes_on_all_interfaces_of_the_box(lab, on_box):
    ports = on_box("thor", "docker port model-gear-gateway 8000").stdout.split()
    assert "0.0.0.0:8000" in ports
