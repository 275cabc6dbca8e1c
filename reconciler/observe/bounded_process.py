"""pyinfra's `run_local_process`, bounded: what the `@openssh` connector runs a box's command with.

pyinfra keeps every line a command writes, however many, and decodes them strictly: a box that
answers a fact with gigabytes is held in the controller's memory whole, and one byte that is
not UTF-8 ends the run in a traceback. The drift transport (transport.py) reads the same boxes
within OUTPUT_LIMIT_BYTES; this is that bound for pyinfra's commands, with pyinfra's own model
otherwise kept: the same CommandOutput of tagged lines, one gevent greenlet per pipe (pyinfra
runs its hosts as greenlets: a thread here would hold them up), its `timeout` (TimeoutError),
its `print_output`. Past the bound the command is killed and fails, saying so on stderr; stderr
past its own bound is read on and dropped (ssh must never block on a full pipe).
"""

from __future__ import annotations

from queue import Queue
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
    process = Popen(argv, stdin=PIPE if stdin else DEVNULL, stdout=PIPE, stderr=PIPE)
    assert process.stdout is not None and process.stderr is not None
    if stdin:
        write_stdin(stdin, process.stdin)  # pyinfra's: lines, newline-ended, then closed
    lines: Queue[OutputLine] = Queue()
    out = _Reader("stdout", OUTPUT_LIMIT_BYTES, lines, print_output, print_prefix, process)
    err = _Reader("stderr", STDERR_LIMIT_BYTES, lines, print_output, print_prefix, None)
    readers = [gevent.spawn(out.read, process.stdout), gevent.spawn(err.read, process.stderr)]
    done = gevent.wait(readers, timeout=timeout)
    if len(done) != len(readers):  # as pyinfra: a command past its timeout raises
        gevent.killall(readers)
        process.kill()
        process.wait()
        raise TimeoutError
    code = process.wait()
    if out.overflowed:
        said = f"more than {OUTPUT_LIMIT_BYTES} bytes of output: refused (the command was stopped)"
        lines.put(OutputLine("stderr", said))
        code = TOO_MUCH
    return code, CommandOutput(list(lines.queue))


class _Reader:
    """One pipe read line by line into `lines`, at most `cap` bytes kept. Past the cap,
    `kill` (stdout: the answer is refused whole) or drain the rest unkept (stderr)."""

    def __init__(
        self,
        name: str,
        cap: int,
        lines: Queue[OutputLine],
        print_output: bool,
        prefix: str,
        kill: Any,
    ) -> None:
        self.name, self.cap, self.lines, self.kill = name, cap, lines, kill
        self.print_output, self.prefix = print_output, prefix
        self.size = 0
        self.overflowed = False

    def read(self, pipe: IO[bytes]) -> None:
        while raw := pipe.readline(self.cap + 1 - self.size if not self.overflowed else 65536):
            if self.overflowed:
                continue  # stderr past its cap: read on, never kept
            self.size += len(raw)
            if self.size > self.cap:
                self.overflowed = True
                if self.kill is not None:
                    self.kill.kill()
                    return
                continue
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.put(OutputLine(self.name, line))
            if self.print_output:
                self._print(line)

    def _print(self, line: str) -> None:
        from pyinfra.api.output import echo, format_text

        from reconciler.report.values import clean

        shown = clean(line)  # the box's words: no control sequence reaches the terminal
        if self.name == "stderr":
            shown = format_text(shown, "red")
        echo(f"{self.prefix}{shown}", err=True)
