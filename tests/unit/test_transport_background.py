"""transport.Background: a function in a daemon thread whose result or exception a caller
collects later, as the probes and the new-connection check are (Future's contract for them)."""

from __future__ import annotations

import threading

import pytest

from reconciler.observe.transport import Background
from tests.unit.conftest import fresh_python


def test_the_value_comes_back() -> None:
    assert Background(lambda a, b: a + b, 2, 3).result(5) == 5


def test_the_exception_comes_back_as_raised() -> None:
    def fails() -> None:
        raise LookupError("no such gateway")

    with pytest.raises(LookupError, match="no such gateway"):
        Background(fails).result(5)


def test_a_result_not_ready_in_time_is_a_timeout_and_still_arrives_later() -> None:
    release = threading.Event()
    running = Background(lambda: release.wait(5) and "done")
    with pytest.raises(TimeoutError):
        running.result(0.05)
    release.set()
    assert running.result(5) == "done"


def test_starting_the_boxes_work_imports_no_pool_or_logging() -> None:
    """What drift's early start imports before the collectors are spawned (early.py, and
    the probes it starts) leaves concurrent.futures and logging for later."""
    code = (
        "import sys\n"
        "import reconciler.observe.early, reconciler.observe.collectors\n"
        "import reconciler.observe.probes, reconciler.observe.transport\n"
        "print(sorted(m for m in ('concurrent.futures', 'logging') if m in sys.modules))\n"
    )
    assert fresh_python(code).strip() == "[]"
