"""pyinfra's `run_local_process`, bounded: what the `@openssh` connector runs a box's command with.

pyinfra keeps every line a command writes, however many, and decodes them strictly: a box that
answers a fact with gigabytes is held in the controller's memory whole, and one byte that is
not UTF-8 ends the run in a traceback. The drift transport (transport.py) reads the same boxes
within OUTPUT_LIMIT_BYTES; this is that bound for pyinfra's commands, with pyinfra's own model
otherwise kept: the same CommandOutput of tagged lines, one gevent greenlet per pipe (pyinfra
runs its hosts as greenlets: a thread here would hold them up), its `timeout` (TimeoutError),
its `print_output`. Past the bound the command is killed and fails, saying so on stderr; stderr
is read to its end (ssh must never block on a full pipe) and only its last lines within its own
bound are kept (what a failure says is its last line).
"""

from __future__ import annotations

import contextlib
import heapq
import io
import itertools
from collections import deque
from typing import IO, Any

import gevent
from gevent.subprocess import DEVNULL, PIPE, Popen  # as pyinfra: pipes that yield to greenlets
from pyinfra.connectors.util import CommandOutput, OutputLine, write_stdin

from reconciler.observe.transport import OUTPUT_LIMIT_BYTES, STDERR_LIMIT_BYTES

TOO_MUCH = 125  # the exit status of a command refused for its output (not one ssh or sh uses)


def run_bounded(
    argv: list[str],
    stdin: Any = None,
    timeout: float | None = None,
    print_output: bool = False,
    print_prefix: str = "",
) -> tuple[int, CommandOutput]:
    """`argv` run (no shell), its output as pyinfra's CommandOutput, within the bounds."""
    data = _stdin_bytes(stdin) if stdin else None  # a bad `stdin` raises before anything runs
    process = Popen(argv, stdin=PIPE if data is not None else DEVNULL, stdout=PIPE, stderr=PIPE)
    assert process.stdout is not None and process.stderr is not None
    arrival = itertools.count()  # the two pipes' lines are put back in the order they came
    out = _Reader("stdout", OUTPUT_LIMIT_BYTES, arrival, print_output, print_prefix, process)
    err = _Reader("stderr", STDERR_LIMIT_BYTES, arrival, print_output, print_prefix, None)
    greenlets = [gevent.spawn(out.read, process.stdout), gevent.spawn(err.read, process.stderr)]
    if data is not None:
        # Written beside the readers and within the timeout: a command that writes a pipe full
        # before it reads its stdin would otherwise block the write, and this call, for ever.
        greenlets.append(gevent.spawn(_feed, data, process.stdin))
    done = gevent.wait(greenlets, timeout=timeout)
    if len(done) != len(greenlets):  # as pyinfra: a command past its timeout raises
        gevent.killall(greenlets)
        process.kill()
        process.wait()
        raise TimeoutError
    code = process.wait()
    kept = [line for _, line, _ in heapq.merge(out.kept, err.kept, key=lambda kept: kept[0])]
    if out.overflowed:
        said = f"more than {OUTPUT_LIMIT_BYTES} bytes of output: refused (the command was stopped)"
        kept.append(OutputLine("stderr", said))
        code = TOO_MUCH
    return code, CommandOutput(kept)


class _Gathered(io.BytesIO):
    def close(self) -> None:  # write_stdin closes what it wrote to: its bytes are still wanted
        pass


def _stdin_bytes(stdin: Any) -> bytes:
    """`stdin` as pyinfra's write_stdin sends it: lines, each newline-ended; bytes (the
    Collected fact's payload, transport.WithStdin) as they are."""
    if isinstance(stdin, bytes):
        return stdin
    gathered = _Gathered()
    write_stdin(stdin, gathered)
    return gathered.getvalue()


def _feed(data: bytes, pipe: IO[bytes]) -> None:
    try:
        pipe.write(data)
    except OSError:  # the command ended without reading it all: its status and stderr say why
        pass
    finally:
        with contextlib.suppress(OSError):
            pipe.close()


class _Reader:
    """One pipe read line by line into `lines`, at most `cap` bytes kept. With `kill`
    (stdout), the first `cap` bytes, and past them the process is killed (the answer is
    refused whole); without (stderr), read to its end and the last lines within `cap` kept."""

    def __init__(
        self,
        name: str,
        cap: int,
        arrival: itertools.count[int],
        print_output: bool,
        prefix: str,
        kill: Any,
    ) -> None:
        self.name, self.cap, self.arrival, self.kill = name, cap, arrival, kill
        self.print_output, self.prefix = print_output, prefix
        self.kept: deque[tuple[int, OutputLine, int]] = deque()  # (arrival, line, bytes)
        self.size = 0
        self.overflowed = False

    def read(self, pipe: IO[bytes]) -> None:
        if self.kill is None:
            self._keep_last(pipe)
            return
        while raw := pipe.readline(self.cap + 1 - self.size):
            self.size += len(raw)
            if self.size > self.cap:
                self.overflowed = True
                self.kill.kill()
                return
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.kept.append((next(self.arrival), OutputLine(self.name, line), len(raw)))
            if self.print_output:
                self._print(line)

    def _keep_last(self, pipe: IO[bytes]) -> None:
        """stderr: ssh's error and a failing command's exception come last, after whatever a
        login shell printed first; the earliest lines are dropped to stay within `cap`. What
        is printed is as before: the lines within the first `cap` bytes."""
        seen = 0
        while raw := pipe.readline(self.cap):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.kept.append((next(self.arrival), OutputLine(self.name, line), len(raw)))
            self.size += len(raw)
            while self.size > self.cap:
                self.size -= self.kept.popleft()[2]
            seen += len(raw)
            if self.print_output and seen <= self.cap:
                self._print(line)

    def _print(self, line: str) -> None:
        from pyinfra.api.output import echo, format_text

        from reconciler.report.values import clean

        shown = clean(line)  # the box's words: no control sequence reaches the terminal
        if self.name == "stderr":
            shown = format_text(shown, "red")
        echo(f"{self.prefix}{shown}", err=True)
