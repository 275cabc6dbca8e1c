"""A box's answer is read with a bound: a box that streams without end costs the controller at
most the answer limit, and the run goes on (reconciler/observe/transport.py `Running.finish`).

The "box" here is a local process behind the same pipes ssh would give: what is under test is
the controller's reading, not the network.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import Future

from reconciler.observe.document import FaultKind
from reconciler.observe.observe import gather
from reconciler.observe.transport import Running

ENDLESS = "import sys\nwhile True: sys.stdout.buffer.write(b'x' * 65536)"


def _box(program: str) -> Running:
    proc = subprocess.Popen(
        [sys.executable, "-c", program],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    return Running("thor", proc)


def test_an_endless_answer_stops_one_byte_past_the_limit_and_the_process_is_killed() -> None:
    handle = _box(ENDLESS)
    result = handle.finish(30.0, limit=1024 * 1024)
    assert result.truncated
    assert len(result.stdout) == 1024 * 1024 + 1
    assert handle.proc is not None and handle.proc.returncode is not None  # killed, not waited on


def test_an_endless_stderr_is_drained_without_blocking_or_keeping_it() -> None:
    handle = _box("import sys\nfor _ in range(64): sys.stderr.write('e' * 65536)\nprint('{}')")
    result = handle.finish(30.0)
    assert not result.truncated and result.error is None
    assert result.stdout.strip() == "{}" and len(result.stderr) <= 64 * 1024


def test_an_answer_that_is_not_utf8_reads_without_raising() -> None:
    result = _box('import sys; sys.stdout.buffer.write(b\'{"a": "\\xff"}\')').finish(30.0)
    assert result.error is None and "\udcff" in result.stdout


def test_an_endless_box_is_that_boxs_too_large_fault_and_the_run_goes_on() -> None:
    probes: Future[dict[str, dict[str, object]]] = Future()
    probes.set_result({})
    found = gather({"thor": _box(ENDLESS)}, probes, 60.0)
    failure = found["thor"].failure
    assert failure is not None and failure.kind is FaultKind.TOO_LARGE


def test_a_box_that_never_answers_times_out_as_before() -> None:
    result = _box("import time; time.sleep(30)").finish(0.5)
    assert result.error == "no answer within 0.5 s"
