"""Bulk work without the cyclic garbage collector: `with paused_gc(): ...`.

A snapshot replay reads, parses and compares a thousand boxes' answers: millions of dicts,
lists and dataclasses, every one freed by reference counting when its box is done (they form
no cycles). The cyclic collector still runs every few hundred allocations, and each of its full
passes walks everything alive, the remembered drift inputs included: ~0.35 s of a 1,000-box
replay (bench/scale_bench.py), per box and growing with the fleet, for no garbage found. Inside
the block it does not run; on leaving, it runs as it would have (anything cyclic made inside is
collected then). Nested blocks and a collector someone else disabled are left as they are.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextmanager
def collecting() -> Iterator[None]:
    """The cyclic collector on inside the block (the desired state's load: ruamel.yaml and
    pydantic may leave cycles), as it was before on leaving."""
    if gc.isenabled():
        yield
        return
    gc.enable()
    try:
        yield
    finally:
        gc.disable()


# Collections of the youngest generation before an older one is walked, inside `young_only`:
# never, in practice (CPython's thresholds are C ints).
_NEVER = 1_000_000_000


@contextmanager
def young_only() -> Iterator[None]:
    """Inside the block the collector, if on, walks only the youngest objects: the cycles a
    located YAML parse leaves (~100 objects a file) die young and are still collected there,
    while the state being built (a 1,000-box fleet, its drift inputs: ~1 million objects, none
    of them garbage) is not walked again and again by the older generations' passes, which
    cost ~0.15 s of loading 1,000 boxes and ~0.2 s of deriving their inputs
    (bench/scale_bench.py). The thresholds are put back on leaving."""
    before = gc.get_threshold()
    gc.set_threshold(before[0], _NEVER, _NEVER)
    try:
        yield
    finally:
        gc.set_threshold(*before)
