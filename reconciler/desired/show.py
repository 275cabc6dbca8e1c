"""Render a box's merged desired state for people: YAML annotated with the layer that set
each value, and the managed `.env` keys with secrets as ***.

A value whose key is no secret may still carry one (`LOBES_EXTRA_ARGS: --api-key sk-...`):
drift never shows it (the box hashes it in place, compare/inline.py), and neither does show.
The secret words are `***` (history/masking.py's `argv`, the rule `reconcile diff` and the
history store mask a command line's clear secrets by), the rest of the value stays; a value
drift's judgement (inline.may_carry_secret) still finds a secret in after that (a quoted
secret, `Authorization: Bearer x`) is `***` whole.

Secret names are judged as a drift run judges them: under the built-in floor and every box's
`secret_patterns` (`adopt_patterns`), so a value drift shows as `***` is never shown in clear.
"""

from __future__ import annotations

import io
import json
import re
import weakref
from collections.abc import Iterable
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from reconciler.compare.inline import may_carry_secret
from reconciler.desired.entries import EnvEntry, SecretName
from reconciler.desired.envfile import box_env
from reconciler.desired.fleet import Fleet
from reconciler.desired.problems import Location, PathKey
from reconciler.desired.secret_names import adopt_fleet_patterns, fleet_patterns
from reconciler.history.masking import argv

MASK = "***"
_WORDS = re.compile(r"(\s+)")

# The fleet whose patterns were adopted last, and what they were: a 1,000-box show renders a
# box at a time, and the union of every box's patterns is the same for each.
_adopted: tuple[weakref.ref[Fleet], tuple[str, ...]] | None = None


def adopt_patterns(fleet: Fleet) -> None:
    """Judge secret names under `fleet`'s own patterns, as a drift run of it does: the union of
    every box's `secret_patterns` (drift_inputs' `secret_patterns`, which drift.py hands to
    `adopt_fleet_patterns`). The maskers `shown_value` relies on (`argv`'s secret flags,
    `may_carry_secret`'s assignments) judge a name under the adopted patterns only: without
    this, `DB_PW=x` under a fleet's `*_PW` was shown in clear where drift shows `***`."""
    global _adopted
    if _adopted is not None and _adopted[0]() is fleet and _adopted[1] == fleet_patterns():
        return
    adopt_fleet_patterns(p for spec in fleet.boxes.values() for p in spec.secret_patterns)
    _adopted = (weakref.ref(fleet), fleet_patterns())


def shown_value(value: str) -> str:
    """An `.env` value as show prints it: any secret it carries inline as `***` (secret names
    as the last `adopt_patterns` made them: show_text and show_json adopt their fleet's)."""
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
    adopt_patterns(fleet)
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
    """One box's document (`reconcile show BOX --format json`)."""
    return json.dumps(show_doc(fleet, box), indent=2) + "\n"


def show_json_boxes(fleet: Fleet, boxes: Iterable[str]) -> str:
    """Several boxes as one JSON document, `{"boxes": {name: show_json's document}}` in the
    order given (`reconcile show --format json`): one document per box, one after the other,
    was no JSON a reader could parse."""
    return json.dumps({"boxes": {box: show_doc(fleet, box) for box in boxes}}, indent=2) + "\n"


def show_doc(fleet: Fleet, box: str) -> dict[str, Any]:
    """One box's document as `show --format json` prints it (JSON-able as it is: pyinfra's
    host.data takes its parts, reconciler/desired/pyinfra_data.py)."""
    adopt_patterns(fleet)
    spec = fleet.boxes[box]
    env = {
        e.key: {"value": _shown_entry(e.value)}
        | {"origin": e.origin}
        | ({"secret": e.value.secret} if isinstance(e.value, SecretName) else {})
        for e in box_env(fleet, box)
    }
    return {
        "box": box,
        "layers": list(fleet.layers[box]),
        "connection": fleet.connection(box).model_dump(mode="json"),
        "desired": _desired(spec.model_dump(mode="json", exclude={"name"})),
        "env": env,
    }


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
            comment = _origin(value, child, where)
            if comment is not None:
                out.yaml_add_eol_comment(comment, key, column=0)
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


def _origin(value: Any, path: PathKey, where: dict[PathKey, Location]) -> str | None:
    """The end-of-line comment of the key at `path`: the file:line that set its value, or
    `default`. None for a mapping that holds keys: each of them names its own (they may come
    from several layers, and the mapping's own position is only the last one's)."""
    if isinstance(value, dict) and value:
        return None
    if isinstance(value, list):
        # A list is set whole by one layer, but `secret_patterns` is every layer's (a layer
        # only adds names): each file its items came from, at its first item's line.
        files: dict[str, Location] = {}
        for i in range(len(value)):
            loc = where.get((*path, i))
            if loc is not None:
                files.setdefault(loc.file, loc)
        if len(files) > 1:
            return ", ".join(_where(loc) for loc in files.values())
    if path in where:
        return _where(where[path])
    return "default"


def _where(loc: Location) -> str:
    return f"{loc.file}:{loc.line}"
