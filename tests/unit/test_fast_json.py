"""reconciler/fast_json.py: msgspec writes the report and reads the snapshot files of large runs,
with exactly json's text, values and faults.

Writing: a property over JSON values shaped like a report's (nested objects and lists, text
with control characters, quotes, backslashes, non-ASCII, U+2028, ints of any size, floats,
NaN) holds `dumps_indented(v) == json.dumps(v, indent=2, ensure_ascii=False, allow_nan=False)`
or the same exception; the C path alone is checked too, so the property is not met by always
falling back. Reading: whatever msgspec reads, json reads the same; whatever it refuses, the
caller reads with json (tests/unit/test_snapshot_fast_read.py checks the faults end to end).
"""

from __future__ import annotations

import json
import subprocess
import sys
from enum import StrEnum
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler import fast_json
from reconciler.fast_json import _same_text, decode_written, dumps_indented

# Text as a box's values hold it: every code point, control characters and the JSON
# escapes (quote, backslash) made likely, U+2028/U+2029 and non-BMP among them.
_SPECIAL = st.sampled_from(['"', "\\", "\n", "\t", "\x00", "\x1f", "\x7f", "\u2028", "é", "😀"])
TEXT = st.lists(st.one_of(st.characters(), _SPECIAL), max_size=12).map("".join)
# Without lone surrogates (not UTF-8: msgspec refuses to write them, json.dumps writes them).
VALID_TEXT = st.lists(
    st.one_of(st.characters(exclude_categories=("Cs",)), _SPECIAL), max_size=12
).map("".join)
SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
NUMBERS = st.one_of(
    st.integers(),  # unbounded: beyond 64 bits too
    st.integers(min_value=-(2**63) - 2, max_value=2**64 + 2),
    st.floats(),  # NaN and infinities included: json refuses them, msgspec writes null
)
LEAVES = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)


def _values(
    leaves: st.SearchStrategy[Any], keys: st.SearchStrategy[str] = TEXT
) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=5), st.dictionaries(keys, inner, max_size=5)
        ),
        max_leaves=25,
    )


VALUES = _values(LEAVES)
ROOT = Path(__file__).resolve().parents[2]


def _stdlib(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)


def _same_as_json(value: Any) -> None:
    try:
        expected = _stdlib(value)
    except Exception as exc:  # json's refusal must be the one the caller gets
        with pytest.raises(type(exc)) as got:
            dumps_indented(value)
        assert str(got.value) == str(exc)
        return
    assert dumps_indented(value) == expected


def _c_text(value: Any) -> str:
    return msgspec.json.format(msgspec.json.encode(value), indent=2).decode()


def _has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        value = list(value.values())
    return isinstance(value, list) and any(map(_has_float, value))


@settings(max_examples=60, deadline=None)
@given(VALUES)
def test_the_text_or_the_error_is_json_dumps(value: Any) -> None:
    _same_as_json(value)


@settings(max_examples=60, deadline=None)
@given(
    _values(
        st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), VALID_TEXT),
        VALID_TEXT,
    )
)
def test_msgspec_itself_writes_json_dumps_text_without_floats(value: Any) -> None:
    # The C path alone, on what dumps_indented sends it: byte for byte.
    assert _same_text(value)
    assert _c_text(value) == _stdlib(value)


@settings(max_examples=60, deadline=None)
@given(_values(st.one_of(LEAVES, st.floats(allow_nan=False, allow_infinity=False))))
def test_msgspec_floats_differ_in_notation_only(value: Any) -> None:
    # Where json spells a float otherwise (1e+16, msgspec 1e16), both read back equal; those
    # values go to json.dumps (_same_text), so the report's text never changes.
    try:
        expected = _stdlib(value)
        ours = _c_text(value)
    except (ValueError, msgspec.EncodeError):
        return  # a lone surrogate is not reachable here; big ints are the property above
    assert json.loads(ours) == json.loads(expected)
    if not _has_float(value):
        assert ours == expected


@pytest.mark.parametrize(
    "value",
    [
        {"a": "\ud800"},  # a lone surrogate: msgspec refuses it (not UTF-8), json writes it
        ["ok", "x\udfff"],
        2**64,  # ints beyond 64 bits
        -(2**63) - 1,
        {"n": 10**30},
        [10**5000],  # json refuses a number of more than 4,300 digits: ValueError
        float("nan"),  # json refuses it (allow_nan=False), msgspec would write null
        [1.0, float("inf")],
        {"x": float("-inf")},
        1e16,  # json's 1e+16
        [1e-7, 0.5],
        {1: "a", 2.5: "b"},  # json writes non-text keys as text
        {True: 1, None: 2},
        {"s": {1, 2}},  # json refuses a set: TypeError, same message
        {"when": b"bytes"},  # msgspec would write base64
    ],
)
def test_what_msgspec_cannot_write_alike_goes_to_json(value: Any) -> None:
    _same_as_json(value)


class Colour(StrEnum):
    RED = "red"


def test_subclasses_and_deep_or_circular_values_go_to_json() -> None:
    _same_as_json({"c": Colour.RED, Colour.RED: 1})
    deep: Any = "leaf"
    for _ in range(150):
        deep = [deep]
    assert not _same_text(deep)
    _same_as_json(deep)
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference detected"):
        dumps_indented(loop)
    _same_as_json([deep] * 3)


def test_a_plain_report_shaped_value_takes_the_c_path() -> None:
    value = {"schema": "x", "boxes": [{"box": "thor", "drifts": [{"desired": 1, "n": None}]}]}
    assert _same_text(value)
    assert not _same_text({"f": 1e16}) and _same_text({"f": 0.5})


# -- reading ---------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(_values(st.one_of(LEAVES, st.text(SURROGATES, max_size=2))))
def test_what_msgspec_reads_json_reads_the_same(value: Any) -> None:
    try:
        text = json.dumps(value, indent=1, ensure_ascii=bool(len(repr(value)) % 2))
    except ValueError:
        return
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        data = text.encode("utf-8", "surrogatepass")  # not UTF-8: both must refuse it
    try:
        ours = decode_written(data)
    except ValueError:
        return  # refused: the caller reads it with json (test_snapshot_fast_read.py)
    expected = json.loads(data.decode("utf-8"))
    assert ours == expected or (ours != ours and expected != expected)  # NaN is never equal
    assert json.dumps(ours) == json.dumps(expected)  # int stays int, key order kept


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=40) | st.text(max_size=30).map(str.encode))
def test_arbitrary_bytes_msgspec_never_reads_what_json_refuses(data: bytes) -> None:
    try:
        ours = decode_written(data)
    except ValueError:
        return
    expected = json.loads(data.decode("utf-8"))
    assert json.dumps(ours) == json.dumps(expected)


@pytest.mark.parametrize(
    "data",
    [
        b"NaN",
        b"[Infinity]",
        b"[-Infinity]",
        b"[1e400]",  # json reads inf without asking parse_constant
        b"1" * 4301,
        b"",
        b"  ",
        b"\xef\xbb\xbf{}",  # a BOM
        b'"\\ud800"',
        b'"\xed\xa0\x80"',  # a surrogate as UTF-8 bytes
        b'"a\x01"',
        b"\xff",
        b"[1,]",
        b'{"a" 1}',
        b"{} x",
    ],
)
def test_msgspec_refuses_what_json_reads_otherwise(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_written(data)


def test_duplicate_keys_read_alike_first_place_last_value() -> None:
    data = b'{"a": 1, "b": 2, "a": 3}'
    assert list(decode_written(data).items()) == list(json.loads(data).items())


@pytest.mark.parametrize("extra", [0, 5, 40])
def test_nesting_msgspec_refuses_before_json_does(extra: int) -> None:
    # Both count depth against the recursion limit from where they run: whatever depth json
    # refuses from here, msgspec refuses too (from `extra` frames deeper or not).
    def at_depth(frames: int, depth: int) -> tuple[bool, bool]:
        if frames:
            return at_depth(frames - 1, depth)
        data = b"[" * depth + b"]" * depth
        try:
            json.loads(data)
            json_ok = True
        except RecursionError:
            json_ok = False
        try:
            decode_written(data)
            c_ok = True
        except ValueError:
            c_ok = False
        return json_ok, c_ok

    limit = sys.getrecursionlimit()
    for depth in range(limit - 60, limit + 5):
        json_ok, c_ok = at_depth(extra, depth)
        assert json_ok or not c_ok, depth
    assert at_depth(extra, 500) == (True, True)


# A run of `boxes` boxes rendered in a fresh interpreter: msgspec imported or not, and the text
# against json.dumps of the same document.
_RENDER = """
import json, sys
from reconciler.compare.drift import Action, BoxResult, Drift, DriftReport, Kind, SecretValue
from reconciler.report.json_report import render_json, to_document
def box(i):
    drifts = (
        Drift(f"b{i}", Kind.ENVFILE, "file:.env", "K", "new\\u2028\\x01 \\"é\\"", None,
              Action.REWRITE_ENV),
        Drift(f"b{i}", Kind.CONTRACT, "gateway", "ctx", 262144, 2**70, Action.RECREATE_GATEWAY),
        Drift(f"b{i}", Kind.SHELL_LEAK, "shell", "KEY", SecretValue("hmac:" + "a" * 64), 0.25,
              Action.SCRUB_SHELL, note="x"),
    )
    return BoxResult(f"b{i}", i % 7 != 3, drifts=drifts, facts={"mem": 1.5, "n": i})
r = DriftReport(tuple(box(i) for i in range(int(sys.argv[1]))), "lab", "t", "r")
text = render_json(r)
same = text == json.dumps(to_document(r), indent=2, ensure_ascii=False, allow_nan=False) + "\\n"
print("msgspec" in sys.modules, same)
"""


@pytest.mark.parametrize(("boxes", "imported"), [(3, False), (fast_json.LARGE, True)])
def test_a_report_is_json_dumps_text_and_msgspec_only_for_a_large_one(
    boxes: int, imported: bool
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _RENDER, str(boxes)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == [str(imported), "True"]
