"""Start one collector run per box and the controller's probes, all at once (stdlib only).

Every observing command (drift, audit, and drift's early start) goes through these two calls,
so what a box is sent and how the controller probes alongside is the same everywhere.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from reconciler.observe.controller_secrets import controller_values, stdin_payload
from reconciler.observe.transport import Running, Target, python_command, spawn

COLLECTOR = Path(__file__).parent / "remote" / "collector.py"

T = TypeVar("T")


def start_collectors(
    targets: Mapping[str, Target],
    payloads: Mapping[str, dict[str, Any]],
    environ: Mapping[str, str] | None = None,
) -> dict[str, Running]:
    """The collector on every box of `payloads` (each with its run key), not waited for.

    The controller_env secrets a payload names are read from `environ` (this process's
    environment) first and go on stdin; an unset one raises before any box is contacted."""
    sent = controller_values(payloads, os.environ if environ is None else environ)
    return {
        box: spawn(targets[box], collector_command(payload), stdin_payload(sent.get(box)))
        for box, payload in payloads.items()
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
