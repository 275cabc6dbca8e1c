"""Layer group_vars documents: all -> groups -> box, deep-merged, remembering who set what.

Mappings merge key by key; anything else (scalars, lists such as the compose `-f` chain)
is replaced whole by the later layer, because half a chain is never what an operator means.
pyinfra's own host.data lookup is shallow, which is why this exists.
"""

from __future__ import annotations

from typing import Any

from reconciler.desired.problems import Location, PathKey
from reconciler.desired.yaml_source import SourceDoc


def merge_layers(layers: list[SourceDoc]) -> tuple[dict[str, Any], dict[PathKey, Location]]:
    merged: dict[str, Any] = {}
    positions: dict[PathKey, Location] = {}
    for doc in layers:
        if () not in positions:
            positions[()] = doc.positions.get((), Location(doc.file, 1, 1))
        _merge_into(merged, doc.data, (), doc, positions)
    return merged, positions


def _merge_into(
    target: dict[str, Any],
    incoming: dict[str, Any],
    path: PathKey,
    doc: SourceDoc,
    positions: dict[PathKey, Location],
) -> None:
    for key, value in incoming.items():
        child = (*path, key)
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            positions[child] = doc.positions[child]
            _merge_into(target[key], value, child, doc, positions)
            continue
        # A replaced subtree must not keep the positions of what it replaced.
        for stale in [p for p in positions if p[: len(child)] == child]:
            del positions[stale]
        target[key] = _copy(value)
        for p, loc in doc.positions.items():
            if p[: len(child)] == child:
                positions[p] = loc


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value
