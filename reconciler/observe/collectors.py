"""Start one collector run per box and the controller's probes, all at once (stdlib only).

Every observing command (drift, audit, and drift's early start) goes through these two calls,
so what a box is sent and how the controller probes alongside is the same everywhere.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from reconciler.observe.transport import Running, Target, python_command, spawn

COLLECTOR = Path(__file__).parent / "remote" / "collector.py"

T = TypeVar("T")


def start_collectors(
    targets: Mapping[str, Target], payloads: Mapping[str, dict[str, Any]]
) -> dict[str, Running]:
    """The collector on every box of `payloads` (each with its run key), not waited for."""
    return {
        box: spawn(targets[box], collector_command(payload)) for box, payload in payloads.items()
    }


def collector_command(payload: dict[str, Any]) -> str:
    """The remote command line of one collector run (also what the pyinfra fact runs)."""
    return python_command(COLLECTOR, _encoded(payload))


def in_background(fn: Callable[..., T], *args: Any) -> Future[T]:
    """`fn(*args)` in a thread of its own (the controller's probes, while the boxes work)."""
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)  # the thread ends with fn; nobody waits for the pool itself
    return future


def _encoded(payload: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(payload).encode("utf-8")).decode("ascii")
