"""The inventory, copied into the new repository (ruamel round trip: its comments stay).

Three changes, each for the new repository to stand on its own: overlays (`image_overlay`,
`box_overlay`) are dropped, since the adopted group_vars already hold what runs; a relative
ssh key or known_hosts path is made absolute (it was relative to the old root); and only the
adopted boxes are kept. A box whose `.env` announces another GATEWAY_SELF_ORIGIN than the
inventory's default gets `gateway_origin`; every other kept box loses the one it had.

The inventory is parsed once (`Inventory`) and each copy takes only the entries it keeps: an
import that judges each box on its own writes one copy per box, and parsing the whole
inventory for each (ruamel's round-trip loader) made naming one invalid box of 240 take 47 s.
"""

from __future__ import annotations

import copy
import io
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, Format

from reconciler.report.values import clean

OVERLAYS = ("image_overlay", "box_overlay")
SSH_PATHS = ("ssh_key", "ssh_known_hosts_file")


class Inventory:
    """The source inventory, parsed once (its comments kept), copied as often as asked."""

    def __init__(self, source: Path, root: Path) -> None:
        self.source, self.root = source, root
        self._yaml = YAML()
        self._yaml.width = sys.maxsize  # never folded (yaml_out.py says why)
        self._data = self._yaml.load(source.read_text(encoding="utf-8"))
        self._order = {name: i for i, name in enumerate(self._data["boxes"])}

    def where(self, box: str, key: str) -> str:
        """`inventory/lab.yaml:12` (its path under the root, 1-based line) of `box`'s `key`, as
        an error names it; the file alone where the line is not known."""
        name = os.path.relpath(self.source, self.root)
        try:
            line, _ = self._data["boxes"][box].lc.key(key)
        except (AttributeError, KeyError, TypeError):
            return name
        return f"{name}:{line + 1}"

    def copy(self, boxes: Iterable[str], origins: Mapping[str, str], partial: str = "") -> str:
        """The inventory holding only `boxes` (in the inventory's order). `partial`: what a
        partial import says of the boxes it left out (run.py), in the header: the inventory
        then lacks them, and must say so to whoever reads it later. The parsed source is
        never changed, and a copy costs what it keeps, not what the inventory holds."""
        listed = self._data["boxes"]
        keep = sorted({b for b in boxes if b in self._order}, key=self._order.__getitem__)
        kept = _only(listed, keep)
        # Everything but the boxes copied whole (a few keys); the boxes map replaced by `kept`.
        data = copy.deepcopy(self._data, {id(listed): kept})
        for key in OVERLAYS:
            if key in data:
                del data[key]
        for name in keep:
            box = data["boxes"][name]
            for key in SSH_PATHS:
                value = box.get(key)
                if isinstance(value, str) and not os.path.isabs(os.path.expanduser(value)):
                    box[key] = os.path.normpath(self.root / value)
            _origin(box, origins.get(name))
        out = io.StringIO()
        out.write(
            f"# Copied by `reconcile import` from {clean(str(self.source))}: overlays dropped "
            "(group_vars/\n# holds what runs), ssh paths made absolute, only the adopted boxes "
            "kept.\n"
        )
        for line in partial.splitlines():
            out.write(f"# {line}\n")
        self._yaml.dump(data, out)
        return out.getvalue()


def copied_inventory(
    source: Path, root: Path, boxes: Iterable[str], origins: Mapping[str, str], partial: str = ""
) -> str:
    """One copy of `source` (Inventory.copy); parse it once with Inventory for several."""
    return Inventory(source, root).copy(boxes, origins, partial)


def _only(listed: CommentedMap, keep: list[str]) -> CommentedMap:
    """A copy of the boxes map holding `keep`'s entries, each with the comments it carries
    (ruamel keeps a comment between two entries on the one above), and the map's own."""
    kept = CommentedMap()
    for name in keep:
        kept[name] = copy.deepcopy(listed[name])
    comments = listed.ca
    kept.ca.comment = copy.deepcopy(comments.comment)
    kept.ca.end = copy.deepcopy(comments.end)
    for name in keep:
        if name in comments.items:
            kept.ca.items[name] = copy.deepcopy(comments.items[name])
    setattr(kept, Format.attrib, copy.copy(listed.fa))
    return kept


def _origin(box: Any, origin: str | None) -> None:
    """The adopted origin, or none: an origin the source inventory names but the box's `.env`
    does not announce is the old state's, and kept it would make the adopted `.env` announce
    it (GATEWAY_SELF_ORIGIN) and the mesh's seeds name it."""
    if origin is None:
        if "gateway_origin" in box:
            del box["gateway_origin"]
        return
    box["gateway_origin"] = origin
    box.yaml_add_eol_comment("GATEWAY_SELF_ORIGIN in .env", "gateway_origin")
