"""is_secret_name remembers its floor verdict per short name (a report asks it of every
drift's path): the answer is the floor's, asked once or many times, short name or long."""

from __future__ import annotations

import fnmatch

import pytest

from reconciler.desired.secret_names import FLOOR, is_secret_name


def _floor(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name.upper(), p) for p in FLOOR)


@pytest.mark.parametrize(
    "name",
    ["GATEWAY_API_KEY", "hf_token", "LOBES_MESH_SEEDS", "MY_SECRET_THING", "TOKENIZERS_PARALLELISM",
     "X" * 100 + "_PASSWORD", "X" * 100 + "_HARMLESS", "db_passwd", ""],
)  # fmt: skip
def test_the_floor_answers_alike_every_time(name: str) -> None:
    assert [is_secret_name(name) for _ in range(3)] == [_floor(name)] * 3


def test_some_floor_names_are_secret_and_some_are_not() -> None:
    assert is_secret_name("GATEWAY_API_KEY") and is_secret_name("X" * 100 + "_PASSWORD")
    assert not is_secret_name("LOBES_MESH_SEEDS") and not is_secret_name("X" * 100 + "_HARMLESS")
