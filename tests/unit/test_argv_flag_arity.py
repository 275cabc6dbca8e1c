"""How many words a vLLM serve flag takes, as vLLM's argparse reads it: a boolean none
(`--enforce-eager M` serves M), a list every word up to the next option (`--served-model-name
a b`). Held to the lab's stand-in, whose parser declares vLLM's serve flags, and read by the
stand-in's own parser on the same lines."""

from __future__ import annotations

import argparse

import pytest

from lab.images import vllm_standin
from reconciler.compare.argv import diff_argv
from reconciler.compare.values import BOOLEAN_FLAGS, LIST_FLAGS, parse_argv


def _serve_actions() -> list[argparse.Action]:
    parser = vllm_standin.build_parser("0")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices["serve"]._actions)


def test_the_boolean_flags_are_the_stand_ins_and_take_no_word() -> None:
    declared = {
        option
        for action in _serve_actions()
        if isinstance(action, argparse.BooleanOptionalAction)
        for option in action.option_strings
    }
    assert declared == BOOLEAN_FLAGS


def test_the_list_flags_are_the_stand_ins_but_the_secret_one() -> None:
    declared = {
        option
        for action in _serve_actions()
        if action.nargs == "+"
        for option in action.option_strings
    }
    assert declared - {"--api-key"} == LIST_FLAGS  # --api-key: read by the secret-flag rule


LINES = [
    ["serve", "--enforce-eager", "Qwen/Qwen3-8B", "--port", "8001"],
    ["serve", "--no-enable-prefix-caching", "m", "--trust-remote-code"],
    ["serve", "m", "--served-model-name", "a", "b", "--port", "8002"],
    ["serve", "--served-model-name", "a", "b", "--enforce-eager"],
    ["serve", "m", "--cuda-graph-sizes", "1", "2", "4", "--seed", "-1"],
    ["serve", "m", "--max-model-len", "4096", "--enforce-eager"],
    ["serve", "m", "--served-model-name", "a", "-1", "-.5", "--port", "8003"],
]


@pytest.mark.parametrize("line", LINES, ids=[" ".join(line) for line in LINES])
def test_a_line_is_read_as_the_stand_ins_parser_reads_it(line: list[str]) -> None:
    ns = vllm_standin.build_parser("0").parse_args(line)
    positionals, flags = parse_argv(line)
    assert positionals == ["serve", *([ns.model_tag] if ns.model_tag else [])]
    for flag, values in flags.items():
        parsed = getattr(ns, flag[2:].removeprefix("no-").replace("-", "_"))
        if flag in BOOLEAN_FLAGS:
            assert values == [True] and parsed is not flag.startswith("--no-")
        elif flag in LIST_FLAGS:
            assert [str(v) for v in parsed] == values
        else:
            assert [str(parsed)] == values


def test_a_boolean_written_before_the_model_is_no_drift() -> None:
    """The render puts the model first; a hand-started lane put the flag first. Before, the
    model read as the flag's value: a changed flag and a missing model, and a recreate."""
    want = ("vllm", "serve", "Qwen/Qwen3-8B", "--enforce-eager", "--port", "8001")
    got = ("vllm", "serve", "--enforce-eager", "Qwen/Qwen3-8B", "--port", "8001")
    assert diff_argv(want[:1], want[1:], got[:1], got[1:]) == []
    other = ("vllm", "serve", "--enforce-eager", "Qwen/Qwen3-4B", "--port", "8001")
    [changed] = diff_argv(want[:1], want[1:], other[:1], other[1:])
    assert (changed.desired, changed.observed) == ("Qwen/Qwen3-8B", "Qwen/Qwen3-4B")


def test_a_list_flags_second_name_is_not_the_model() -> None:
    want = ("vllm", "serve", "m", "--served-model-name", "a", "b")
    got = ("vllm", "serve", "m", "--served-model-name", "a", "c")
    [changed] = diff_argv(want[:1], want[1:], got[:1], got[1:])
    assert changed.path == "--served-model-name"
    assert (changed.desired, changed.observed) == (("a", "b"), ("a", "c"))
