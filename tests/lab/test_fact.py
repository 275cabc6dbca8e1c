"""The collector as a pyinfra fact: `pyinfra inventory.py fact reconciler.observe.fact.Collected`
runs the same program as `reconcile drift` through pyinfra's fact machinery and the @openssh
connector, on every box at once, and no secret leaves a box in clear."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]


def _fact_data(stderr: str) -> dict[str, Any]:
    # pyinfra prints "--> Fact data for: NAME" and then one JSON document (on stderr).
    start = stderr.index("{", stderr.index("--> Fact data for: reconciler.observe.fact.Collected"))
    data: dict[str, Any] = json.JSONDecoder().raw_decode(stderr[start:])[0]
    return data


def test_the_collector_runs_as_a_pyinfra_fact_on_every_box(lab: dict[str, Any]) -> None:
    result = subprocess.run(
        [str(ROOT / ".venv/bin/pyinfra"), "-y", "inventory.py", "fact",
         "reconciler.observe.fact.Collected"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "FLEET_INVENTORY": "lab"},
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    data = _fact_data(result.stderr)
    assert sorted(data) == ["orin", "spark", "thor"]
    for box, doc in data.items():
        assert doc["user"] == f"fl-{box}"
        services = {c["service"] for c in doc["docker"]["containers"]}
        assert "gateway" in services and "vllm-embed" in services
        assert doc["gateway"]["health"]["status"] == 200
    # One run key for the whole pyinfra run: the mesh key, equal on every box, hashes alike.
    mesh = [
        next(e["value"] for e in doc["envfile"] if e["key"] == "LOBES_MESH_KEY")
        for doc in data.values()
    ]
    assert mesh[0]["secret"].startswith("hmac:") and mesh.count(mesh[0]) == 3
    secrets = json.loads((ROOT / ".lab" / "secrets.json").read_text(encoding="utf-8"))
    for value in secrets.values():
        assert value not in result.stdout + result.stderr
