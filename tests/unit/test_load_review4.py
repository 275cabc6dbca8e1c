"""The desired-state loader, review 4: the file an overlay check judged was not always the file
read (`image_overlay: "{box}/../images.yaml"` was checked per box, then read with `{box}`
literal; `lnk/../x.yaml` was judged by its text while the kernel goes up from lnk's target),
errors and the cache named a file by that text, and a group_vars/ that is no directory was
taken for "no layers" (every box then missed all.yaml's keys, blamed on other files)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from reconciler.desired.facts import snapshot_facts
from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError
from reconciler.desired.safe_read import Unreadable, read_regular, refused_link

INCIDENTS = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"
DIGEST = "vllm/vllm-openai@sha256:" + "a" * 64
OVERLAY = "memory:\n  mem_available_floor_gib: 3\n"


def _add_to_inventory(repo: Path, lines: str) -> None:
    inventory = repo / "inventory" / "hosts.yaml"
    inventory.write_text(lines + inventory.read_text())


def _problems(repo: Path, inventory: str | None = None) -> list[str]:
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(repo, inventory)
    return [str(p) for p in caught.value.problems]


def test_an_image_overlay_naming_box_is_refused_not_read_elsewhere(
    repo: Path, tmp_path: Path
) -> None:
    """The reviewer's repro: `{box}` -> outside/sub, each `outside/sub/../images.yaml` was
    checked as `<box>/../images.yaml` (inside), and `{box}/../images.yaml` read from outside."""
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "images.yaml").write_text(f"vllm: {DIGEST}\n")
    (repo / "{box}").symlink_to(outside / "sub")
    _add_to_inventory(repo, 'image_overlay: "{box}/../images.yaml"\n')
    assert _problems(repo) == [
        "inventory/hosts.yaml:1:1: image_overlay: {box}/../images.yaml is one file for every "
        "box: `{box}` is for box_overlay (a box's own layer)"
    ]


@pytest.mark.parametrize(
    ("key", "value"),
    [("box_overlay", "lnk/../{box}.yaml"), ("image_overlay", "lnk/../images.yaml")],
)
def test_a_dotdot_in_an_overlay_path_is_refused(repo: Path, key: str, value: str) -> None:
    """`lnk -> a/b`: `lnk/../thor.yaml` is a/thor.yaml to the kernel, thor.yaml to the text.
    Both inside the repository, and still refused: one rule, nothing to reason about."""
    (repo / "a" / "b").mkdir(parents=True)
    (repo / "lnk").symlink_to("a/b")
    for box in ("thor", "spark", "orin"):
        (repo / "a" / f"{box}.yaml").write_text(OVERLAY)
    (repo / "a" / "images.yaml").write_text(f"vllm: {DIGEST}\n")
    _add_to_inventory(repo, f'{key}: "{value}"\n')
    assert _problems(repo) == [
        f"inventory/hosts.yaml:1:1: {key}: {value}: a `..` in an overlay's path is refused; name "
        "it from the repository's top (or by its absolute path beside the inventory)"
    ]


def test_a_file_reached_through_a_symlink_and_dotdot_leaving_the_repository_is_refused(
    tmp_path: Path,
) -> None:
    root = tmp_path / "fleet"
    root.mkdir()
    (tmp_path / "outside" / "sub").mkdir(parents=True)
    (tmp_path / "outside" / "creds.yaml").write_text("token: x\n")
    (root / "lnk").symlink_to(tmp_path / "outside" / "sub")
    path = root / "lnk" / ".." / "creds.yaml"  # abspath: root/creds.yaml, inside
    assert refused_link(path, root)
    with pytest.raises(Unreadable, match="outside the repository"):
        read_regular(path, within=root)


def test_a_symlink_and_dotdot_staying_inside_is_read(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "x.yaml").write_text("inside: 1\n")
    (root / "lnk").symlink_to("a/b")
    assert read_regular(root / "lnk" / ".." / "x.yaml", within=root) == b"inside: 1\n"


def test_an_error_names_the_file_read_through_a_symlink_and_dotdot(repo: Path) -> None:
    """`-i lnk/../hosts.yaml` with lnk -> inventory/sub reads inventory/hosts.yaml: its errors
    named hosts.yaml, a file at the repository's top that does not exist."""
    (repo / "inventory" / "sub").mkdir()
    (repo / "lnk").symlink_to("inventory/sub")
    _add_to_inventory(repo, "no_such_key: 1\n")
    said = _problems(repo, "lnk/../hosts.yaml")
    assert said and all(line.startswith("inventory/hosts.yaml:1:1: ") for line in said), said


def test_the_inputs_recorded_are_the_files_read(tmp_path: Path) -> None:
    """A snapshot's facts/ named through `lnk/..` (lnk -> a/b): the cache recorded the path's
    text collapsed (x/facts/images.yaml, no such file), so an edit of the file read was not
    seen. Every recorded input must be the file parsed."""
    root = tmp_path / "fleet"
    shutil.copytree(INCIDENTS, root, ignore=shutil.ignore_patterns("snapshot"))
    shutil.copytree(INCIDENTS / "facts", tmp_path / "a" / "facts")
    (tmp_path / "a" / "b").mkdir()
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "lnk").symlink_to(tmp_path / "a" / "b")
    facts = tmp_path / "x" / "lnk" / ".." / "facts"
    assert snapshot_facts(facts.parent) is not None  # the kernel finds a/facts
    fleet = load_fleet(root, "lab", facts=facts)
    missing = [str(p) for p in fleet.inputs if not p.exists()]
    assert missing == []
    read = {os.path.realpath(p) for p in fleet.inputs}
    assert os.path.realpath(tmp_path / "a" / "facts" / "images.yaml") in read
    assert set(fleet.seen.files) == {str(p) for p in fleet.inputs}


def _dangling(folder: Path) -> None:
    folder.symlink_to("nowhere")


def _file(folder: Path) -> None:
    folder.write_text("all: {}\n")


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (None, "does not exist"),
        (_file, "is not a directory"),
        (_dangling, "is a dangling symlink (to 'nowhere' that does not exist)"),
    ],
)
def test_a_group_vars_that_is_no_directory_is_said(repo: Path, make: object, why: str) -> None:
    shutil.rmtree(repo / "group_vars")
    if callable(make):
        make(repo / "group_vars")
    assert _problems(repo) == [
        f"group_vars:1:1: {why}: the repository's layers are group_vars/NAME.yaml files, "
        "all.yaml first"
    ]


def test_a_root_that_does_not_exist_is_said(tmp_path: Path) -> None:
    nowhere = tmp_path / "nowhere"
    assert _problems(nowhere) == [
        f"{nowhere}:1:1: the fleet repository does not exist (--root or FLEET_ROOT)"
    ]
