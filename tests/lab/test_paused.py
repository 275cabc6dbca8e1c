"""A lane and a gateway paused on a real engine (`docker pause`): drift says each is paused,
with the `docker unpause` that resumes it, report-only (a recreate would load the lane's
model again), and the gateway's loopback probes, which a frozen process cannot answer, are
not three more errors of the box."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from reconciler.compare.drift import Kind
from tests.lab.test_drift import observe

pytestmark = pytest.mark.lab

PAUSED = ("model-gear-vllm-hand", "model-gear-gateway")


def test_paused_containers_are_said_with_their_unpause_and_left_as_they_are(
    lab: Any, on_box: Callable[..., Any]
) -> None:
    on_box("spark", f"docker pause {' '.join(PAUSED)}")
    try:
        result = observe("spark")
    finally:
        on_box("spark", f"docker unpause {' '.join(PAUSED)}", check=False)
    paused = {
        d.source: d
        for d in result.drifts
        if d.kind is Kind.STATE and d.path == "status" and d.observed == "paused"
    }
    assert sorted(paused) == sorted(PAUSED)
    for name, d in paused.items():
        assert d.action.value == "report-only"
        assert d.note is not None and f"`docker unpause {name}`" in d.note
    assert [e for e in result.errors if e.where.startswith("gateway")] == []
    assert observe("spark").errors == ()  # unpaused: as it was
