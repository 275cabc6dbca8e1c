"""Start one collector run per box, all at once (stdlib only).

Every observing command (drift, audit, and drift's early start) goes through this call, so
what a box is sent is the same everywhere; the controller's own probes run beside it as a
transport.Background.

What a box is sent travels on ssh's stdin, as apply's payload does (apply/boxcall.py): the
payload (its run key, the desired settings, any secret a setting carries inline) and the
controller_env secrets' values. The command line (ssh's argv here, `sh -c` and python3's on
the box, which every user of either machine can read in /proc/PID/cmdline) carries only the
program and `-`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from reconciler.observe import fanout
from reconciler.observe.controller_secrets import controller_values, stdin_payload
from reconciler.observe.transport import Running, Target, python_command, spawn

COLLECTOR = Path(__file__).parent / "remote" / "collector.py"
# What the collector reads of its stdin at most (its STDIN_LIMIT): a payload is a few KB, the
# controller_env secrets at most controller_secrets.STDIN_LIMIT_BYTES.
STDIN_LIMIT_BYTES = 1024 * 1024


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
    names are read from `environ` (this process's environment) first and go on stdin with the
    payload (`collector_stdin`); an unset one raises before any box is contacted."""
    sent = controller_values(payloads, os.environ if environ is None else environ)
    size = fanout.limit() if max_parallel is None else max_parallel
    # Every box's work is made before the first ssh starts: what raises here (secrets too large
    # for stdin, a box without a target) must raise while no box has been contacted, not after
    # earlier boxes' ssh clients started and their handles were lost with the exception.
    inputs = {box: collector_stdin(payload, sent.get(box)) for box, payload in payloads.items()}
    command = collector_command()  # the same line for every box: nothing of its payload
    work = {box: (targets[box], command, inputs[box]) for box in payloads}

    def starter(box: str) -> Callable[[], Running]:
        target, command, stdin = work[box]
        return lambda: spawn(target, command, stdin)

    handles: dict[str, Running] = {}
    try:
        if len(payloads) <= size:  # every box at once: no line to wait in, nothing to schedule
            for box in work:
                handles[box] = starter(box)()
            return handles
        slots = fanout.Slots(size)
        for box in work:
            queued = fanout.Queued(box, starter(box), slots)
            handles[box] = queued
            slots.take(queued)
        return handles
    except BaseException:
        # Ctrl-C (or a failure) between two boxes' starts: no caller ever gets these handles,
        # so the boxes already started are stopped here, their ssh clients killed, not left
        # running after the controller is gone.
        fanout.cancel_all(handles.values())
        raise


def collector_command() -> str:
    """The remote command line of a collector run (also what the pyinfra fact runs): the
    program and `-`, its input on stdin (`collector_stdin`). Nothing of a payload."""
    return python_command(COLLECTOR, "-")


def collector_stdin(payload: dict[str, Any], secrets: Mapping[str, str] | None = None) -> bytes:
    """What a collector reads on stdin: one JSON object, `{"payload": ..., "sent": ...}`
    (`sent`: the controller_env secrets' values, name -> value; {} when there are none).
    Raises ValueError, naming no value, when the box would refuse it for its size."""
    sent = stdin_payload(secrets) or b"{}"  # its own bound: controller_secrets.py
    data = b'{"payload": %s, "sent": %s}' % (json.dumps(payload).encode("utf-8"), sent)
    if len(data) > STDIN_LIMIT_BYTES:
        raise ValueError(
            f"a collector's payload and secrets: more than {STDIN_LIMIT_BYTES} bytes together"
        )
    return data
