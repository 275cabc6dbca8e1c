"""`reconcile import` against the real lab: adopt the pristine lab, then drift against the
adopted repository; adopt again from a snapshot with no way to connect; refuse to overwrite.

The pristine lab is lobes' own render, which leaves HAND_IMAGE (compose falls back to
VLLM_NIGHTLY_IMAGE) and CULTURE_VLLM_API_KEY out of `.env`: import adopts them as
`env: {KEY: null}`, so drift is zero on every box, live and from a snapshot. Every output is
searched for the lab's secret values (never printed here).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

import lab as labpkg
from tests.lab import audit_scenarios as sc

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
BOXES = ("thor", "spark", "orin")


def reconcile(
    root: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / ".venv/bin/reconcile"), "--root", str(root), "-i", "lab", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
        env=env,
    )


def drift_entries(result: subprocess.CompletedProcess[str]) -> dict[str, set[tuple[str, str]]]:
    report = json.loads(result.stdout)
    out: dict[str, set[tuple[str, str]]] = {}
    for box in report["boxes"]:
        assert box["reachable"] and not box["errors"], box
        out[box["box"]] = {(d["kind"], d["path"]) for d in box["drifts"]}
    return out


def remaining(import_output: str) -> int:
    found = re.search(r"(\d+) differences remain", import_output)
    return int(found.group(1)) if found else 0


def test_adopt_the_lab_then_drift_replay_and_refuse(lab: Any, tmp_path: Path) -> None:
    outputs: list[str] = []
    adopted = tmp_path / "adopted"

    # Live: one discovery run per box (twice where .env names a longer -f chain), then drift.
    done = reconcile(ROOT, "import", "--output", str(adopted))
    outputs += [done.stdout, done.stderr]
    assert done.returncode == 0, done.stdout + done.stderr
    assert "found while importing" not in done.stdout
    drift = reconcile(adopted, "drift", "--format", "json")
    outputs += [drift.stdout, drift.stderr]
    assert drift_entries(drift) == {box: set() for box in BOXES}  # zero, on every box
    assert drift.returncode == 0

    # A second import over it is refused, and nothing in it changes.
    before = {p: p.read_bytes() for p in adopted.rglob("*") if p.is_file()}
    again = reconcile(ROOT, "import", "--output", str(adopted))
    outputs += [again.stdout, again.stderr]
    assert again.returncode == 1 and "already exists" in again.stderr
    assert {p: p.read_bytes() for p in adopted.rglob("*") if p.is_file()} == before

    # From a snapshot, with no ssh on PATH: nothing can connect, and the result is the same.
    snapshot = tmp_path / "snapshot"
    saved = reconcile(adopted, "drift", "--save-snapshot", str(snapshot), "--format", "json")
    outputs += [saved.stdout, saved.stderr]
    # spark's .env is exactly what the adopted state writes: one render serves both.
    spark = json.loads((snapshot / "spark.json").read_text(encoding="utf-8"))["collected"]
    assert "render_current" not in spark and spark["render"]["basis"]
    offline = {**os.environ, "PATH": str(tmp_path / "no-such-bin")}
    replayed = tmp_path / "replayed"
    done2 = reconcile(
        ROOT, "import", "--from-snapshot", str(snapshot), "--output", str(replayed), env=offline
    )
    outputs += [done2.stdout, done2.stderr]
    assert done2.returncode == 0, done2.stdout + done2.stderr
    drift2 = reconcile(
        replayed, "drift", "--from-snapshot", str(snapshot), "--format", "json", env=offline
    )
    outputs += [drift2.stdout, drift2.stderr]
    assert drift_entries(saved) == drift_entries(drift2) == {box: set() for box in BOXES}

    # A snapshot saved against the repository's own state, whose .env differs from every
    # pristine box's: it holds compose's render of each box's own .env too, so the state
    # imported from it replays to zero, as a live drift of it does.
    lab_snapshot = tmp_path / "lab-snapshot"
    saved3 = reconcile(ROOT, "drift", "--save-snapshot", str(lab_snapshot), "--format", "json")
    outputs += [saved3.stdout, saved3.stderr]
    assert saved3.returncode == 2 and all(drift_entries(saved3).values())  # drifts, each box
    for box in BOXES:
        answer = json.loads((lab_snapshot / f"{box}.json").read_text(encoding="utf-8"))
        assert answer["collected"]["render_current"]["services"], box
    from_lab = tmp_path / "from-lab"
    done3 = reconcile(
        ROOT, "import", "--from-snapshot", str(lab_snapshot), "--output", str(from_lab), env=offline
    )
    outputs += [done3.stdout, done3.stderr]
    assert done3.returncode == 0, done3.stdout + done3.stderr
    replay3 = reconcile(
        from_lab, "drift", "--from-snapshot", str(lab_snapshot), "--format", "json", env=offline
    )
    live3 = reconcile(from_lab, "drift", "--format", "json")
    outputs += [replay3.stdout, replay3.stderr, live3.stdout, live3.stderr]
    assert drift_entries(replay3) == drift_entries(live3) == {box: set() for box in BOXES}

    # Never a secret: not in what was printed, written or saved.
    secrets = json.loads((ROOT / ".lab" / "secrets.json").read_text(encoding="utf-8"))
    dirs = (adopted, replayed, snapshot, lab_snapshot, from_lab)
    files = [p for d in dirs for p in d.rglob("*") if p.is_file()]
    written = [p.read_text(encoding="utf-8") for p in files]
    for name, value in secrets.items():
        assert isinstance(value, str) and len(value) >= 8
        leaks = [i for i, text in enumerate(outputs + written) if value in text]
        assert not leaks, f"the lab's {name} appears in output #{leaks[0]}"  # never the value


def test_a_login_shell_key_is_found_while_importing(
    lab: Any, pristine: Any, tmp_path: Path
) -> None:
    """Incident #209 on thor: the gateway runs with a key only ~/.bashrc exports. Import adopts
    it keyed and lists the export as found; its reference is the placeholder, naming the line
    (a converge reads the rc file's last assignment of the key, which the trace cannot show is
    the line bash ran: importer/secrets.py), and drift says the placeholder is not there."""
    pristine("thor")
    did = labpkg.incidents.shell_exported_key("thor", "GATEWAY_API_KEY")
    sc.wait_mesh()  # the recreated gateway lists its peers' proxied roles a few beats later
    adopted = tmp_path / "adopted"
    done = reconcile(ROOT, "import", "--output", str(adopted))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "thor: a login shell export" in done.stdout
    assert f"is exported by the login shell at ~/.bashrc:{did['line']}" in done.stdout
    thor = (adopted / "group_vars" / "thor.yaml").read_text(encoding="utf-8")
    assert "path: ~/.lobes/.secrets.unfound.env, key: GATEWAY_API_KEY}" in thor
    assert f"exported at ~/.bashrc:{did['line']}; put it here" in thor
    drift = reconcile(adopted, "drift", "--format", "json")
    report = json.loads(drift.stdout)
    box = next(b for b in report["boxes"] if b["box"] == "thor")
    assert box["reachable"] and "secrets.unfound.env" in json.dumps(box["errors"]), box
    entries = {(d["kind"], d["path"]) for d in box["drifts"]}
    assert ("shell-leak", "GATEWAY_API_KEY") in entries
    assert entries <= {
        ("shell-leak", "GATEWAY_API_KEY"),
        ("envfile", "GATEWAY_API_KEY"),  # .env does not hold the key the gateway runs with
        ("env", "GATEWAY_API_KEY"),  # the lanes would carry it through env_file
    }
    assert remaining(done.stdout) == json.loads(drift.stdout)["summary"]["drifts"]
    for text in (done.stdout, done.stderr, drift.stdout, thor):
        assert did["value"] not in text
