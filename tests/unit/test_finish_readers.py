"""Reading a fleet's answers takes a reader thread per box in flight, not per box of the fleet
(observe._finish_each): 1,000 boxes made ~1,000 threads, past a container's pids limit."""

from __future__ import annotations

import threading
import time
from typing import ClassVar

from reconciler.observe import fanout
from reconciler.observe.observe import _finish_each
from reconciler.observe.transport import RemoteResult, Running


class _Box(Running):
    """A box that answers after a moment, noting how many threads ran while it worked and how
    many boxes were being read at once."""

    seen: ClassVar[list[int]] = []
    lock = threading.Lock()
    reading = peak = 0
    together: threading.Barrier | None = None  # every box waits for all the others to be read

    def __init__(self, box: str, stdout: str = "not json") -> None:
        super().__init__(box, None)
        self.stdout = stdout

    def finish(self, timeout: float, limit: int = 0) -> RemoteResult:
        cls = type(self)
        with cls.lock:
            cls.reading += 1
            cls.peak = max(cls.peak, cls.reading)
            cls.seen.append(threading.active_count())
        if cls.together is not None:
            cls.together.wait()  # broken (an error: that box's fault) unless all are read at once
        time.sleep(0.02)
        with cls.lock:
            cls.reading -= 1
        return RemoteResult(self.box, 0, self.stdout, "", None)

    def cancel(self) -> None:
        pass


def _line(boxes: list[str], size: int) -> dict[str, Running]:
    slots = fanout.Slots(size)
    handles: dict[str, Running] = {}
    for box in boxes:  # as collectors.start_collectors does
        queued = fanout.Queued(box, lambda box=box: _Box(box), slots)
        handles[box] = queued
        slots.take(queued)
    return handles


def test_a_fleet_past_the_limit_is_read_by_as_many_threads_as_boxes_in_flight() -> None:
    _Box.seen.clear()
    boxes = [f"b{i}" for i in range(40)]
    before = threading.active_count()
    counted: list[int] = []
    answers = _finish_each(_line(boxes, 4), 10.0, counted.append)
    assert list(answers) == boxes  # every box, in its own order
    assert counted == list(range(1, 41))
    assert all(doc is not None for _, doc in answers.values())
    assert len(_Box.seen) == 40
    assert max(_Box.seen) <= before + 4  # the readers; before: a thread for each of the 40


def test_every_box_at_once_is_read_by_a_thread_each() -> None:
    _Box.seen.clear()
    _Box.together = threading.Barrier(6, timeout=10)
    boxes = {f"b{i}": _Box(f"b{i}") for i in range(6)}
    before = threading.active_count()
    try:
        answers = _finish_each(dict(boxes), 10.0)
    finally:
        _Box.together = None
    assert list(answers) == list(boxes)
    assert not any("reading the answer failed" in str(doc) for _, doc in answers.values())
    assert max(_Box.seen) <= before + 6
