"""Each box's managed `.env` is derived once on a load (to check it) and handed on from there,
never to a copy of the state with other boxes, and never remembered in the pickled state."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from reconciler import records
from reconciler.desired import envfile
from reconciler.desired.envfile import desired_env, fleet_env, mesh_seeds
from reconciler.desired.fleet import Fleet
from reconciler.desired.load import load_fleet

ROOT = Path(__file__).resolve().parents[2]


def _derived_anew(fleet: Fleet) -> dict[str, list[object]]:
    mesh = mesh_seeds(fleet)
    return {n: desired_env(b, fleet.inventory.boxes, mesh) for n, b in fleet.boxes.items()}


def test_a_loaded_state_hands_on_the_envs_it_checked_without_deriving_them_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet = load_fleet(ROOT, "hosts")
    expected = _derived_anew(fleet)

    def no_derive(*_args: object) -> None:
        raise AssertionError("an env was derived again")

    monkeypatch.setattr(envfile, "desired_env", no_derive)
    got = fleet_env(fleet, list(fleet.boxes))
    assert got == expected
    got["thor"].append(got["thor"][0])  # a caller's own list: the state's stays as it was
    assert fleet_env(fleet, ["thor"])["thor"] == expected["thor"]


def test_a_copy_with_other_boxes_derives_its_own_envs() -> None:
    fleet = load_fleet(ROOT, "hosts")
    thor = fleet.boxes["thor"]
    lobes = thor.lobes.model_copy(update={"profile": "changed"})
    boxes = {**fleet.boxes, "thor": thor.model_copy(update={"lobes": lobes})}
    copy = records.replace(fleet, boxes=boxes)
    env = {e.key: e.value for e in fleet_env(copy, ["thor"])["thor"]}
    assert env["LOBES_PROFILE"] == "changed"
    assert fleet_env(copy, list(copy.boxes)) == _derived_anew(copy)


def test_the_remembered_state_carries_no_envs() -> None:
    fleet = load_fleet(ROOT, "hosts")
    again = pickle.loads(pickle.dumps(fleet, protocol=5))
    assert fleet.envs is not None and again.envs is None
    assert again.boxes == fleet.boxes and again.seen == fleet.seen
    assert fleet_env(again, list(again.boxes)) == fleet_env(fleet, list(fleet.boxes))
