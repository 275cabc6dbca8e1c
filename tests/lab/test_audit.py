"""`reconcile audit` against the lab: each auth scenario set up by hand, audited through the
CLI, and the verdicts, evidence and exit code checked. Every output (text, json, markdown and
the saved observations) is searched for every real key value: none may appear.

Run under the lab lock: flock .lab/tests.lock .venv/bin/pytest tests/lab/test_audit.py
Set AUDIT_FIXTURES=DIR to keep each scenario's observations (trimmed) for the unit tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lab as labpkg
from lab import lifecycle
from lab.config import REPO
from tests.lab import audit_scenarios as sc

pytestmark = pytest.mark.lab

MESH_KEY = "mesh_key"


@pytest.fixture
def restore(lab: dict[str, Any], request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Boxes a test changes; all of them are put back to pristine afterwards. While the test
    runs it holds the lab's own lock, so another session's `lab up` (a reset of every box)
    waits instead of undoing the scenario under the audit."""
    touched: list[str] = []
    os.environ["AUDIT_SCENARIO"] = request.node.name.removeprefix("test_audit_")
    with lifecycle.locked():
        yield touched
    if len(set(touched)) > 1:
        labpkg.incidents.reset()
    elif touched:
        labpkg.incidents.reset(touched[0])


def reconcile(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", "--root", str(REPO), *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def audit(
    inventory: Path, tmp: Path, *boxes: str, secrets: tuple[str, ...] = ()
) -> tuple[int, dict[str, Any], str]:
    """One live audit (json, observations saved), then text and markdown from the snapshot;
    every output is searched for every secret. Returns (exit code, json doc, text)."""
    snap = tmp / "snapshot"
    live = reconcile("-i", str(inventory), "audit", *boxes, "--format", "json",
                     "--save-snapshot", str(snap))  # fmt: skip
    assert live.returncode in (0, 1, 2), live.stderr
    outputs = {"json": live.stdout, "stderr": live.stderr}
    for fmt in ("text", "markdown"):
        offline = reconcile("-i", str(inventory), "audit", *boxes, "--format", fmt,
                            "--from-snapshot", str(snap))  # fmt: skip
        assert offline.returncode == live.returncode, offline.stderr
        outputs[fmt] = offline.stdout + offline.stderr
    for path in sorted(p for p in snap.rglob("*") if p.is_file()):  # facts/ included
        outputs[str(path.relative_to(snap))] = path.read_text()
    values = [*sc.lab_secrets().values(), *secrets]
    for name, text in outputs.items():
        for value in values:
            assert value not in text, f"a key value appears in the {name} output"
    _keep(snap)
    return live.returncode, json.loads(live.stdout), outputs["text"]


def _keep(snap: Path) -> None:
    target = os.environ.get("AUDIT_FIXTURES")
    if target:
        sc.trim_snapshot(snap, Path(target) / os.environ["AUDIT_SCENARIO"])


def box(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(b for b in doc["boxes"] if b["box"] == name)


def codes(entry: dict[str, Any]) -> set[str]:
    return {f["code"] for f in entry["findings"]}


def test_audit_open_mesh(lab, restore, tmp_path):
    mesh = sc.lab_secrets()[MESH_KEY]
    restore += ["thor", "spark", "orin"]
    for name in ("thor", "spark", "orin"):
        sc.opened(name, mesh)
    sc.wait_mesh()
    inventory = sc.desired_state(tmp_path / "desired", {b: "open" for b in restore})
    rc, doc, text = audit(inventory, tmp_path)
    for name in ("thor", "spark", "orin"):
        entry = box(doc, name)
        assert entry["verdict"] == "ok", entry["findings"]
        assert entry["evidence"]["posture"] == "open"
        assert entry["evidence"]["probes"]["mesh_side"]["models"]["status"] == 200
        assert entry["evidence"]["probes"]["loopback"]["chat"]["status"] == 200
    assert doc["mesh"]["verdict"] == "ok" and doc["mesh"]["open"] == ["thor", "spark", "orin"]
    assert rc == 0 and doc["summary"]["exit_code"] == 0
    assert "mesh: OK" in text


def test_audit_fully_keyed_mesh(lab, restore, tmp_path):
    mesh = sc.lab_secrets()[MESH_KEY]
    keys = {name: sc.new_key(name) for name in ("thor", "spark", "orin")}
    restore += list(keys)
    for name, key in keys.items():
        sc.keyed(name, key, mesh)
    sc.wait_mesh()
    inventory = sc.desired_state(tmp_path / "desired", {})
    rc, doc, _ = audit(inventory, tmp_path, secrets=tuple(keys.values()))
    digests = set()
    for name in keys:
        entry = box(doc, name)
        assert entry["verdict"] == "ok", entry["findings"]
        ev = entry["evidence"]
        assert ev["posture"] == "keyed"
        assert ev["probes"]["keyed"]["status"] == 200
        assert ev["probes"]["keyed"]["key_from"] == "secret:gateway_api_key"
        assert ev["keys"]["inbound"]["matches_desired"] is True
        assert ev["keys"]["inbound"]["same_as"] == []
        assert ev["keys"]["mesh"]["same_as"] == sorted(set(keys) - {name}, key=list(keys).index)
        digests.add(ev["keys"]["inbound"]["digest"]["digest"])
    assert len(digests) == 3  # one key per box, as desired
    assert doc["mesh"]["verdict"] == "ok" and doc["mesh"]["keyed"] == list(keys)
    assert rc == 0


def test_audit_key_armed_from_login_shell(lab, restore, tmp_path):
    """Seed #209: `.env` has the key commented out, ~/.bashrc exports it, the gateway was
    recreated from a login shell. Desired open (the operator never decided to key it)."""
    restore.append("thor")
    key = sc.new_key("thor")
    did = labpkg.incidents.shell_exported_key("thor", "GATEWAY_API_KEY", key)
    inventory = sc.desired_state(tmp_path / "desired", {"thor": "open"})
    rc, doc, text = audit(inventory, tmp_path, "thor", secrets=(key,))
    entry = box(doc, "thor")
    where = f"~/.bashrc:{did['line']}"
    assert entry["verdict"] == "fail"
    assert {"posture.open-but-keyed", "key.from-login-shell", "shell.secret-export"} <= codes(entry)
    ev = entry["evidence"]
    assert ev["envfile"]["GATEWAY_API_KEY"]["state"] == "commented-out"
    carried = ev["gateway"]["carries"]["GATEWAY_API_KEY"]
    assert carried["origin"] == "shell" and carried["where"] == where
    exported = [s for s in ev["shell_exports"] if s["name"] == "GATEWAY_API_KEY"]
    assert [s["source"] for s in exported] == [where]
    assert exported[0]["digest"] == carried["digest"]
    assert ev["probes"]["mesh_side"]["models"]["status"] == 401
    assert where in text
    assert rc == 2


def test_audit_stale_key(lab, restore, tmp_path):
    """The key is in `.env` (and the desired source) but the gateway was never recreated."""
    restore.append("thor")
    key = sc.new_key("thor")
    did = sc.stale_key("thor", key, sc.lab_secrets()[MESH_KEY])
    inventory = sc.desired_state(tmp_path / "desired", {"thor": "keyed"})
    rc, doc, _ = audit(inventory, tmp_path, "thor", secrets=(key,))
    entry = box(doc, "thor")
    assert entry["verdict"] == "fail"
    assert {"posture.keyed-but-open", "key.stale"} <= codes(entry)
    ev = entry["evidence"]
    declared = ev["envfile"]["GATEWAY_API_KEY"]
    assert declared["state"] == "set" and declared["line"] == did["env_line"]
    assert declared["digest"] == entry["intent"]["api_key"]["digest"]  # .env holds the right key
    carried = ev["gateway"]["carries"]["GATEWAY_API_KEY"]
    assert carried["digest"] is None and carried["origin"] == "unexplained"
    assert ev["probes"]["loopback"]["models"]["status"] == 200
    assert rc == 2


def test_audit_weakest_link_proven_live(lab, restore, tmp_path):
    """thor open and spark, orin keyed, each exactly as desired: every box passes, and the
    mesh still fails, proven by an unauthenticated request through thor."""
    mesh = sc.lab_secrets()[MESH_KEY]
    keys = {"spark": sc.new_key("spark"), "orin": sc.new_key("orin")}
    restore += ["thor", "spark", "orin"]
    sc.opened("thor", mesh)
    for name, key in keys.items():
        sc.keyed(name, key, mesh)
    sc.wait_mesh()
    inventory = sc.desired_state(tmp_path / "desired", {"thor": "open"})
    rc, doc, text = audit(inventory, tmp_path, secrets=tuple(keys.values()))
    for name in ("thor", "spark", "orin"):
        assert box(doc, name)["verdict"] == "ok", box(doc, name)["findings"]
    m = doc["mesh"]
    assert m["verdict"] == "fail" and codes(m) == {"mesh.weakest-link"}
    assert m["open"] == ["thor"] and m["keyed"] == ["spark", "orin"]
    proven = [p for p in m["proofs"] if p["proven"]]
    assert proven, m["proofs"]
    for p in proven:
        assert p["via"] == "thor" and p["status"] == 200
        assert p["mesh_member"] == p["host"]
        assert p["proxied_by"] == lab["boxes"][p["host"]]["gateway_url"]
    assert "proven: POST http://10.77.0.11:8000/v1/chat/completions" in " ".join(text.split())
    assert rc == 2


def test_audit_lane_port_published(lab, restore, tmp_path):
    restore.append("orin")
    sc.publish_lane("orin", "vllm-embed", 18001)
    inventory = sc.desired_state(tmp_path / "desired", {})
    rc, doc, text = audit(inventory, tmp_path, "orin")
    entry = box(doc, "orin")
    assert "publish.lane" in codes(entry)
    assert entry["verdict"] == "fail"
    lanes = entry["evidence"]["published"]["lanes"]
    assert [(b["container"], b["address"]) for b in lanes] == [
        ("model-gear-vllm-embed", "0.0.0.0:18001")
    ]
    probes = entry["evidence"]["published"]["lane_probes"]
    assert [(p["url"], p["status"]) for p in probes] == [("http://10.77.0.13:18001/v1/models", 200)]
    assert "LANE vllm-embed 0.0.0.0:18001" in " ".join(text.split())  # a cell may wrap
    assert rc == 2


def test_audit_never_prints_a_canary(lab, restore, tmp_path):
    """A canary key armed through lobes' fallback variable, in .env and the login shell: the
    audit traces it to both and prints it nowhere (only its digest, equal in both places)."""
    restore.append("thor")
    canary = "CANARY-" + sc.new_key("thor")
    sc.set_env_key("thor", "CULTURE_VLLM_API_KEY", canary)
    labpkg.incidents.shell_exported_key("thor", "CULTURE_VLLM_API_KEY", canary)
    inventory = sc.desired_state(tmp_path / "desired", {"thor": "keyed"})
    rc, doc, _ = audit(inventory, tmp_path, "thor", secrets=(canary, canary[7:]))
    ev = box(doc, "thor")["evidence"]
    assert ev["posture"] == "keyed"
    assert ev["gateway"]["inbound_key"] == "CULTURE_VLLM_API_KEY"
    carried = ev["gateway"]["carries"]["CULTURE_VLLM_API_KEY"]
    assert carried["origin"] == "env+shell"
    assert carried["digest"] == ev["envfile"]["CULTURE_VLLM_API_KEY"]["digest"] is not None
    # The desired key (the lab's own, in .secrets.env) is not the canary: it is refused.
    assert ev["probes"]["keyed"]["key_from"] == "secret:gateway_api_key"
    assert ev["probes"]["keyed"]["status"] == 401
    assert {"key.not-desired", "key.right-key-refused"} <= codes(box(doc, "thor"))
    assert rc == 2


def test_audit_exits_1_when_a_box_cannot_be_audited(lab, restore, tmp_path):
    """Nothing changes on the boxes: thor's sshd is only looked for on a port nobody listens
    on. Its gateway still answers the controller, so thor is seen from the mesh side (partial):
    pristine thor runs open where the desired state says keyed, and that is said too."""
    inventory = sc.unreachable(sc.desired_state(tmp_path / "desired", {}), "thor")
    rc, doc, text = audit(inventory, tmp_path)
    thor = box(doc, "thor")
    assert (thor["audited"], thor["verdict"], thor["evidence"]) == (False, "fail", None)
    assert thor["observation"] == "partial" and "ssh" in thor["errors"][0].lower()
    assert codes(thor) == {"audit.unobserved", "posture.keyed-but-open"}
    assert all(box(doc, b)["audited"] for b in ("spark", "orin"))
    assert "mesh.incomplete" in codes(doc["mesh"])
    assert rc == 1 and doc["summary"]["exit_code"] == 1
    assert "thor: FAIL (not audited)" in text
