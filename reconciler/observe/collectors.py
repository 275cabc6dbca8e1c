"""Start one collector run per box, all at once (stdlib only).

Every observing command (drift, audit, and drift's early start) goes through this call, so
what a box is sent is the same everywhere; the controller's own probes run beside it as a
transport.Background.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from reconciler.observe import fanout
from reconciler.observe.controller_secrets import controller_values, stdin_payload
from reconciler.observe.transport import Running, Target, python_command, spawn

COLLECTOR = Path(__file__).parent / "remote" / "collector.py"


def start_collectors(
    targets: Mapping[str, Target],
    payloads: Mapping[str, dict[str, Any]],
    environ: Mapping[str, str] | None = None,
    max_parallel: int | None = None,
) -> dict[str, Running]:
    """The collector on every box of `payloads` (each with its run key), not waited for.

    At most `max_parallel` boxes (default: fanout.limit(), sized for this controller) run at
    once: when there are more, the rest wait in line and each starts when an earlier box's
    answer has been read (reconciler/observe/fanout.py). The controller_env secrets a payload
    names are read from `environ` (this process's environment) first and go on stdin; an unset
    one raises before any box is contacted."""
    sent = controller_values(payloads, os.environ if environ is None else environ)
    size = fanout.limit() if max_parallel is None else max_parallel
    # Every box's work is made before the first ssh starts: what raises here (secrets too large
    # for stdin, a box without a target) must raise while no box has been contacted, not after
    # earlier boxes' ssh clients started and their handles were lost with the exception.
    work = {
        box: (targets[box], collector_command(payload), stdin_payload(sent.get(box)))
        for box, payload in payloads.items()
    }

    def starter(box: str) -> Callable[[], Running]:
        target, command, stdin = work[box]
        return lambda: spawn(target, command, stdin)

    if len(payloads) <= size:  # every box at once: no line to wait in, nothing to schedule
        return {box: starter(box)() for box in work}
    slots = fanout.Slots(size)
    handles: dict[str, Running] = {}
    for box in work:
        queued = fanout.Queued(box, starter(box), slots)
        handles[box] = queued
        slots.take(queued)
    return handles


def collector_command(payload: dict[str, Any]) -> str:
    """The remote command line of one collector run (also what the pyinfra fact runs)."""
    return python_command(COLLECTOR, _encoded(payload))


def _encoded(payload: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(payload).encode("utf-8")).decode("ascii")
