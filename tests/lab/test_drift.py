"""`reconcile drift` against the real lab: each field incident, reproduced by hand with the lab's
incident helpers (plain ssh/docker/compose, never our code), must appear as exactly the drift
entries it causes — no more, no less — and the exit code must say so.

The pristine lab is lobes' own render (keys unarmed, no fleet pins), so it already differs from
the desired state; each test compares the drift after the incident with the drift before it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import lab as labpkg
from reconciler.compare.drift import BoxResult, Drift, SecretValue
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from tests.lab import audit_scenarios as sc

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
Entry = tuple[str, str, str, Any, Any, str]


def observe(box: str, root: Path = ROOT) -> BoxResult:
    return run_drift(load_fleet(root, "lab"), [box]).report.boxes[0]


def shown(value: Any) -> Any:
    return "***" if isinstance(value, SecretValue) else value


def entry(d: Drift) -> Entry:
    return (d.kind.value, d.subject, d.path, shown(d.desired), shown(d.observed), d.action.value)


def entries(result: BoxResult) -> set[Entry]:
    assert result.reachable and not result.errors, result.errors
    return {entry(d) for d in result.drifts}


def by_path(result: BoxResult, kind: str, path: str) -> Drift:
    found = [d for d in result.drifts if d.kind.value == kind and d.path == path]
    assert len(found) == 1, found
    return found[0]


def cli(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / ".venv/bin/reconcile"), "--root", str(root), "-i", "lab", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def env_line(on_box: Callable[..., Any], box: str, key: str) -> int:
    out = on_box(box, f"grep -n '^{key}=' ~/.lobes/.env | tail -n 1 | cut -d: -f1").stdout
    return int(out.strip())


def test_pristine_lab_differs_only_where_the_desired_state_asks_for_more(lab: Any) -> None:
    """No false positives: a lab that lobes rendered and compose started shows no image, argv,
    port, compose-file, contract, state or shell-leak drift — only what the fleet pins on top
    (.env keys, and the env_file copies of them in the lanes) and the keyed posture it wants."""
    for box in ("thor", "spark", "orin"):
        result = observe(box)
        kinds = {d.kind.value for d in result.drifts}
        assert kinds <= {"envfile", "env", "auth"}, (box, sorted(entries(result)))
        # Two runs in a row agree: nothing flaps.
        assert entries(observe(box)) == entries(result)


def test_window_changed_and_lane_recreated_alone_shows_a_stale_contract(
    lab: Any, pristine: Callable[[str], None], on_box: Callable[..., Any]
) -> None:
    """Seed 000 §8 (#208): the lane serves the new window, the gateway advertises the old one."""
    pristine("thor")
    before = entries(observe("thor"))
    labpkg.incidents.window_change_lane_only("thor", "WORKER_MAX_MODEL_LEN", 131072)
    after_result = observe("thor")
    after = entries(after_result)
    assert after - before == {
        ("envfile", "file:.env", "WORKER_MAX_MODEL_LEN", "262144", "131072", "rewrite-env"),
        ("argv", "lane:vllm-worker", "--max-model-len", "262144", "131072", "recreate"),
        ("env", "lane:vllm-worker", "WORKER_MAX_MODEL_LEN", "262144", "131072", "recreate"),
        # The gateway advertises the desired window; the lane left it, and the entries above
        # bring it back (review 8: a gateway recreate was planned, which changed nothing).
        ("contract", "gateway", "capabilities.worker.context", 131072, 262144, "report-only"),
    }  # fmt: skip
    assert before - after == set()
    line = env_line(on_box, "thor", "WORKER_MAX_MODEL_LEN")
    assert by_path(after_result, "envfile", "WORKER_MAX_MODEL_LEN").source == f".env:{line}"
    result = cli("drift", "thor", "--format", "json")
    assert result.returncode == 2
    doc = json.loads(result.stdout)
    contract = [d for d in doc["boxes"][0]["drifts"] if d["kind"] == "contract"]
    assert contract[0]["path"] == "capabilities.worker.context"


def test_key_exported_in_bashrc_and_gateway_recreated_from_a_login_shell(
    lab: Any, pristine: Callable[[str], None], tmp_path: Path
) -> None:
    """Seed 000 §9 (#209): the key gate armed from ~/.bashrc while .env says nothing."""
    pristine("thor")
    before = entries(observe("thor"))
    canary = "canary-" + "7f3a9c1e5b2d4f60"
    done = labpkg.incidents.shell_exported_key("thor", "GATEWAY_API_KEY", canary)
    sc.wait_mesh()  # the recreated gateway lists its peers' proxied roles a few beats later
    after_result = observe("thor")
    after = entries(after_result)
    new = after - before
    leak = by_path(after_result, "shell-leak", "GATEWAY_API_KEY")
    assert leak.source == f"~/.bashrc:{done['line']}"
    assert "gateway.environment.GATEWAY_API_KEY" in (leak.note or "")
    assert "model-gear-gateway carry the shell's value" in (leak.note or "")
    assert new == {
        ("shell-leak", "shell", "GATEWAY_API_KEY", None, "***", "report-only:shell"),
        # The desired key is the box's own (~/.lobes/.secrets.env); the gateway runs the shell's.
        ("env", "gateway", "GATEWAY_API_KEY", "***", "***", "recreate-gateway"),
    }
    assert by_path(after_result, "env", "GATEWAY_API_KEY").secret_changed is True
    # The gate is armed now, which is what the desired state wants: the auth drift is gone,
    # but the key is the shell's, not the box's (the env entry above says so).
    assert {e for e in before - after if e[0] == "auth"} == {
        ("auth", "gateway", "GET /v1/models without key (loopback)", 401, 200,
         "recreate-gateway"),
        ("auth", "gateway", "GET /v1/models without key (controller)", 401, 200,
         "recreate-gateway"),
    }  # fmt: skip
    # The canary and the lab's real keys never appear, in any format or in a snapshot.
    secrets = json.loads((ROOT / ".lab" / "secrets.json").read_text())
    outputs = [cli("drift", "thor", "--format", f).stdout for f in ("text", "json", "markdown")]
    snap = tmp_path / "snap"
    outputs.append(cli("drift", "thor", "--save-snapshot", str(snap)).stdout)
    outputs += [p.read_text() for p in snap.rglob("*") if p.is_file()]  # facts/ too
    for text in outputs:
        assert canary not in text
        for value in secrets.values():
            assert value not in text


def test_flag_hard_coded_in_the_override_makes_the_env_knob_dead(
    lab: Any, pristine: Callable[[str], None]
) -> None:
    pristine("thor")
    before = entries(observe("thor"))
    labpkg.incidents.hardcoded_flag("thor", "vllm-worker", "--max-model-len=65536")
    after = entries(observe("thor"))
    new = after - before
    digest = {e for e in new if e[1] == "file:docker-compose.override.yml"}
    assert len(digest) == 1 and next(iter(digest))[2] == "sha256"
    assert new - digest == {
        ("compose-file", "lane:vllm-worker", "--max-model-len", "262144", "65536",
         "restore-file"),
        ("contract", "gateway", "capabilities.worker.context", 65536, 262144, "report-only"),
    }  # fmt: skip
    assert before - after == set()


def test_lane_run_from_another_digest_is_seen_only_in_docker_inspect(
    lab: Any, pristine: Callable[[str], None]
) -> None:
    pristine("thor")
    images = labpkg.imageset.load()
    before = entries(observe("thor"))
    labpkg.incidents.other_image_digest("thor", "vllm-worker", images["vllm_nightly_alt"])
    after = entries(observe("thor"))
    assert after - before == {
        ("image", "lane:vllm-worker", "digest", images["vllm_nightly"],
         images["vllm_nightly_alt"], "pull-and-recreate"),
    }  # fmt: skip
    assert before - after == set()


def test_gateway_published_on_loopback_only(lab: Any, pristine: Callable[[str], None]) -> None:
    pristine("thor")
    before = entries(observe("thor"))
    labpkg.incidents.gateway_published_on("thor", "127.0.0.1")
    after_result = observe("thor")
    after = entries(after_result)
    new = after - before
    assert ("port", "gateway", "8000/tcp", "0.0.0.0:8000", "127.0.0.1:8000",
            "recreate-gateway") in new  # fmt: skip
    assert {e[1] for e in new} == {"gateway", "file:docker-compose.override.yml"}
    # The controller (the mesh side) cannot reach the gateway any more: its auth probe has no
    # answer, so only the box's own loopback probe still reports the open posture.
    assert {e[2] for e in before - after} == {"GET /v1/models without key (controller)"}


def test_one_unreachable_box_does_not_stop_the_others(lab: Any, tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    for part in ("inventory", "group_vars", ".lab/ssh", ".lab/overlay"):
        shutil.copytree(ROOT / part, root / part)
    shutil.copy(ROOT / ".lab" / "images.yaml", root / ".lab" / "images.yaml")
    inventory = root / "inventory" / "lab.yaml"
    text = inventory.read_text()
    # thor's address with a port nothing listens on: refused at once, no traffic elsewhere.
    inventory.write_text(text.replace("ssh_port: 22\n", "ssh_port: 2222\n", 1))
    result = cli("drift", "--format", "json", root=root)
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    boxes = {b["box"]: b for b in doc["boxes"]}
    assert boxes["thor"]["reachable"] is False
    assert "unreachable" in boxes["thor"]["errors"][0]
    assert boxes["spark"]["reachable"] and boxes["orin"]["reachable"]
    assert not boxes["spark"]["errors"] and not boxes["orin"]["errors"]


def _gateway_server(on_box: Callable[..., Any], box: str) -> list[int]:
    """The gateway's server processes: the children of its container's init (docker-init).
    Stopped with SIGSTOP, the gateway hangs while docker still says it runs (`docker pause`
    would say paused, and drift would report that instead: tests/lab/test_paused.py)."""
    inspect = "docker inspect --format '{{.State.Pid}}' model-gear-gateway"
    init = int(on_box(box, inspect).stdout.strip())
    children = Path(f"/proc/{init}/task/{init}/children").read_text(encoding="ascii")
    return [int(pid) for pid in children.split()]


def test_a_hanging_gateway_is_a_bounded_error_of_its_box(
    lab: Any, pristine: Callable[[str], None], on_box: Callable[..., Any]
) -> None:
    pristine("spark")
    server = _gateway_server(on_box, "spark")
    assert server
    for pid in server:
        os.kill(pid, signal.SIGSTOP)  # the lab runs as root: the engine's processes are ours
    try:
        result = cli("drift", "--format", "json")
    finally:
        for pid in server:
            os.kill(pid, signal.SIGCONT)
    assert result.returncode == 1
    boxes = {b["box"]: b for b in json.loads(result.stdout)["boxes"]}
    assert any("gateway health (loopback)" in e for e in boxes["spark"]["errors"])
    assert not boxes["thor"]["errors"] and not boxes["orin"]["errors"]
