"""An overlay is read from inside the repository (review 2, item 5): `box_overlay: /tmp/x.yaml`
and `image_overlay: ../../x.yaml` read any file on the controller into every box's desired
state, where a symlink to the same file was already refused as outside the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError

DIGEST = "vllm/vllm-openai@sha256:" + "a" * 64


def _add_to_inventory(repo: Path, lines: str) -> None:
    inventory = repo / "inventory" / "hosts.yaml"
    inventory.write_text(lines + inventory.read_text())


def _problems(repo: Path) -> list[str]:
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(repo)
    return [str(p) for p in caught.value.problems]


def test_a_box_overlay_outside_the_repository_is_refused(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for box in ("thor", "spark", "orin"):
        (outside / f"{box}.yaml").write_text("memory:\n  mem_available_floor_gib: 3\n")
    _add_to_inventory(repo, f"box_overlay: {outside}/{{box}}.yaml\n")
    assert _problems(repo) == [
        f"inventory/hosts.yaml:1:1: box_overlay: {outside}/{{box}}.yaml is outside the "
        "repository: an overlay is read from inside it (or beside the inventory that names it)"
    ]


def test_an_image_overlay_climbing_out_of_the_repository_is_refused(
    repo: Path, tmp_path: Path
) -> None:
    (tmp_path / "images.yaml").write_text(f"vllm: {DIGEST}\n")  # repo is tmp_path/fleet
    _add_to_inventory(repo, "image_overlay: ../images.yaml\n")
    assert _problems(repo) == [
        "inventory/hosts.yaml:1:1: image_overlay: ../images.yaml is outside the repository: an "
        "overlay is read from inside it (or beside the inventory that names it)"
    ]


def test_an_overlay_through_a_directory_leading_out_is_refused(repo: Path, tmp_path: Path) -> None:
    """`facts/../..` or a symlinked directory: where the path resolves to is what counts."""
    (tmp_path / "images.yaml").write_text(f"vllm: {DIGEST}\n")
    (repo / "facts").symlink_to(tmp_path)
    _add_to_inventory(repo, "image_overlay: facts/images.yaml\n")
    (said,) = _problems(repo)
    assert said.startswith("inventory/hosts.yaml:1:1: image_overlay: facts/images.yaml is outside")
