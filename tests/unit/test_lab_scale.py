"""Pure parts of the scale lab (lab/scale.py; no root, no daemons): names that fit the kernel's
and the desired state's types, the generated inventory layered like the lab's, the override."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from lab import scale
from lab.deployments import render_override
from reconciler.desired.load import load_fleet

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "examples" / "lab-incidents" / "facts" / "images.yaml"
YAML_SAFE = YAML(typ="safe")
SERVICES = ["gateway", "vllm-embed", "vllm-hand", "vllm-rerank", "vllm-worker"]


def test_fifty_boxes_have_distinct_names_addresses_and_short_enough_interface_names() -> None:
    fleet = scale.boxes(50)
    assert [b.name for b in fleet[:4]] == ["thor", "spark", "orin", "thor-1"]
    assert len({b.name for b in fleet}) == len({b.address for b in fleet}) == 50
    assert {b.address.rsplit(".", 1)[0] for b in fleet} == {"10.77.0"}  # the lab's own range
    assert all(100 <= int(b.address.rsplit(".", 1)[1]) <= 254 for b in fleet)
    assert all(len(b.veth) <= 15 and len(f"fsp-{b.index}") <= 15 for b in fleet)  # IFNAMSIZ
    assert all(len(b.user) <= 32 and b.user != f"fl-{b.name}" for b in fleet)  # not a lab user
    assert {b.project for b in fleet}.isdisjoint({"lobes"})  # never the lab's compose project


@pytest.mark.parametrize("count", [0, scale.MAX_BOXES + 1])
def test_a_fleet_size_out_of_range_is_refused(count: int) -> None:
    with pytest.raises(scale.LabError):
        scale.boxes(count)


def test_the_scale_override_is_the_labs_plus_container_names_and_the_shared_network() -> None:
    images = YAML_SAFE.load(IMAGES.read_text())
    text = scale.scale_override("scale-thor-1", SERVICES, images)
    lab = render_override(scale.BOX_BY_NAME["thor"], SERVICES, images)
    assert [line for line in text.splitlines() if line in lab.splitlines()] == lab.splitlines()
    parsed = YAML_SAFE.load(text.replace("!reset ", ""))
    assert {s: parsed["services"][s]["container_name"] for s in SERVICES} == {
        s: f"scale-thor-1-{s}" for s in SERVICES
    }
    assert parsed["networks"]["default"] == {"name": scale.NETWORK, "external": True}


def test_the_generated_inventory_layers_each_copy_like_its_original(tmp_path: Path) -> None:
    """A copy (thor-1) gets all -> gpu -> jetson -> thor.yaml -> the image overlay -> its own
    overlay, as the box `thor` does: the same desired state but for its name, address, user
    and compose project."""
    shutil.copytree(REPO / "group_vars", tmp_path / "group_vars")
    (tmp_path / "inventory").mkdir()
    lab_dir = tmp_path / ".lab"
    (lab_dir / "scale" / "overlay").mkdir(parents=True)
    shutil.copyfile(IMAGES, lab_dir / "images.yaml")
    fleet = scale.boxes(6)
    (lab_dir / "scale" / "lab-scale.yaml").write_text(scale.inventory_text(fleet))
    for b in fleet:
        override = scale.scale_override(b.project, SERVICES, {}).encode()
        (lab_dir / "scale" / "overlay" / f"{b.name}.yaml").write_text(
            scale.overlay_text(b, override)
        )
    loaded = load_fleet(tmp_path, ".lab/scale/lab-scale.yaml")
    assert list(loaded.boxes) == [b.name for b in fleet]
    thor, copy = loaded.boxes["thor"], loaded.boxes["thor-1"]
    assert "group_vars/thor.yaml" in loaded.layers["thor-1"]
    assert loaded.layers["thor-1"][-1] == ".lab/scale/overlay/thor-1.yaml"
    assert copy.deployment.project == "scale-thor-1" and thor.deployment.project == "scale-thor"
    # Its secrets where box_files writes them: its own directory's .secrets.env
    assert {s.path for s in copy.secrets.values()} == {"~/scale-thor-1/.secrets.env"}
    assert {n: s.key for n, s in copy.secrets.items()} == scale.SECRET_KEYS
    assert copy.lanes == thor.lanes and copy.contract == thor.contract
    assert copy.lobes == thor.lobes and copy.env == thor.env
    assert loaded.boxes["orin-1"].lanes == loaded.boxes["orin"].lanes
    assert loaded.boxes["spark-1"].lanes != thor.lanes
