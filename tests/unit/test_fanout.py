"""The observation fan-out (reconciler/observe/fanout.py): at most N boxes in flight, a box in
line starts when an earlier one is read, a box that hangs costs its own timeout and nothing
more, and the progress line appears on a terminal only.

The "boxes" are local processes behind the same pipes ssh gives (`Running`, as
test_transport_bounded.py): what is under test is the controller's scheduling and reading.
"""

from __future__ import annotations

import io
import resource
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

import pytest

from reconciler.observe import fanout
from reconciler.observe.document import FaultKind
from reconciler.observe.observe import _finish_each, gather
from reconciler.observe.probes import NOT_MADE, PATHS
from reconciler.observe.transport import Running

ANSWER = '{"collector": 0}'  # valid JSON; the document parser refuses it as a fault, fine here


class Box:
    """A box that answers after `delay` seconds; counts how many boxes run at once."""

    lock = threading.Lock()

    def __init__(self, name: str, delay: float, live: list[int], peak: list[int]) -> None:
        self.name, self.delay, self.live, self.peak = name, delay, live, peak

    def start(self) -> Running:
        with self.lock:
            self.live[0] += 1
            self.peak[0] = max(self.peak[0], self.live[0])
        program = f"import time; time.sleep({self.delay}); print({ANSWER!r})"
        proc = subprocess.Popen(
            [sys.executable, "-S", "-c", program],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        return _Counted(self.name, proc, self)


class _Counted(Running):
    def __init__(self, box: str, proc: subprocess.Popen[bytes], owner: Box) -> None:
        super().__init__(box, proc)
        self.owner = owner

    def finish(self, timeout: float, limit: int = 8 * 1024 * 1024):  # type: ignore[no-untyped-def]
        try:
            return super().finish(timeout, limit)
        finally:
            with Box.lock:
                self.owner.live[0] -= 1


def _fleet(delays: dict[str, float], size: int) -> tuple[dict[str, Running], list[int]]:
    live, peak = [0], [0]
    slots = fanout.Slots(size)
    handles: dict[str, Running] = {}
    for name, delay in delays.items():
        queued = fanout.Queued(name, Box(name, delay, live, peak).start, slots)
        handles[name] = queued
        slots.take(queued)
    return handles, peak


def _no_probes() -> Future[dict[str, dict[str, object]]]:
    done: Future[dict[str, dict[str, object]]] = Future()
    done.set_result({})
    return done


def test_never_more_boxes_in_flight_than_the_limit_and_every_box_is_read() -> None:
    handles, peak = _fleet({f"b{i}": 0.2 for i in range(10)}, size=3)
    counts: list[int] = []
    answers = _finish_each(handles, 30.0, counts.append)
    assert peak[0] == 3
    assert list(answers) == [f"b{i}" for i in range(10)]  # the boxes' own order
    assert counts == list(range(1, 11))  # one more box through each time
    assert all(raw is None or isinstance(raw, dict) for raw, _ in answers.values())


def test_a_hanging_box_costs_its_own_timeout_and_holds_only_its_own_slot() -> None:
    # b0 hangs; with 2 slots the nine others go through the one slot left: 9 x 0.2 s.
    delays = {"b0": 60.0, **{f"b{i}": 0.2 for i in range(1, 10)}}
    handles, peak = _fleet(delays, size=2)
    finished: dict[str, float] = {}
    started = time.monotonic()

    def note(_: int) -> None:
        finished[str(len(finished))] = time.monotonic() - started

    answers = _finish_each(handles, 3.0, note)
    took = time.monotonic() - started
    assert peak[0] == 2
    fault = answers["b0"][1]
    assert getattr(fault, "kind", None) is FaultKind.UNREACHABLE and "3 s" in str(fault)
    # Every other box was read before the hanging one gave up, and the run took its timeout,
    # not its timeout plus the others' time.
    assert sorted(finished.values())[8] < 3.0
    assert 3.0 <= took < 4.5


def test_a_box_waiting_in_line_counts_its_timeout_from_its_own_start() -> None:
    # One slot: b1 waits 1 s for b0, then answers in 0.3 s; a 1.0 s timeout counted from the
    # line's start would have failed it.
    handles, _ = _fleet({"b0": 1.0, "b1": 0.3}, size=1)
    answers = _finish_each(handles, 1.5, lambda n: None)
    assert all(not str(doc).startswith("no answer") for _, doc in answers.values())


def test_cancelling_a_box_still_in_line_never_starts_it() -> None:
    live, peak = [0], [0]
    slots = fanout.Slots(1)
    first = fanout.Queued("b0", Box("b0", 0.2, live, peak).start, slots)
    second = fanout.Queued("b1", Box("b1", 0.2, live, peak).start, slots)
    slots.take(first)
    slots.take(second)
    second.cancel()
    assert first.finish(10.0).error is None
    result = second.finish(10.0)  # returns at once: its turn will never come
    assert result.error is not None and "cancelled" in result.error
    assert peak[0] == 1 and second.proc is None


def test_gather_reads_queued_boxes_like_running_ones() -> None:
    handles, _ = _fleet({"thor": 0.1, "spark": 0.1, "orin": 0.1}, size=1)
    found = gather(handles, _no_probes(), 30.0)
    assert list(found) == ["thor", "spark", "orin"]
    assert all(obs.failure is not None for obs in found.values())  # '{"collector": 0}' is refused
    assert all(obs.failure.kind is not FaultKind.UNREACHABLE for obs in found.values())  # type: ignore[union-attr]


def test_gather_says_each_boxs_probes_were_not_made_when_the_probes_fail_whole() -> None:
    # The probes' run raising (a bug, a limit) used to leave every box with no probes at all:
    # its gateway read as never probed, and nothing said why.
    handles, _ = _fleet({"thor": 0.05, "spark": 0.05}, size=2)
    failed: Future[dict[str, dict[str, object]]] = Future()
    failed.set_exception(RuntimeError("a secret-looking text hf_abcdef"))
    found = gather(handles, failed, 30.0)
    for obs in found.values():
        assert set(obs.controller) == {probe for probe, _ in PATHS}
        for probe in obs.controller.values():
            assert probe["status"] is None
            assert probe["error"].startswith(NOT_MADE)
            assert "RuntimeError" in probe["error"] and "hf_" not in probe["error"]


# -- the limit -------------------------------------------------------------------------------------
def test_the_default_limit_is_per_core_within_the_open_file_limit() -> None:
    assert fanout.default_limit(cpus=2, open_files=20000) == 64
    assert fanout.default_limit(cpus=16, open_files=1024) == (1024 - 64) // 8
    assert fanout.default_limit(cpus=1, open_files=64) == fanout.MIN_LIMIT


def _limit_under(soft: int, hard: int, asked: str) -> tuple[int, int, str]:
    """fanout.limit() for --max-parallel `asked`, in a process whose open files are (soft,
    hard): the limit used, the soft limit after, what was said on stderr."""
    script = (
        "import resource; from reconciler.observe import fanout\n"
        f"fanout.configure(max_parallel={asked})\n"
        "print(fanout.limit(), fanout.limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
    )
    first, second, after = map(int, ran.stdout.split())
    assert first == second
    return first, after, ran.stderr


def test_an_asked_limit_raises_the_soft_open_file_limit_as_far_as_its_boxes_need() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2000:
        pytest.fail(f"this test needs a hard open-file limit of 2,000 or more, not {hard}")
    used, soft, said = _limit_under(128, hard, "200")
    assert used == 200 and soft == fanout.FDS_RESERVED + 200 * fanout.FDS_PER_BOX
    assert said == ""
    used, soft, said = _limit_under(4096, hard, "200")  # enough already: left alone
    assert (used, soft, said) == (200, 4096, "")


def test_an_asked_limit_past_the_hard_open_file_limit_is_lowered_and_said_once() -> None:
    # Before, the boxes past what fitted each failed with EMFILE, as if the box had.
    used, soft, said = _limit_under(128, 128, "40")
    assert used == (128 - fanout.FDS_RESERVED) // fanout.FDS_PER_BOX == 8 and soft == 128
    assert said.count("observing at most 8 boxes at once, not 40") == 1, said


def test_the_limit_and_timeout_come_from_the_command_line_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fanout, "_configured", {})
    monkeypatch.setenv(fanout.LIMIT_ENV, "7")
    monkeypatch.setenv(fanout.TIMEOUT_ENV, "2.5")
    assert (fanout.limit(), fanout.box_timeout()) == (7, 2.5)
    fanout.configure(max_parallel=3, timeout=9.0)
    assert (fanout.limit(), fanout.box_timeout()) == (3, 9.0)
    fanout.configure()  # the next command without options: the environment's again
    assert (fanout.limit(), fanout.box_timeout()) == (7, 2.5)
    monkeypatch.delenv(fanout.LIMIT_ENV)
    monkeypatch.delenv(fanout.TIMEOUT_ENV)
    monkeypatch.setattr(fanout, "_configured", {})
    assert fanout.box_timeout() == fanout.DEFAULT_TIMEOUT_S


@pytest.mark.parametrize("text", ["0", "-3", "1.5", "many", ""])
def test_a_limit_that_is_not_a_positive_whole_number_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        fanout.parse_limit(text)


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "1e9", "soon"])
def test_a_timeout_out_of_range_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        fanout.parse_timeout(text)


def test_the_command_line_refuses_a_bad_limit_with_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from reconciler.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["drift", "--max-parallel", "0"])
    assert exit_.value.code == 1  # bad input; 2 would read as drift
    assert "at least one box at a time" in capsys.readouterr().err
    args = build_parser().parse_args(["drift", "--max-parallel", "5", "--timeout", "12"])
    assert (args.max_parallel, args.timeout) == (5, 12.0)


# -- the progress line -----------------------------------------------------------------------------
class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_drawn_in_place_on_a_terminal_and_erased_at_the_end() -> None:
    out = Terminal()
    progress = fanout.Progress(50, out)
    progress.update(31)
    progress.update(50)
    progress.close()
    text = out.getvalue()
    assert "\r31/50 boxes observed\x1b[K" in text and "\r50/50 boxes observed" in text
    assert text.endswith("\r\x1b[K") and "\n" not in text


def test_progress_writes_nothing_when_not_a_terminal() -> None:
    out = io.StringIO()  # a pipe, a file, a report: never a progress line
    progress = fanout.Progress(50, out)
    progress.update(31)
    progress.close()
    assert out.getvalue() == ""


def test_progress_draws_every_count_so_the_last_but_one_is_never_stale() -> None:
    out = Terminal()
    progress = fanout.Progress(1000, out)
    for done in range(1, 1001):
        progress.update(done)
    assert out.getvalue().count("boxes observed") == 1000
    assert "\r999/1000 boxes observed" in out.getvalue()
