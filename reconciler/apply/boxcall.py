"""Run the box-side converge program over the fleet's OpenSSH transport, streaming its events.

The payload goes on stdin (secrets included, when a controller_env secret is needed), so it
never appears in a process list on either side. The ssh options, key and ControlMaster socket
are the `@openssh` connector's (reconciler.observe.transport), so pyinfra, `reconcile drift`
and this share one authenticated connection per box.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from reconciler.apply.answer import taken_snapshot
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
# All kept events together: lines of up to MAX_LINE_CHARS times MAX_EVENTS would be ~100 GB.
# Past this, events are still read (shown, and a result still ends the call) but only counted.
MAX_KEPT_CHARS = 4 * 1024 * 1024
MAX_STDERR_CHARS = 64 * 1024  # its end: the last line says why a program failed

# The box program's own ceiling per command (reconciler/apply/remote/converge.py). A call's
# deadline is their sum over everything its payload can make the box do, so the controller
# never ends a call the box would still finish by its own limits; only a box that keeps going
# past them (a broken or hostile one streaming `wait` for ever) meets it.
BASE_S = 300  # connect, lock, checks, snapshot, listing; and the margin
PULL_S = 60 + 3600  # `docker image inspect`, then `docker pull`
RECREATE_S = 300 + 60 + 600  # `docker stop`, a page-cache drop, `compose up` (+ health wait)
UNDO_S = 300 + RECREATE_S  # a rollback's `compose rm` of a created service, then its recreate


# ssh's own errors before a session runs a command (connect, DNS, host key, key exchange,
# authentication, its configuration): the remote program cannot have been started. Anything
# else ssh says (a connection closed, reset or timed out mid-session) may come after it was.
CONNECT_FAILED = re.compile(
    r"ssh: connect\b|ssh: Could not resolve hostname|Permission denied \(|"
    r"Host key verification failed|kex_exchange_identification:|ssh_exchange_identification:|"
    r"Connection timed out during banner exchange|Unable to negotiate with|"
    r"Bad owner or permissions on|^Connection closed by \S+ port \d+$|"
    r"^Connection (?:closed|reset) by (?:authenticating|invalid) user"
)


@dataclass
class BoxCall:
    result: Event  # the program's last `result` event (ok, failed, snapshot, ...)
    events: list[Event] = field(default_factory=list)
    stderr: str = ""
    answered: bool = True  # False: no result came (connection lost, program died, deadline)
    timed_out: bool = False  # the deadline passed and ssh was killed
    snapshot: str | None = None  # the id a `snapshot` event announced (answer.taken_snapshot)
    heard: int = 0  # events read, kept or not
    dropped: int = 0  # events read but not kept (MAX_EVENTS, MAX_KEPT_CHARS)
    delivered: bool = False  # the whole payload was handed to ssh (written, stdin closed)
    output: bool = False  # ssh wrote anything at all on stdout, an event or not
    code: int | None = None  # ssh's exit status

    @property
    def may_have_run(self) -> bool:
        """No result came, and the box program may have run all the same: its state is
        unknown (STATE UNKNOWN), never "unreachable, nothing changed".

        The rule: a payload handed to ssh may have reached the box, and its program changes
        the box before its first event can reach us (and, before it checked its output at
        the lock, went on without one); so once the payload was delivered, only a proof that
        the program never ran makes the call a plain failure:
        - the payload was not all delivered: ssh was gone before it took it; a program that
          started read a cut JSON text, which never parses, and refuses before the lock;
        - ssh exited 255 (its own failure) with no output at all, its last words one of the
          errors ssh gives while connecting or authenticating, before any command runs
          (CONNECT_FAILED): "Connection to HOST closed by remote host", a reset or a broken
          pipe come after the session started, and are not proof.
        Anything the box said (an event), or a deadline passed, is never such a proof."""
        if self.answered:
            return False
        if self.heard or self.timed_out or self.snapshot is not None:
            return True
        return self.delivered and not self.connect_failed

    @property
    def connect_failed(self) -> bool:
        last = (self.stderr.strip().splitlines() or [""])[-1]
        return self.code == 255 and not self.output and bool(CONNECT_FAILED.search(last))


def deadline_s(payload: Mapping[str, Any]) -> int:
    """How long a call with `payload` may take, from the box program's own limits.

    A converge may recreate every service (compose's config hash adds any the new files
    change, not only the plan's), pull each one's image and the planned ones, check the
    gateway, and then roll all of it back, each recreate waiting its lane's boot timeout."""
    waits = [_seconds(lane.get("timeout_s")) for lane in payload.get("lane_specs") or []]
    gateway = _seconds((payload.get("gateway") or {}).get("timeout_s"))
    waits.append(gateway)
    action = payload.get("action")
    if action == "rollback":
        return BASE_S + sum(UNDO_S + w for w in waits)
    if action != "converge":
        return BASE_S
    pulls = len(payload.get("pulls") or []) + len(waits)
    forward = pulls * PULL_S + sum(RECREATE_S + w for w in waits) + gateway
    return BASE_S + forward + sum(UNDO_S + w for w in waits)


def _seconds(value: Any) -> int:
    # check() refused anything but whole seconds before this is read
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def call_box(target: Target, payload: dict[str, Any], on_event: OnEvent | None = None) -> BoxCall:
    """Send `payload` to the box program and collect its events. A payload the box would refuse
    is refused here, before any connection: the box is never asked to start on a bad value.
    Past `deadline_s(payload)` ssh is killed and the call ends without a result."""
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
    call = BoxCall(result={})
    limit = deadline_s(payload)
    timer = threading.Timer(limit, _expire, (proc, call))
    timer.daemon = True
    timer.start()
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.append(_tail(proc.stderr)), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        call.delivered = _send(proc, payload)
        _read(proc, call, on_event)
        code = proc.wait()
    finally:
        timer.cancel()
    reader.join(timeout=5)
    call.stderr = "".join(errors)
    call.code = code
    if not call.result:
        call.answered = False
        call.result = {"event": "result", "ok": False, "failed": _unanswered(call, code, limit)}
    return call


def _send(proc: subprocess.Popen[str], payload: dict[str, Any]) -> bool:
    """The payload to ssh's stdin; False when ssh did not take all of it (see may_have_run)."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(payload))
        proc.stdin.close()
    except OSError:
        return False  # ssh is gone already (killed, or never connected): its exit says why
    return True


def _read(proc: subprocess.Popen[str], call: BoxCall, on_event: OnEvent | None) -> None:
    assert proc.stdout is not None
    kept_chars = 0
    for line in _lines(proc.stdout):
        call.output = True
        event = _event(line)
        if event is None:
            continue  # not ours (a motd, a warning): never echoed, it could hold anything
        call.heard += 1
        if len(call.events) < MAX_EVENTS and kept_chars + len(line) <= MAX_KEPT_CHARS:
            call.events.append(event)
            kept_chars += len(line)
        else:
            call.dropped += 1
        if event.get("event") == "result":
            call.result = event
        elif call.snapshot is None:
            call.snapshot = taken_snapshot(event)
        if on_event is not None:
            try:
                on_event(event)
            except Exception:
                # Showing progress must never end the call: the box converges whatever the
                # terminal does, and its result must still be read (and rolled back on).
                on_event = None


def _expire(proc: subprocess.Popen[str], call: BoxCall) -> None:
    call.timed_out = True
    with contextlib.suppress(OSError):  # it may have ended just now
        proc.kill()  # ssh only: the box program outlives it (it ignores SIGHUP), see engine


def _unanswered(call: BoxCall, code: int, limit: int) -> str:
    if call.timed_out:
        return f"no result within {limit}s (the deadline from the plan's timeouts): ssh was ended"
    last = scrub_text((call.stderr.strip().splitlines() or [f"exit {code}"])[-1])
    # ssh's own failure (255) reads "unreachable" whether or not the program ran: whether the
    # state is unknown is may_have_run's to say (engine: STATE UNKNOWN), not this text's.
    reason = "unreachable" if code == 255 else "the box program ended without a result"
    return f"{reason}: {last}"


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
