"""A value found on a box, with where it was found (`.env:61`, `docker inspect`, ...).

An adopted desired state is a tree of plain dicts whose leaves are `Sourced`; a leaf's value
may itself be a list or a small mapping (`{secret: mesh_key}`), written whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

Tree = dict[str, Any]  # str -> Tree | Sourced
Path = tuple[str, ...]


@dataclass(frozen=True)
class Sourced:
    value: Any
    origin: str  # the end-of-line comment: where the value came from


@dataclass(frozen=True)
class Finding:
    """Something adopting a box showed that no desired state removes or that needs a look:
    `.env` and the running containers disagree, a value had to be defaulted, a container
    could not be adopted. Never holds a secret value (digests are not shown either)."""

    box: str
    what: str


def put(tree: Tree, path: Path, leaf: Sourced) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = leaf


def leaves(tree: Tree, prefix: Path = ()) -> Iterator[tuple[Path, Sourced]]:
    for key, node in tree.items():
        if isinstance(node, Sourced):
            yield (*prefix, key), node
        else:
            yield from leaves(node, (*prefix, key))
