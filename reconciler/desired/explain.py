"""Turn pydantic's validation errors into one operator-readable line per problem.

pydantic reports a location as a tuple that mixes data keys with union member tags
(`('env', 'X', 'SecretRef', 'secret')`); we walk it along the real data to find the YAML path,
look the path up in the position table, and reword the message in terms of YAML keys.
Unknown keys get the nearest valid name, taken from the model's JSON Schema.

An input value is shown to help fix a typo, except where it may be a real key pasted into YAML:
under a secret-named key (`env.HF_TOKEN`, `gateway.api_key`, anything the floor or
`secret_patterns` matches), anywhere under `secrets:` (a secret's spec names where the value
is, and a value pasted there is the secret: `key: hf_...`), and a value any text of which may
carry a secret inline (`VLLM_ARGS: [--api-key, sk-...]`, drift's judgement,
compare/inline.may_carry_secret). There the message says what was wrong with it and never what
it was. pydantic's own text (`input_value=...`) is never printed.

A key kept from one layer beside a secret `source:` another layer set (layers deep-merge, so
`path:` of a box_file secret stays under a box's `source: controller_env`) is said as such, with
both places and what to do, not as an unknown key whose nearest valid name is itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from reconciler.compare.inline import may_carry_secret
from reconciler.desired.near import nearest
from reconciler.desired.problems import Location, PathKey, Problem, dotted
from reconciler.desired.secret_names import adopt_fleet_patterns, fleet_patterns, is_secret_name

HIDDEN = "(value not shown: a secret-named key)"
# A value an overlay set: a file a tool wrote, or whatever the inventory names as one.
OVERLAY_HIDDEN = "(value not shown: an overlay's)"
# Keys whose value is a secret whatever they are called: a literal here is the key itself.
_SECRET_SLOTS: tuple[PathKey, ...] = (("gateway", "api_key"), ("mesh", "key"))
# Fields named like a secret that hold where one is, never the secret: an inventory's path to an
# SSH key file. Hiding their value would hide why a path was refused.
_LOCATORS = frozenset({"ssh_key"})
# What is said instead of a value under `secrets:` and of one that may carry a secret inline.
SPEC_HIDDEN = "not shown: under secrets:"
INLINE_HIDDEN = "not shown: it may carry a secret"
# A quoted text in a validator's message (`{host!r}`), and the shortest value looked for there.
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_SHORTEST = 4
_TAG = re.compile(r"[a-z][a-z_]{0,31}")
# What to do about a key of another source beside this one (layers deep-merge: merge.py).
_SWITCH = (
    "layers deep-merge, so a secret's source cannot be switched in place, and a null does not "
    "remove a key (it is a value too): declare a new secret name with source {source} instead "
    "and point its references ({{secret: NAME}}) at it"
)


@dataclass(frozen=True)
class _Hidden:
    """How a message stands for a value it must not show. `value`: the words in its place
    (`'x' does not match ...`), `note`: after its type (`got list ...`). `reason`: a
    validator's own words are kept, with the value cut out of them (else `invalid value`)."""

    value: str
    note: str
    reason: bool = False


def _words(words: str) -> _Hidden:
    """A value stood for by `words` alone, with nothing a validator said about it."""
    return _Hidden(words, words)


def _because(why: str, value: Any) -> _Hidden:
    """`the value (WHY, N characters)`: its length tells a name (`HF_TOKEN`) from a pasted key."""
    size = f", {len(value)} characters" if isinstance(value, str) else ""
    note = f"({why}{size})"
    return _Hidden(f"the value {note}", note, reason=True)


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
        for hint in _nearest(str(path[-1]), _keys_at(schema, path[:-1], data))
    }
    patterns = _patterns(data)
    # The inline judgement (may_carry_secret) reads the adopted fleet patterns: this layer's
    # own too (`--db-pw x` under `*_PW`), for these messages only.
    before = fleet_patterns()
    adopt_fleet_patterns((*before, *patterns))
    try:
        return _problems(located, suggested, patterns, schema, data, positions, hidden_files)
    finally:
        adopt_fleet_patterns(before)


def _problems(
    located: list[tuple[PathKey, Any]],
    suggested: set[PathKey],
    patterns: tuple[str, ...],
    schema: dict[str, Any],
    data: Any,
    positions: dict[PathKey, Location],
    hidden_files: frozenset[str],
) -> list[Problem]:
    problems = []
    for path, error in located:
        if error["type"] == "missing" and path in suggested:
            continue  # "unknown key max_model_length; did you mean max_model_len?" says it
        where = _locate(path, positions)
        if error["type"] == "extra_forbidden":
            message = _unknown_key(path, schema, data, positions)
        elif error["type"] == "missing":
            message = "required key is missing"
        else:
            hidden = _hidden(path, _judged(error), patterns)
            if hidden is None and where.file in hidden_files:
                hidden = _words(OVERLAY_HIDDEN)
            message = _message(error, path, schema, hidden)
        problems.append(Problem(where, dotted(path), message))
    return problems


def _hidden(path: PathKey, value: Any, patterns: tuple[str, ...]) -> _Hidden | None:
    """How the value at `path` is hidden, or None where it is shown."""
    if path[:1] == ("secrets",):
        # A secret's spec only names where the value is: anything else pasted here (`key:
        # hf_...`, `variable: <the key>`, a bare string for the whole spec) is the secret.
        # Before the names: a secret's own name (`mesh_key`) is no secret-named variable.
        # A source's tag that is a plain lower-case word (`source: vault`) is a kind of
        # source mistyped, shown: no key is written so.
        if isinstance(value, _Tag) and _TAG.fullmatch(value.tag):
            return None
        return _because(SPEC_HIDDEN, value)
    if holds_secret(path, patterns):
        return _words(HIDDEN)
    if _may_carry(value, patterns):
        return _because(INLINE_HIDDEN, value)
    return None


@dataclass(frozen=True)
class _Tag:
    """A union's tag that names no member (`source: vault`): the value its message shows."""

    tag: str


def _judged(error: Any) -> Any:
    """The value an error's message would show: a union's unknown tag, else its input."""
    tag = error.get("ctx", {}).get("tag") if error["type"] == "union_tag_invalid" else None
    return _Tag(tag) if isinstance(tag, str) else error.get("input")


def _may_carry(value: Any, patterns: tuple[str, ...], depth: int = 0) -> bool:
    """Whether any text inside `value` may carry a secret, by drift's judgement
    (`may_carry_secret`): a string, a list's strings read as one command line (`[--api-key,
    sk-...]` is the flag and its value), a mapping's keys and values, a key also by the secret
    names (`{HF_TOKEN: ...}`)."""
    if isinstance(value, str):
        return may_carry_secret(value)
    if depth > 20:  # YAML nests no deeper in any value worth showing: hide it
        return True
    if isinstance(value, list | tuple):
        words = " ".join(str(item) for item in value if isinstance(item, str | int | float))
        return may_carry_secret(words) or any(_may_carry(v, patterns, depth + 1) for v in value)
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and (is_secret_name(key, patterns) or may_carry_secret(key)):
                return True
            if _may_carry(item, patterns, depth + 1):
                return True
    return False


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


def _message(error: Any, path: PathKey, schema: dict[str, Any], hidden: _Hidden | None) -> str:
    """`hidden`: how the value is stood for, which is then never shown."""
    kind = error["type"]
    value = error.get("input")
    shown = hidden.value if hidden else _shown(value)
    after = hidden.note if hidden else shown  # after the value's type
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        return f"{shown if hidden else repr(value)} is not one of {expected}"
    if kind in ("value_error", "assertion_error"):
        msg = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if hidden:  # a validator's own words may quote the value
            return _cut_out(msg, value, hidden) or f"invalid value {hidden.note}"
        return msg
    if kind == "string_pattern_mismatch":
        pattern = error.get("ctx", {}).get("pattern", "")
        shown = shown if hidden else repr(value)
        return f"{shown} does not match the pattern {pattern}{_name_not_value(path, hidden)}"
    if kind == "union_tag_invalid":
        expected = error.get("ctx", {}).get("expected_tags", "")
        tag = error.get("ctx", {}).get("tag")
        if hidden:  # the words said of the spec (the input), with the tag's own length
            tag = _because(SPEC_HIDDEN, tag).note if hidden.reason else hidden.note
        else:
            tag = repr(tag)
        return f"source {tag} is not one of {expected}"
    if kind == "union_tag_not_found":
        return "missing `source:` (box_file or controller_env)"
    if kind == "union_type":
        names = [_article(k, schema) for k in sorted(set(error["all"]))]
        listed = ", ".join(names[:-1]) + f" or {names[-1]}"
        return f"expected {listed}, got {_kind(value)} {after}"
    if kind in ("one_type", "model_type"):
        expected = error["kind"] if kind == "one_type" else _expected_kind(error)
        return f"expected {_article(expected, schema)}, got {_kind(value)} {after}"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        expected = kind.removesuffix("_type").removesuffix("_parsing").replace("_", " ")
        return f"expected {_article(expected)}, got {_kind(value)} {after}"
    msg = str(error["msg"])
    if hidden:  # pydantic's message may quote the input (enum, length, url errors)
        cut = _cut_out(msg, value, hidden)
        return f"{cut[:1].lower()}{cut[1:]} {hidden.note}" if cut else f"invalid value {after}"
    return f"{msg[:1].lower()}{msg[1:]} (got {shown})"


def _cut_out(msg: str, value: Any, hidden: _Hidden) -> str:
    """A validator's message with the value it quotes (`'/etc/x' is absolute: ...`) as the
    hidden words, or "" where it may still hold some of the value: a quoted text left that is
    part of it (`{host!r}`), or the value's own text (one of 4 characters or more: shorter
    would find `~` in `the home itself (~)`; scrub.py masks no shorter secret either)."""
    if not hidden.reason or not isinstance(value, str):
        return ""
    out = msg.replace(repr(value), hidden.value)
    rest = out.replace(hidden.value, "")
    if any(quoted[1:-1] in value for quoted in _QUOTED.findall(rest)):
        return ""
    return "" if len(value.strip()) >= _SHORTEST and value.strip() in rest else out


def _name_not_value(path: PathKey, hidden: _Hidden | None) -> str:
    """Under `secrets:`, `key:` and `variable:` name a variable: a value refused there is
    most often the secret itself, pasted where its name goes."""
    if hidden and path[:1] == ("secrets",) and path[-1:] in (("key",), ("variable",)):
        return " (the name of the variable that holds the secret goes here, never its value)"
    return ""


def _unknown_key(
    path: PathKey, schema: dict[str, Any], data: Any, positions: dict[PathKey, Location]
) -> str:
    """`unknown key` with the nearest valid name, from the keys of the union member the data
    chose (a secret's `source:`). A key of another member is no typo: it is said as such, and
    where the layers put it beside this source, both places and what to do."""
    valid = _keys_at(schema, path[:-1], data)
    key = str(path[-1])
    chosen = _chosen(schema, path[:-1], data)
    if chosen is not None and key not in valid:
        field, tag, members = chosen
        owners = [t for t, keys in members.items() if t != tag and key in keys]
        if owners:
            null = _value_at(data, path) is None
            return _other_member(path, field, tag, owners, valid, positions, null)
    hint = _nearest(key, valid)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
    known = f" (valid keys: {', '.join(sorted(valid))})" if valid and not hint else ""
    return f"unknown key{suggestion}{known}"


def _other_member(
    path: PathKey,
    field: str,
    tag: str,
    owners: list[str],
    valid: list[str],
    positions: dict[PathKey, Location],
    null: bool,
) -> str:
    """`path: a box_file secret's key, kept from this layer, but a later one changed source to
    controller_env (FILE:LINE:COL) ...`: the problem's own place is the key's line."""
    key, parent = str(path[-1]), path[:-1]
    whose = f"a {' or '.join(owners)} secret's key"
    at_key, at_tag = positions.get(path), positions.get((*parent, field))
    if at_key and at_tag and at_key.file != at_tag.file:
        # The merge moves a mapping's position to the last layer that wrote into it (merge.py):
        # of the key and the source, the one set in that layer was set after the other.
        last = positions.get(parent)
        if last and at_tag.file == last.file:
            return (
                f"{whose}, kept from this layer, but a later one changed {field} to {tag} "
                f"({at_tag}), which has no {key}: {_SWITCH.format(source=tag)}"
            )
        if last and at_key.file == last.file:
            return (
                f"{whose}, set by this layer, but an earlier one made this secret's {field} "
                f"{tag} ({at_tag}), which has no {key}: {_SWITCH.format(source=owners[0])}"
            )
        return (  # both from layers before the last one to write into this secret
            f"{whose}, set by this layer, but another one sets this secret's {field} to {tag} "
            f"({at_tag}), which has no {key}: {_SWITCH.format(source=tag)}"
        )
    listed = f" (valid keys: {', '.join(valid)})" if valid else ""
    said = f"{whose}, not a {tag} secret's{listed}"
    return f"{said}; {_SWITCH.format(source=tag)}" if null else said


def _value_at(data: Any, path: PathKey) -> Any:
    """The value at `path` in the data (None where there is none)."""
    node = data
    for part in path:
        in_map = isinstance(node, dict) and part in node
        in_seq = isinstance(node, list | tuple) and isinstance(part, int) and part < len(node)
        if not (in_map or in_seq):
            return None
        node = node[part]
    return node


def _kind(value: Any) -> str:
    return {"tuple": "list", "dict": "mapping", "NoneType": "null"}.get(
        type(value).__name__, type(value).__name__
    )


def _shown(value: Any) -> str:
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


def _article(noun: str, schema: dict[str, Any] | None = None) -> str:
    if noun.startswith("model:"):
        return _model_shape(noun.removeprefix("model:"), schema or {})
    aliases = {
        "dict": "mapping",
        "model_attributes": "mapping",  # a discriminated union's input (a secret's spec)
        "tuple": "list",
        "int": "integer",
        "float": "number",
    }
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


def _keys_at(schema: dict[str, Any], path: PathKey, data: Any = None) -> list[str]:
    """The property names a mapping at `path` accepts, following $refs and unions; given the
    data, only those of the union member its discriminator (`source:`) chose, if it chose one."""
    chosen = _chosen(schema, path, data)
    if chosen is not None:
        return chosen[2][chosen[1]]
    names: set[str] = set()
    for node in _nodes(schema, path):
        for resolved in _resolve(schema, node):
            names.update(resolved.get("properties", {}))
    return sorted(names)


def _nodes(schema: dict[str, Any], path: PathKey) -> list[dict[str, Any]]:
    nodes = [schema]
    for part in path:
        nodes = [child for node in nodes for child in _children(schema, node, part)]
    return nodes


def _chosen(
    schema: dict[str, Any], path: PathKey, data: Any
) -> tuple[str, str, dict[str, list[str]]] | None:
    """Where the mapping at `path` is a discriminated union's (a secret's spec) and the data
    names one of its members (`source: controller_env`): the discriminating key, that tag, and
    each member's keys by its tag."""
    mapping = _value_at(data, path) if data is not None else None
    if not isinstance(mapping, dict):
        return None
    for node in _nodes(schema, path):
        found = node.get("discriminator")
        if not isinstance(found, dict):
            continue
        field, refs = found.get("propertyName", ""), found.get("mapping", {})
        tag = mapping.get(field)
        if isinstance(tag, str) and tag in refs:
            members = {
                name: sorted(
                    key
                    for resolved in _resolve(schema, {"$ref": ref})
                    for key in resolved.get("properties", {})
                )
                for name, ref in refs.items()
            }
            return field, tag, members
    return None


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
