"""The JSON Schema of one group_vars layer, for editor completion.

A layer is partial (thor.yaml sets a few keys, all.yaml most), so nothing is required in it;
the loader still checks that the merged result is complete.
"""

from __future__ import annotations

import json
from typing import Any

from reconciler.desired.models import BoxSpec


def layer_schema() -> dict[str, Any]:
    schema = BoxSpec.model_json_schema()
    schema["properties"].pop("name", None)
    _drop_required(schema)
    schema["title"] = "fleet-reconciler group_vars layer"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


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
