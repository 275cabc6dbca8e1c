"""The new repository goes into place whole or not at all.

It is built in a hidden directory beside NEWROOT (same filesystem, so the final rename is
atomic), checked there, and renamed into place. An existing NEWROOT is refused unless forced;
forced, the old one is moved aside first and removed only once the new one is in place.

`--force` deletes what NEWROOT holds, so it replaces only what an import could have written:
an empty directory, or one holding nothing but `inventory/`, `group_vars/` (and `facts/`) of
YAML files, the group_vars saying an import wrote them. `/`, the home, the current directory
and any directory holding one of them are refused outright (`--output . --force` once deleted
the files of the directory it ran in).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from reconciler.report.values import clean

# What an adopted repository holds at its top (facts/: a snapshot's facts an operator copied in).
REPOSITORY_DIRS = frozenset({"inventory", "group_vars", "facts"})
# What the files an import writes end with: `.yaml`, but the inventory is copied under its own
# name (`inventory/mesh.yml` stays `.yml`, and a second `--force` import must replace it).
SUFFIXES = {"inventory": (".yaml", ".yml")}
YAML = (".yaml",)
# The words every group_vars layer an import writes starts with (run.py's header).
WRITTEN_BY = "Adopted by `reconcile import`"


class OutputRefused(Exception):
    """NEWROOT cannot take the new repository; nothing was written there."""


class OutputExists(OutputRefused):
    pass


def check_free(output: Path, force: bool, sources: Mapping[str, Path] | None = None) -> None:
    """Refuse an existing `output` unless forced, and, forced or not, an output that is or
    holds what the import reads (`sources`: the repository, the snapshot): replacing it would
    delete them (symlinks followed). Forced, only a directory an import could have written is
    replaced (the module's docstring)."""
    real = Path(os.path.realpath(output))
    for what, source in (sources or {}).items():
        held = Path(os.path.realpath(source))
        if held == real or real in held.parents:
            raise OutputExists(
                f"{clean(str(output))} holds {what} {clean(str(source))}: choose a new directory"
            )
    _never_replaced(output, real)
    if not os.path.lexists(output):
        return
    if not force:
        raise OutputExists(f"{clean(str(output))} already exists (use --force to replace it)")
    unexpected = _not_written_by_import(output)
    if unexpected is not None:
        raise OutputExists(
            f"{clean(str(output))} is not a repository `reconcile import` wrote ({unexpected}); "
            "--force replaces only an empty directory or one import wrote: choose a new directory"
        )


def _never_replaced(output: Path, real: Path) -> None:
    """`/`, the home, the current directory, or a directory holding one of them."""
    if real == Path(real.anchor):
        raise OutputExists(f"{clean(str(output))} is the root directory: choose a new directory")
    for what, place in _kept_places():
        held = Path(os.path.realpath(place))
        if held == real or real in held.parents:
            raise OutputExists(f"{clean(str(output))} is or holds {what}: choose a new directory")


def _kept_places() -> list[tuple[str, str]]:
    places = []
    with contextlib.suppress(OSError):  # a current directory removed under us holds nothing
        places.append(("the current directory", os.getcwd()))
    home = os.path.expanduser("~")
    if home != "~":  # no HOME and no passwd entry: no home to keep
        places.append(("your home", home))
    return places


def _not_written_by_import(output: Path) -> str | None:
    """Why `output` is not what an import writes (None: it is, or it is an empty directory)."""
    try:
        if not stat.S_ISDIR(os.lstat(output).st_mode):
            return "not a directory"
        with os.scandir(output) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            if entry.name not in REPOSITORY_DIRS or not entry.is_dir(follow_symlinks=False):
                return f"it holds {clean(str(entry.name))}"
            stray = next(_not_yaml(Path(entry.path), SUFFIXES.get(entry.name, YAML)), None)
            if stray is not None:
                return f"it holds {clean(str(os.path.relpath(stray, output)))}"
        if entries and not _header_says_import(output / "group_vars"):
            return "no group_vars layer says `reconcile import` wrote it"
    except OSError as exc:
        return f"it cannot be read: {exc.strerror or type(exc).__name__}"
    return None


def _not_yaml(directory: Path, suffixes: tuple[str, ...] = YAML) -> Iterator[str]:
    """Every entry under `directory` that is neither a directory nor a regular YAML file
    ending in one of `suffixes` (symlinks included: what they lead to is not the import's)."""
    with os.scandir(directory) as it:
        entries = list(it)
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            yield from _not_yaml(Path(entry.path), suffixes)
        elif not (entry.is_file(follow_symlinks=False) and entry.name.endswith(suffixes)):
            yield entry.path


def _header_says_import(group_vars: Path) -> bool:
    """Whether a layer's first line is the header an import writes (run.py)."""
    if not group_vars.is_dir() or group_vars.is_symlink():
        return False
    for layer in sorted(group_vars.glob("*.yaml")):
        with open(layer, "rb") as f:
            if WRITTEN_BY.encode() in f.readline(4096):
                return True
    return False


def build(output: Path, files: Mapping[str, str]) -> Path:
    """Write `files` (relative path -> text) into a new directory beside `output`."""
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{output.name}.import-", dir=output.parent))
    except OSError as exc:  # a parent that is a file, a place this user cannot write
        raise OutputRefused(f"{clean(str(output))}: {exc.strerror or exc}") from None
    try:
        os.chmod(building, 0o755)
        for name, text in files.items():
            path = building / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    except OSError as exc:  # a full disk
        discard(building)
        raise OutputRefused(f"{clean(str(output))}: {exc.strerror or exc}") from None
    except UnicodeError:  # a path that is not UTF-8 (a copied ssh_key's), which YAML cannot hold
        discard(building)
        raise OutputRefused(
            f"{clean(str(output))}: a path the repository would name is not UTF-8 text"
        ) from None
    except BaseException:
        discard(building)  # never a half-built directory left behind, whatever stopped us
        raise
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
