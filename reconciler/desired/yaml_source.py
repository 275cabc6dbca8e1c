"""Read YAML files into plain data, remembering the file, line and column of every key.

The desired state needs plain YAML only: mappings with string keys, lists, strings, numbers,
booleans and null. Everything else YAML can express is refused here, each at its own line,
before it can cost time or memory or reach a model as something unexpected:

- anchors and aliases (`&a`, `*a`): a 1.4 KB alias bomb expands to gigabytes, and `<<` merge
  keys only exist to use them; desired state spells every value out;
- nesting deeper than MAX_DEPTH: checked while composing, before any deep structure exists;
- tags other than the core ones (`!!python/...`, `!!binary`, `!!set`, `!!timestamp`, `!local`),
  and `%YAML`/`%TAG` directives (`%YAML 1.1` would turn `yes`/`on` into booleans);
- keys that are not strings (`1:`, `true:`, `null:`, `[a]:`), duplicate keys (the message
  names the first occurrence, never a value: a duplicated secret-named key must not echo);
- control characters, NUL and lone surrogates (from `"\\ud800"` escapes), non-UTF-8 bytes;
- non-finite numbers (`.inf`, `.nan`, `1e400`) and integers outside 64 bits.
No message quotes a value (it may sit under a secret-named key); keys and tags are quoted.
A date such as `2024-01-01` stays the text it is written as.

ruamel.yaml's pure-Python scanner and parser turn the text into events and nodes, which carry
the line and column of every key and item; we build plain dicts and tuples (strict models
accept tuples) plus a flat `{path: Location}` table from those nodes ourselves, so later stages
(merge, pydantic, cross-checks) can name the exact line without carrying ruamel types around.
Comments are not needed for that, so the round-trip scanner (which reads a whole line ahead
of every token to attach comments) is not used.

That located loader costs ~2 ms for a 40-line layer, so a plain file (nearly all of them) is
read first by yaml_fast.py from libyaml's events (same data, same positions, ~30x faster);
whatever that path finds not plain, this loader reads again and judges, so every error and
refusal is worded here, whichever path met it first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.composer import Composer, ComposerError
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from ruamel.yaml.scanner import Scanner

from reconciler.desired.fingerprint import FileRead, file_read
from reconciler.desired.problems import DesiredStateError, Location, PathKey, Problem, dotted
from reconciler.desired.safe_read import (
    INVENTORY_MAX_BYTES,
    MAX_BYTES,
    Unreadable,
    read_regular_as_found,
)
from reconciler.desired.yaml_fast import plain_source
from reconciler.desired.yaml_scalars import (
    AS_TEXT,
    BAD_CHAR,
    BAD_KEY_CHAR,
    BOOL,
    EXPLICIT_OK,
    FLOAT,
    INT,
    MAP,
    MERGE,
    NULL,
    SEQ,
    char_name,
    rewritten,
    scalar_value,
)

MAX_DEPTH = 32  # the deepest path of the desired state today is 5 levels
# The pure-Python parser costs tens of microseconds per value; the largest layer today holds
# 172 values (keys, scalars, lists, mappings), so 2,000 leave room and still parse quickly.
MAX_NODES = 2000
# The inventory grows with the fleet (about 20 values a box): room for 5,000 boxes, parsed in
# a few seconds. Every other file is a layer and keeps MAX_NODES.
INVENTORY_MAX_NODES = 100_000
# In the file's text also what YAML counts as a line break and an editor does not (a lone CR,
# U+2028, U+2029): every line number we report must be the line the operator's editor shows.
_BAD_TEXT = re.compile(f"{BAD_CHAR.pattern}|\r(?!\n)|[\u2028\u2029]")


@dataclass(frozen=True)
class SourceDoc:
    """One parsed YAML file: plain data plus the position of every key and item."""

    file: str
    data: dict[str, Any]
    positions: dict[PathKey, Location]
    read: FileRead | None = None  # the file as read from disk (None: parsed from a text)
    # Paths of number and boolean scalars whose value reads back as other text than written
    # (yaml_scalars.rewritten): an `env:` value among them is refused by the loader.
    rewritten: frozenset[PathKey] = frozenset()


def load_yaml(
    path: Path,
    display: str,
    *,
    within: Path | None = None,
    required: str | None = None,
    inventory: bool = False,
) -> SourceDoc:
    """Parse one file; anything wrong with it raises DesiredStateError at its line.

    `within`: the repository a symlinked file must stay in. `required`: what the file must
    hold (an empty file is then an error naming it); without it an empty layer is empty.
    `inventory`: the file that lists the boxes, with limits that grow with a fleet."""
    at_start = Location(display, 1, 1)
    try:
        raw, opened = read_regular_as_found(
            path, within=within, limit=INVENTORY_MAX_BYTES if inventory else MAX_BYTES
        )
    except Unreadable as exc:
        raise DesiredStateError([Problem(at_start, "", exc.message)]) from None
    doc = parse_text(_decode(raw, display), display, required=required, inventory=inventory)
    return SourceDoc(
        doc.file, doc.data, doc.positions, file_read(raw, opened), rewritten=doc.rewritten
    )


def parse_text(
    text: str,
    display: str,
    *,
    required: str | None = None,
    inventory: bool = False,
    located_only: bool = False,
) -> SourceDoc:
    """`load_yaml` on a file's decoded text. A plain file takes libyaml's events (yaml_fast.py);
    anything else, or `located_only`, the located loader, which words every refusal."""
    composer = _InventoryComposer if inventory else _LimitedComposer
    if not located_only:
        plain = plain_source(text, display, max_nodes=composer.max_nodes, max_depth=MAX_DEPTH)
        if plain is not None:
            data, positions, rewritten = plain
            return SourceDoc(display, data, positions, rewritten=rewritten)
    at_start = Location(display, 1, 1)
    node = _compose(text, display, composer)
    if node is None or (isinstance(node, ScalarNode) and node.tag == NULL):
        if required is not None:
            raise DesiredStateError([Problem(at_start, "", f"file is empty, expected {required}")])
        return SourceDoc(display, {}, {(): at_start})
    if not isinstance(node, MappingNode):
        kind = "seq" if isinstance(node, SequenceNode) else "scalar"
        raise DesiredStateError(
            [Problem(at_start, "", f"expected a mapping of keys, got a {kind}")]
        )
    builder = _Builder(display)
    data = builder.plain(node, ())
    if builder.problems:
        raise DesiredStateError(builder.problems)
    return SourceDoc(display, data, builder.positions, rewritten=frozenset(builder.rewritten))


def _decode(raw: bytes, display: str) -> str:
    body = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark is allowed, and dropped
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = _line_col(body[: exc.start].decode("utf-8", "replace"))
        problem = Problem(Location(display, line, col), "", f"not UTF-8 text: {exc.reason}")
        raise DesiredStateError([problem]) from None
    bad = _BAD_TEXT.search(text)
    if bad:
        line, col = _line_col(text[: bad.start()])
        message = f"{char_name(bad.group())} is not allowed in a YAML file"
        raise DesiredStateError([Problem(Location(display, line, col), "", message)])
    return text


def _line_col(before: str) -> tuple[int, int]:
    line = before.count("\n") + 1
    return line, len(before) - (before.rfind("\n") + 1) + 1


# -- parsing with limits -----------------------------------------------------------------------
class _Refused(Exception):
    """Something plain YAML does not need, found while composing (parsing stops there)."""

    def __init__(self, mark: Any, message: str) -> None:
        self.mark = mark
        self.message = message
        super().__init__(message)


class _LinearScanner(Scanner):
    """ruamel's scanner, with its two walks over every pending simple key made proportional to
    what changes: `[[[[...` 900 deep took 1.8 s (quadratic in the nesting) before the composer
    could see the first level. Keys are saved in token order, one per flow level, so the dict's
    insertion order is token order: the nearest key is the first, and stale keys are a prefix.
    """

    def next_possible_simple_key(self) -> Any:
        for key in self.possible_simple_keys.values():
            return key.token_number
        return None

    def stale_possible_simple_keys(self) -> None:
        line, index = self.reader.line, self.reader.index
        stale = []
        for level, key in self.possible_simple_keys.items():
            if key.line == line and index - key.index <= 1024:
                break
            if key.required:
                super().stale_possible_simple_keys()  # raises ruamel's own located error
            stale.append(level)
        for level in stale:
            del self.possible_simple_keys[level]


class _LimitedComposer(Composer):
    """ruamel's composer, refusing anchors, aliases, unknown tags, directives and deep nesting
    at the event that brings them, before a node is built from it."""

    nesting = 0
    nodes = 0
    max_nodes = MAX_NODES

    def compose_document(self) -> Any:
        start = self.parser.peek_event()  # DOCUMENT-START
        if getattr(start, "version", None) or getattr(start, "tags", None):
            raise _Refused(start.start_mark, "%YAML and %TAG directives are not allowed")
        return super().compose_document()

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.parser.peek_event()
        if isinstance(event, AliasEvent):
            raise _Refused(
                event.start_mark,
                f"alias *{event.anchor[:40]} is not allowed: anchors and aliases are refused, "
                "write the value out",
            )
        if event.anchor is not None:
            raise _Refused(
                event.start_mark,
                f"anchor &{event.anchor[:40]} is not allowed: anchors and aliases are refused, "
                "write the value out",
            )
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise _Refused(event.start_mark, f"more than {self.max_nodes} values in one file")
        tag = getattr(event, "ctag", None)
        if tag is not None and str(tag) not in EXPLICIT_OK:
            raise _Refused(event.start_mark, f"tag {_tag_text(tag)} is not allowed")
        nests = isinstance(event, MappingStartEvent | SequenceStartEvent)
        if nests:
            self.nesting += 1
            if self.nesting > MAX_DEPTH:
                raise _Refused(event.start_mark, f"nested deeper than {MAX_DEPTH} levels")
        try:
            return super().compose_node(parent, index)
        finally:
            if nests:
                self.nesting -= 1


class _InventoryComposer(_LimitedComposer):
    max_nodes = INVENTORY_MAX_NODES


def _tag_text(tag: Any) -> str:
    handle, suffix = getattr(tag, "handle", None), getattr(tag, "suffix", None)
    text = f"{handle}{suffix}" if handle and suffix else str(tag)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _compose(text: str, display: str, composer: type[_LimitedComposer]) -> Node | None:
    yaml = YAML(typ="safe", pure=True)
    yaml.Scanner = _LinearScanner
    yaml.Composer = composer
    try:
        return yaml.compose(text)
    except _Refused as exc:
        where = Location(display, exc.mark.line + 1, exc.mark.column + 1)
        if exc.message.startswith("%YAML"):
            # The document's start mark follows its directives: name the directive's own line.
            lines = text.splitlines()
            line = next((i + 1 for i, x in enumerate(lines) if x.startswith("%")), where.line)
            where = Location(display, line, 1)
        raise DesiredStateError([Problem(where, "", exc.message)]) from None
    except ComposerError as exc:
        if exc.context == "expected a single document in the stream":
            mark = exc.problem_mark or exc.context_mark
            where = Location(display, mark.line + 1, mark.column + 1)
            message = "a second YAML document (---); a file holds one document"
            raise DesiredStateError([Problem(where, "", message)]) from None
        raise DesiredStateError([_marked(exc, display)]) from None
    except MarkedYAMLError as exc:
        raise DesiredStateError([_marked(exc, display)]) from None
    except YAMLError as exc:
        message = f"malformed YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        raise DesiredStateError([Problem(Location(display, 1, 1), "", message)]) from None
    except (
        RecursionError,
        MemoryError,
        ValueError,
        TypeError,
        AttributeError,
        IndexError,
        KeyError,
        AssertionError,
    ) as exc:
        # A parser bug on hostile input is still this file's error, never a traceback.
        message = f"malformed YAML: the parser failed ({type(exc).__name__})"
        raise DesiredStateError([Problem(Location(display, 1, 1), "", message)]) from None


def _marked(exc: MarkedYAMLError, display: str) -> Problem:
    mark = exc.problem_mark or exc.context_mark
    line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    text = (exc.problem or exc.context or "malformed YAML").strip()
    return Problem(Location(display, line, col), "", f"malformed YAML: {text}")


# -- nodes -> plain data -----------------------------------------------------------------------
class _Builder:
    """Plain data and positions from composed nodes; every refusal is collected with its line."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.positions: dict[PathKey, Location] = {(): Location(file, 1, 1)}
        self.problems: list[Problem] = []
        self.rewritten: list[PathKey] = []

    def where(self, node: Node) -> Location:
        return Location(self.file, node.start_mark.line + 1, node.start_mark.column + 1)

    def refuse(self, node: Node, path: PathKey, message: str) -> None:
        self.problems.append(Problem(self.where(node), dotted(path), message))

    def plain(self, node: Node, path: PathKey) -> Any:
        if isinstance(node, MappingNode):
            return self.mapping(node, path)
        if isinstance(node, SequenceNode):
            if node.tag != SEQ:
                self.refuse(node, path, f"tag {_tag_text(node.tag)} does not fit a list")
            items = []
            for index, item in enumerate(node.value):
                child = (*path, index)
                self.positions[child] = self.where(item)
                items.append(self.plain(item, child))
            return tuple(items)
        return self.scalar(node, path)

    def mapping(self, node: MappingNode, path: PathKey) -> dict[str, Any]:
        if node.tag != MAP:
            self.refuse(node, path, f"tag {_tag_text(node.tag)} does not fit a mapping")
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = self.key(key_node, path)
            if key is None:
                continue
            child = (*path, key)
            if key in out:
                first = self.positions[child]
                self.refuse(key_node, child, f"duplicate key (first at line {first.line})")
                continue
            self.positions[child] = self.where(key_node)
            out[key] = self.plain(value_node, child)
        return out

    def key(self, node: Node, path: PathKey) -> str | None:
        if not isinstance(node, ScalarNode):
            kind = "mapping" if isinstance(node, MappingNode) else "list"
            self.refuse(node, path, f"a {kind} cannot be a key; keys are names")
            return None
        if node.tag == MERGE:
            self.refuse(node, path, "merge keys (<<) are not allowed: write the keys out")
            return None
        if node.tag not in AS_TEXT:
            kind = {INT: "an integer", FLOAT: "a number", BOOL: "a boolean"}.get(
                str(node.tag), "null"
            )
            shown = node.value[:40] or "(empty)"
            self.refuse(node, path, f"key {shown} is {kind}, not a name: quote it")
            return None
        bad = BAD_KEY_CHAR.search(node.value)
        if bad:
            self.refuse(node, path, f"{char_name(bad.group())} is not allowed in a key")
            return None
        return str(node.value)

    def scalar(self, node: Node, path: PathKey) -> Any:
        tag = str(node.tag)
        if tag not in AS_TEXT and tag not in (MERGE, NULL, BOOL, INT, FLOAT):
            self.refuse(node, path, f"tag {_tag_text(node.tag)} does not fit a scalar")
            return None
        text = str(node.value)
        value, problem = scalar_value(tag, text)
        if problem is not None:
            self.refuse(node, path, problem)
        elif rewritten(tag, text, value):
            self.rewritten.append(path)
        return value
