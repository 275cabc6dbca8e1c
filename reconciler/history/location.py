"""Where the history store lives (stdlib only: checked before a run contacts any box).

The default is the user's state directory, `$XDG_STATE_HOME/fleet-reconciler/history.sqlite3`
(`~/.local/state/...` without it), or `--history PATH`. A store inside the fleet repository is
refused: it would be committed, or copied with the desired state to wherever that goes.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_ENV = "XDG_STATE_HOME"
APP_DIR = "fleet-reconciler"
FILE_NAME = "history.sqlite3"


class HistoryLocationError(ValueError):
    """A history path that cannot be used (said before anything is observed)."""


def state_dir() -> Path:
    """This tool's state directory: `$XDG_STATE_HOME/fleet-reconciler` (`~/.local/state/...`
    without it). Holds the history store and the snapshot key (observe/snapshot_key.py)."""
    state = os.environ.get(STATE_ENV)
    # The XDG spec: a relative XDG_STATE_HOME is invalid and must be ignored.
    base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / APP_DIR


def default_path() -> Path:
    return state_dir() / FILE_NAME


def history_path(chosen: str | None, repo_root: Path | None) -> Path:
    """The store's absolute path: `chosen` (--history) or the default, refused when it is
    inside `repo_root` (the fleet repository) or names a directory."""
    path = Path(os.path.realpath(os.path.expanduser(chosen))) if chosen else default_path()
    path = Path(os.path.realpath(path))
    try:
        if path.is_dir():
            raise HistoryLocationError(f"history: {chosen or path} is a directory, not a file")
        blocked = _not_a_directory(path.parent)
    except OSError as exc:  # a directory on the way the user may not look into
        raise HistoryLocationError(
            f"history: {chosen or path} cannot be used: {exc.strerror or exc}"
        ) from None
    if blocked is not None:
        # `prepare` makes the missing directories; one that is a file would fail it only once
        # the run is done, as a warning after every box was observed.
        raise HistoryLocationError(
            f"history: {chosen or path} cannot be used: {blocked} is not a directory"
        )
    if repo_root is not None:
        root = Path(os.path.realpath(repo_root))
        if path == root or root in path.parents:
            raise HistoryLocationError(
                f"history: {path} is inside the fleet repository {root}; "
                "choose a path outside it (--history PATH) or --no-history"
            )
    return path


def _not_a_directory(directory: Path) -> Path | None:
    """The nearest existing ancestor of `directory` (itself included) when it is not a
    directory, else None."""
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def prepare(path: Path) -> None:
    """Create the store's directory private to the user (0700) when it is missing, and keep
    the files private (0600): runs name boxes, lanes and what drifted on them."""
    directory = path.parent
    if not directory.exists():
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)  # mkdir's mode is masked by the umask


def restrict(path: Path) -> None:
    """0600 on the store and on the -wal/-shm files sqlite keeps beside it."""
    for suffix in ("", "-wal", "-shm"):
        part = Path(f"{path}{suffix}")
        if part.exists() and part.stat().st_mode & 0o077:
            os.chmod(part, 0o600)
