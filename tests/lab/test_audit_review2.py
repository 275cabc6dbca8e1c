"""The second audit review on the lab: an unkeyed vLLM container started by hand beside the
compose project (`docker run -p 0.0.0.0:18001:8000`) is seen, asked without a key at thor's
own address, and fails the box (`publish.stray`); before, `audit thor` said ok.

Run under the lab lock: flock /tmp/lab.lock .venv/bin/pytest tests/lab/test_audit_review2.py
"""

from __future__ import annotations

import shlex

import pytest

from tests.lab import audit_scenarios as sc
from tests.lab.test_audit import audit, box, codes, restore  # noqa: F401 (a fixture)

pytestmark = pytest.mark.lab

STRAY = "review2-stray-lane"


def test_audit_a_stray_unkeyed_lane_fails(lab, restore, tmp_path):  # noqa: F811
    restore.append("thor")
    image = sc._sh(
        "thor", "docker inspect --format '{{.Config.Image}}' model-gear-vllm-worker"
    ).strip()
    run = (
        f"docker rm -f {STRAY} >/dev/null 2>&1; docker run -d --name {STRAY} "
        f"-p 0.0.0.0:18001:8000 --entrypoint vllm {shlex.quote(image)} serve stray/model "
        "--host=0.0.0.0 >/dev/null"
    )
    try:
        sc._sh("thor", run)
        sc._sh(
            "thor", "for i in $(seq 60); do curl -fs localhost:18001/health && break; sleep 1; done"
        )
        inventory = sc.desired_state(tmp_path / "desired", {"thor": "open"})
        rc, doc, text = audit(inventory, tmp_path, "thor")
    finally:
        sc._sh("thor", f"docker rm -f {STRAY} >/dev/null 2>&1 || true")
    entry = box(doc, "thor")
    assert "publish.stray" in codes(entry), entry["findings"]
    assert entry["verdict"] == "fail"
    published = entry["evidence"]["published"]
    assert [(b["container"], b["address"]) for b in published["stray"]] == [
        (STRAY, "0.0.0.0:18001")
    ]
    probes = {p["container"]: p for p in published["lane_probes"]}
    address = lab["boxes"]["thor"]["gateway_url"].split("//")[1].rsplit(":", 1)[0]
    assert probes[STRAY]["url"] == f"http://{address}:18001/v1/models"
    assert probes[STRAY]["status"] == 200  # unkeyed: answers anyone on the mesh
    assert f"STRAY {STRAY}" in " ".join(text.split())
    assert rc == 2
