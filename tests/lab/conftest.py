"""The lab fixture: `lab up` once per session (cold or warm), then every lab test reads facts.

`lab up` is idempotent and restores every box to its pristine deployment, so a session that
starts on a lab someone left in an incident state still starts clean.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import lab as labpkg
from lab import config, ssh


@pytest.fixture(scope="session")
def lab() -> Iterator[dict[str, Any]]:
    if os.geteuid() != 0:
        pytest.fail("the lab tests need root (network namespaces, users, daemons)")
    # One lab, many test sessions (developers, CI): tests break boxes on purpose and reset
    # them, so two sessions at once would see each other's incidents. Serialise sessions.
    config.LAB_DIR.mkdir(parents=True, exist_ok=True)
    with open(config.LAB_DIR / "session.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield labpkg.up()


@pytest.fixture(scope="session")
def on_box(lab: dict[str, Any]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a shell command line on a box over SSH as its user: on_box("thor", "docker ps")."""

    def run(box: str, command: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        return ssh.run(config.box(box), command, check=check)

    return run


@pytest.fixture(scope="session")
def http(lab: dict[str, Any]) -> Iterator[httpx.Client]:
    # trust_env=False: every target is a lab address; http_proxy/ALL_PROXY must not apply.
    with httpx.Client(timeout=5, trust_env=False) as client:
        yield client


@pytest.fixture
def pristine(lab: dict[str, Any]) -> Iterator[Callable[[str], None]]:
    """For tests that break a box on purpose: register the box, it is reset afterwards."""
    touched: list[str] = []
    yield touched.append
    for box in dict.fromkeys(touched):
        labpkg.incidents.reset(box)
