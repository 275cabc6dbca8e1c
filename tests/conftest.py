"""Every test session records its drift and audit runs (the CLI does by default) in a state
directory of its own, never in the user's: XDG_STATE_HOME points into a temporary directory for
the whole session, subprocesses included (they inherit the environment).

The test command (scripts/test.sh) runs the tests in two pytest-xdist workers: the lab tests
wait most of their time (a lane's health check every 5 s, a converge's verification), the unit
tests are CPU, so the unit tests run beside the lab tests instead of after them. The lab tests
are one unit of work (`pytest_xdist_make_scheduler` below): one worker runs them all, in one
session holding the lab (tests/lab/conftest.py), as a run without workers does. Each worker
is a session of its own here: its own state directory."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import pytest

# The tests that break boxes on purpose and reset them: never two workers on one lab.
LAB_TESTS = "tests/lab/"
LAB_UNIT = "the lab"
_STATE: dict[str, str | None] = {}


def pytest_configure(config: pytest.Config) -> None:
    _STATE["before"] = os.environ.get("XDG_STATE_HOME")
    _STATE["dir"] = tempfile.mkdtemp(prefix="fleet-tests-state-")
    os.environ["XDG_STATE_HOME"] = _STATE["dir"]


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: a run without workers has none
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "load":  # another mode, chosen on purpose: xdist's own
        return None
    return lab_apart()(config, log)


def lab_apart() -> Any:
    """xdist's scheduler by scope, with every lab test in one unit of work (one worker, in the
    order collected) and each other module a unit of its own (its module-scoped fixtures made
    once). Not `--dist loadgroup` with an `xdist_group` mark: with pytest 9.2 that silently
    groups nothing (pytest-xdist #1386), and two workers then took turns at the lab's session
    lock. A class made when asked: xdist is imported only by a run with workers."""
    from xdist.scheduler import LoadScopeScheduling

    class LabApart(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return LAB_UNIT if nodeid.startswith(LAB_TESTS) else super()._split_scope(nodeid)

    return LabApart


def pytest_unconfigure(config: pytest.Config) -> None:
    before, directory = _STATE.get("before"), _STATE.get("dir")
    if before is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = before
    if directory:
        shutil.rmtree(directory, ignore_errors=True)
