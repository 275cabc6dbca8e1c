"""Turn pydantic's validation errors into one operator-readable line per problem.

pydantic reports a location as a tuple that mixes data keys with union member tags
(`('env', 'X', 'SecretRef', 'secret')`); we walk it along the real data to find the YAML path,
look the path up in the position table, and reword the message in terms of YAML keys.
Unknown keys get the nearest valid name, taken from the model's JSON Schema.

An input value is shown to help fix a typo, except under a secret-named key (`env.HF_TOKEN`,
`gateway.api_key`, anything the floor or `secret_patterns` matches): there the value may be a
real key pasted into YAML, so the message says what was wrong with it and never what it was.
pydantic's own text (`input_value=...`) is never printed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from reconciler.desired.near import nearest
from reconciler.desired.problems import Location, PathKey, Problem, dotted
from reconciler.desired.secret_names import is_secret_name

HIDDEN = "(value not shown: a secret-named key)"
# A value an overlay set: a file a tool wrote, or whatever the inventory names as one.
OVERLAY_HIDDEN = "(value not shown: an overlay's)"
# Keys whose value is a secret whatever they are called: a literal here is the key itself.
_SECRET_SLOTS: tuple[PathKey, ...] = (("gateway", "api_key"), ("mesh", "key"))
# Fields named like a secret that hold where one is, never the secret: an inventory's path to an
# SSH key file. Hiding their value would hide why a path was refused.
_LOCATORS = frozenset({"ssh_key"})


def explain(
    exc: ValidationError,
    model: type[BaseModel],
    data: Any,
    positions: dict[PathKey, Location],
    hidden_files: frozenset[str] = frozenset(),
) -> list[Problem]:
    """`hidden_files`: files whose values are never shown (the overlays: files the inventory
    names, written by tools, whose content is not the operator's YAML)."""
    schema = model.model_json_schema()
    located = []
    for error in exc.errors(include_url=False):
        path = _data_path(error["loc"], data)
        if error["type"] == "missing":
            path = (*path, str(error["loc"][-1])) if error["loc"] else path
        located.append((path, error))
    located = _drop_union_noise(located)
    suggested = {
        (*path[:-1], hint)
        for path, error in located
        if error["type"] == "extra_forbidden"
        for hint in _nearest(str(path[-1]), _keys_at(schema, path[:-1]))
    }
    patterns = _patterns(data)
    problems = []
    for path, error in located:
        if error["type"] == "missing" and path in suggested:
            continue  # "unknown key max_model_length; did you mean max_model_len?" says it
        where = _locate(path, positions)
        hidden = HIDDEN if holds_secret(path, patterns) else ""
        if not hidden and where.file in hidden_files:
            hidden = OVERLAY_HIDDEN
        problems.append(Problem(where, dotted(path), _message(error, path, schema, hidden)))
    return problems


def _patterns(data: Any) -> tuple[str, ...]:
    raw = data.get("secret_patterns") if isinstance(data, dict) else None
    return tuple(p for p in raw if isinstance(p, str)) if isinstance(raw, list | tuple) else ()


def holds_secret(path: PathKey, patterns: tuple[str, ...] = ()) -> bool:
    """Whether the value at `path` (or a part of it) may be a secret: an `env:` key or any
    key whose name is secret-named, or a slot that only ever holds a secret reference."""
    if any(path[: len(slot)] == slot for slot in _SECRET_SLOTS):
        return True
    for index, part in enumerate(path):
        if not isinstance(part, str):
            continue
        under_env = index > 0 and path[index - 1] == "env"
        last = index == len(path) - 1 and part not in _LOCATORS
        if (under_env or last) and is_secret_name(part, patterns):
            return True
    return False


def _nearest(word: str, options: list[str]) -> list[str]:
    near = nearest(word, options)
    return [near] if near else []


def _drop_union_noise(located: list[tuple[PathKey, Any]]) -> list[tuple[PathKey, Any]]:
    """A mapping given where a union also allows scalars fails every scalar member too:
    keep the errors of the mapping member. Several scalar failures at one path become one."""
    deeper = {path[:i] for path, _ in located for i in range(len(path))}
    out: list[tuple[PathKey, Any]] = []
    merged: dict[PathKey, list[Any]] = {}
    for path, error in located:
        is_type = error["type"].endswith("_type")
        if is_type and isinstance(error.get("input"), dict) and path in deeper:
            continue
        if is_type:
            if path not in merged:
                merged[path] = []
                out.append(
                    (path, {"type": "union_type", "input": error.get("input"), "all": merged[path]})
                )
            merged[path].append(_expected_kind(error))
            continue
        out.append((path, error))
    return [(p, _single(e)) if e["type"] == "union_type" else (p, e) for p, e in out]


def _expected_kind(error: Any) -> str:
    """`int`, `dict`, ... from a `*_type` error; a model's as `model:ClassName`, so its message
    can name the shape that model wants (_article)."""
    kind = str(error["type"]).removesuffix("_type")
    if kind == "model":
        return f"model:{error.get('ctx', {}).get('class_name', '')}"
    return kind


def _single(error: Any) -> Any:
    kinds = error["all"]
    if len(kinds) == 1:
        return {"type": "one_type", "kind": kinds[0], "input": error["input"]}
    return error


def _data_path(loc: tuple[Any, ...], data: Any) -> PathKey:
    """Keep the parts of pydantic's loc that are real keys/indices of the data."""
    path: list[str | int] = []
    node = data
    for part in loc:
        in_map = isinstance(node, dict) and part in node
        in_seq = isinstance(node, list | tuple) and isinstance(part, int) and part < len(node)
        if in_map or in_seq:
            path.append(part)
            node = node[part]
    return tuple(path)


def _locate(path: PathKey, positions: dict[PathKey, Location]) -> Location:
    for end in range(len(path), -1, -1):
        if path[:end] in positions:
            return positions[path[:end]]
    return next(iter(positions.values()))


def _message(error: Any, path: PathKey, schema: dict[str, Any], hidden: str = "") -> str:
    """`hidden`: the words that stand for the value, which is then never shown."""
    kind = error["type"]
    value = error.get("input")
    shown = hidden or _shown(value)
    if kind == "extra_forbidden":
        valid = _keys_at(schema, path[:-1])
        hint = _nearest(str(path[-1]), valid)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        known = f" (valid keys: {', '.join(sorted(valid))})" if valid and not hint else ""
        return f"unknown key{suggestion}{known}"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        return f"{shown if hidden else repr(value)} is not one of {expected}"
    if kind in ("value_error", "assertion_error"):
        if hidden:  # a validator's own words may quote the value
            return f"invalid value {hidden}"
        return str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if kind == "string_pattern_mismatch":
        pattern = error.get("ctx", {}).get("pattern", "")
        return f"{shown if hidden else repr(value)} does not match the pattern {pattern}"
    if kind == "union_tag_invalid":
        expected = error.get("ctx", {}).get("expected_tags", "")
        return f"source {error.get('ctx', {}).get('tag')!r} is not one of {expected}"
    if kind == "union_tag_not_found":
        return "missing `source:` (box_file or controller_env)"
    if kind == "union_type":
        names = [_article(k, schema) for k in sorted(set(error["all"]))]
        listed = ", ".join(names[:-1]) + f" or {names[-1]}"
        return f"expected {listed}, got {_kind(value)} {shown}"
    if kind in ("one_type", "model_type"):
        expected = error["kind"] if kind == "one_type" else _expected_kind(error)
        return f"expected {_article(expected, schema)}, got {_kind(value)} {shown}"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        expected = kind.removesuffix("_type").removesuffix("_parsing").replace("_", " ")
        return f"expected {_article(expected)}, got {_kind(value)} {shown}"
    if hidden:  # pydantic's message may quote the input (enum, length, url errors)
        return f"invalid value {hidden}"
    msg = str(error["msg"])
    return f"{msg[:1].lower()}{msg[1:]} (got {shown})"


def _kind(value: Any) -> str:
    return {"tuple": "list", "dict": "mapping", "NoneType": "null"}.get(
        type(value).__name__, type(value).__name__
    )


def _shown(value: Any) -> str:
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


def _article(noun: str, schema: dict[str, Any] | None = None) -> str:
    if noun.startswith("model:"):
        return _model_shape(noun.removeprefix("model:"), schema or {})
    aliases = {"dict": "mapping", "tuple": "list", "int": "integer", "float": "number"}
    noun = aliases.get(noun, noun)
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def _model_shape(class_name: str, schema: dict[str, Any]) -> str:
    """The mapping a model wants, by its keys: `{secret: NAME}` for a SecretRef, else its
    required keys (all of them if none is required), from the schema the editors get."""
    if class_name == "SecretRef":
        return "a {secret: NAME}"
    found = schema.get("$defs", {}).get(class_name, {})
    keys = found.get("required") or sorted(found.get("properties", {}))
    if not keys:
        return "a mapping"
    return "a mapping {" + ", ".join(f"{key}: ..." for key in keys) + "}"


def _keys_at(schema: dict[str, Any], path: PathKey) -> list[str]:
    """The property names a mapping at `path` accepts, following $refs and unions."""
    nodes = [schema]
    for part in path:
        nodes = [child for node in nodes for child in _children(schema, node, part)]
    names: set[str] = set()
    for node in nodes:
        for resolved in _resolve(schema, node):
            names.update(resolved.get("properties", {}))
    return sorted(names)


def _resolve(root: dict[str, Any], node: dict[str, Any]) -> list[dict[str, Any]]:
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return _resolve(root, root["$defs"][name])
    for key in ("anyOf", "oneOf", "allOf"):
        if key in node:
            return [r for member in node[key] for r in _resolve(root, member)]
    return [node]


def _children(root: dict[str, Any], node: dict[str, Any], part: str | int) -> list[dict[str, Any]]:
    out = []
    for resolved in _resolve(root, node):
        if isinstance(part, int) and "items" in resolved:
            out.append(resolved["items"])
        elif isinstance(part, str) and part in resolved.get("properties", {}):
            out.append(resolved["properties"][part])
        elif isinstance(part, str) and isinstance(resolved.get("additionalProperties"), dict):
            out.append(resolved["additionalProperties"])
        elif isinstance(part, str) and resolved.get("patternProperties"):
            out.extend(resolved["patternProperties"].values())
    return out
