"""The observation document's bulk checks (reconciler/observe/document.py) accept and refuse
exactly what the per-entry checks do: an environment is read with C scans over its values and
one joined text, yet a control character, a wrong type or a bad secret anywhere in it is still
that box's fault, and the entries read are the same."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.observe import document
from reconciler.observe.document import Fault, FaultKind, SecretValue, parse_collected

THOR = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents" / "snapshot" / "thor.json"
DIGEST = "hmac:" + "ab" * 32


def _collected() -> dict[str, Any]:
    return json.loads(THOR.read_text(encoding="utf-8"))["collected"]


@pytest.mark.parametrize("code", range(128))
def test_a_long_ascii_text_is_printable_exactly_as_str_says(code: int) -> None:
    text = "A_NAME" * 60 + chr(code) + "TAIL"
    assert document._printable(text) is text.isprintable()
    assert document._printable(chr(code)) is chr(code).isprintable()


def test_non_ascii_text_takes_str_isprintable() -> None:
    assert document._printable("É" * 300) is True
    assert document._printable("É" * 300 + "\u200b") is False  # a zero-width space (Cf)


def test_mixed_environment_reads_every_entry() -> None:
    env = {"A": "1", "KEY": {"secret": DIGEST}, "B": "two", "C": "", "TOKEN": {"secret": DIGEST}}
    out = document._env(env, "x.env")
    assert set(out) == set(env)
    assert out["A"] == "1" and out["B"] == "two" and out["C"] == ""
    assert isinstance(out["KEY"], SecretValue) and out["KEY"].digest == DIGEST
    assert isinstance(out["TOKEN"], SecretValue)
    assert list(out) == ["A", "B", "C", "KEY", "TOKEN"]  # the text, then the secrets


@pytest.mark.parametrize(
    ("value", "what"),
    [
        (None, "expected a string, got null"),
        (7, "expected a string, got an integer"),
        ({"secret": "hmac:zz"}, "keyed digest"),
        ({"secret": DIGEST, "more": 1}, "not a hashed secret"),
    ],
)
def test_a_wrong_value_in_a_long_environment_is_located(value: Any, what: str) -> None:
    raw = _collected()
    env = raw["docker"]["containers"][0]["env"]
    env["BROKEN"] = value
    fault = parse_collected(raw, complete=False, version=1)
    assert isinstance(fault, Fault) and fault.kind is FaultKind.MALFORMED
    assert what in fault.what
    assert fault.path is not None and ".env.BROKEN" in fault.path


@pytest.mark.parametrize("bad", ["\x00", "\x1b", "\x7f", "\u2028"])
def test_a_control_character_in_a_name_is_a_fault(bad: str) -> None:
    raw = _collected()
    env = raw["docker"]["containers"][0]["env"]
    assert sum(map(len, env)) > 256  # the joined names take the bulk scan
    env[f"BAD{bad}NAME"] = "x"
    fault = parse_collected(raw, complete=False, version=1)
    assert isinstance(fault, Fault) and fault.kind is FaultKind.MALFORMED
    assert "control characters" in fault.what


def test_the_same_document_as_before_on_a_real_capture() -> None:
    raw = _collected()
    doc = parse_collected(copy.deepcopy(raw), complete=False, version=1)
    assert not isinstance(doc, Fault)
    for container, source in zip(doc.containers, raw["docker"]["containers"], strict=True):
        assert set(container.env) == set(source["env"])
        for key, value in source["env"].items():
            got = container.env[key]
            if isinstance(value, str):
                assert got == value
            else:
                assert isinstance(got, SecretValue) and got.digest == value["secret"]


def test_a_bad_token_in_a_plain_command_line_is_located() -> None:
    raw = _collected()
    container = raw["docker"]["containers"][0]
    container["cmd"] = ["serve", "--port", "8000", "x" * (document.MAX_TEXT + 1)]
    fault = parse_collected(raw, complete=False, version=1)
    assert isinstance(fault, Fault) and fault.kind is FaultKind.MALFORMED
    assert fault.path == "docker.containers[0].cmd[3]" and "longer than" in fault.what


def test_a_name_list_with_a_number_is_located() -> None:
    raw = _collected()
    raw["current_env_keys"] = ["A", "B", 3]
    fault = parse_collected(raw, complete=False, version=1)
    assert isinstance(fault, Fault) and fault.path == "current_env_keys[2]"
