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
