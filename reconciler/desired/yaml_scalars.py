"""What a YAML scalar or key of the desired state may be, and the plain value it becomes.

Shared by both ways a file is read (yaml_source.py's located loader and yaml_fast.py's C
path), so the two can only ever agree on what a value means. Tags are the strings the YAML
1.2 resolver gives; nothing here knows about nodes, events or files.
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_INT = 2**63  # every integer of the desired state fits a signed 64-bit value

CORE = "tag:yaml.org,2002:"
STR, INT, FLOAT, BOOL, NULL = (f"{CORE}{t}" for t in ("str", "int", "float", "bool", "null"))
MAP, SEQ, MERGE = f"{CORE}map", f"{CORE}seq", f"{CORE}merge"
# Implicit tags the 1.2 resolver gives plain scalars that we keep as the text they are.
AS_TEXT = frozenset({STR, f"{CORE}timestamp", f"{CORE}value", f"{CORE}yaml", "!"})
EXPLICIT_OK = frozenset({STR, INT, FLOAT, BOOL, NULL, MAP, SEQ, "!"})

# Not allowed anywhere in a value: C0 controls but TAB/LF/CR, DEL, C1 controls (a terminal
# reads some as escape sequences), surrogates, and the two non-characters YAML excludes.
BAD_CHAR = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
# A key is a name: no line breaks (U+2028 and U+2029 from `"\L"`, `"\P"` escapes too) or tabs
# either. Values may hold those two (a double-quoted text); the types of what reaches `.env`, a
# path or a command line refuse them there (types.py).
BAD_KEY_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\ufffe\uffff]")

_NULL_FORMS = ("", "~", "null", "Null", "NULL")
# Tags whose value is written back as text of our own making (`.env`): see `rewritten`.
NUMERIC = frozenset({INT, FLOAT, BOOL})


def as_text(value: bool | int | float | str) -> str:
    """The text a scalar's value reaches `.env` as (envfile.env_text): booleans as lobes
    writes them (true/false), numbers as Python prints them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def rewritten(tag: str, text: str, value: Any) -> bool:
    """Whether a number or boolean scalar would reach `.env` as other text than it is written
    (`0022` as 22, `1_000` as 1000, `0x10` as 16, `1e3` as 1000.0, `TRUE` as true): the loader
    refuses that under `env:` (the operator meant the text). Both readers ask this of the same
    source text (a plain scalar's value is its text), so they agree on every path."""
    return tag in NUMERIC and value is not None and as_text(value) != text


def char_name(char: str) -> str:
    code = ord(char)
    if 0xD800 <= code <= 0xDFFF:
        return f"lone surrogate U+{code:04X}"
    if code in (0xFFFE, 0xFFFF):
        return f"non-character U+{code:04X}"
    if code == 0x0D:
        return "carriage return without a line feed"
    if code == 0x2028:
        return "line separator U+2028"
    if code == 0x2029:
        return "paragraph separator U+2029"
    return f"control character U+{code:04X}"


def scalar_value(tag: str, value: str) -> tuple[Any, str | None]:
    """The plain value of a scalar with this (resolved or explicit) tag, and the problem that
    refuses it (None: none). `tag` is known to fit a scalar or the caller refuses it first."""
    if tag in AS_TEXT or tag == MERGE:  # `<<` as a value is just the text
        bad = BAD_CHAR.search(value)
        if bad:
            return value, f"{char_name(bad.group())} is not allowed in a value"
        return value, None
    if tag == NULL:
        if value not in _NULL_FORMS:
            return None, "!!null holds a value; write null or nothing"
        return None, None
    if tag == BOOL:
        lowered = value.lower()
        if lowered not in ("true", "false"):
            return lowered == "true", "!!bool value is not true or false"
        return lowered == "true", None
    if tag == INT:
        return integer(value)
    if tag == FLOAT:
        return number(value)
    return None, "not a scalar tag"


def integer(value: str) -> tuple[int | None, str | None]:
    text = value.replace("_", "")
    sign, digits = (-1, text[1:]) if text[:1] == "-" else (1, text.removeprefix("+"))
    base = {"0x": 16, "0o": 8, "0b": 2}.get(digits[:2].lower(), 10)
    digits = digits[2:] if base != 10 else digits
    try:
        if not digits.isalnum():
            raise ValueError
        found = sign * int(digits, base) if len(digits) <= 64 else MAX_INT
    except ValueError:
        return None, "!!int value is not an integer"
    if not -MAX_INT <= found < MAX_INT:
        return None, "integer out of range (more than 64 bits)"
    return found, None


def number(value: str) -> tuple[float | None, str | None]:
    text = value.replace("_", "").lower()
    try:
        if text.lstrip("+-") in (".inf", ".nan", "inf", "nan", "infinity"):
            raise OverflowError
        found = float(text)
        if not math.isfinite(found):
            raise OverflowError
    except OverflowError:
        return None, "number is not finite (.inf, .nan, or too large)"
    except ValueError:
        return None, "!!float value is not a number"
    return found, None
