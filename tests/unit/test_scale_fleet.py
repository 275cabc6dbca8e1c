"""A fleet replicated from examples/lab-incidents (bench/scale_fleet.py) replays as its
originals: thor-1 has exactly thor's drift once the two swap names and addresses (each one's
mesh seeds are the other members'). This catches a generator that copies an observation
wrongly and an engine whose result for one box depends on where it sits in a large fleet.

The 1,000-box run is marked `scale` and not in the default run:

    .venv/bin/pytest tests/unit/test_scale_fleet.py -m scale -q
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.scale_fleet import address, build_fleet, inventory_text, names, original_of
from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError
from reconciler.desired.yaml_source import load_yaml
from reconciler.drift import run_drift_on
from reconciler.drift_inputs import drift_inputs
from reconciler.report.json_report import to_document


def _replay(root: Path, keep: bool = True) -> dict[str, Any]:
    fleet = load_fleet(root, "lab")
    inputs = drift_inputs(fleet)
    run = run_drift_on(
        inputs, list(inputs.boxes), from_snapshot=root / "snapshot", keep_observations=keep
    )
    return to_document(run.report)


def _swapped(box: dict[str, Any], name: str) -> str:
    """The box's drifts as text, with its identity and its original's exchanged."""
    text = json.dumps(box["drifts"], sort_keys=True)
    original = original_of(name)
    for mine, theirs in ((address(name), address(original)), (f"fl-{name}", f"fl-{original}")):
        text = text.replace(mine, "\0").replace(theirs, mine).replace("\0", theirs)
    return _normal(json.loads(text))


def _normal(drifts: list[dict[str, Any]]) -> str:
    """Seeds are a sorted list: after the swap, sort them again."""
    for drift in drifts:
        if drift["path"] == "LOBES_MESH_SEEDS":
            for side in ("desired", "observed"):
                if isinstance(drift[side], str):
                    drift[side] = ",".join(sorted(drift[side].split(",")))
    return json.dumps(drifts, sort_keys=True)


def _check_replicas(document: dict[str, Any], count: int) -> None:
    boxes = {b["box"]: b for b in document["boxes"]}
    assert sorted(boxes) == sorted(names(count))
    for name, box in boxes.items():
        original = boxes[original_of(name)]
        assert box["reachable"] and box["errors"] == original["errors"]
        assert box["drifts"], name  # the lab's incidents are in every copy
        if name != original["box"]:
            assert _swapped(box, name) == _normal(original["drifts"]), name


def test_a_replica_drifts_as_its_original(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    build_fleet(tmp_path / "fleet", 10)
    document = _replay(tmp_path / "fleet")
    _check_replicas(document, 10)
    # Every box's seeds name the nine other members, itself never.
    for box in document["boxes"]:
        seeds = [d for d in box["drifts"] if d["path"] == "LOBES_MESH_SEEDS"]
        assert seeds, box["box"]
        for drift in seeds:
            origins = drift["desired"].split(",")
            assert len(origins) == 9 and f"//{address(box['box'])}:" not in drift["desired"]
    # The streaming replay (what the CLI runs) reports the same as the kept one.
    streamed = _replay(tmp_path / "fleet", keep=False)
    assert streamed["boxes"] == document["boxes"] and streamed["summary"] == document["summary"]


def test_an_inventory_may_outgrow_a_layers_limits(tmp_path: Path) -> None:
    text = inventory_text(names(400))  # about 76 KB and 6,800 values
    assert len(text) > 64 * 1024
    path = tmp_path / "lab.yaml"
    path.write_text(text, encoding="utf-8")
    assert len(load_yaml(path, "inventory/lab.yaml", inventory=True).data["boxes"]) == 400
    with pytest.raises(DesiredStateError, match="larger than 64 KiB"):
        load_yaml(path, "group_vars/thor.yaml")


@pytest.mark.scale
def test_a_thousand_boxes_replay_as_their_originals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    build_fleet(tmp_path / "fleet", 1000)
    _check_replicas(_replay(tmp_path / "fleet", keep=False), 1000)
