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


class OutputRefused(Exception):
    """NEWROOT cannot take the new repository; nothing was written there."""


class OutputExists(OutputRefused):
    pass


def check_free(output: Path, force: bool, sources: Mapping[str, Path] | None = None) -> None:
    """Refuse an existing `output` unless forced, and, forced or not, an output that is or
    holds what the import reads (`sources`: the repository, the snapshot): replacing it would
    delete them (symlinks followed)."""
    real = Path(os.path.realpath(output))
    for what, source in (sources or {}).items():
        held = Path(os.path.realpath(source))
        if held == real or real in held.parents:
            raise OutputExists(f"{output} holds {what} {source}: choose a new directory")
    if os.path.lexists(output) and not force:
        raise OutputExists(f"{output} already exists (use --force to replace it)")


def build(output: Path, files: Mapping[str, str]) -> Path:
    """Write `files` (relative path -> text) into a new directory beside `output`."""
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{output.name}.import-", dir=output.parent))
    except OSError as exc:  # a parent that is a file, a place this user cannot write
        raise OutputRefused(f"{output}: {exc.strerror or exc}") from None
    try:
        os.chmod(building, 0o755)
        for name, text in files.items():
            path = building / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    except OSError as exc:  # a full disk
        discard(building)
        raise OutputRefused(f"{output}: {exc.strerror or exc}") from None
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
