"""What an operator sees while a box converges: steps as lines, health waits as a progress bar.

Events come from the box program (names and states only, never values). On a terminal a rich
progress bar tracks each wait against its timeout; elsewhere (CI, pyinfra's log) one line per
state change keeps the log short.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from reconciler.apply import answer
from reconciler.report.values import free_text


class Reporter:
    def __init__(self, box: str, stream: TextIO | None = None, bar: bool | None = None) -> None:
        self.box = box
        self.stream = stream or sys.stderr
        self.bar = self.stream.isatty() if bar is None else bar
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._last: dict[str, str] = {}

    def line(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(f"{self.box}: {text}", markup=False, highlight=False)
        else:
            self.stream.write(f"{self.box}: {text}\n")
            self.stream.flush()

    def on_event(self, raw: dict[str, Any]) -> None:
        """One event of the box program, read through its type (reconciler/apply/answer.py):
        an event that is not understood is not shown; free text is scrubbed and cleaned."""
        event = answer.event(raw)
        if isinstance(event, answer.Wait):
            self._wait(event)
        elif isinstance(event, answer.Healthy):
            self._done(event.service)
            self.line(f"{event.service} healthy after {event.elapsed:.0f}s")
        elif isinstance(event, answer.StepEvent):
            self._step(event)
        elif isinstance(event, answer.SnapshotTaken):
            self.line(f"snapshot {event.id}")
        elif isinstance(event, answer.Message):
            self.line(("FAILED: " if event.failed else "") + free_text(event.text))
        elif isinstance(event, answer.Memory):
            self.line(
                f"memory gate for {event.service}: {event.available_kib / 1048576:.1f} GiB "
                f"available, {event.need_kib / 1048576:.1f} GiB needed "
                f"(page cache dropped: {event.dropped or 'no'})"
            )

    def _step(self, event: answer.StepEvent) -> None:
        status, step, subject = event.status, event.step, event.subject
        if step == "write-env" and status == "done":
            keys = event.keys
            self.line(f"wrote .env: {', '.join(keys) if keys else 'no key differed'}")
        elif step == "restore-files" and status == "done":
            self.line(f"restored {', '.join(event.files) or 'nothing'}")
        elif step == "rollback":
            reason = f" ({free_text(event.reason)})" if event.reason else ""
            self.line(f"rollback to snapshot {subject}: {status}{reason}")
        elif status in ("start", "present", "failed"):
            self.line(f"{step} {subject}" + ("" if status == "start" else f": {status}"))

    def _wait(self, event: answer.Wait) -> None:
        service, state = event.service, event.state
        elapsed, timeout = event.elapsed, event.timeout
        if not self.bar:
            if self._last.get(service) != state:
                self._last[service] = state
                self.line(f"waiting for {service}: {state} ({elapsed:.0f}s of {timeout:.0f}s)")
            return
        if self._progress is None:
            self._progress = Progress(
                # markup=False: the service and its state are the box's words, shown as text
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                TextColumn("{task.fields[state]}", markup=False),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=True,
            )
            self._progress.start()
        if service not in self._tasks:
            self._tasks[service] = self._progress.add_task(
                f"{self.box}: {service}", total=timeout, state=state
            )
        self._progress.update(self._tasks[service], completed=elapsed, state=state)

    def _done(self, service: str) -> None:
        if self._progress is not None and service in self._tasks:
            self._progress.remove_task(self._tasks.pop(service))
            if not self._tasks:
                self._progress.stop()
                self._progress = None

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
