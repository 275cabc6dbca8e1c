"""The inventory, copied into the new repository (ruamel round trip: its comments stay).

Three changes, each for the new repository to stand on its own: overlays (`image_overlay`,
`box_overlay`) are dropped, since the adopted group_vars already hold what runs; a relative
ssh key or known_hosts path is made absolute (it was relative to the old root); and only the
adopted boxes are kept. A box whose `.env` announces another GATEWAY_SELF_ORIGIN than the
inventory's default gets `gateway_origin`; every other kept box loses the one it had.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from reconciler.report.values import clean

OVERLAYS = ("image_overlay", "box_overlay")
SSH_PATHS = ("ssh_key", "ssh_known_hosts_file")


def copied_inventory(
    source: Path, root: Path, boxes: Iterable[str], origins: Mapping[str, str], partial: str = ""
) -> str:
    """`partial`: what a partial import says of the boxes it left out (run.py), in the
    header: the inventory then lacks them, and must say so to whoever reads it later."""
    yaml = YAML()
    yaml.width = 4096
    data = yaml.load(source.read_text(encoding="utf-8"))
    keep = set(boxes)
    for key in OVERLAYS:
        if key in data:
            del data[key]
    for name in [b for b in data["boxes"] if b not in keep]:
        del data["boxes"][name]
    for name, box in data["boxes"].items():
        for key in SSH_PATHS:
            value = box.get(key)
            if isinstance(value, str) and not os.path.isabs(os.path.expanduser(value)):
                box[key] = os.path.normpath(root / value)
        _origin(box, origins.get(name))
    out = io.StringIO()
    out.write(
        f"# Copied by `reconcile import` from {clean(str(source))}: overlays dropped (group_vars/\n"
        "# holds what runs), ssh paths made absolute, only the adopted boxes kept.\n"
    )
    for line in partial.splitlines():
        out.write(f"# {line}\n")
    yaml.dump(data, out)
    return out.getvalue()


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
