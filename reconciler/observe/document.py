"""A box's answer, parsed once into a typed, versioned observation document.

Everything the controller learns about a box crosses one boundary: the JSON the collector
prints (reconciler/observe/remote/collector.py) and the controller's own gateway probes
(reconciler/observe/probes.py, audit/probes.py). A box may be broken or hostile, so its answer
is read here exactly once, before anything else looks at it:

1. the raw text: at most `MAX_ANSWER_BYTES`, UTF-8, one JSON document without NaN/Infinity,
   duplicate keys or absurd nesting (`load_json`);
2. the document: every field the tool reads has one type and a range, checked here
   (`parse_collected`, `parse_probes`); keys it does not read are ignored, so a newer collector
   may add some.

The result is either a frozen document (`Observed`, `ControllerProbes`) or a `Fault` of that
box, never an exception: the other boxes of a run are compared and reported as usual. A fault
names the field path and what was wrong with it, never the value (a box's values may be
secrets, or text crafted to mislead a reader).

Records (reconciler/records.py), not pydantic: a repeated `reconcile drift` imports this
module on its fast path, which must stay as light as BENCHMARKS.md says (no pydantic, no
ruamel, no dataclasses there). The document classes are `eq=False`: a document is only ever
read field by field, never compared whole.

A field the collector always writes must be present in a live answer (`complete=True`); a saved
snapshot may hold a document cut down to what one command reads (tests/fixtures/audit keep a
few KB per box), so a snapshot is read with absent fields taken as not observed
(`complete=False`). A field present with the wrong type is a fault either way.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from itertools import compress
from typing import Any, Literal, NoReturn, TypeVar

from reconciler.records import field, record_class

T = TypeVar("T")

# The document classes are records (reconciler/records.py: frozen as mypy checks them, no
# dataclasses import on the drift path) compared by identity (`eq=False`): nothing compares a
# document whole, and identity is what a parsed answer's parts are. No field `repr` either
# (`repr=False`, as before): a box's values never reach a text through one.


# What this reconciler reads: the collector's `collector` field. A collector that changes the
# meaning of a field bumps it, and an answer in a version not listed here is refused whole.
COLLECTOR_VERSIONS = frozenset({1})

# The raw answer's size limit, checked before json.loads. A real answer is 120-160 KB (the
# lab's three boxes; a box with a dozen lanes stays under 1 MB: the size grows with the
# number of containers and the length of their environments). 8 MiB leaves room for 50x that
# while bounding what a hostile box can make the controller hold: json.loads needs about ten
# times the text's size in objects, so one box can cost at most ~100 MB, not unbounded.
MAX_ANSWER_BYTES = 8 * 1024 * 1024
# Nesting: the deepest real answer is 8 levels (a capabilities replica's fingerprint). A box's
# answer, a gateway's body and any value kept without a fixed shape (a compose port entry, a key
# this reconciler does not read, kept as received) nest this deep at most (`load_json`): what is
# kept is written again by a snapshot's json.dumps, whose indenting encoder recurses in Python.
MAX_DEPTH = 32
# A snapshot file holds the answer one level down (`collected`), and the controller's probes
# with the gateway's bodies a few levels down (`controller.audit.weakest_link[i].body`).
SNAPSHOT_DEPTH = MAX_DEPTH + 8
# Any one list or mapping: far above a real box (100 .env lines, 5 containers, 250 compose
# variables), low enough that every comparison stays linear in a bounded input.
MAX_ITEMS = 20_000
# Any one string: the longest real one is a compose file list or a speculative config (<1 KB).
MAX_TEXT = 64 * 1024
_MAX_INT = 2**53  # JSON's safe integers; anything bigger is not a count, size or code


# -- faults ----------------------------------------------------------------------------------------
class FaultKind(StrEnum):
    UNREACHABLE = "unreachable"  # no answer: ssh refused, timed out, could not start
    COLLECTOR_FAILED = "collector-failed"  # the program ran and exited non-zero
    NOT_JSON = "not-json"  # truncated, not UTF-8, NaN, duplicate keys, too deep to parse
    TOO_LARGE = "too-large"  # over MAX_ANSWER_BYTES, refused before parsing
    MALFORMED = "malformed"  # JSON, but a field the tool reads has the wrong type or range
    UNSUPPORTED_VERSION = "unsupported-version"  # a collector version this reconciler can't read
    NOT_OBSERVED = "not-observed"  # nothing to read (a box missing from a snapshot)
    RECORDED = "recorded"  # a snapshot's box that was not observed then (its text only)


CONTROLLER_PART = "controller"  # parse_probes' paths: the controller's probes, not the box's


@record_class()
class Fault:
    """Why one box's answer cannot be used. `path` is the field path for MALFORMED (and the
    version field for UNSUPPORTED_VERSION); `what` says what was wrong, without the value."""

    kind: FaultKind
    what: str
    path: str | None = None

    @property
    def message(self) -> str:
        where = f"{self.path}: " if self.path else ""
        prefix = {
            FaultKind.UNREACHABLE: "",
            FaultKind.COLLECTOR_FAILED: "collector failed: ",
            FaultKind.NOT_JSON: "the collector's answer is not usable JSON: ",
            FaultKind.TOO_LARGE: "the collector's answer is too large: ",
            FaultKind.MALFORMED: "the collector's answer is malformed: ",
            FaultKind.UNSUPPORTED_VERSION: "",
            FaultKind.NOT_OBSERVED: "",
            FaultKind.RECORDED: "",
        }[self.kind]
        if self.kind is FaultKind.MALFORMED and (self.path or "").startswith(CONTROLLER_PART):
            # The controller's own record of its probes (a snapshot's, edited), not the box's
            prefix = "the controller's record of its probes is malformed: "
        return f"{prefix}{where}{self.what}"

    def __str__(self) -> str:
        return self.message


def transport_fault(reason: str) -> Fault:
    """A box that gave no answer (reconciler/observe/transport.py's reason: ssh's own line)."""
    return Fault(FaultKind.UNREACHABLE, printable(reason, 300))


def collector_failed(returncode: int | None, stderr: str) -> Fault:
    """The collector ran and failed: its last stderr line (a traceback's exception line),
    scrubbed. The collector never writes a secret there, but the login shell it runs in may
    (a `set -x` in ~/.bashrc traces `export HF_TOKEN=...`), and this text is kept in
    snapshots and shown by `import`."""
    from reconciler.scrub import scrub_text

    lines = [line for line in (stderr or "").strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit {returncode}"
    return Fault(FaultKind.COLLECTOR_FAILED, scrub_text(last, limit=300))


def printable(text: str, limit: int) -> str:
    """Text from a box, safe to print: no control characters or lone surrogates, bounded."""
    text = text[: limit * 2]
    out = "".join(c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF else "?" for c in text)
    return out[:limit]


class _Bad(Exception):
    """Internal: one wrong field; parse_* turn it into a Fault, it never leaves this module."""

    def __init__(self, path: str, what: str, kind: FaultKind = FaultKind.MALFORMED) -> None:
        super().__init__(path)
        self.fault = Fault(kind, what, path or None)


def _bad(path: str, what: str) -> NoReturn:
    raise _Bad(path, what)


# -- the raw text ----------------------------------------------------------------------------------
def load_json(
    text: str | bytes,
    limit: int = MAX_ANSWER_BYTES,
    keys_unique: bool = False,
    in_c: bool = False,
    depth: int = MAX_DEPTH,
) -> Any | Fault:
    """One JSON document from a box, or why not: size first, then UTF-8, then JSON without
    NaN/Infinity or duplicate keys (json.loads would silently keep the last of two `Id`s),
    nested at most `depth` levels (`nested_deeper`: json.loads takes ~990, and what is kept as
    received is written again with json.dumps, which fails from ~500).
    `keys_unique`: the text is known to repeat no key (a snapshot file still as this tool wrote
    it, observe.snapshot_observation), so objects are built without the check. `in_c` (with
    `keys_unique`, for bytes; a large replay): read by msgspec first, straight from the bytes;
    anything it refuses is read below as always, so every fault is json's (fast_json.py)."""
    value = _load_json(text, limit, keys_unique, in_c)
    if type(value) in _NESTED and nested_deeper((value,), depth):
        return Fault(FaultKind.NOT_JSON, f"nested deeper than {depth} levels")
    return value


_NESTED = frozenset({dict, list})


def nested_deeper(values: Iterable[Any], limit: int) -> bool:
    """Whether any of these JSON values nests lists and objects more than `limit` deep (`[]` is
    one level, `[{}]` two). Level by level, each level's containers found by C loops (most
    values are text): no Python step per value, and no recursion however deep."""
    level = list(values)
    for _ in range(limit + 1):
        level = list(compress(level, map(_NESTED.__contains__, map(type, level))))
        if not level:
            return False
        below: list[Any] = []
        add = below.extend
        for item in level:
            add(item.values() if type(item) is dict else item)
        level = below
    return True


def _load_json(text: str | bytes, limit: int, keys_unique: bool, in_c: bool) -> Any | Fault:
    size = len(text)
    if size > limit:
        return Fault(FaultKind.TOO_LARGE, f"{size} bytes, the limit is {limit}")
    if in_c and keys_unique and isinstance(text, bytes):
        from reconciler.fast_json import decode_written

        try:
            return decode_written(text)
        except ValueError:
            pass  # not UTF-8, NaN, too deep, a number too long...: json says which, below
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Fault(FaultKind.NOT_JSON, f"not UTF-8 (byte {exc.start})")
    elif not text.isascii():
        try:
            text.encode("utf-8")  # the transport keeps undecodable bytes as lone surrogates
        except UnicodeEncodeError as exc:
            return Fault(FaultKind.NOT_JSON, f"not UTF-8 (character {exc.start})")
    if not text or text.isspace():  # not text.strip(): no copy of a 150 KB answer to ask
        return Fault(FaultKind.NOT_JSON, "empty answer")
    try:
        hook = None if keys_unique else _unique_keys
        return json.loads(
            text, object_pairs_hook=hook, parse_constant=_no_constant, parse_float=_finite
        )
    except json.JSONDecodeError as exc:
        # msg and position only: JSONDecodeError never quotes the document itself.
        return Fault(FaultKind.NOT_JSON, f"{exc.msg} at line {exc.lineno} column {exc.colno}")
    except _Bad as exc:
        return Fault(FaultKind.NOT_JSON, exc.fault.what)
    except RecursionError:
        return Fault(FaultKind.NOT_JSON, "nested too deeply to parse")
    except ValueError:
        # int() of a number with more than sys.get_int_max_str_digits() digits
        return Fault(FaultKind.NOT_JSON, "a number too long to read")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Bad("", f"a key appears twice in one object ({_key_hint(key)})")
            seen.add(key)
    return out


def _key_hint(key: str) -> str:
    # A key is a name, not a value; still, only a plain identifier is shown.
    ok = key.replace("_", "").replace("-", "").replace(".", "").replace("/", "").isalnum()
    return repr(key) if ok and len(key) <= 64 and key.isascii() else "a key"


def _no_constant(name: str) -> NoReturn:
    raise _Bad("", f"{name} is not a JSON number")


def _finite(text: str) -> float:
    # `1e400` is JSON, but reads as inf: kept, it would be saved as `Infinity`, which no JSON
    # reader takes back (msgspec refuses it as out of range, so both readers agree).
    value = float(text)
    if not math.isfinite(value):
        raise _Bad("", "a number out of range")
    return value


# -- field readers ---------------------------------------------------------------------------------


class _Reader:
    """Typed access to one raw document. `complete`: every field the collector writes must be
    present (a live answer); otherwise an absent field is read as not observed (a snapshot)."""

    def __init__(self, complete: bool) -> None:
        self.complete = complete

    def get(self, obj: Mapping[str, Any], key: str, path: str, required: bool = True) -> Any:
        if key in obj:
            return obj[key]
        if required and self.complete:
            _bad(_join(path, key), "missing")
        return None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _at(path: str, key: str) -> str:
    """The path of a mapping's entry. Keys are names (variables, services, files), yet a hostile
    box chooses them: only a short plain name is shown, anything else as `[?]`."""
    plain = key.replace("_", "").replace("-", "").replace(".", "").replace("/", "")
    if len(key) <= 64 and key.isascii() and (plain.isalnum() or not plain):
        return _join(path, key)
    return f"{path}[?]"


def _or(raw: Any, default: Any) -> Any:
    """`raw`, or `default` when the field is null or absent. Never `raw or default`: that would
    read a wrong-typed falsy value (`""`, `0`, `[]` where an object belongs) as empty."""
    return default if raw is None else raw


def _obj(raw: Any, path: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        _bad(path, f"expected an object, got {_kind(raw)}")
    if len(raw) > MAX_ITEMS:
        _bad(path, f"more than {MAX_ITEMS} entries")
    return raw


def _opt_obj(raw: Any, path: str) -> dict[str, Any] | None:
    return None if raw is None else _obj(raw, path)


def _list(raw: Any, path: str) -> list[Any]:
    if not isinstance(raw, list):
        _bad(path, f"expected a list, got {_kind(raw)}")
    if len(raw) > MAX_ITEMS:
        _bad(path, f"more than {MAX_ITEMS} items")
    return raw


def _kind(raw: Any) -> str:
    # The JSON type only: never the value.
    if raw is None:
        return "null"
    if isinstance(raw, bool):
        return "a boolean"
    if isinstance(raw, int):
        return "an integer"
    if isinstance(raw, float):
        return "a number"
    if isinstance(raw, str):
        return "a string"
    if isinstance(raw, list):
        return "a list"
    return "an object"


def _text(raw: Any, path: str) -> str:
    if not isinstance(raw, str):
        _bad(path, f"expected a string, got {_kind(raw)}")
    if len(raw) > MAX_TEXT:
        _bad(path, f"a string longer than {MAX_TEXT} characters")
    if not raw.isascii():
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:
            _bad(path, "a string that is not valid Unicode (a lone surrogate)")
    return raw


def _opt_text(raw: Any, path: str) -> str | None:
    return None if raw is None else _text(raw, path)


def _name(raw: Any, path: str) -> str:
    """A name (service, container, variable, file, role): text without control characters."""
    text = _text(raw, path)
    if not text.isprintable():
        _bad(path, "a name with control characters")
    return text


def _opt_name(raw: Any, path: str) -> str | None:
    return None if raw is None else _name(raw, path)


def _int(raw: Any, path: str, lo: int = 0, hi: int = _MAX_INT) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        _bad(path, f"expected an integer, got {_kind(raw)}")
    if not lo <= raw <= hi:
        _bad(path, f"an integer outside {lo}..{hi}")
    return raw


def _opt_int(raw: Any, path: str, lo: int = 0, hi: int = _MAX_INT) -> int | None:
    return None if raw is None else _int(raw, path, lo, hi)


def _bool(raw: Any, path: str) -> bool:
    if not isinstance(raw, bool):
        _bad(path, f"expected true or false, got {_kind(raw)}")
    return raw


def _opt_bool(raw: Any, path: str) -> bool | None:
    return None if raw is None else _bool(raw, path)


def _number(raw: Any, path: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        _bad(path, f"expected a number, got {_kind(raw)}")
    if not math.isfinite(raw) or not 0 <= raw <= _MAX_INT:
        _bad(path, "a number out of range")
    return float(raw)


def _texts(raw: Any, path: str) -> tuple[str, ...]:
    return tuple(_text(v, f"{path}[{i}]") for i, v in enumerate(_list(raw, path)))


def _names(raw: Any, path: str) -> tuple[str, ...]:
    items = _list(raw, path)
    if _all_text(items) and _fine_texts(items, names=True):
        return tuple(items)
    return tuple(_name(v, f"{path}[{i}]") for i, v in enumerate(items))


def _all_text(items: list[Any]) -> bool:
    # C loops (map, list.count) rather than a generator's Python step per item.
    return list(map(type, items)).count(str) == len(items)


def _mapping(raw: Any, path: str, read: Callable[[Any, str], T]) -> dict[str, T]:
    obj = _obj(raw, path)
    if _plain_keys(obj):  # the usual case: no check and no _at per key
        prefix = f"{path}." if path else ""
        return {k: read(v, prefix + k) for k, v in obj.items()}
    return {_name(k, path): read(v, _at(path, k)) for k, v in obj.items()}


def _plain_keys(obj: dict[str, Any]) -> bool:
    """Every key a plain name (letters, digits, `_-./`, some alnum, at most 64): a name `_name`
    accepts and `_at` shows as is. Checked in bulk, by C loops over the keys joined."""
    if not obj:
        return True
    try:
        joined = "".join(obj)
    except TypeError:  # not a JSON object's keys: the located check says which
        return False
    plain = joined.replace("_", "").replace("-", "").replace(".", "").replace("/", "")
    # Alnum over the joined plain parts: each key's own part is alnum or empty, and the empty
    # ones are what `_at` allows too; the joined text being empty falls to the located check.
    return joined.isascii() and plain.isalnum() and max(map(len, obj)) <= 64


def _plain_json(raw: Any, path: str, depth: int = 0) -> Any:
    """A value kept without a fixed shape (a compose port entry): plain JSON, bounded depth."""
    if depth > MAX_DEPTH:
        _bad(path, f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(raw, dict):
        return {
            _text(k, path): _plain_json(v, _at(path, k), depth + 1)
            for k, v in _obj(raw, path).items()
        }
    if isinstance(raw, list):
        return [_plain_json(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(_list(raw, path))]
    if isinstance(raw, str):
        return _text(raw, path)
    return raw  # None, bool, int, finite float (load_json refused NaN and Infinity)


# -- secrets and values ----------------------------------------------------------------------------
@record_class(order=True)
class SecretValue:
    """A secret, as the box's keyed digest (`hmac:<hex>`): equal values give equal digests
    within one run, and nothing about the value can be recovered. Prints as `***`."""

    digest: str

    def __str__(self) -> str:
        return "***"


# What an environment entry, a `.env` line or an argv token holds: text, or a hashed secret.
EnvValue = str | SecretValue

_DIGEST_PREFIX = "hmac:"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX = re.compile(r"[0-9a-f]{1,64}")


def _digest(raw: Any, path: str) -> str:
    text = _text(raw, path)
    hexpart = text.removeprefix(_DIGEST_PREFIX)
    if hexpart == text or not _HEX64.fullmatch(hexpart):
        _bad(path, "expected a keyed digest (hmac: and 64 hex digits)")
    return text


def _opt_digest(raw: Any, path: str) -> str | None:
    return None if raw is None else _digest(raw, path)


def _secret(raw: Any, path: str) -> SecretValue:
    obj = _obj(raw, path)
    if set(obj) != {"secret"}:
        _bad(path, "an object that is not a hashed secret ({secret: digest})")
    return SecretValue(_digest(obj["secret"], f"{path}.secret"))


def _env_value(raw: Any, path: str) -> EnvValue:
    """A value from an environment: text, or `{"secret": digest}` (hashed on the box)."""
    if isinstance(raw, dict):
        return _secret(raw, path)
    return _text(raw, path)


def _quick_secret(raw: Any) -> SecretValue | None:
    """A well-formed `{"secret": "hmac:<64 hex>"}`, recognised without building a field path;
    None for anything else, which then takes the located check (`_secret`). An answer holds
    thousands of secrets and argv tokens: their paths are built only when one is wrong."""
    if type(raw) is dict and len(raw) == 1:
        digest = raw.get("secret")
        if (
            type(digest) is str
            and len(digest) == len(_DIGEST_PREFIX) + 64
            and digest.startswith(_DIGEST_PREFIX)
            and _HEX64.fullmatch(digest, len(_DIGEST_PREFIX))
        ):
            return SecretValue(digest)
    return None


def _opt_env_value(raw: Any, path: str) -> EnvValue | None:
    return None if raw is None else _env_value(raw, path)


def _env(raw: Any, path: str) -> dict[str, EnvValue]:
    # Environments are most of an answer (thousands of entries): every name and the plain-text
    # values are checked in bulk (C loops over one joined string), without building a path;
    # the few entries that are not text (hashed secrets among ~100) are found by one pass and
    # recognised without a path (_quick_secret). An environment that fails the bulk check goes
    # through the full, located check, entry by entry, in its own order.
    obj = _obj(raw, path)
    rest = [key for key, value in obj.items() if type(value) is not str]
    plain: dict[str, Any] = dict(obj)
    for key in rest:
        del plain[key]
    out: dict[str, EnvValue]
    if _fine_texts(obj.keys(), names=True) and _fine_texts(plain.values()):
        out = plain
        for key in rest:  # text first, then the secrets, each in the environment's order
            value = obj[key]
            quick = _quick_secret(value)
            out[key] = quick if quick is not None else _env_value(value, _at(path, key))
        return out
    out = {}
    for key, value in obj.items():
        name = _name(key, path)
        quick = _quick_secret(value)
        out[name] = quick if quick is not None else _env_value(value, _at(path, name))
    return out


def _fine_texts(texts: Iterable[str], names: bool = False) -> bool:
    """Every one of these strings within MAX_TEXT, valid Unicode (and printable, for names)."""
    texts = list(texts)
    if not texts:
        return True
    joined = "".join(texts)
    if names and not _printable(joined):
        return False
    if not joined.isascii() and not _encodes(joined):
        return False
    return len(joined) <= MAX_TEXT or max(map(len, texts)) <= MAX_TEXT


# The characters str.isprintable() refuses in ASCII text. For a long ASCII text (the joined
# names of an environment), one memchr per character (`in`) is ~5x cheaper than isprintable's
# Unicode table lookup per character; a short one is not worth the 33 searches.
_ASCII_CONTROLS = tuple(map(chr, (*range(0x20), 0x7F)))


def _printable(text: str) -> bool:
    if len(text) < 256 or not text.isascii():
        return text.isprintable()
    return not any(map(text.__contains__, _ASCII_CONTROLS))


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _argv(raw: Any, path: str) -> tuple[EnvValue, ...]:
    items = _list(raw, path)
    if _all_text(items):  # most command lines hold no secret: no step per token at all
        if _fine_texts(items):
            return tuple(items)
        return tuple(_env_value(v, f"{path}[{i}]") for i, v in enumerate(items))
    quick: list[EnvValue] = []
    for token in items:  # the common case in bulk (see _quick_secret); else located, below
        value = token if type(token) is str else _quick_secret(token)
        if value is None:
            break
        quick.append(value)
    else:
        if _fine_texts(t for t in quick if type(t) is str):
            return tuple(quick)
    return tuple(_env_value(v, f"{path}[{i}]") for i, v in enumerate(items))


def _opt_argv(raw: Any, path: str) -> tuple[EnvValue, ...] | None:
    return None if raw is None else _argv(raw, path)


def _opt_texts(raw: Any, path: str) -> tuple[str, ...] | None:
    return None if raw is None else _texts(raw, path)


def _error(obj: Mapping[str, Any], path: str) -> str | None:
    """A section's own `error` (the box said why it could not observe that part)."""
    return _opt_text(obj.get("error"), _join(path, "error"))


# -- the collector's document ----------------------------------------------------------------------
@record_class(eq=False, repr=False)
class FileFact:
    """A file on the box: exists, digest, mode and size, or why it could not be read."""

    exists: bool
    sha256: str | None = None
    mode: str | None = None  # "0o600"
    size: int | None = None
    error: str | None = None


@record_class(eq=False, repr=False)
class EnvLine:
    """One assignment of the deployed `.env`, parsed like compose (the last one wins)."""

    key: str
    value: EnvValue
    line: int


# file-unreadable: the file is there but is not one the collector reads (a FIFO, a directory,
# over its size limit, not UTF-8); the answer's `file_errors` says which.
SourceStatus = Literal["ok", "file-missing", "file-unreadable", "key-missing", "not-sent"]


@record_class(eq=False, repr=False)
class SourceSpec:
    """The source a secret was read from, as the run's payload named it (the answer's
    `source`): a box_file's `path` as given (`~/...`), as `expanded` on the box, and its `key`;
    a controller_env's `variable`. Names, never a value. A replay tells by it a snapshot that
    read another source than the desired one (compare/envfile.py `stale_sources`)."""

    path: str | None = None
    expanded: str | None = None
    key: str | None = None
    variable: str | None = None


@record_class(eq=False, repr=False)
class SecretSource:
    """A secret's source as the collector read it (box_file) or was sent it on stdin
    (controller_env, `path` "$VAR on the controller"); digest only when found. `spec`: which
    source that was (None: an answer from before the collector said so)."""

    status: SourceStatus
    path: str | None
    digest: SecretValue | None
    spec: SourceSpec | None = None


@record_class(eq=False, repr=False)
class Binding:
    """One published port of a container: the host address and port."""

    host_ip: str  # "" = every interface
    host_port: str


@record_class(eq=False, repr=False)
class Container:
    """One container of the compose project, as `docker inspect` showed it (secrets hashed)."""

    name: str
    id: str
    service: str | None
    image_ref: str | None
    image_id: str | None
    cmd: tuple[EnvValue, ...] | None
    env: Mapping[str, EnvValue]
    status: str | None
    health: str | None
    restart_count: int
    exit_code: int | None
    ports: Mapping[str, tuple[Binding, ...]]  # "8000/tcp" -> host bindings
    ips: tuple[str, ...]
    entrypoint: tuple[EnvValue, ...] | None = None  # masked with the command: one argv
    config_hash: str | None = None
    config_files: str | None = None
    started_at: str | None = None
    runtime: str | None = None
    # HostConfig.RestartPolicy as compose writes `restart` (collector.restart_policy); None
    # where not recorded (a snapshot of an earlier collector): then never compared.
    restart_policy: str | None = None
    # Its Mounts (collector.container_mounts); None where not recorded: never compared.
    mounts: tuple[Mount, ...] | None = None
    # A `docker compose run` container (label com.docker.compose.oneoff=True): never its
    # service's container. False also where not recorded (a snapshot of an earlier collector),
    # so such a snapshot compares as it always did.
    oneoff: bool = False

    @property
    def key(self) -> str:
        """The compose service, else the container's name (a container compose did not make)."""
        return self.service or self.name


@record_class(eq=False, repr=False)
class Image:
    """An image as the Engine describes it: its digests, tags and default environment."""

    repo_digests: tuple[str, ...]
    repo_tags: tuple[str, ...]
    env: Mapping[str, EnvValue]


@record_class(eq=False, repr=False)
class Docker:
    """The project's containers and their images, or why the engine could not be asked."""

    containers: tuple[Container, ...] | None  # None: not observed (see error)
    images: Mapping[str, Image] = field(default_factory=dict)
    error: str | None = None


@record_class(eq=False, repr=False)
class Mount:
    """A container's mount (docker inspect's Mounts) or a service's volume (the render's
    `volumes`), recorded alike by the collector (container_mounts, render_mounts)."""

    type: str  # bind, volume, tmpfs, ...
    source: str | None  # a bind's host path, a volume's name; None: tmpfs, an anonymous volume
    target: str  # the path inside the container
    read_only: bool

    @property
    def anonymous(self) -> bool:
        """A volume docker named itself (64 hex digits): an anonymous one, or an image's
        VOLUME."""
        return self.type == "volume" and _HEX64.fullmatch(self.source or "") is not None


@record_class(eq=False, repr=False)
class Service:
    """One service of `docker compose config` (secrets hashed)."""

    image: str | None
    command: tuple[EnvValue, ...] | None
    environment: Mapping[str, EnvValue]
    ports: tuple[str, ...]  # each published-port entry as canonical JSON (compared whole)
    entrypoint: tuple[EnvValue, ...] | None = None  # masked with the command: one argv
    profiles: tuple[str, ...] = ()
    container_name: str | None = None
    runtime: str | None = None
    restart: str | None = None  # `restart:` (None: the render names none, or not recorded)
    # `volumes:` (None: not recorded, a snapshot of an earlier collector: never compared)
    volumes: tuple[Mount, ...] | None = None


@record_class(eq=False, repr=False)
class Render:
    """compose's render (its services) or why it failed, and the .env it used."""

    services: Mapping[str, Service] | None  # None: the render failed (see error)
    error: str | None = None
    basis: str | None = None  # sha256 of the .env it renders (compare/render_basis.py)


@record_class(eq=False, repr=False)
class Variables:
    """The variables the compose files interpolate, or why they could not be listed."""

    names: frozenset[str]  # the variables the compose files interpolate
    error: str | None = None
    observed: bool = True  # False: a snapshot without the section (no names known, no error)


@record_class(eq=False, repr=False)
class ConfigHashes:
    """compose's config hash of each service from the files on the box as they are (its own
    `.env`, the deployment directory), or why compose could not give them: what `docker
    compose up` compares with a container's label to decide whether to recreate it."""

    services: Mapping[str, str] | None  # None: compose failed (see error)
    error: str | None = None


@record_class(eq=False, repr=False)
class Export:
    """One variable the login shell exports: its value and where it was set."""

    value: EnvValue
    source: str | None  # "~/.bashrc:6": the file and line that last assigned it


@record_class(eq=False, repr=False)
class LoginShell:
    """What the deploy user's login shell exports, or why it could not be traced."""

    exports: Mapping[str, Export]
    error: str | None = None
    observed: bool = True  # False: a snapshot without the section (no exports known, no error)


@record_class(eq=False, kw_only=True, repr=False)
class Probe:
    """One HTTP request's outcome: a status, or why there was none (`error`)."""

    status: int | None
    error: str | None = None
    ms: int | None = None
    error_type: str | None = None  # the gateway's own error type (invalid_api_key)
    model: str | None = None  # the model a chat probe asked for
    headers: Mapping[str, str] = field(default_factory=dict)  # X-Lobes-* mesh headers

    @property
    def failure(self) -> str | None:
        return self.error or self.error_type


@record_class(eq=False, repr=False)
class RoleEntry:
    """One role of the gateway's `/capabilities` (only what the tool reads)."""

    context: int | None = None
    feasible: bool | None = None
    ready: bool | None = None
    member: str | None = None
    proxied: bool | None = None


@record_class(eq=False, kw_only=True, repr=False)
class HealthProbe(Probe):
    """The gateway's /health answer, with the version it reports."""

    version: str | None = None  # /health's `version`


@record_class(eq=False, kw_only=True, repr=False)
class CapabilitiesProbe(Probe):
    """The gateway's /capabilities answer, with the roles it advertises."""

    roles: Mapping[str, RoleEntry] | None = None  # None: no JSON object in the answer


@record_class(eq=False, kw_only=True, repr=False)
class LaneProbe(Probe):
    """A lane's /v1/models answer, with the first served model's window."""

    max_model_len: int | None = None  # the first served model's window (/v1/models)


@record_class(eq=False, repr=False)
class GatewayProbes:
    """`/health`, `/capabilities` and an unauthenticated `/v1/models` from one place."""

    health: HealthProbe | None = None
    capabilities: CapabilitiesProbe | None = None
    models_noauth: Probe | None = None
    error: str | None = None  # the probes themselves could not run
    observed: bool = True  # False: a snapshot without the section (no probes known, no error)


@record_class(eq=False, repr=False)
class MemInfo:
    """The box's memory from /proc/meminfo, in KiB."""

    total_kib: int | None = None
    available_kib: int | None = None


# -- the audit section (payload["audit"], `reconcile audit`) ---------------------------------------
LineState = Literal["set", "empty", "commented-out", "absent", "no-file"]


@record_class(eq=False, repr=False)
class EnvKeyState:
    """One audited key's line in `.env`: set, empty, commented out or absent (digest only)."""

    state: LineState
    line: int | None = None
    digest: SecretValue | None = None


@record_class(eq=False, kw_only=True, repr=False)
class KeyedProbe(Probe):
    """`GET /v1/models` with a key, sent on the box (only the key's digest comes back)."""

    key_from: str | None = None  # "secret:gateway_api_key", ".env:GATEWAY_API_KEY"
    key: SecretValue | None = None
    skipped: str | None = None  # why no request was sent


@record_class(eq=False, repr=False)
class HostNetwork:
    """The containers on the host network, or why they could not be listed."""

    containers: tuple[str, ...] | None  # None: not observed (see error)
    error: str | None = None


@record_class(eq=False, repr=False)
class RunningContainer:
    """A running container of any compose project or none: where it publishes (audit)."""

    name: str
    image: str | None
    project: str | None  # its com.docker.compose.project label
    service: str | None
    host_network: bool
    ports: Mapping[str, tuple[Binding, ...]]  # "8000/tcp" -> host bindings, as bound now


@record_class(eq=False, repr=False)
class Running:
    """Every running container on the box (no label filter), or why they could not be listed."""

    containers: tuple[RunningContainer, ...] | None  # None: not observed (see error)
    error: str | None = None  # also: the list was cut (more than the collector lists)


@record_class(eq=False, repr=False)
class AuditSection:
    """The box side of an audit: .env's key lines, probes, host network."""

    envfile_keys: Mapping[str, EnvKeyState]
    chat_noauth: Probe | None
    models_key: KeyedProbe | None
    models_mesh_key: KeyedProbe | None
    host_network: HostNetwork | None
    error: str | None = None  # the audit part of the collector failed
    # None: not in the answer (a snapshot from before the collector listed them)
    running: Running | None = None


@record_class(eq=False, repr=False)
class ConvergeHolder:
    """A converge of the box held its lock while it was observed (the lock file's record: who,
    which process, since when; each None where the record did not say)."""

    pid: int | None
    holder: str | None
    since: str | None


# -- the whole answer ------------------------------------------------------------------------------
@record_class(eq=False, kw_only=True, repr=False)
class Observed:
    """One box's collector answer, typed. Version `collector`; see COLLECTOR_VERSIONS."""

    collector: int
    user: str | None
    home: str | None
    deploy_dir: str | None
    deploy_dir_exists: bool
    time: str | None
    meminfo: MemInfo
    files: Mapping[str, FileFact]
    envfile: tuple[EnvLine, ...] | None  # None: the deployment has no .env
    secret_sources: Mapping[str, SecretSource]
    docker: Docker
    gateway: GatewayProbes
    lanes: Mapping[str, LaneProbe]  # by compose service
    # False: a snapshot without `lanes` (none known, no error; compare/box.py says so).
    lanes_observed: bool = True
    render: Render  # compose config from the desired .env, scrubbed environment
    render_login: Render | None  # the same under the deploy user's login shell
    # The box's own .env rendered, when a snapshot asked and it differs from the desired one.
    render_current: Render | None = None
    render_login_current: Render | None = None
    variables: Variables
    login_shell: LoginShell
    current_env_keys: tuple[str, ...]
    audit: AuditSection | None  # only when the payload asked for it
    timings_ms: Mapping[str, int]
    # A box file the collector found but could not read (a FIFO, a device, a directory, over
    # its size limit, not UTF-8, unreadable), as the box names it (`.env`, `~/.docker/...`) ->
    # why: each one an error of the box. Absent from older answers: none then.
    file_errors: Mapping[str, str] = field(default_factory=dict)
    # The desired value of each managed `.env` key that carries a secret inline
    # (`VLLM_ARGS=--api-key x`), masked on the box as that key's `envfile` line is: the only
    # form a line masked with the run's key compares with. Absent (none) from older answers
    # and wherever no desired value carries one.
    envfile_desired: Mapping[str, str] = field(default_factory=dict)
    # The words of each lane knob whose desired value carries a secret inline (`--api-key x`
    # in WORKER_SPECULATIVE_CONFIG), masked on the box as the render's command is: what the
    # render's flags compare with (compare/composefiles.py). Absent (none) from older answers
    # and wherever no knob carries one.
    knobs_desired: Mapping[str, tuple[EnvValue, ...]] = field(default_factory=dict)
    # A converge of the box was running while it was observed (at the collector's start or
    # end): what was seen may be half-converged (compare/box.py: an error of the box). Absent
    # (None) from older answers and whenever no converge held the lock.
    converge: ConvergeHolder | None = None
    # compose's config hashes of the files on the box. Absent (None) from older answers and
    # wherever the deployment was not rendered: not compared then.
    config_hashes: ConfigHashes | None = None

    @property
    def containers(self) -> tuple[Container, ...]:
        return self.docker.containers or ()

    def envfile_by_key(self) -> dict[str, EnvLine]:
        """`.env` by key; compose keeps the last assignment of a key, so do we."""
        return {e.key: e for e in self.envfile or ()}


def parse_answer(text: str | bytes, limit: int = MAX_ANSWER_BYTES) -> Observed | Fault:
    """The collector's stdout -> its document, or the fault of that box."""
    raw = load_json(text, limit)
    if isinstance(raw, Fault):
        return raw
    return parse_collected(raw)


def parse_collected(
    raw: Any, complete: bool = True, version: int | None = None
) -> Observed | Fault:
    """A collector document already read from JSON -> typed, or the fault of that box.

    `version`: the collector version to assume when the document does not say (a snapshot of
    the version-1 format, cut down by a test helper); a live answer always says."""
    try:
        return _observed(_Reader(complete), raw, version)
    except _Bad as exc:
        return exc.fault
    except RecursionError:  # a structure json.loads accepted, deeper than we walk
        return Fault(FaultKind.MALFORMED, "nested too deeply")


def _observed(r: _Reader, raw: Any, assumed: int | None) -> Observed:
    doc = _obj(raw, "")
    if "collector" not in doc and assumed is not None:
        version = assumed
    elif "collector" not in doc:
        raise _Bad("collector", "no collector version", FaultKind.UNSUPPORTED_VERSION)
    else:
        version_raw = doc["collector"]
        if isinstance(version_raw, bool) or not isinstance(version_raw, int):
            raise _Bad("collector", "the version is not an integer", FaultKind.UNSUPPORTED_VERSION)
        version = version_raw
    if version not in COLLECTOR_VERSIONS:
        shown = str(version) if 0 <= version < 10**6 else "out of range"
        raise _Bad(
            "collector",
            f"collector version {shown} is not supported (this reconciler reads "
            f"{', '.join(map(str, sorted(COLLECTOR_VERSIONS)))})",
            FaultKind.UNSUPPORTED_VERSION,
        )
    get = r.get
    envfile_raw = get(doc, "envfile", "")
    render_login = get(doc, "render_login", "")
    own = get(doc, "render_current", "", required=False)
    own_login = get(doc, "render_login_current", "", required=False)
    audit = get(doc, "audit", "", required=False)
    lanes = get(doc, "lanes", "")
    return Observed(
        collector=version,
        user=_opt_text(get(doc, "user", ""), "user"),
        home=_opt_text(get(doc, "home", ""), "home"),
        deploy_dir=_opt_text(get(doc, "deploy_dir", ""), "deploy_dir"),
        deploy_dir_exists=_deploy_dir_exists(r, doc),
        time=_opt_text(get(doc, "time", ""), "time"),
        meminfo=_meminfo(r, get(doc, "meminfo", "")),
        files=_mapping(_or(get(doc, "files", ""), {}), "files", _file_fact),
        envfile=None if envfile_raw is None else _envfile(envfile_raw, "envfile"),
        secret_sources=_sections(
            r, get(doc, "secret_sources", ""), "secret_sources", _secret_source
        ),
        docker=_docker(r, get(doc, "docker", ""), "docker"),
        gateway=_gateway(r, get(doc, "gateway", ""), "gateway"),
        lanes=_sections(r, lanes, "lanes", _lane_probe),
        lanes_observed=lanes is not None,
        render=_render(r, get(doc, "render", ""), "render"),
        render_login=None if render_login is None else _render(r, render_login, "render_login"),
        render_current=None if own is None else _render(r, own, "render_current"),
        render_login_current=(
            None if own_login is None else _render(r, own_login, "render_login_current")
        ),
        variables=_variables(r, get(doc, "variables", ""), "variables"),
        login_shell=_login_shell(r, get(doc, "login_shell", ""), "login_shell"),
        current_env_keys=_names(_or(get(doc, "current_env_keys", ""), []), "current_env_keys"),
        audit=None if audit is None else _audit(r, audit, "audit"),
        timings_ms=_mapping(_or(get(doc, "timings_ms", ""), {}), "timings_ms", _int),
        file_errors=_file_errors(get(doc, "file_errors", "", required=False)),
        envfile_desired=_envfile_desired(get(doc, "envfile_desired", "", required=False)),
        knobs_desired=_knobs_desired(get(doc, "knobs_desired", "", required=False)),
        converge=_converge(get(doc, "converge", "", required=False)),
        config_hashes=_config_hashes(get(doc, "config_hashes", "", required=False)),
    )


def _config_hashes(raw: Any) -> ConfigHashes | None:
    """`config_hashes`: service -> 64 hex digits, or the error (None when absent: an older
    answer, or no render)."""
    if raw is None:
        return None
    obj = _obj(raw, "config_hashes")
    services = obj.get("services")
    if services is None:
        return ConfigHashes(None, _error(obj, "config_hashes"))
    return ConfigHashes(_mapping(services, "config_hashes.services", _sha256))


def _sha256(raw: Any, path: str) -> str:
    text = _opt_sha256(raw, path)
    if text is None:
        _bad(path, "expected 64 lowercase hex digits, got null")
    return text


def _converge(raw: Any) -> ConvergeHolder | None:
    """`converge`: the record of the converge holding the box's lock (none when absent: an
    older answer, or no converge ran)."""
    if raw is None:
        return None
    obj = _obj(raw, "converge")
    return ConvergeHolder(
        pid=_opt_int(obj.get("pid"), "converge.pid", lo=1),
        holder=_opt_name(obj.get("holder"), "converge.holder"),
        since=_opt_name(obj.get("since"), "converge.since"),
    )


def _file_errors(raw: Any) -> dict[str, str]:
    """`file_errors`: file -> why it could not be read (none when absent: an older answer)."""
    return _mapping(_or(raw, {}), "file_errors", _text)


def _envfile_desired(raw: Any) -> dict[str, str]:
    """`envfile_desired`: managed key -> its desired value as the box masked it (none when
    absent: an older answer, or no desired value carries a secret)."""
    return _mapping(_or(raw, {}), "envfile_desired", _text)


def _knobs_desired(raw: Any) -> dict[str, tuple[EnvValue, ...]]:
    """`knobs_desired`: knob key -> its command-line words as the box masked them, read as a
    command line is (none when absent: an older answer, or no knob carries a secret)."""
    return _mapping(_or(raw, {}), "knobs_desired", _argv)


def _deploy_dir_exists(r: _Reader, doc: Mapping[str, Any]) -> bool:
    raw = r.get(doc, "deploy_dir_exists", "")
    return False if raw is None else _bool(raw, "deploy_dir_exists")


def _meminfo(r: _Reader, raw: Any) -> MemInfo:
    mem = _obj(raw if raw is not None or r.complete else {}, "meminfo")
    for key, value in mem.items():
        _int(value, _at("meminfo", _name(key, "meminfo")))
    return MemInfo(mem.get("MemTotal_kib"), mem.get("MemAvailable_kib"))


def _file_fact(raw: Any, path: str) -> FileFact:
    obj = _obj(raw, path)
    return FileFact(
        exists=_bool(obj.get("exists"), f"{path}.exists"),
        sha256=_opt_sha256(obj.get("sha256"), f"{path}.sha256"),
        mode=_opt_mode(obj.get("mode"), f"{path}.mode"),
        size=_opt_int(obj.get("size"), f"{path}.size"),
        error=_error(obj, path),
    )


def _opt_sha256(raw: Any, path: str) -> str | None:
    if raw is None:
        return None
    text = _text(raw, path)
    if not _HEX64.fullmatch(text):
        _bad(path, "expected 64 lowercase hex digits")
    return text


def _opt_mode(raw: Any, path: str) -> str | None:
    if raw is None:
        return None
    text = _text(raw, path)
    if (
        not text.startswith("0o")
        or not 3 <= len(text) <= 6
        or any(c not in "01234567" for c in text[2:])
    ):
        _bad(path, "expected an octal mode like 0o600")
    return text


def _envfile(raw: Any, path: str) -> tuple[EnvLine, ...]:
    items = _list(raw, path)
    quick: list[EnvLine] = []
    keys: list[str] = []
    texts: list[str] = []
    # Bound methods and positional fields: ~100 lines a box, each a dataclass built.
    add, add_key, add_text = quick.append, keys.append, texts.append
    for item in items:  # the common case in bulk (see _quick_secret); else located, below
        if type(item) is not dict:
            break
        key, value, line = item.get("key"), item.get("value"), item.get("line")
        if type(key) is not str or type(line) is not int or not 1 <= line <= _MAX_INT:
            break
        if type(value) is str:
            add_text(value)
        elif (value := _quick_secret(value)) is None:
            break
        add_key(key)
        add(EnvLine(key, value, line))
    else:
        if _fine_texts(keys, names=True) and _fine_texts(texts):
            return tuple(quick)
    out = []
    for i, item in enumerate(items):
        where = f"{path}[{i}]"
        obj = _obj(item, where)
        out.append(
            EnvLine(
                key=_name(obj.get("key"), f"{where}.key"),
                value=_env_value(obj.get("value"), f"{where}.value"),
                line=_int(obj.get("line"), f"{where}.line", 1),
            )
        )
    return tuple(out)


_SOURCE_STATUSES: tuple[SourceStatus, ...] = (
    "ok",
    "file-missing",
    "file-unreadable",
    "key-missing",
    "not-sent",
)


def _secret_source(raw: Any, path: str) -> SecretSource:
    obj = _obj(raw, path)
    status = _text(obj.get("status"), f"{path}.status")
    if status not in _SOURCE_STATUSES:
        _bad(f"{path}.status", f"expected one of {', '.join(_SOURCE_STATUSES)}")
    digest = _opt_digest(obj.get("digest"), f"{path}.digest")
    if status == "ok" and digest is None:
        _bad(f"{path}.digest", "missing for a source that was read")
    return SecretSource(
        status=status,
        path=_opt_text(obj.get("path"), f"{path}.path"),
        digest=SecretValue(digest) if digest is not None else None,
        spec=_source_spec(obj.get("source"), f"{path}.source"),
    )


def _source_spec(raw: Any, path: str) -> SourceSpec | None:
    """A secret source's `source` (None where an older collector wrote none)."""
    if raw is None:
        return None
    obj = _obj(raw, path)
    return SourceSpec(
        path=_opt_text(obj.get("path"), f"{path}.path"),
        expanded=_opt_text(obj.get("expanded"), f"{path}.expanded"),
        key=_opt_name(obj.get("key"), f"{path}.key"),
        variable=_opt_name(obj.get("variable"), f"{path}.variable"),
    )


def _sections(r: _Reader, raw: Any, path: str, read: Callable[[Any, str], T]) -> dict[str, T]:
    """A mapping the collector always writes (`secret_sources`, `lanes`): see `_section`."""
    return _mapping(raw if _section(r, raw, path) else {}, path, read)


def _section(r: _Reader, raw: Any, path: str) -> bool:
    """Whether a section the collector always writes as an object is there: a live answer's
    null is malformed (read as empty, it would turn that section's checks off without a word);
    a snapshot's is not observed (compare/box.py says which checks could not be made)."""
    if raw is None:
        if r.complete:
            _bad(path, "expected an object, got null")
        return False
    return True


def _docker(r: _Reader, raw: Any, path: str) -> Docker:
    if not _section(r, raw, path):
        return Docker(None)  # a snapshot without the section: not observed, no error
    obj = _obj(raw, path)
    error = _error(obj, path)
    if "containers" not in obj:
        if error is None and r.complete:
            _bad(f"{path}.containers", "missing (and no error says why)")
        return Docker(None, error=error)
    containers = tuple(
        _container(r, c, f"{path}.containers[{i}]")
        for i, c in enumerate(_list(obj["containers"], f"{path}.containers"))
    )
    images = r.get(obj, "images", path)
    return Docker(
        containers,
        _mapping(images, f"{path}.images", _image) if images is not None else {},
        error,
    )


def _container(r: _Reader, raw: Any, path: str) -> Container:
    obj = _obj(raw, path)

    def get(key: str, required: bool = True) -> Any:
        return r.get(obj, key, path, required)

    ports = get("ports")
    return Container(
        name=_name(obj.get("name"), f"{path}.name"),  # always: a container is named by it
        id=_container_id(r, get("id"), f"{path}.id"),
        service=_opt_name(get("service"), f"{path}.service"),
        image_ref=_opt_text(get("image_ref"), f"{path}.image_ref"),
        image_id=_opt_text(get("image_id"), f"{path}.image_id"),
        cmd=_opt_argv(get("cmd"), f"{path}.cmd"),
        env=_env(_or(get("env"), {}), f"{path}.env"),
        status=_opt_name(get("status"), f"{path}.status"),
        health=_opt_name(get("health"), f"{path}.health"),
        restart_count=_int(_or(get("restart_count"), 0), f"{path}.restart_count"),
        exit_code=_opt_int(get("exit_code"), f"{path}.exit_code", -(2**31), 2**31),
        ports=_ports(ports, f"{path}.ports") if ports is not None else {},
        ips=_names(_or(get("ips"), []), f"{path}.ips"),
        entrypoint=_opt_argv(get("entrypoint", False), f"{path}.entrypoint"),
        config_hash=_opt_text(get("config_hash", False), f"{path}.config_hash"),
        config_files=_opt_text(get("config_files", False), f"{path}.config_files"),
        started_at=_opt_text(get("started_at", False), f"{path}.started_at"),
        runtime=_opt_text(get("runtime", False), f"{path}.runtime"),
        restart_policy=_opt_text(get("restart_policy", False), f"{path}.restart_policy"),
        mounts=_opt_mounts(get("mounts", False), f"{path}.mounts"),
        oneoff=_bool(_or(get("oneoff", False), False), f"{path}.oneoff"),
    )


def _opt_mounts(raw: Any, path: str) -> tuple[Mount, ...] | None:
    """A container's mounts or a service's volumes; None (not recorded) stays None."""
    if raw is None:
        return None
    return tuple(_mount(m, f"{path}[{i}]") for i, m in enumerate(_list(raw, path)))


def _mount(raw: Any, path: str) -> Mount:
    obj = _obj(raw, path)
    return Mount(
        type=_name(obj.get("type"), f"{path}.type"),
        source=_opt_text(obj.get("source"), f"{path}.source"),
        target=_text(obj.get("target"), f"{path}.target"),
        read_only=_bool(_or(obj.get("read_only"), False), f"{path}.read_only"),
    )


def _container_id(r: _Reader, raw: Any, path: str) -> str:
    if raw is None and not r.complete:
        return ""  # a snapshot cut down to what the audit reads
    text = _name(raw, path)
    if not _HEX.fullmatch(text):
        _bad(path, "expected a hex container id")
    return text


def _ports(raw: Any, path: str) -> dict[str, tuple[Binding, ...]]:
    out = {}
    for key, bindings in _obj(raw, path).items():
        where = _at(path, _name(key, path))
        items = [] if bindings is None else _list(bindings, where)
        out[key] = tuple(_binding(b, f"{where}[{i}]") for i, b in enumerate(items))
    return out


def _binding(raw: Any, path: str) -> Binding:
    obj = _obj(raw, path)
    return Binding(
        host_ip=_host_ip(_or(obj.get("HostIp"), ""), f"{path}.HostIp"),
        host_port=_host_port(_or(obj.get("HostPort"), ""), f"{path}.HostPort"),
    )


def _host_ip(raw: Any, path: str) -> str:
    # The audit sends a request to a published lane's address: an address, never a URL part.
    text = _name(raw, path)
    if text:
        import ipaddress  # only for a binding to one address ("" is every interface)

        # No IPv6 scope id: ipaddress takes any text after `%` ("fe80::1%]@host:port#"), which
        # would become the authority of the URL the audit requests. Docker writes none.
        if "%" in text:
            _bad(path, "expected an IP address without a scope id")
        try:
            ipaddress.ip_address(text)
        except ValueError:
            _bad(path, "expected an IP address")
    return text


def _host_port(raw: Any, path: str) -> str:
    # Docker's HostPort: "" (chosen at start), a port, or a range "8000-8010".
    text = _name(raw, path)
    parts = text.split("-") if text else []
    ports = (p for p in parts if p.isascii() and p.isdigit() and len(p) <= 5)
    if len(parts) > 2 or sum(1 for p in ports if 0 < int(p) < 65536) != len(parts):
        _bad(path, "expected a port number or a range of them")
    return text


def _image(raw: Any, path: str) -> Image:
    obj = _obj(raw, path)
    return Image(
        repo_digests=_texts(_or(obj.get("repo_digests"), []), f"{path}.repo_digests"),
        repo_tags=_texts(_or(obj.get("repo_tags"), []), f"{path}.repo_tags"),
        env=_env(_or(obj.get("env"), {}), f"{path}.env"),
    )


def _render(r: _Reader, raw: Any, path: str) -> Render:
    if raw is None:
        if r.complete:
            _bad(path, "expected an object, got null")
        return Render(None)  # a snapshot without the section
    obj = _obj(raw, path)
    error = _error(obj, path)
    basis = _opt_sha256(obj.get("basis"), f"{path}.basis")
    if "services" not in obj:
        if error is None and r.complete:
            _bad(f"{path}.services", "missing (and no error says why)")
        return Render(None, error, basis)
    return Render(_mapping(obj["services"], f"{path}.services", _service), error, basis)


def _service(raw: Any, path: str) -> Service:
    obj = _obj(raw, path)
    ports = _list(_or(obj.get("ports"), []), f"{path}.ports")
    return Service(
        image=_opt_text(obj.get("image"), f"{path}.image"),
        command=_opt_argv(obj.get("command"), f"{path}.command"),
        environment=_env(_or(obj.get("environment"), {}), f"{path}.environment"),
        ports=tuple(_port_entry(p, f"{path}.ports[{i}]") for i, p in enumerate(ports)),
        entrypoint=_opt_argv(obj.get("entrypoint"), f"{path}.entrypoint"),
        profiles=_names(_or(obj.get("profiles"), []), f"{path}.profiles"),
        container_name=_opt_name(obj.get("container_name"), f"{path}.container_name"),
        runtime=_opt_text(obj.get("runtime"), f"{path}.runtime"),
        restart=_opt_text(obj.get("restart"), f"{path}.restart"),
        volumes=_opt_mounts(obj.get("volumes"), f"{path}.volumes"),
    )


def _port_entry(raw: Any, path: str) -> str:
    """A published-port entry of compose's render, as canonical JSON (compared whole)."""
    return json.dumps(_plain_json(raw, path), sort_keys=True)


def _variables(r: _Reader, raw: Any, path: str) -> Variables:
    if not _section(r, raw, path):
        return Variables(frozenset(), observed=False)
    obj = _obj(raw, path)
    names = obj.get("names")
    return Variables(
        frozenset(_names(names, f"{path}.names")) if names is not None else frozenset(),
        _error(obj, path),
    )


def _login_shell(r: _Reader, raw: Any, path: str) -> LoginShell:
    if not _section(r, raw, path):
        return LoginShell({}, observed=False)
    obj = _obj(raw, path)
    exports = obj.get("exports")
    return LoginShell(
        _mapping(exports, f"{path}.exports", _export) if exports is not None else {},
        _error(obj, path),
    )


def _export(raw: Any, path: str) -> Export:
    obj = _obj(raw, path)
    return Export(
        _env_value(obj.get("value"), f"{path}.value"),
        _opt_text(obj.get("source"), f"{path}.source"),
    )


# -- probes ----------------------------------------------------------------------------------------
_STATUS_LO, _STATUS_HI = 100, 599


def _probe_fields(obj: Mapping[str, Any], path: str) -> dict[str, Any]:
    headers = obj.get("headers")
    return {
        "status": _opt_int(obj.get("status"), f"{path}.status", _STATUS_LO, _STATUS_HI),
        "error": _opt_text(obj.get("error"), f"{path}.error"),
        "ms": _opt_int(obj.get("ms"), f"{path}.ms"),
        "error_type": _opt_text(obj.get("error_type"), f"{path}.error_type"),
        "model": _opt_text(obj.get("model"), f"{path}.model"),
        "headers": _mapping(headers, f"{path}.headers", _text) if headers is not None else {},
    }


def _probe(raw: Any, path: str) -> Probe:
    return Probe(**_probe_fields(_obj(raw, path), path))


def _opt_probe(raw: Any, path: str) -> Probe | None:
    return None if raw is None else _probe(raw, path)


def _body(obj: Mapping[str, Any], path: str) -> dict[str, Any] | None:
    # The collector stores null when the answer was not JSON; anything else must be an object.
    return _opt_obj(obj.get("body"), f"{path}.body")


def _answered(
    obj: Mapping[str, Any], path: str, read: Callable[[dict[str, Any] | None], T]
) -> tuple[dict[str, Any], T | None]:
    """A probe's fields and what `read` takes from the gateway's JSON body. A body that is not
    what lobes sends is that probe's error (the gateway answered, oddly), never a fault of the
    whole document: the box's other parts, and its other probes, are still read."""
    fields = _probe_fields(obj, path)
    try:
        return fields, read(_body(obj, path))
    except _Bad as exc:
        odd = exc.fault
        where = printable(odd.path or path, 200)
        fields["error"] = f"the gateway's answer is not what lobes sends ({where}: {odd.what})"
        return fields, None


def _health(raw: Any, path: str) -> HealthProbe:
    def version(body: dict[str, Any] | None) -> str | None:
        return _opt_text((body or {}).get("version"), f"{path}.body.version")

    fields, found = _answered(_obj(raw, path), path, version)
    return HealthProbe(**fields, version=found)


def _capabilities(raw: Any, path: str) -> CapabilitiesProbe:
    def roles(body: dict[str, Any] | None) -> dict[str, RoleEntry] | None:
        return None if body is None else _mapping(body, f"{path}.body", _role_entry)

    fields, found = _answered(_obj(raw, path), path, roles)
    return CapabilitiesProbe(**fields, roles=found)


def _role_entry(raw: Any, path: str) -> RoleEntry:
    obj = _obj(raw, path)
    return RoleEntry(
        context=_opt_int(obj.get("context"), f"{path}.context"),
        feasible=_opt_bool(obj.get("feasible"), f"{path}.feasible"),
        ready=_opt_bool(obj.get("ready"), f"{path}.ready"),
        member=_opt_name(obj.get("member"), f"{path}.member"),
        proxied=_opt_bool(obj.get("proxied"), f"{path}.proxied"),
    )


def _lane_probe(raw: Any, path: str) -> LaneProbe:
    obj = _obj(raw, path)
    body = _body(obj, path) or {}
    window = None
    data = body.get("data")
    for i, model in enumerate(_list(data, f"{path}.body.data") if data is not None else []):
        entry = _obj(model, f"{path}.body.data[{i}]")
        found = _opt_int(entry.get("max_model_len"), f"{path}.body.data[{i}].max_model_len")
        if window is None:
            window = found
    return LaneProbe(**_probe_fields(obj, path), max_model_len=window)


def _gateway(r: _Reader, raw: Any, path: str) -> GatewayProbes:
    if not _section(r, raw, path):
        return GatewayProbes(observed=False)  # a snapshot without the section
    obj = _obj(raw, path)
    error = _error(obj, path)

    def part(key: str, read: Callable[[Any, str], T]) -> T | None:
        value = obj.get(key)
        if value is None and r.complete and error is None:
            _bad(f"{path}.{key}", "missing")
        return None if value is None else read(value, f"{path}.{key}")

    return GatewayProbes(
        health=part("health", _health),
        capabilities=part("capabilities", _capabilities),
        models_noauth=part("models_noauth", _probe),
        error=error,
    )


# -- audit section ---------------------------------------------------------------------------------
_LINE_STATES: tuple[LineState, ...] = ("set", "empty", "commented-out", "absent", "no-file")


def _env_key_state(raw: Any, path: str) -> EnvKeyState:
    obj = _obj(raw, path)
    state = _text(obj.get("state"), f"{path}.state")
    if state not in _LINE_STATES:
        _bad(f"{path}.state", f"expected one of {', '.join(_LINE_STATES)}")
    digest = _opt_digest(obj.get("digest"), f"{path}.digest")
    return EnvKeyState(
        state,
        _opt_int(obj.get("line"), f"{path}.line", 1),
        SecretValue(digest) if digest is not None else None,
    )


def _keyed_probe(raw: Any, path: str) -> KeyedProbe:
    obj = _obj(raw, path)
    key = _opt_digest(obj.get("key"), f"{path}.key")
    return KeyedProbe(
        **_probe_fields(obj, path),
        key_from=_opt_text(obj.get("key_from"), f"{path}.key_from"),
        key=SecretValue(key) if key is not None else None,
        skipped=_opt_text(obj.get("skipped"), f"{path}.skipped"),
    )


def _audit(r: _Reader, raw: Any, path: str) -> AuditSection:
    obj = _obj(raw, path)
    probes = _obj(_or(obj.get("probes"), {}), f"{path}.probes")
    host = obj.get("host_network")
    host_network = None
    if host is not None:
        host_obj = _obj(host, f"{path}.host_network")
        names = host_obj.get("containers")
        host_network = HostNetwork(
            _names(names, f"{path}.host_network.containers") if names is not None else None,
            _error(host_obj, f"{path}.host_network"),
        )
    keys = obj.get("envfile_keys")

    def keyed(name: str) -> KeyedProbe | None:
        value = probes.get(name)
        return None if value is None else _keyed_probe(value, f"{path}.probes.{name}")

    return AuditSection(
        envfile_keys=_mapping(_or(keys, {}), f"{path}.envfile_keys", _env_key_state),
        chat_noauth=_opt_probe(probes.get("chat_noauth"), f"{path}.probes.chat_noauth"),
        models_key=keyed("models_key"),
        models_mesh_key=keyed("models_mesh_key"),
        host_network=host_network,
        error=_error(obj, path),
        # A live answer's audit section always lists them (or says why not); the section's
        # own failure (`error`, nothing else) lists nothing.
        running=_running(r.get(obj, "running", path, not obj.get("error")), f"{path}.running"),
    )


def _running(raw: Any, path: str) -> Running | None:
    if raw is None:
        return None
    obj = _obj(raw, path)
    listed = obj.get("containers")
    return Running(
        None
        if listed is None
        else tuple(
            _running_container(c, f"{path}.containers[{i}]")
            for i, c in enumerate(_list(listed, f"{path}.containers"))
        ),
        _error(obj, path),
    )


def _running_container(raw: Any, path: str) -> RunningContainer:
    obj = _obj(raw, path)
    ports = obj.get("ports")
    return RunningContainer(
        name=_name(obj.get("name"), f"{path}.name"),
        image=_opt_text(obj.get("image"), f"{path}.image"),
        project=_opt_name(obj.get("project"), f"{path}.project"),
        service=_opt_name(obj.get("service"), f"{path}.service"),
        host_network=_bool(_or(obj.get("host_network"), False), f"{path}.host_network"),
        ports=_ports(ports, f"{path}.ports") if ports is not None else {},
    )


# -- the controller's probes -----------------------------------------------------------------------
@record_class(eq=False, kw_only=True, repr=False)
class MeshDetectProbe(Probe):
    """The gateway's /mesh/detect answer: is it a mesh member?"""

    mesh: bool | None = None  # /mesh/detect's `mesh`


@record_class(eq=False, kw_only=True, repr=False)
class ProofProbe(Probe):
    """A weakest-link request: through `via`, for `role`, which `host` serves (audit phase 2)."""

    via: str
    role: str
    host: str
    url: str


@record_class(eq=False, kw_only=True, repr=False)
class LanePortProbe(Probe):
    """An unauthenticated request to a lane port published on the box (audit phase 2)."""

    box: str
    container: str
    url: str


@record_class(eq=False, repr=False)
class ControllerAudit:
    """The controller side of an audit: keyless probes, proofs, lane ports."""

    chat_noauth: Probe | None = None
    mesh_detect: MeshDetectProbe | None = None
    weakest_link: tuple[ProofProbe, ...] = ()
    lane_ports: tuple[LanePortProbe, ...] = ()


@record_class(eq=False, repr=False)
class ControllerProbes:
    """What a caller on the network got from the box's gateway, without a key."""

    base: str | None = None
    health: HealthProbe | None = None
    capabilities: CapabilitiesProbe | None = None
    models_noauth: Probe | None = None
    audit: ControllerAudit | None = None


NO_PROBES = ControllerProbes()


def parse_probes(raw: Any) -> ControllerProbes | Fault:
    """The controller's probes of one box (observe/probes.py, audit/probes.py) -> typed.

    The controller made these itself, but the bodies are the gateway's answers, and a snapshot
    may come from anywhere: the same checks as the collector's document apply."""
    try:
        return _controller(raw if raw is not None else {}, CONTROLLER_PART)
    except _Bad as exc:
        return exc.fault
    except RecursionError:
        return Fault(FaultKind.MALFORMED, "nested too deeply", CONTROLLER_PART)


def _controller(raw: Any, path: str) -> ControllerProbes:
    obj = _obj(raw, path)

    def part(key: str, read: Callable[[Any, str], T]) -> T | None:
        value = obj.get(key)
        return None if value is None else read(value, f"{path}.{key}")

    return ControllerProbes(
        base=_opt_text(obj.get("base"), f"{path}.base"),
        health=part("health", _health),
        capabilities=part("capabilities", _capabilities),
        models_noauth=part("models_noauth", _probe),
        audit=part("audit", _controller_audit),
    )


def _controller_audit(raw: Any, path: str) -> ControllerAudit:
    obj = _obj(raw, path)
    mesh = obj.get("mesh_detect")
    proofs = obj.get("weakest_link")
    lanes = obj.get("lane_ports")
    return ControllerAudit(
        chat_noauth=_opt_probe(obj.get("chat_noauth"), f"{path}.chat_noauth"),
        mesh_detect=None if mesh is None else _mesh_detect(mesh, f"{path}.mesh_detect"),
        weakest_link=tuple(
            _proof(p, f"{path}.weakest_link[{i}]")
            for i, p in enumerate(_list(_or(proofs, []), f"{path}.weakest_link"))
        ),
        lane_ports=tuple(
            _lane_port(p, f"{path}.lane_ports[{i}]")
            for i, p in enumerate(_list(_or(lanes, []), f"{path}.lane_ports"))
        ),
    )


def _mesh_detect(raw: Any, path: str) -> MeshDetectProbe:
    def mesh(body: dict[str, Any] | None) -> bool | None:
        return _opt_bool((body or {}).get("mesh"), f"{path}.body.mesh")

    fields, found = _answered(_obj(raw, path), path, mesh)
    return MeshDetectProbe(**fields, mesh=found)


def _proof(raw: Any, path: str) -> ProofProbe:
    obj = _obj(raw, path)
    return ProofProbe(
        **_probe_fields(obj, path),
        via=_name(obj.get("via"), f"{path}.via"),
        role=_name(obj.get("role"), f"{path}.role"),
        host=_name(obj.get("host"), f"{path}.host"),
        url=_text(obj.get("url"), f"{path}.url"),
    )


def _lane_port(raw: Any, path: str) -> LanePortProbe:
    obj = _obj(raw, path)
    return LanePortProbe(
        **_probe_fields(obj, path),
        box=_name(obj.get("box"), f"{path}.box"),
        container=_name(obj.get("container"), f"{path}.container"),
        url=_text(obj.get("url"), f"{path}.url"),
    )


# Float fields are not read by the tool today; _number is kept for `elapsed_s`.
def elapsed(raw: Any) -> float:
    """A snapshot's `elapsed_s` (seconds the observation took), 0.0 when unreadable."""
    try:
        return _number(raw, "elapsed_s")
    except _Bad:
        return 0.0
