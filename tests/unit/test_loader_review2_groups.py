"""What a group cannot be named (review 2, item 2): a name pyinfra's side already uses (`boxes`
replaced pyinfra's group of every host with its data and the deploys ended in a traceback), a
group listed twice, a box in a group named like itself, a box named `all` (each put one
group_vars layer twice in a box's chain). Refused at the inventory line that says it."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from pyinfra.api.inventory import Inventory

from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError


def _inventory(repo: Path) -> Path:
    return repo / "inventory" / "hosts.yaml"


def _replace(repo: Path, old: str, new: str) -> None:
    text = _inventory(repo).read_text()
    assert old in text
    _inventory(repo).write_text(text.replace(old, new, 1))


def _problems(repo: Path) -> list[str]:
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(repo)
    return [str(p) for p in caught.value.problems]


@pytest.mark.parametrize("name", ["boxes", "all", "self", "names_data", "override_data"])
def test_a_group_named_as_pyinfra_names_its_own_is_refused(repo: Path, name: str) -> None:
    _replace(repo, "group_order: [gpu, jetson, dgx]", f"group_order: [gpu, jetson, dgx, {name}]")
    (said,) = _problems(repo)
    assert said.startswith(f"inventory/hosts.yaml:5:33: group_order[3]: {name!r} is reserved")


def test_the_reserved_names_cover_pyinfras_inventory_parameters() -> None:
    """pyinfra builds Inventory(all, override_data=..., **groups): a group named like a
    parameter is a TypeError before any deploy runs."""
    from reconciler.desired.pyinfra_data import RESERVED_GROUPS

    parameters = set(inspect.signature(Inventory.__init__).parameters) - {"groups"}
    assert parameters <= RESERVED_GROUPS
    assert {"all", "boxes"} <= RESERVED_GROUPS


def test_a_group_listed_twice_is_refused(repo: Path) -> None:
    _replace(repo, "group_order: [gpu, jetson, dgx]", "group_order: [gpu, jetson, dgx, gpu]")
    assert _problems(repo) == [
        "inventory/hosts.yaml:5:33: group_order[3]: group 'gpu' is listed twice: its layer "
        "would be applied twice"
    ]


def test_a_box_in_a_group_named_like_itself_is_refused(repo: Path) -> None:
    _replace(repo, "group_order: [gpu, jetson, dgx]", "group_order: [gpu, jetson, dgx, spark]")
    _replace(repo, "groups: [gpu, dgx]", "groups: [gpu, dgx, spark]")
    (said,) = _problems(repo)
    assert said.startswith("inventory/hosts.yaml:14:24: boxes.spark.groups[2]: box 'spark' is in")


def test_a_box_named_all_is_refused(repo: Path) -> None:
    _replace(repo, "  orin:\n", "  all:\n")
    (repo / "group_vars" / "orin.yaml").unlink()  # no box or group named orin: its own error
    (said,) = _problems(repo)
    assert said.startswith("inventory/hosts.yaml:18:3: boxes.all: a box cannot be named 'all'")
