"""Render a box's merged desired state for people: YAML annotated with the layer that set
each value, and the managed `.env` keys with secrets as ***."""

from __future__ import annotations

import io
import json
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from reconciler.desired.entries import EnvEntry, SecretName
from reconciler.desired.envfile import box_env
from reconciler.desired.fleet import Fleet
from reconciler.desired.problems import Location, PathKey

MASK = "***"


def env_lines(entries: list[EnvEntry]) -> list[str]:
    """KEY=value lines as compose will read them; a secret shows *** and its source."""
    out = []
    for entry in entries:
        if entry.value is None:
            out.append(f"# {entry.key} left out of .env   (null: {entry.origin})")
        elif isinstance(entry.value, str):
            out.append(f"{entry.key}={entry.value}")
        else:
            out.append(f"{entry.key}={MASK}   # secret {entry.value.secret}")
    return out


def show_text(fleet: Fleet, box: str) -> str:
    spec = fleet.boxes[box]
    data = spec.model_dump(mode="json", exclude={"name"})
    annotated = _annotate(data, (), fleet.positions[box])
    buf = io.StringIO()
    yaml = YAML()
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.dump(annotated, buf)
    layers = " -> ".join(fleet.layers[box])
    conn = fleet.connection(box)
    header = [
        f"# box {box}: {conn.ssh_user}@{conn.ssh_hostname}:{conn.ssh_port}"
        f" ({fleet.inventory_file})",
        f"# layers: {layers}",
        "# secret_patterns: every layer's, plus the built-in floor (a layer can only add names)",
    ]
    env = [
        f"# .env keys managed on {box} ({spec.deployment.directory}/.env)",
        *env_lines(box_env(fleet, box)),
    ]
    return "\n".join([*header, buf.getvalue().rstrip(), "", *env]) + "\n"


def show_json(fleet: Fleet, box: str) -> str:
    spec = fleet.boxes[box]
    env = {
        e.key: {"value": e.value if e.value is None or isinstance(e.value, str) else MASK}
        | {"origin": e.origin}
        | ({"secret": e.value.secret} if isinstance(e.value, SecretName) else {})
        for e in box_env(fleet, box)
    }
    doc = {
        "box": box,
        "layers": list(fleet.layers[box]),
        "connection": fleet.connection(box).model_dump(mode="json"),
        "desired": spec.model_dump(mode="json", exclude={"name"}),
        "env": env,
    }
    return json.dumps(doc, indent=2) + "\n"


def _annotate(node: Any, path: PathKey, where: dict[PathKey, Location]) -> Any:
    if isinstance(node, dict):
        out = CommentedMap()
        for key, value in node.items():
            child = (*path, key)
            out[key] = _annotate(value, child, where)
            if not isinstance(value, dict | list) and child in where:
                out.yaml_add_eol_comment(_where(where[child]), key, column=0)
            elif not isinstance(value, dict | list):
                out.yaml_add_eol_comment("default", key, column=0)
        return out
    if isinstance(node, list):
        seq = CommentedSeq(_annotate(v, (*path, i), where) for i, v in enumerate(node))
        seq.fa.set_flow_style()
        return seq
    return node


def _where(loc: Location) -> str:
    return f"{loc.file}:{loc.line}"
