"""Run the box-side converge program over the fleet's OpenSSH transport, streaming its events.

The payload goes on stdin (secrets included, when a controller_env secret is needed), so it
never appears in a process list on either side. The ssh options, key and ControlMaster socket
are the `@openssh` connector's (reconciler.observe.transport), so pyinfra, `reconcile drift`
and this share one authenticated connection per box.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reconciler.apply.payload import BOX_PROGRAM, BadPayload, check
from reconciler.observe.transport import Target, python_command, ssh_argv
from reconciler.scrub import scrub_text

PROGRAM = BOX_PROGRAM

Event = dict[str, Any]
OnEvent = Callable[[Event], None]


@dataclass
class BoxCall:
    result: Event  # the program's last `result` event (ok, failed, snapshot, ...)
    events: list[Event] = field(default_factory=list)
    stderr: str = ""


def call_box(target: Target, payload: dict[str, Any], on_event: OnEvent | None = None) -> BoxCall:
    """Send `payload` to the box program and collect its events. A payload the box would refuse
    is refused here, before any connection: the box is never asked to start on a bad value."""
    try:
        check(payload)
    except BadPayload as exc:
        return BoxCall(result={"event": "result", "ok": False, "failed": f"refused: {exc}"})
    command = python_command(PROGRAM, "-")
    argv = ssh_argv(target, command, connect_timeout=10)
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(payload))
    proc.stdin.close()
    call = BoxCall(result={})
    for line in proc.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # not ours (a motd, a warning): never echoed, it could hold anything
        call.events.append(event)
        if event.get("event") == "result":
            call.result = event
        if on_event is not None:
            on_event(event)
    code = proc.wait()
    reader.join(timeout=5)
    call.stderr = "".join(errors)
    if not call.result:
        last = scrub_text((call.stderr.strip().splitlines() or [f"exit {code}"])[-1])
        reason = "unreachable" if code == 255 else "the box program ended without a result"
        call.result = {"event": "result", "ok": False, "failed": f"{reason}: {last}"}
    return call
