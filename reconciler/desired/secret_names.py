"""Which variable names hold secrets: a built-in floor that no configuration can lower.

`secret_patterns` in group_vars can only add names. Whatever a layer lists (fewer patterns, `[]`,
a narrower box file), every use of the list goes through `effective()`, which puts the floor
back: the desired-state model, the collector and converge payloads, the audit, the reports and
`reconcile show`. The floor is reconciler/box_shared/secret_floor.py, which the box programs
carry too and union with what a payload lists, so an old or crafted payload cannot switch
hashing off either.

Stdlib only: the repeated-drift path and the payload builders import it.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from reconciler.box_shared.secret_floor import FLOOR


def effective(patterns: Iterable[str] = ()) -> tuple[str, ...]:
    """The configured patterns (their order kept, repeats dropped) followed by every floor
    pattern they do not already list."""
    out: list[str] = []
    for pattern in (*patterns, *FLOOR):
        if isinstance(pattern, str) and pattern not in out:
            out.append(pattern)
    return tuple(out)


def is_secret_name(name: str, patterns: Iterable[str] = ()) -> bool:
    """A name any configured pattern or the floor matches. The floor also matches in upper
    case (`hf_token` in a container's environment holds the same kind of value)."""
    if patterns:
        configured = patterns if type(patterns) is tuple else tuple(patterns)
        if _any_of(configured)(name):
            return True
    upper = name.upper()
    return _floor_matches(upper) if len(upper) > 64 else _floor_matches_remembered(upper)


@functools.lru_cache(maxsize=64)
def _any_of(patterns: tuple[str, ...]) -> Callable[[str], object]:
    """Whether a name matches any of these globs, as `fnmatch.fnmatchcase` matches each: their
    translations as one regular expression, one C match a name (a drift judges a few hundred
    names, and ~15 fnmatch calls each were ~3 ms of a repeated run)."""
    globs = [p for p in patterns if isinstance(p, str)]
    if not globs:
        return lambda name: False
    return re.compile("|".join(fnmatch.translate(p) for p in globs)).match


def _floor_matches(upper: str) -> bool:
    return _any_of(FLOOR)(upper) is not None


# Remembered per short name (bounded: a box chooses names): a report asks this of every drift's
# path, twice, and a fleet's paths are a few hundred names; ~20 fnmatch calls each were a third
# of the JSON report's time.
_floor_matches_remembered = functools.lru_cache(maxsize=4096)(_floor_matches)


# The fleet's own patterns beyond the floor (every box's `secret_patterns`), adopted by a drift
# run once it knows its desired state. The last guards that judge a name without a box at hand
# (the reports' `secret_path`, the history store's masking, the free-text scrub) then mask a
# clear value under them too: a snapshot saved before the pattern was added, or edited, holds
# such values in clear, and the collector's hashing on the box never saw them.
_fleet_patterns: tuple[str, ...] = ()
_forgetters: list[Callable[[], None]] = []


def fleet_patterns() -> tuple[str, ...]:
    return _fleet_patterns


def adopt_fleet_patterns(patterns: Iterable[str]) -> None:
    """Make `patterns` (the floor's own are dropped) the fleet's; what was judged under the
    previous ones is forgotten."""
    global _fleet_patterns
    extra = tuple(dict.fromkeys(p for p in patterns if isinstance(p, str) and p not in FLOOR))
    if extra == _fleet_patterns:
        return
    _fleet_patterns = extra
    for forget in _forgetters:
        forget()


def is_fleet_secret_name(name: str) -> bool:
    """`is_secret_name` under the adopted fleet patterns."""
    return is_secret_name(name, _fleet_patterns)


def when_patterns_change(forget: Callable[[], None]) -> None:
    """Call `forget` whenever the fleet's patterns change (a module's memory of judged names)."""
    _forgetters.append(forget)


def added_by_layers(layers: Sequence[Any]) -> list[tuple[Any, Any, int]] | None:
    """`secret_patterns` of every layer, lower layers first, each pattern once: a layer adds to
    what the layers below it list and can never remove one. Returns (pattern, layer, index in
    that layer) triples, or None when the merged value is not a sequence (the model then reports
    the wrong type where the last layer set it). `layers` are SourceDocs (`.data`)."""
    merged: Any = None
    found = False
    for doc in layers:
        data = getattr(doc, "data", None)
        if isinstance(data, dict) and "secret_patterns" in data:
            merged = data["secret_patterns"]
            found = True
    if not found or not isinstance(merged, list | tuple):
        return None
    out: list[tuple[Any, Any, int]] = []
    seen: list[Any] = []
    for doc in layers:
        data = getattr(doc, "data", None)
        value = data.get("secret_patterns") if isinstance(data, dict) else None
        if not isinstance(value, list | tuple):
            continue
        for index, pattern in enumerate(value):
            if pattern not in seen:
                seen.append(pattern)
                out.append((pattern, doc, index))
    return out


def union_layers(layers: Sequence[Any], data: dict[str, Any], where: dict[Any, Any]) -> None:
    """Make the merged `secret_patterns` the union of every layer's list (see
    `added_by_layers`), each pattern keeping the FILE:LINE:COL of the layer that listed it."""
    triples = added_by_layers(layers)
    if triples is None:
        return
    merged = [pattern for pattern, _, _ in triples]
    data["secret_patterns"] = (
        tuple(merged) if isinstance(data["secret_patterns"], tuple) else merged
    )
    for stale in [k for k in where if len(k) > 1 and k[0] == "secret_patterns"]:
        del where[stale]
    for index, (_, doc, at) in enumerate(triples):
        location = doc.positions.get(("secret_patterns", at))
        if location is not None:
            where[("secret_patterns", index)] = location
