"""Secrets against the lab (issue 10, class 4): a key holding CR/LF in the box's secret file
makes the collector's keyed probe fail inside http.client, whose error quotes the header
(`Bearer <key>`); `reconcile audit` must print the failure and never the key, in text, JSON,
markdown and the saved observations.

Run under the lab lock:
  flock /tmp/fleet-labtests.lock .venv/bin/pytest tests/lab/test_secret_boundaries.py
"""

from __future__ import annotations

import pytest

from tests.lab import audit_scenarios as sc
from tests.lab.test_audit import audit, box, restore  # noqa: F401 (restore is a fixture)

pytestmark = pytest.mark.lab


def test_audit_of_a_key_holding_crlf_prints_it_nowhere(lab, restore, tmp_path):  # noqa: F811
    restore.append("thor")
    key = sc.new_key("thor")
    lab_keys = sc.lab_secrets()
    # Inside double quotes, compose's dotenv (and the collector's) turns \r\n into CR LF.
    sc.write_secrets(
        "thor",
        {
            "GATEWAY_API_KEY": f'"{key}\\r\\nX-Smuggled: yes"',
            "LOBES_MESH_KEY": lab_keys["mesh_key"],
            "HF_TOKEN": lab_keys["hf_token"],
        },
    )
    inventory = sc.desired_state(tmp_path / "desired", {"thor": "keyed"})
    rc, doc, text = audit(inventory, tmp_path, "thor", secrets=(key,))
    keyed = box(doc, "thor")["evidence"]["probes"]["keyed"]
    assert keyed["key_from"] == "secret:gateway_api_key"
    assert keyed["status"] is None  # the request never left: http.client refused the header
    assert "header" in keyed["note"] and "Bearer" not in keyed["note"]
    assert "Smuggled" not in text
    assert rc == 2
