"""What an error line shows (review 2, item 4): a key is shown escaped, never obeyed (a right-to-
left override in a key reordered the terminal line), and a problem found in a box's merged data
at a shared layer's line says which box it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError, dotted


def test_a_key_path_shows_non_printable_characters_escaped() -> None:
    assert dotted(("env", "PO\u202eRT", 3, "a\x1b[2Jb")) == "env.PO\\u202eRT[3].a\\x1b[2Jb"
    assert dotted(("lanes", "worker", "env", "KEY")) == "lanes.worker.env.KEY"


def test_a_key_with_a_right_to_left_override_is_reported_escaped(repo: Path) -> None:
    dgx = repo / "group_vars" / "dgx.yaml"
    dgx.write_text(dgx.read_text() + "po\u202ert: 1\n")
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(repo)
    (problem,) = caught.value.problems
    assert problem.path == "po\\u202ert"
    assert str(problem).isprintable()


def test_a_problem_at_a_shared_layers_line_names_its_boxes(repo: Path) -> None:
    """gpu.yaml's budget is thor's and spark's (orin sets its own): the line says so; a problem
    at a box's own layer needs no name."""
    gpu = repo / "group_vars" / "gpu.yaml"
    gpu.write_text(gpu.read_text() + "gpu_memory_budget: 0.1\n")
    thor = repo / "group_vars" / "thor.yaml"
    thor.write_text(thor.read_text() + "gpu_memory_budget: 0.2\n")
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(repo)
    said = {p.location.file: p.message for p in caught.value.problems}
    assert said["group_vars/gpu.yaml"].endswith("over the budget 0.1 (box spark)")
    assert said["group_vars/thor.yaml"].endswith("over the budget 0.2")


def test_one_problem_in_several_boxes_is_one_line_naming_them(repo: Path) -> None:
    """jetson.yaml is thor's and orin's; a problem every box has needs no names."""
    jetson = repo / "group_vars" / "jetson.yaml"
    assert "\nlanes:" not in jetson.read_text()
    jetson.write_text(jetson.read_text() + "lanes:\n  extra:\n    image: vllm\n")
    gpu = repo / "group_vars" / "gpu.yaml"  # every box's
    gpu.write_text(gpu.read_text().replace("\nlanes:\n", "\nlanes:\n  more:\n    image: vllm\n", 1))
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(repo)
    said = {p.path: p.message for p in caught.value.problems}
    assert said["lanes.extra.role"] == "required key is missing (boxes thor, orin)"
    assert said["lanes.more.role"] == "required key is missing"
