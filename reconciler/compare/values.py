"""Normalising observed values into the desired side's terms (pure helpers)."""

from __future__ import annotations

import functools
import json
import shlex
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from reconciler.compare.drift import SecretValue, Value
from reconciler.observe.document import EnvValue


def value(raw: EnvValue | bool | list[Any] | tuple[Any, ...] | None) -> Value:
    """An observed value (from the typed document) -> a drift value: lists become tuples."""
    if isinstance(raw, list | tuple):
        return tuple(value(v) for v in raw)
    return raw


def same(a: Any, b: Any) -> bool:
    """Equal as compose would see them; JSON-looking strings compare by content."""
    if a == b:
        return True
    if isinstance(a, str) and isinstance(b, str) and a[:1] in "{[" and b[:1] in "{[":
        try:
            return bool(json.loads(a) == json.loads(b))
        except (ValueError, RecursionError):  # a box's string may nest past the parser's depth
            return False
    return False


def changed_keys(
    expected: Mapping[str, EnvValue], observed: Mapping[str, EnvValue]
) -> dict[str, tuple[EnvValue | None, EnvValue | None]]:
    """Two flat mappings (a container's environment) -> {key: (expected, observed)} for every
    key added, removed or changed, absent as None, in key order. Environments are flat
    str -> str maps, so a set of keys is the whole diff; deepdiff's tree walk cost ~0.2 s CPU
    per drift run here.
    The (key, value) pairs in one map and not the other are a set operation in C (the values,
    text and hashed secrets, are hashable; a key whose value differs appears twice)."""
    try:
        differing = {key for key, _ in expected.items() ^ observed.items()}
    except TypeError:  # an unhashable value: key by key
        differing = {
            key
            for key in expected.keys() | observed.keys()
            if key not in expected or key not in observed or expected[key] != observed[key]
        }
    return {key: (expected.get(key), observed.get(key)) for key in sorted(differing)}


Flags = dict[str, list[EnvValue | bool]]  # parse_argv's {flag: [values...]}


def parse_argv(argv: Sequence[EnvValue] | None) -> tuple[list[EnvValue], Flags]:
    """Split a vLLM-style argv into positionals and {flag: [values...]}.

    `--flag=value` and `--flag value` both map to the flag; a bare `--flag` (a boolean) maps to
    True. Secret values (already digests) stay opaque.
    """
    positionals, flags = _remembered(argv)
    # Copies: the remembered parse is shared by every call with this command line.
    return list(positionals), {name: list(values) for name, values in flags.items()}


def flags_of(argv: Sequence[EnvValue] | None) -> Mapping[str, tuple[EnvValue | bool, ...]]:
    """parse_argv's flags, read-only: {flag: (values...)}, shared by every caller that only
    reads them (no copy to make)."""
    return MappingProxyType(_remembered(argv)[1])


Parsed = tuple[tuple[EnvValue, ...], dict[str, tuple[EnvValue | bool, ...]]]


def _remembered(argv: Sequence[EnvValue] | None) -> Parsed:
    tokens = tuple(argv or ())
    try:
        return _parsed(tokens)
    except TypeError:  # a token that cannot be hashed (not one the typed parse lets through)
        return _frozen(tokens)


def _frozen(items: tuple[EnvValue, ...]) -> Parsed:
    """_parse's answer in tuples: remembered and shared, so nobody can change it."""
    positionals, flags = _parse(items)
    return tuple(positionals), {name: tuple(values) for name, values in flags.items()}


def _parse(items: tuple[EnvValue, ...]) -> tuple[list[EnvValue], Flags]:
    positionals: list[EnvValue] = []
    flags: Flags = {}
    # argv_items' walk inlined (no generator step per token: compare parses ~20 argv a box).
    i, count = 0, len(items)
    while i < count:
        token = items[i]
        if isinstance(token, str) and token.startswith("--"):
            name, eq, inline = token.partition("=")
            parsed: EnvValue | bool
            if eq:
                parsed = _secret_inline(inline)
            elif i + 1 < count and not _is_flag(items[i + 1]):
                parsed = items[i + 1]
                i += 1
            else:
                parsed = True
            flags.setdefault(name, []).append(parsed)
        elif not isinstance(token, bool):  # True stands only for a bare flag
            positionals.append(token)
        i += 1
    return positionals, flags


# Remembered per command line (bounded: a box chooses its commands): a fleet's lanes run a
# handful of distinct command lines, and comparing a box parses each of its lanes' twice (the
# render's and the running one): ~12 us a parse, ~0.1 s of comparing 1,000 boxes.
_parsed = functools.lru_cache(maxsize=1024)(_frozen)


def argv_items(
    argv: Sequence[EnvValue] | None,
) -> Iterator[tuple[int, str | None, EnvValue | bool]]:
    """(index in argv, flag name or None for a positional, value) in order: parse_argv's walk,
    with each item's position kept so a sequence diff can name where a positional sits."""
    items = list(argv or ())
    i = 0
    while i < len(items):
        token, at = items[i], i
        if isinstance(token, str) and token.startswith("--"):
            name, eq, inline = token.partition("=")
            parsed: EnvValue | bool
            if eq:
                parsed = _secret_inline(inline)
            elif i + 1 < len(items) and not _is_flag(items[i + 1]):
                parsed = items[i + 1]
                i += 1
            else:
                parsed = True
            yield at, name, parsed
        else:
            yield at, None, token
        i += 1


def _is_flag(token: Any) -> bool:
    return isinstance(token, str) and token.startswith("--")


def _secret_inline(text: str) -> EnvValue:
    # The collector writes `--api-key={"secret": "..."}` so the flag name survives masking.
    if text.startswith('{"secret"'):
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError):
            return text
        digest = raw.get("secret") if isinstance(raw, dict) else None
        if isinstance(digest, str) and len(raw) == 1:
            return SecretValue(digest)
    return text


def knob_tokens(flag: str, knob_value: str) -> list[str]:
    """What a `.env` knob puts on the command line, lexed like compose does.

    `WORKER_MAX_MODEL_LEN=262144` -> `--max-model-len=262144`; a knob that carries its own flag
    (`'--speculative-config={...}'`) is lexed as is.
    """
    text = knob_value.strip()
    if text.startswith(("'", '"', "--")):
        return list(_lexed(text))
    return [f"{flag}={text}"]


@functools.lru_cache(maxsize=4096)
def _lexed(text: str) -> tuple[str, ...]:
    """shlex's tokens of a knob (~0.2 ms each, pure Python): a fleet's boxes mostly share
    their knobs' values, so each distinct one is lexed once per run, not once per box."""
    try:
        return tuple(shlex.split(text))
    except ValueError:
        return (text,)
