"""Render a box's merged desired state for people: YAML annotated with the layer that set
each value, and the managed `.env` keys with secrets as ***.

A value whose key is no secret may still carry one (`LOBES_EXTRA_ARGS: --api-key sk-...`):
drift never shows it (the box hashes it in place, compare/inline.py), and neither does show.
The secret words are `***` (history/masking.py's `argv`, the rule `reconcile diff` and the
history store mask a command line's clear secrets by), the rest of the value stays; a value
drift's judgement (inline.may_carry_secret) still finds a secret in after that (a quoted
secret, `Authorization: Bearer x`) is `***` whole.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from reconciler.compare.inline import may_carry_secret
from reconciler.desired.entries import EnvEntry, SecretName
from reconciler.desired.envfile import box_env
from reconciler.desired.fleet import Fleet
from reconciler.desired.problems import Location, PathKey
from reconciler.history.masking import argv

MASK = "***"
_WORDS = re.compile(r"(\s+)")


def shown_value(value: str) -> str:
    """An `.env` value as show prints it: any secret it carries inline as `***`."""
    if not may_carry_secret(value):
        return value
    parts = _WORDS.split(value)  # words at even indices, the blanks between them kept
    words = parts[::2]
    masked = argv(words)
    # What the words masked leave (a flag hiding the next word goes with it): if drift would
    # still find a secret there, or a quote may have split one across words, hide it all.
    left = [
        word
        for i, word in enumerate(words)
        if masked[i] == word and not (i + 1 < len(words) and masked[i + 1] != words[i + 1])
    ]
    if "'" in value or '"' in value or may_carry_secret(" ".join(left)):
        return MASK
    parts[::2] = masked
    return "".join(parts)


def env_lines(entries: list[EnvEntry]) -> list[str]:
    """KEY=value lines as compose will read them; a secret shows *** and its source."""
    out = []
    for entry in entries:
        if entry.value is None:
            out.append(f"# {entry.key} left out of .env   (null: {entry.origin})")
        elif isinstance(entry.value, str):
            out.append(f"{entry.key}={shown_value(entry.value)}")
        else:
            out.append(f"{entry.key}={MASK}   # secret {entry.value.secret}")
    return out


def show_text(fleet: Fleet, box: str) -> str:
    spec = fleet.boxes[box]
    data = _desired(spec.model_dump(mode="json", exclude={"name"}))
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
        e.key: {"value": _shown_entry(e.value)}
        | {"origin": e.origin}
        | ({"secret": e.value.secret} if isinstance(e.value, SecretName) else {})
        for e in box_env(fleet, box)
    }
    doc = {
        "box": box,
        "layers": list(fleet.layers[box]),
        "connection": fleet.connection(box).model_dump(mode="json"),
        "desired": _desired(spec.model_dump(mode="json", exclude={"name"})),
        "env": env,
    }
    return json.dumps(doc, indent=2) + "\n"


def _shown_entry(value: str | SecretName | None) -> str | None:
    if value is None:
        return None
    return shown_value(value) if isinstance(value, str) else MASK


def _desired(data: dict[str, Any]) -> dict[str, Any]:
    """A box's dumped state with the text of its `env:` pins (the box's and each lane's) as
    `shown_value` prints it: the same values reach `.env`."""

    def pins(env: dict[str, Any]) -> dict[str, Any]:
        return {k: shown_value(v) if isinstance(v, str) else v for k, v in env.items()}

    lanes = {name: {**lane, "env": pins(lane["env"])} for name, lane in data["lanes"].items()}
    return {**data, "env": pins(data["env"]), "lanes": lanes}


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
        if any(isinstance(v, dict | list) for v in node):
            # A list of mappings (audit.expected_containers) in block style: each key's
            # comment inside a flow mapping would end the line in the middle of it.
            seq.fa.set_block_style()
        else:
            seq.fa.set_flow_style()  # a list of values stays on its key's line
        return seq
    return node


def _where(loc: Location) -> str:
    return f"{loc.file}:{loc.line}"
