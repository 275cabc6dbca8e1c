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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from reconciler.apply.payload import BOX_PROGRAM, BadPayload, check
from reconciler.observe.transport import Target, python_command, ssh_argv
from reconciler.scrub import scrub_text

PROGRAM = BOX_PROGRAM

Event = dict[str, Any]
OnEvent = Callable[[Event], None]

# What the controller holds of a box's answer. The box program's events are a few hundred
# bytes each (a `snapshots` listing a few KB), a wait event a second for at most a model's boot;
# a broken or hostile box can send anything, for as long as it likes.
MAX_LINE_CHARS = 1024 * 1024  # a longer line is skipped as it is read, never held
MAX_EVENTS = 100_000  # kept for the evidence and the summary; later ones are still read
MAX_STDERR_CHARS = 64 * 1024  # its end: the last line says why a program failed


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
        # A byte that is not UTF-8 (a login banner, a hostile box) is replaced, never raised:
        # such a line is not an event, and stderr is only ever shown scrubbed.
        encoding="utf-8",
        errors="replace",
        bufsize=1,
    )
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.append(_tail(proc.stderr)), daemon=True)  # type: ignore[arg-type]
    reader.start()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(payload))
    proc.stdin.close()
    call = BoxCall(result={})
    for line in _lines(proc.stdout):
        event = _event(line)
        if event is None:
            continue  # not ours (a motd, a warning): never echoed, it could hold anything
        if len(call.events) < MAX_EVENTS:
            call.events.append(event)
        if event.get("event") == "result":
            call.result = event
        if on_event is not None:
            try:
                on_event(event)
            except Exception:
                # Showing progress must never end the call: the box converges whatever the
                # terminal does, and its result must still be read (and rolled back on).
                on_event = None
    code = proc.wait()
    reader.join(timeout=5)
    call.stderr = "".join(errors)
    if not call.result:
        last = scrub_text((call.stderr.strip().splitlines() or [f"exit {code}"])[-1])
        reason = "unreachable" if code == 255 else "the box program ended without a result"
        call.result = {"event": "result", "ok": False, "failed": f"{reason}: {last}"}
    return call


def _lines(stream: IO[str]) -> Iterator[str]:
    """The stream's lines, each at most MAX_LINE_CHARS: a longer one is read past, not kept."""
    while line := stream.readline(MAX_LINE_CHARS + 1):
        if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
            while line and not line.endswith("\n"):
                line = stream.readline(MAX_LINE_CHARS + 1)
            continue
        yield line


def _event(line: str) -> Event | None:
    """One line as the box program's event (a JSON object), or None for anything else: text,
    another JSON value, or nesting past json's depth."""
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return event if isinstance(event, dict) else None


def _tail(stream: IO[str]) -> str:
    """All of the stream read, its last MAX_STDERR_CHARS kept."""
    kept = ""
    while chunk := stream.read(MAX_STDERR_CHARS):
        kept = (kept + chunk)[-MAX_STDERR_CHARS:]
    return kept
