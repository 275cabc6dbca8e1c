"""`reconcile drift` leads with causes (issue 11 §4), against the real lab.

One incident on a freshly rendered lab: thor's `.env` window changed and only the lane was
recreated (#208). The report must group every box's entries by cause in text and markdown (the
`.env` key first, then what it explains: the lane's flag and environment, the gateway's stale
window), collapse a cause shared by several boxes into one block listing them, and still list
every entry, each with its cause, in JSON. The pure rules are tested on captured data in
tests/unit/test_report_causes.py; this checks them on what the lab really answers.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import lab as labpkg

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
WINDOW = "envfile:WORKER_MAX_MODEL_LEN"


def drift(fmt: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / ".venv/bin/reconcile"), "--root", str(ROOT), "-i", "lab", "drift",
         "--format", fmt, *extra],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def test_drift_is_grouped_by_cause_in_every_format(
    lab: Any, pristine: Callable[[str], None], tmp_path: Path
) -> None:
    pristine("thor")
    labpkg.incidents.window_change_lane_only("thor", "WORKER_MAX_MODEL_LEN", 131072)
    # One observation, rendered three times: three live runs could each see the mesh peers'
    # proxied roles at another point of their heartbeat lag after the worker's recreate.
    snap = tmp_path / "snapshot"
    runs = {"json": drift("json", "--save-snapshot", str(snap))}
    runs |= {fmt: drift(fmt, "--from-snapshot", str(snap)) for fmt in ("text", "markdown")}
    for fmt, done in runs.items():
        assert done.returncode == 2, (fmt, done.stderr[-2000:])

    # JSON: every entry, each with its cause.
    doc = json.loads(runs["json"].stdout)
    entries = [(b["box"], d) for b in doc["boxes"] for d in b["drifts"]]
    assert len(entries) == doc["summary"]["drifts"] > 0
    boxes_of: dict[str, list[str]] = defaultdict(list)
    for box, d in entries:
        if box not in boxes_of[d["cause"]]:
            boxes_of[d["cause"]].append(box)
    assert doc["summary"]["causes"] == len(boxes_of) < len(entries)
    window = {(d["kind"], d["subject"], d["path"], d["symptom"]) for box, d in entries
              if d["cause"] == WINDOW}  # fmt: skip
    assert window == {
        ("envfile", "file:.env", "WORKER_MAX_MODEL_LEN", False),
        ("argv", "lane:vllm-worker", "--max-model-len", True),
        ("env", "lane:vllm-worker", "WORKER_MAX_MODEL_LEN", True),
        ("contract", "gateway", "capabilities.worker.context", True),  # the stale window
    }
    # A key a box's .env lacks explains that key in every container of the box.
    for box, d in entries:
        if d["kind"] == "env":
            lacking = any(
                b == box and e["kind"] == "envfile" and e["path"] == d["path"] for b, e in entries
            )
            assert (d["cause"] == f"envfile:{d['path']}") == lacking, (box, d)
    shared = {cause: boxes for cause, boxes in boxes_of.items() if len(boxes) > 1}
    assert shared, "the fresh render leaves keys missing on every box"

    # Text: one block per cause, a shared cause once with its boxes; the summary counts both.
    text = runs["text"].stdout
    heads = re.findall(r"^(\S+): (\d+) differences? on (.+)$", text, re.M)
    assert {cause for cause, _, _ in heads} == set(boxes_of)
    assert len(heads) == len(boxes_of)
    for cause, count, boxes in heads:
        assert boxes.split(", ") == boxes_of[cause]
        assert int(count) == sum(1 for _, d in entries if d["cause"] == cause)
    summary = " ".join(text.split("\n\n")[-1].split())
    assert summary.startswith(
        f"drift: {len(boxes_of)} causes, {len(entries)} differences on 3 of 3 boxes"
    )
    block = text.split(f"\n{WINDOW}: ", 1)[1].split("\n\n", 1)[0]
    roles = re.findall(r"^  (cause|symptom) +(\S+) +(\S+)", block, re.M)
    assert roles[0] == ("cause", "envfile", "WORKER_MAX_MODEL_LEN")
    assert {("symptom", "argv", "--max-model-len"), ("symptom", "contract",
            "capabilities.worker.context")} <= set(roles[1:])  # fmt: skip

    # Markdown: one section per cause, the same boxes.
    titles = re.findall(r"^### `([^`]+)`: \d+ differences? on (.+)$", runs["markdown"].stdout, re.M)
    assert {cause: boxes.split(", ") for cause, boxes in titles} == dict(boxes_of)
