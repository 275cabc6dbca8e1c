"""The new repository goes into place whole or not at all.

It is built in a hidden directory beside NEWROOT (same filesystem, so the final rename is
atomic), checked there, and renamed into place. An existing NEWROOT is refused unless forced;
forced, the old one is moved aside first and removed only once the new one is in place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path


class OutputExists(Exception):
    pass


def check_free(output: Path, force: bool) -> None:
    if os.path.lexists(output) and not force:
        raise OutputExists(f"{output} already exists (use --force to replace it)")


def build(output: Path, files: Mapping[str, str]) -> Path:
    """Write `files` (relative path -> text) into a new directory beside `output`."""
    output.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{output.name}.import-", dir=output.parent))
    os.chmod(building, 0o755)
    for name, text in files.items():
        path = building / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return building


def discard(building: Path) -> None:
    shutil.rmtree(building, ignore_errors=True)


def put_in_place(building: Path, output: Path, force: bool) -> None:
    check_free(output, force)
    old = None
    if os.path.lexists(output):
        old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old-", dir=output.parent))
        os.replace(output, old / "previous")
    os.replace(building, output)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
