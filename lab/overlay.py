"""The lab's facts for the fleet's desired state: `.lab/overlay/<box>.yaml`.

inventory/lab.yaml reads these as the last group_vars layer of each box. They hold only what
the lab decides and group_vars cannot know: the digest of the lab's own
docker-compose.override.yml (what a GPU-less box needs). Everything else comes from group_vars,
exactly as for the real mesh.
"""

from __future__ import annotations

import hashlib

from .config import LAB_DIR, Box

OVERLAY_DIR = LAB_DIR / "overlay"


def write(box: Box, override_name: str, override_bytes: bytes) -> None:
    digest = hashlib.sha256(override_bytes).hexdigest()
    text = (
        "# Written by `lab up` (lab/overlay.py): the lab's own compose override, by digest.\n"
        "deployment:\n"
        "  file_digests:\n"
        f"    {override_name}: {digest}\n"
    )
    OVERLAY_DIR.mkdir(parents=True, exist_ok=True)
    path = OVERLAY_DIR / f"{box.name}.yaml"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
