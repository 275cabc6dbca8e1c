"""A large replay reads each snapshot file the index's digest vouches for with msgspec
(load_json(in_c=True), reconciler/fast_json.py): the same values as json, and for a damaged or
hostile file the same fault, word for word, as the json path gives; files without a digest and
live answers keep json with its duplicate-key check."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.observe import document
from reconciler.observe.document import Fault, FaultKind, load_json
from reconciler.observe.observe import load_snapshot, snapshot_observation

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents" / "snapshot"
THOR = (EXAMPLE / "thor.json").read_bytes()

# (file bytes, what the fault says): every fault json gives a file, through the C path.
FAULTS = [
    (THOR[: len(THOR) // 2], "line "),  # truncated: json's message, line and column
    (b'{"box": "thor", "elapsed_s": NaN}', "NaN is not a JSON number"),
    (b'{"box": "thor", "elapsed_s": -Infinity}', "-Infinity is not a JSON number"),
    (b'{"box": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested too deeply to parse"),
    (b'{"box": "thor", "n": ' + b"7" * 5000 + b"}", "a number too long to read"),
    (b'{"box": "th\xffor"}', "not UTF-8 (byte 11)"),
    (b'{"box": "th\xed\xa0\x80or"}', "not UTF-8 (byte 11)"),  # a surrogate in UTF-8
    (b"", "empty answer"),
    (b" \n ", "empty answer"),
    (b"\xef\xbb\xbf{}", "Unexpected UTF-8 BOM"),
    (b'{"box": "a\x01b"}', "Invalid control character"),
    (b'{"box": "thor",}', "Expecting property name enclosed in double quotes"),
    (b'{"box": "thor"} {}', "Extra data"),
]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(("data", "says"), FAULTS)
def test_every_fault_through_the_c_path_is_the_json_paths(
    data: bytes, says: str, tmp_path: Path
) -> None:
    c_read = load_json(data, keys_unique=True, in_c=True)
    assert isinstance(c_read, Fault) and c_read.kind is FaultKind.NOT_JSON
    assert says in c_read.what
    assert c_read == load_json(data, keys_unique=True)
    path = tmp_path / "thor.json"
    path.write_bytes(data)
    fast = snapshot_observation("thor", path, _digest(data), in_c=True)
    slow = snapshot_observation("thor", path, _digest(data))
    assert fast.failure == slow.failure and fast.failure is not None
    assert says in str(fast.failure)


def test_what_json_reads_without_asking_is_read_alike() -> None:
    # 1e400 is inf to json (parse_constant is for the NaN/Infinity words only): msgspec refuses
    # it, json reads it, as before; a lone surrogate escape is text to json.
    for data in (b'{"x": 1e400}', b'{"x": "\\ud800"}', b'{"x": 1, "x": 2}'):
        ours, theirs = (
            load_json(data, keys_unique=True, in_c=True),
            load_json(data, keys_unique=True),
        )
        assert repr(ours) == repr(theirs)


def test_too_large_is_refused_before_any_parser() -> None:
    fault = load_json(b"[" + b"1," * 100 + b"1]", 50, keys_unique=True, in_c=True)
    assert isinstance(fault, Fault) and fault.kind is FaultKind.TOO_LARGE


def _refuse_json(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("json.loads called")


def test_a_vouched_file_is_read_by_msgspec_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = load_json(THOR, keys_unique=True)
    monkeypatch.setattr(document.json, "loads", _refuse_json)
    assert load_json(THOR, keys_unique=True, in_c=True) == expected
    with pytest.raises(AssertionError, match=r"json\.loads called"):
        load_json(THOR, keys_unique=True)  # without in_c: json, as before


def test_without_a_digest_or_from_a_box_the_duplicate_key_check_stays(tmp_path: Path) -> None:
    data = b'{"box": "thor", "collected": {"collector": 1, "user": "a", "user": "b"}}'
    twice = load_json(data, in_c=True)  # not vouched for: json with the check
    assert isinstance(twice, Fault) and "a key appears twice" in twice.what
    path = tmp_path / "thor.json"
    path.write_bytes(data)
    wrong = snapshot_observation("thor", path, _digest(b"other"), in_c=True)
    assert wrong.failure is not None and "a key appears twice" in str(wrong.failure)
    assert "appears twice" in str(snapshot_observation("thor", path, None, in_c=True).failure)


def test_the_example_reads_the_same_both_ways(tmp_path: Path) -> None:
    _, observations = load_snapshot(EXAMPLE)
    for box in observations:
        data = (EXAMPLE / f"{box}.json").read_bytes()
        path = tmp_path / f"{box}.json"
        path.write_bytes(data)
        fast = snapshot_observation(box, path, _digest(data), in_c=True)
        slow = snapshot_observation(box, path, _digest(data))
        assert fast.failure is None and slow.failure is None
        assert json.dumps(fast.collected) == json.dumps(slow.collected)
        assert fast.controller == slow.controller
