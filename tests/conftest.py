"""Every test session records its drift and audit runs (the CLI does by default) in a state
directory of its own, never in the user's: XDG_STATE_HOME points into a temporary directory for
the whole session, subprocesses included (they inherit the environment)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_STATE: dict[str, str | None] = {}


def pytest_configure(config: pytest.Config) -> None:
    _STATE["before"] = os.environ.get("XDG_STATE_HOME")
    _STATE["dir"] = tempfile.mkdtemp(prefix="fleet-tests-state-")
    os.environ["XDG_STATE_HOME"] = _STATE["dir"]


def pytest_unconfigure(config: pytest.Config) -> None:
    before, directory = _STATE.get("before"), _STATE.get("dir")
    if before is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = before
    if directory:
        shutil.rmtree(directory, ignore_errors=True)
