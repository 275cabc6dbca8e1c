"""The box-side memory gate before a GPU lane boots: drop the page cache only when short,
re-check, refuse with the numbers when still short (unified memory: MemAvailable lies)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import load_box_program

ROOT = Path(__file__).resolve().parents[2]
converge = load_box_program("box_converge_memory", "reconciler/apply/remote/converge.py")

GIB = 1024 * 1024  # KiB


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Any:
    state: dict[str, Any] = {"drops": 0, "events": []}

    def run(total_gib: float, available_gib: list[float], util: float, floor: float = 4) -> Any:
        readings = iter(available_gib)

        def meminfo() -> dict[str, int]:
            return {"MemTotal": int(total_gib * GIB), "MemAvailable": int(next(readings) * GIB)}

        def drop(box: Any) -> str:
            state["drops"] += 1
            return "sudo"

        monkeypatch.setattr(converge, "meminfo", meminfo)
        monkeypatch.setattr(converge, "drop_caches", drop)
        monkeypatch.setattr(converge, "emit", lambda *a, **kw: state["events"].append(kw))
        box = converge.Box({"directory": "/nonexistent", "project": "lobes",
                            "memory": {"floor_gib": floor, "drop_caches": True}})  # fmt: skip
        converge.memory_gate(box, "vllm-worker", util)
        return state

    return run, state


def test_enough_memory_boots_without_dropping_anything(gate):
    run, state = gate
    run(122.8, [70.0], util=0.45)  # needs 0.45 x 122.8 + 4 = 59.3 GiB
    assert state["drops"] == 0


def test_short_memory_drops_the_page_cache_and_boots_when_that_freed_enough(gate):
    run, state = gate
    run(122.8, [40.0, 80.0], util=0.45)
    assert state["drops"] == 1
    assert state["events"][0]["dropped"] == "sudo"


def test_still_short_after_dropping_is_refused_with_the_numbers(gate):
    run, state = gate
    with pytest.raises(converge.Failed) as refused:
        run(122.8, [40.0, 41.0], util=0.45)
    assert state["drops"] == 1
    assert str(refused.value) == (
        "vllm-worker needs 59.3 GiB available (0.45 x MemTotal + 4 GiB) but only 41.0 GiB is, "
        "after dropping the page cache"
    )
