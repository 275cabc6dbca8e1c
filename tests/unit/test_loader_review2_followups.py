"""Two follow-ups of the loader's review: an entry of group_vars/ the loader refuses (a
directory, `x.YAML`) added after a state was remembered is met by a cached command as by
`validate`, never hidden by the cache; and a `%YAML` directive is named at its own line."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.desired.cache import load_fleet_cached
from reconciler.desired.fingerprint import layer_listing
from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError


@pytest.mark.parametrize("entry", ["spark.YAML", "orin"])
def test_a_refused_entry_added_after_a_remembered_state_is_met_by_a_cached_load(
    repo: Path, entry: str
) -> None:
    load_fleet_cached(repo, "hosts")  # remembered
    added = repo / "group_vars" / entry
    if "." in entry:
        added.write_text("gateway:\n  port: 8000\n")
    else:
        added.mkdir()
        (added / "main.yaml").write_text("gateway:\n  port: 8000\n")
    with pytest.raises(DesiredStateError) as caught:
        load_fleet_cached(repo, "hosts")
    assert any(entry in str(p) for p in caught.value.problems), caught.value.problems


def test_a_hidden_entry_changes_no_listing(repo: Path) -> None:
    before = layer_listing(repo)
    (repo / "group_vars" / ".all.yaml.swp").write_text("x")
    assert layer_listing(repo) == before


def test_a_yaml_directive_is_named_at_its_line(repo: Path) -> None:
    layer = repo / "group_vars" / "gpu.yaml"
    layer.write_text("%YAML 1.1\n---\n" + layer.read_text())
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(repo)
    assert [str(p.location) for p in caught.value.problems] == ["group_vars/gpu.yaml:1:1"]


@pytest.mark.parametrize(
    "leftover",
    [
        "thor.yaml~",
        "#all.yaml#",
        "gpu.yaml.orig",
        "gpu.yaml.rej",
        "all.yaml.bak",
        "README",
        "README.md",
        "notes.md",
        "all.yaml.dpkg-old",
        "all.yaml.rpmnew",
    ],
)
def test_an_editors_or_a_merges_leftover_is_neither_read_nor_refused(
    repo: Path, leftover: str
) -> None:
    """Refusing them stopped every command (validate, drift, apply, pyinfra) over a backup file
    an editor left behind; they hold no layer, so they change no state and no cache either."""
    before = layer_listing(repo)
    (repo / "group_vars" / leftover).write_text("gatewya: not yaml a layer would take\n")
    assert len(load_fleet(repo).boxes) == 3
    assert layer_listing(repo) == before


@pytest.mark.parametrize("misnamed", ["spark.YAML", "spark.yaml.txt", "thor.json"])
def test_a_misnamed_layer_is_still_refused(repo: Path, misnamed: str) -> None:
    (repo / "group_vars" / misnamed).write_text("gateway:\n  port: 8000\n")
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(repo)
    assert any(misnamed in str(p) for p in caught.value.problems)
