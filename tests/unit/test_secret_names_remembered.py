"""is_secret_name remembers its floor verdict per short name (a report asks it of every
drift's path): the answer is the floor's, asked once or many times, short name or long."""

from __future__ import annotations

import fnmatch

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


# Configured globs are matched as one regular expression (secret_names._any_of): the verdict
# must stay fnmatch's, pattern by pattern, for any glob a fleet may write (`*`, `?`, `[...]`,
# `[!...]`, an unclosed `[`, regex metacharacters taken literally) and any name.
GLOB_CHARS = st.sampled_from(list("AB_Kk*?[]!-.^$+(){}|\\"))
GLOBS = st.lists(st.text(GLOB_CHARS, max_size=8), max_size=4)
NAMES = st.text(st.sampled_from(list("AB_Kk[]!-.^$+(){}|\\\n")), max_size=10)


@given(NAMES, GLOBS)
def test_configured_globs_match_as_fnmatch_does(name: str, globs: list[str]) -> None:
    by_fnmatch = any(fnmatch.fnmatchcase(name, p) for p in globs) or _floor(name)
    assert is_secret_name(name, globs) == by_fnmatch
    assert is_secret_name(name, tuple(globs)) == by_fnmatch


def test_a_configured_glob_adds_a_name_the_floor_does_not_hold() -> None:
    assert not is_secret_name("DB_CRED")
    assert is_secret_name("DB_CRED", ["DB_*", "*_PIN"])
    assert is_secret_name("X_PIN", ("DB_*", "*_PIN"))
    assert not is_secret_name("db_cred", ["DB_*"])  # a configured glob matches case as written
