"""The common case of reading a YAML file, at C speed: libyaml's events straight to plain data.

yaml_source.py's loader runs ruamel.yaml's pure-Python scanner and parser (~2 ms for a 40-line
layer: 4 s of a 1,000-box fleet's 2,006 files). Almost every file is plain: a mapping of names
to strings, numbers, lists and mappings. For those, ruamel.yaml.clib's CParser (libyaml, the
scanner and parser of ruamel.yaml's own C loader) gives the events ~30x faster, and this module
turns them into the same `(data, positions)` the located loader builds, with the same YAML 1.2
tag resolution (ruamel's own resolver table) and the same scalar rules (yaml_scalars.py).

It only ever answers for a file it finds entirely plain. Anything else (a parse error, an
anchor, alias, explicit tag or directive, a second document, a non-name or duplicate key, a
refused character or number, too many values, too deep) makes it answer None, and the caller
reads the file again with the located loader, which alone words every error and refusal. So a
file is accepted only if both agree it is plain, and an error reads the same whichever path
met it first. tests/unit/test_yaml_fast.py holds the two to the same answer on every YAML file
of the repository, the hostile corpus and random damage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ruamel.yaml.error import YAMLError
from ruamel.yaml.events import (
    DocumentEndEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
    StreamStartEvent,
)
from ruamel.yaml.resolver import VersionedResolver

from reconciler.desired.problems import Location, PathKey
from reconciler.desired.yaml_scalars import AS_TEXT, BAD_KEY_CHAR, STR, rewritten, scalar_value

try:  # ruamel.yaml's optional C extension (a dependency of this package on CPython)
    from _ruamel_yaml import CParser
except ImportError:  # pragma: no cover - then every file takes the located loader
    CParser = None

Rules = list[tuple[str, Callable[[str], Any]]]
_BLOCK = ("|", ">")


class _NotPlain(Exception):
    """Something only the located loader may judge: it reads the file again."""


def available() -> bool:
    return CParser is not None


def plain_source(
    text: str, file: str, *, max_nodes: int, max_depth: int
) -> tuple[dict[str, Any], dict[PathKey, Location], frozenset[PathKey]] | None:
    """The file's data, the position of every key and item and the paths of scalars that read
    back as other text (yaml_scalars.rewritten), or None (see the docstring)."""
    if CParser is None or "\t" in text or "\ufeff" in text:
        # Where libyaml's scanner and ruamel's part (tests/unit/test_yaml_fast.py found them):
        # a tab as a separator (`a:\tb`, which ruamel refuses) and a byte order mark past
        # the start (libyaml skips it, so columns and even acceptance differ).
        return None
    builder = _Builder(text, file, max_nodes, max_depth)
    try:
        data = builder.document(CParser(text).get_event)
        return data, builder.positions, frozenset(builder.rewritten)
    except (_NotPlain, YAMLError, ValueError, UnicodeError, MemoryError, RecursionError):
        return None


def _resolver_rules() -> tuple[dict[str, Rules], Rules]:
    """ruamel's YAML 1.2 implicit resolvers by first character (the loader's default version),
    each with those that apply to any first character appended, as its `resolve` walks them."""
    table = {
        first: [(str(tag), regexp.match) for tag, regexp in rules]  # the compiled pattern's own
        for first, rules in VersionedResolver().versioned_resolver.items()  # (lazily built)
    }
    any_first = table.get(None, [])
    return {first: [*rules, *any_first] for first, rules in table.items()}, any_first


_RULES, _ANY_FIRST = _resolver_rules()


def _implicit_tag(value: str) -> str:
    """The tag ruamel's VersionedResolver gives a plain scalar."""
    for tag, match in _RULES.get(value[:1], _ANY_FIRST):
        if match(value):
            return tag
    return STR


class _Builder:
    def __init__(self, text: str, file: str, max_nodes: int, max_depth: int) -> None:
        self.text = text
        self.file = file
        self.positions: dict[PathKey, Location] = {(): Location(file, 1, 1)}
        self.nodes_left = max_nodes
        self.max_depth = max_depth
        self.rewritten: list[PathKey] = []

    def document(self, get: Callable[[], Any]) -> dict[str, Any]:
        if type(get()) is not StreamStartEvent:
            raise _NotPlain
        start = get()
        if type(start) is not DocumentStartEvent or start.version or start.tags:
            raise _NotPlain  # a directive, or an empty stream: the located loader says which
        root = get()
        if type(root) is not MappingStartEvent:
            raise _NotPlain  # an empty document, a list or a scalar
        data = self.mapping(get, root, (), 1)
        if type(get()) is not DocumentEndEvent or type(get()) is not StreamEndEvent:
            raise _NotPlain  # a second document
        return data

    def count(self, event: Any) -> None:
        """The located loader's per-value limit and its refusal of anchors and explicit tags."""
        self.nodes_left -= 1
        if self.nodes_left < 0 or event.anchor is not None or event.ctag is not None:
            raise _NotPlain

    def where(self, event: Any) -> Location:
        mark = event.start_mark
        return Location(self.file, mark.line + 1, mark.column + 1)

    def value(self, get: Callable[[], Any], event: Any, path: PathKey, depth: int) -> Any:
        kind = type(event)
        if kind is ScalarEvent:
            self.count(event)
            if event.style in _BLOCK:
                self.block_scalar_start(event.start_mark.index)
            tag = _implicit_tag(event.value) if event.implicit[0] else STR
            found, problem = scalar_value(tag, event.value)
            if problem is not None:
                raise _NotPlain
            if rewritten(tag, event.value, found):
                self.rewritten.append(path)
            return found
        if kind is MappingStartEvent:
            return self.mapping(get, event, path, depth + 1)
        if kind is SequenceStartEvent:
            return self.sequence(get, event, path, depth + 1)
        raise _NotPlain  # an alias

    def mapping(
        self, get: Callable[[], Any], start: Any, path: PathKey, depth: int
    ) -> dict[str, Any]:
        self.count(start)
        if depth > self.max_depth:
            raise _NotPlain
        out: dict[str, Any] = {}
        while True:
            event = get()
            if type(event) is MappingEndEvent:
                return out
            key = self.key(event)
            if key in out:
                raise _NotPlain
            child = (*path, key)
            self.positions[child] = self.where(event)
            out[key] = self.value(get, get(), child, depth)

    def key(self, event: Any) -> str:
        if type(event) is not ScalarEvent:
            raise _NotPlain  # a list, a mapping or an alias as a key
        self.count(event)
        if event.style in _BLOCK:
            raise _NotPlain  # `? |` a block scalar as a key
        value = event.value
        if event.implicit[0] and _implicit_tag(value) not in AS_TEXT:
            raise _NotPlain  # `1:`, `true:`, `null:`, `<<:`
        if BAD_KEY_CHAR.search(value):
            raise _NotPlain
        return str(value)

    def block_scalar_start(self, at: int) -> None:
        """ruamel's scanner refuses two block scalar starts libyaml reads: a comment right
        after the header's indicators (`|#`, `>-#`), and, with no indentation indicator, a
        leading blank line of k > 0 spaces followed by a line indented deeper than k."""
        text = self.text
        line_end = text.find("\n", at)
        header = text[at + 1 : len(text) if line_end < 0 else line_end]
        indicators = header[: len(header) - len(header.lstrip("+-0123456789"))]
        if len(indicators) > 2 or header[len(indicators) :][:1] not in ("", " ", "\r"):
            raise _NotPlain
        if any(c.isdigit() for c in indicators) or line_end < 0:
            return  # an indentation indicator: nothing is detected from the leading lines
        first_blank, deepest, start = -1, 0, line_end + 1
        while start < len(text):
            end = text.find("\n", start)
            line = text[start : len(text) if end < 0 else end].removesuffix("\r")
            spaces = len(line) - len(line.lstrip(" "))
            deepest = max(deepest, spaces)
            if spaces < len(line) or end < 0:
                break  # the first line with content (or the end of the file)
            if first_blank < 0:
                first_blank = spaces
            start = end + 1
        if first_blank > 0 and deepest > first_blank:
            raise _NotPlain

    def sequence(
        self, get: Callable[[], Any], start: Any, path: PathKey, depth: int
    ) -> tuple[Any, ...]:
        self.count(start)
        if depth > self.max_depth:
            raise _NotPlain
        items: list[Any] = []
        while True:
            event = get()
            if type(event) is SequenceEndEvent:
                return tuple(items)
            child = (*path, len(items))
            self.positions[child] = self.where(event)
            items.append(self.value(get, event, child, depth))
