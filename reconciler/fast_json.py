"""JSON in C (msgspec) where it gives exactly what the stdlib `json` gives: the same text out,
the same values in, the same faults.

A 1,000-box replay reads 141 MB of snapshot files and writes a 33 MB report; `json.loads` and
the pure-Python indenting encoder behind `json.dumps(indent=2)` were a third of its time
(BENCHMARKS.md, issue 12). msgspec does both in C. It is imported only by the callers that
pay for it (`LARGE`): its import (typing_extensions, uuid, decimal) costs ~10 ms, more than
it saves on a three-box run, whose reports and snapshot files stay with `json`.

Neither function changes a result: anything msgspec would write or read differently from
`json` goes to `json` itself, so its output and its errors are today's.
"""

from __future__ import annotations

import json
from typing import Any

# From this many boxes in a run, importing msgspec is cheaper than json's extra time (~0.4 ms
# of json.dumps per box report written, ~1 ms of json.loads per snapshot file read).
LARGE = 32

# Containers deeper than this go to json.dumps: its indenting encoder recurses in Python and
# refuses (RecursionError) a depth msgspec would write. A report nests about 8 levels.
_MAX_DEPTH = 100
_TEXT = frozenset({str, bool, type(None)})
_PLAIN = frozenset({str, bool, type(None), int, float, dict, list, tuple})
_INT64_LO, _UINT64_HI = -(2**63), 2**64


def dumps_indented(value: Any) -> str:
    """`json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)`, in C where that
    gives the same text (`_same_text`); the same text, or the same exception, in any case."""
    if _same_text(value):
        from msgspec import MsgspecError
        from msgspec import json as c_json

        try:
            return c_json.format(c_json.encode(value), indent=2).decode("utf-8")
        except (MsgspecError, ValueError, TypeError, OverflowError, RecursionError):
            pass  # a lone surrogate (not UTF-8): json.dumps writes it, as it always did
    return json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)


def _same_text(value: Any) -> bool:
    """Whether msgspec writes `value` exactly as json.dumps does: plain JSON types only (no
    subclass: a StrEnum, an OrderedDict), text keys, ints within 64 bits, floats that json
    and msgspec spell alike (json writes `1e+16`, msgspec `1e16`; NaN: json refuses it,
    msgspec writes null), no deeper than _MAX_DEPTH (and so no cycle). A C pass over each
    container's types; only containers holding numbers or containers are looked into."""
    pending: list[tuple[Any, int]] = [((value,), 0)]
    while pending:
        values, depth = pending.pop()
        kinds = set(map(type, values))
        if kinds <= _TEXT:
            continue
        if not kinds <= _PLAIN or depth > _MAX_DEPTH:
            return False
        for item in values:
            kind = type(item)
            if kind is int:
                if not _INT64_LO <= item < _UINT64_HI:
                    return False
            elif kind is float:
                if not _same_float(item):
                    return False
            elif kind is dict:
                if item and set(map(type, item)) != {str}:
                    return False  # json.dumps turns 1, 1.5, True, None keys into text
                pending.append((item.values(), depth + 1))
            elif kind is list or kind is tuple:
                pending.append((item, depth + 1))
    return True


def _same_float(number: float) -> bool:
    from msgspec import json as c_json

    return c_json.encode(number) == float.__repr__(number).encode("ascii")


def loads_bytes(data: bytes) -> Any:
    """`json.loads` of UTF-8 bytes, with every fault a ValueError: not UTF-8, not JSON, and
    nesting past json's depth (a RecursionError from json itself)."""
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("nested too deeply to parse") from None


def decode_written(data: bytes) -> Any:
    """A JSON document this tool wrote (no key repeated: msgspec, like json without a hook,
    keeps the last of two) -> the values `json.loads(data.decode())` gives, or ValueError.

    Anything msgspec refuses raises (the caller then reads it with json, for json's own
    fault). What msgspec reads, json reads the same: checked for every fault a box or a file
    can make (tests/unit/test_fast_json.py), except nesting: both count it against the
    interpreter's recursion limit from where they are called, and json.loads adds three
    frames before its scanner starts, so msgspec is called deeper still (`_deeper`): a
    document json finds too deep, msgspec refuses first."""
    from msgspec import MsgspecError

    try:
        return _deeper(data, _EXTRA_FRAMES)
    except (MsgspecError, RecursionError) as exc:
        raise ValueError("not read by msgspec") from exc


# json.loads -> JSONDecoder.decode -> raw_decode: three Python frames before json's scanner;
# a few more here, so msgspec's nesting limit is always below json's.
_EXTRA_FRAMES = 6


def _deeper(data: bytes, frames: int) -> Any:
    if frames:
        return _deeper(data, frames - 1)
    return _decoder().decode(data)


_DECODER: list[Any] = []


def ready_decoder() -> None:
    """Import msgspec and make the decoder now: before a replay forks its workers
    (reconciler/replay_workers.py), which then share it instead of each importing msgspec."""
    _decoder()


def _decoder() -> Any:
    if not _DECODER:
        from msgspec import json as c_json

        _DECODER.append(c_json.Decoder())
    return _DECODER[0]
