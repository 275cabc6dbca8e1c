"""The JSON Schema of one group_vars layer, for editor completion.

A layer is partial (thor.yaml sets a few keys, all.yaml most), so nothing is required in it;
the loader checks each layer on its own against it (layer_errors), and that the merged result
is complete.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from reconciler.desired.models import BoxSpec


def layer_schema() -> dict[str, Any]:
    schema = BoxSpec.model_json_schema()
    schema["properties"].pop("name", None)
    _drop_required(schema)
    schema["title"] = "fleet-reconciler group_vars layer"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


# What layer_schema() no longer requires of a layer, as pydantic words it: a key (`missing`),
# and a secret's `source:` (a layer may change a secret's path and leave its source to the
# layer below).
_LEFT_TO_OTHER_LAYERS = frozenset({"missing", "union_tag_not_found"})


def layer_errors(layer: dict[str, Any]) -> ValidationError | None:
    """What is wrong with one layer on its own against layer_schema(): BoxSpec's own checks
    (types, ranges, unknown keys, patterns) with nothing required. `name` is not a layer's key
    (the loader says so at its line). None: nothing."""
    try:
        BoxSpec.model_validate({k: v for k, v in layer.items() if k != "name"})
    except ValidationError as exc:
        errors = [e for e in exc.errors() if e["type"] not in _LEFT_TO_OTHER_LAYERS]
        return ValidationError.from_exception_data(exc.title, errors) if errors else None  # type: ignore[arg-type]
    return None


def layer_schema_json() -> str:
    return json.dumps(layer_schema(), indent=2, sort_keys=True) + "\n"


def _drop_required(node: Any) -> None:
    if isinstance(node, dict):
        node.pop("required", None)
        for value in node.values():
            _drop_required(value)
    elif isinstance(node, list):
        for value in node:
            _drop_required(value)
