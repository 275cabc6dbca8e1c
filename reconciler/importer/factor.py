"""Layers: a value every adopted box shares goes to all.yaml, a value every member of a group
shares to that group, the rest to the box's own file.

The loader merges all -> groups in `group_order` -> box, mappings deep and everything else
(lists included) replaced whole, so a leaf here is a whole list or a small mapping. A layer
only ever receives a value that every box it applies to has, with the same value, and a box
file restates a value wherever the layers above would give it another one: each box's merged
result is exactly its adopted tree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from reconciler.importer.sourced import Path, Sourced, Tree, leaves, put


def _same(a: Sourced, b: Sourced) -> bool:
    return type(a.value) is type(b.value) and a.value == b.value


def _origin(found: list[tuple[str, Sourced]]) -> Sourced:
    """One value shared by several boxes: its origin once if they all agree, else per box."""
    origins = {s.origin for _, s in found}
    if len(origins) == 1:
        return found[0][1]
    return Sourced(found[0][1].value, "; ".join(f"{b} {s.origin}" for b, s in found))


def factor(
    trees: Mapping[str, Tree], groups: Mapping[str, Sequence[str]], group_order: Sequence[str]
) -> dict[str, Tree]:
    """box trees -> layer name (`all`, a group, a box) -> tree; empty layers are left out."""
    layers: dict[str, Tree] = {}
    by_path: dict[Path, dict[str, Sourced]] = {}
    for box, tree in trees.items():
        for path, leaf in leaves(tree):
            by_path.setdefault(path, {})[box] = leaf
    boxes = list(trees)
    for path, values in by_path.items():
        got = {b: values[b] for b in boxes if b in values}
        first = next(iter(got.values()))
        if len(got) == len(boxes) and all(_same(first, v) for v in got.values()):
            put(layers.setdefault("all", {}), path, _origin(list(got.items())))
            continue
        given: dict[str, Sourced] = {}  # what each box would inherit from the groups
        for group in group_order:
            members = [b for b in boxes if group in groups.get(b, ())]
            if len(members) < 2 or not all(b in got for b in members):
                continue
            head = got[members[0]]
            if all(_same(head, got[b]) for b in members):
                put(layers.setdefault(group, {}), path, _origin([(b, got[b]) for b in members]))
                for b in members:
                    given[b] = head
        for box, leaf in got.items():
            inherited = given.get(box)
            if inherited is None or not _same(inherited, leaf):
                put(layers.setdefault(box, {}), path, leaf)
    return layers
