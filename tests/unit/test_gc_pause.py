"""The collector modes bulk work runs under (reconciler/gc_pause.py)."""

from __future__ import annotations

import gc
import weakref

from reconciler.gc_pause import collecting, paused_gc, young_only


class Node:
    """A cyclic object, as a located YAML parse leaves them."""

    def __init__(self) -> None:
        self.me = self


def test_young_only_walks_no_older_generation_and_puts_the_thresholds_back() -> None:
    before = gc.get_threshold()
    older_before = [s["collections"] for s in gc.get_stats()][1:]
    with young_only():
        assert gc.get_threshold()[0] == before[0]
        kept = [[index] for index in range(200_000)]  # dozens of youngest-generation passes
    older_after = [s["collections"] for s in gc.get_stats()][1:]
    assert gc.get_threshold() == before
    assert older_after == older_before
    assert len(kept) == 200_000


def test_young_only_still_collects_young_cycles() -> None:
    was = gc.isenabled()
    gc.enable()
    try:
        with young_only():
            cycle = Node()
            gone = weakref.ref(cycle)
            del cycle
            kept = [[] for _ in range(50_000)]  # allocations enough for several young passes
            assert gone() is None
            assert len(kept) == 50_000
    finally:
        if not was:
            gc.disable()


def test_young_only_restores_the_thresholds_after_an_error() -> None:
    before = gc.get_threshold()
    try:
        with young_only():
            raise KeyError("boom")
    except KeyError:
        pass
    assert gc.get_threshold() == before


def test_paused_and_collecting_leave_the_collector_as_they_found_it() -> None:
    was = gc.isenabled()
    try:
        gc.enable()
        with paused_gc():
            assert not gc.isenabled()
        assert gc.isenabled()
        gc.disable()
        with collecting():
            assert gc.isenabled()
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
