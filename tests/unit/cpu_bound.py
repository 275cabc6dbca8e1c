"""A bound on the CPU one block of this thread spends: the guard a test puts on a hostile or
huge input staying linear (each guarded function once took seconds to minutes on it, growing
as the square of the input), never a speed goal (bench/ measures speed, in ratio tables).

This thread's CPU time, not the wall clock: a test runs beside others on a shared machine (the
lab's engines and containers, the other xdist worker, a CI host's neighbours), which slow it in
wall time without its code doing any more work. A wall-clock bound failed so (2.8 s against
1.0 s of a linear scan that takes milliseconds alone), saying nothing about the code."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cpu_bound(seconds: float) -> Iterator[None]:
    started = time.thread_time()
    yield
    spent = time.thread_time() - started
    assert spent < seconds, f"{spent:.2f} s of this thread's CPU, against a bound of {seconds:g} s"
