"""compare/values.py's fast paths agree with their plain definitions: parse_argv with
argv_items' walk (the one the argv kind uses), changed_keys with a key-by-key diff."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from reconciler.compare.values import argv_items, changed_keys, parse_argv
from reconciler.observe.document import SecretValue

DIGEST = "hmac:" + "cd" * 32
TOKENS = st.one_of(
    st.sampled_from(["--port", "--port=8000", "--x=", "--", "8000", "serve", "-v", ""]),
    st.sampled_from(['--api-key={"secret": "' + DIGEST + '"}', '--k={"secret": 1}']),
    st.builds(SecretValue, st.just(DIGEST)),
    st.text(max_size=6).map(lambda t: "--" + t),
    st.text(max_size=6),
)
VALUES = st.one_of(st.text(max_size=3), st.builds(SecretValue, st.sampled_from([DIGEST, "x"])))


def _reference_argv(argv: Any) -> tuple[list[Any], dict[str, list[Any]]]:
    positionals: list[Any] = []
    flags: dict[str, list[Any]] = {}
    for _, name, parsed in argv_items(argv):
        if name is not None:
            flags.setdefault(name, []).append(parsed)
        elif not isinstance(parsed, bool):
            positionals.append(parsed)
    return positionals, flags


@given(st.one_of(st.none(), st.lists(TOKENS, max_size=12), st.tuples(TOKENS, TOKENS)))
def test_parse_argv_is_argv_items_walk(argv: Any) -> None:
    assert parse_argv(argv) == _reference_argv(argv)


def test_parse_argv_on_a_real_command_line() -> None:
    positionals, flags = parse_argv(
        ["serve", "/models/x", "--port", "8000", "--enforce-eager", "--max-model-len=4096"]
    )
    assert positionals == ["serve", "/models/x"]
    assert flags == {"--port": ["8000"], "--enforce-eager": [True], "--max-model-len": ["4096"]}


ENVS = st.dictionaries(st.sampled_from("ABCDEF"), VALUES)


@given(ENVS, ENVS)
def test_changed_keys_is_the_key_by_key_diff(a: dict[str, Any], b: dict[str, Any]) -> None:
    want = {
        k: (a.get(k), b.get(k))
        for k in sorted(a.keys() | b.keys())
        if k not in a or k not in b or a[k] != b[k]
    }
    got = changed_keys(a, b)
    assert got == want and list(got) == list(want)


def test_changed_keys_with_an_unhashable_value_still_diffs() -> None:
    assert changed_keys({"A": ["x"], "B": "1"}, {"A": ["x"], "B": "2"}) == {"B": ("1", "2")}  # type: ignore[dict-item]
