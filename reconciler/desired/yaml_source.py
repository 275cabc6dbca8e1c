"""Read YAML files into plain data, remembering the file, line and column of every key.

ruamel.yaml's round-trip loader keeps positions on its CommentedMap/CommentedSeq; we copy them
into a flat `{path: Location}` table so later stages (merge, pydantic, cross-checks) can name
the exact line that caused a problem without carrying ruamel types around.
Sequences become tuples so strict models accept them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from reconciler.desired.problems import DesiredStateError, Location, PathKey, Problem


@dataclass(frozen=True)
class SourceDoc:
    """One parsed YAML file: plain data plus the position of every key and item."""

    file: str
    data: dict[str, Any]
    positions: dict[PathKey, Location]


def load_yaml(path: Path, display: str) -> SourceDoc:
    """Parse one file; a malformed file raises DesiredStateError pointing at the bad line."""
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"))
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        text = (exc.problem or exc.context or "malformed YAML").strip()
        problem = Problem(Location(display, line, col), "", f"malformed YAML: {text}")
        raise DesiredStateError([problem]) from None
    except YAMLError as exc:
        raise DesiredStateError(
            [Problem(Location(display, 1, 1), "", f"malformed YAML: {exc}")]
        ) from None
    except UnicodeDecodeError as exc:
        raise DesiredStateError(
            [Problem(Location(display, 1, 1), "", f"not UTF-8 text: {exc.reason}")]
        ) from None
    if raw is None:
        return SourceDoc(display, {}, {})
    if not isinstance(raw, CommentedMap):
        kind = type(raw).__name__.replace("Commented", "").lower()
        problem = Problem(Location(display, 1, 1), "", f"expected a mapping of keys, got a {kind}")
        raise DesiredStateError([problem])
    positions: dict[PathKey, Location] = {(): Location(display, 1, 1)}
    data = _plain(raw, (), display, positions)
    return SourceDoc(display, data, positions)


def _plain(node: Any, path: PathKey, file: str, positions: dict[PathKey, Location]) -> Any:
    if isinstance(node, CommentedMap):
        out: dict[str, Any] = {}
        for key, value in node.items():
            line, col = node.lc.key(key)
            child = (*path, str(key))
            positions[child] = Location(file, line + 1, col + 1)
            out[str(key)] = _plain(value, child, file, positions)
        return out
    if isinstance(node, CommentedSeq):
        items = []
        for index, value in enumerate(node):
            line, col = node.lc.item(index)
            child = (*path, index)
            positions[child] = Location(file, line + 1, col + 1)
            items.append(_plain(value, child, file, positions))
        return tuple(items)
    if isinstance(node, str):
        return str(node)  # drop ruamel's scalar string subclasses
    if isinstance(node, bool | int | float) or node is None:
        return _scalar(node)
    return node


def _scalar(node: Any) -> Any:
    # ruamel returns ScalarFloat/ScalarInt subclasses; strict models want the builtins.
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    return float(node)
