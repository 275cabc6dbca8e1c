"""Unit tests see the repository as it is, whatever the caller's shell selects: an operator's
exported FLEET_INVENTORY=lab (as the README's examples use) must not change their results."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_fleet_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_INVENTORY", raising=False)
    monkeypatch.delenv("FLEET_ROOT", raising=False)
