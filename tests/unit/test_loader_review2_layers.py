"""Every layer is judged, and every entry of group_vars/ is accounted for (review 2, item 3): a
layer no box uses (a group with no member yet), or a value a later layer replaces for every
box, was never checked; group_vars/orin/main.yaml (Ansible's layout) and spark.YAML were
skipped in silence."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError


def _problems(repo: Path) -> list[str]:
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(repo)
    return [str(p) for p in caught.value.problems]


def _with_unused_group(repo: Path, layer: str) -> None:
    inventory = repo / "inventory" / "hosts.yaml"
    text = inventory.read_text()
    inventory.write_text(text.replace("[gpu, jetson, dgx]", "[gpu, jetson, dgx, spare]", 1))
    (repo / "group_vars" / "spare.yaml").write_text(layer)


def test_a_layer_no_box_uses_is_judged_on_its_own(repo: Path) -> None:
    """Only what is wrong with it: keys it leaves to other layers (a lane's role, a secret's
    source, everything else) are not asked of it."""
    _with_unused_group(
        repo,
        "gatewya:\n"
        "  port: 1\n"
        "gateway:\n"
        "  port: 99999\n"
        "env:\n"
        '  FOO: "a\\nb"\n'
        "lanes:\n"
        "  worker:\n"
        "    max_model_len: 4096\n"
        "secrets:\n"
        "  gateway_api_key: {path: ~/.lobes/other.env}\n",
    )
    assert _problems(repo) == [
        "group_vars/spare.yaml:1:1: gatewya: unknown key; did you mean 'gateway'?",
        "group_vars/spare.yaml:4:3: gateway.port: input should be less than or equal to 65535 "
        "(got 99999)",
        "group_vars/spare.yaml:6:3: env.FOO: an .env value cannot contain a line feed (the "
        "value is not shown)",
    ]


def test_a_value_every_box_replaces_is_still_judged(repo: Path) -> None:
    gpu = repo / "group_vars" / "gpu.yaml"
    gpu.write_text(gpu.read_text() + "gateway:\n  port: 0\n")
    for box in ("thor", "spark", "orin"):
        layer = repo / "group_vars" / f"{box}.yaml"
        layer.write_text(layer.read_text() + "gateway:\n  port: 8000\n")
    (said,) = _problems(repo)
    assert said.startswith("group_vars/gpu.yaml:") and ": gateway.port: input should be " in said


def test_an_unused_layers_value_is_hidden_by_every_layers_secret_patterns(repo: Path) -> None:
    """all.yaml's secret_patterns name the key secret: the unused layer's value stays unshown,
    as it would in a box's merged data."""
    all_yaml = repo / "group_vars" / "all.yaml"
    text = all_yaml.read_text()
    assert "\nsecret_patterns:" in text
    all_yaml.write_text(text.replace("\nsecret_patterns: [", '\nsecret_patterns: ["SESAME_*", ', 1))
    _with_unused_group(repo, "env:\n  SESAME_X: [hunter2-sesame]\n")
    (said,) = _problems(repo)
    assert said.startswith("group_vars/spare.yaml:2:3: env.SESAME_X: ")
    assert "hunter2" not in said


def test_every_other_entry_of_group_vars_is_an_error_naming_it(repo: Path) -> None:
    folder = repo / "group_vars"
    (folder / "orin").mkdir()
    (folder / "orin" / "main.yaml").write_text("gateway:\n  port: 9000\n")
    (folder / "spark.YAML").write_text("gateway:\n  port: 9000\n")
    (folder / "notes.txt").write_text("todo\n")
    (folder / ".all.yaml.swp").write_bytes(b"\0vim swap")  # hidden: an editor's, not a layer
    assert _problems(repo) == [
        "group_vars/notes.txt:1:1: not a layer: group_vars/ holds only NAME.yaml (or NAME.yml) "
        "files",
        "group_vars/orin:1:1: a directory: a layer is one file, group_vars/NAME.yaml (Ansible's "
        "group_vars/NAME/ directories are not read)",
        "group_vars/spark.YAML:1:1: not read: a layer's name ends in .yaml or .yml, lowercase; "
        "rename it spark.yaml",
    ]
