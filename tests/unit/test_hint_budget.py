"""An invalid desired state is refused in about the time a valid one loads, however many
unknown names it holds: every problem is reported, the first MAX_HINTS get "did you mean"
(reconciler/desired/near.py), and group membership is checked against a set.

Before: an inventory naming thousands of unknown groups took minutes (a list scanned per
group, then difflib against every known group per unknown one).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reconciler.desired.load import load_fleet
from reconciler.desired.near import MAX_HINTS
from reconciler.desired.problems import DesiredStateError

INCIDENTS = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"
UNKNOWN = 3000


def with_groups(tmp_path: Path, known: int, unknown: int) -> Path:
    """The incidents' repository, thor in `unknown` groups group_order does not list, and
    group_order holding `known` more (similar names: difflib's quick filters pass them)."""
    repo = tmp_path / "repo"
    shutil.copytree(INCIDENTS, repo)
    inventory = repo / "inventory" / "lab.yaml"
    text = inventory.read_text()
    order = ", ".join(["gpu", "jetson", "dgx", *(f"grp{i:05d}" for i in range(known))])
    text = text.replace("group_order: [gpu, jetson, dgx]", f"group_order: [{order}]")
    wrong = ", ".join(f"grq{i:05d}" for i in range(unknown))
    text = text.replace("    groups: [gpu, jetson]\n", f"    groups: [gpu, jetson, {wrong}]\n", 1)
    inventory.write_text(text)
    return repo


def problems(repo: Path) -> list[str]:
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(repo, "lab")
    return [str(p) for p in caught.value.problems]


def test_every_unknown_group_is_reported_and_the_first_few_get_a_hint(tmp_path: Path) -> None:
    said = problems(with_groups(tmp_path, known=UNKNOWN, unknown=UNKNOWN))
    unknown = [p for p in said if "is not in group_order" in p]
    assert len(unknown) == UNKNOWN
    hinted = [p for p in unknown if "; did you mean 'grp" in p]
    assert len(hinted) == MAX_HINTS


def test_each_load_has_its_own_hints(tmp_path: Path) -> None:
    repo = with_groups(tmp_path, known=3, unknown=1)
    for _ in range(MAX_HINTS + 2):  # a budget spent by one load would leave the next without
        (said,) = [p for p in problems(repo) if "is not in group_order" in p]
        assert said.endswith("group 'grq00000' is not in group_order; did you mean 'grp00000'?")
