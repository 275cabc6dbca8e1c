"""The live fan-out on the 50-box scale lab (lab/scale.py): drift over every box, the
concurrency limit, and a box that hangs costing its own timeout and nothing more.

Not in the default run (about a minute and a half on 2 cores):
    flock /tmp/fleet-labtests.lock .venv/bin/pytest -m scale tests/lab/test_scale_live.py -q
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import scale
from reconciler.observe.transport import control_dir

pytestmark = [pytest.mark.lab, pytest.mark.scale]

REPO = Path(__file__).resolve().parents[2]
COUNT = 50
HANGING = "orin-7"


@pytest.fixture(scope="module")
def scale_lab(lab: dict[str, Any]) -> Iterator[list[str]]:
    """The 50 boxes, brought up if they are not (and then taken down again at the end)."""
    was_up = len(scale.made()) == COUNT and scale.ready(scale.status())
    if not was_up:
        scale.up(COUNT)
    try:
        yield [b.name for b in scale.made()]
    finally:
        if not was_up:
            scale.down()


def reconcile(*args: str, stderr: int | None = None) -> subprocess.Popen[bytes]:
    inventory = str(scale.INVENTORY.relative_to(REPO))
    return subprocess.Popen(
        [sys.executable, "-m", "reconciler", "--root", str(REPO), "-i", inventory, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if stderr is None else stderr,
        env={**os.environ, "FLEET_MAX_PARALLEL": "", "FLEET_BOX_TIMEOUT": ""},
    )


def report_of(proc: subprocess.Popen[bytes], timeout: float = 240) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode in (1, 2), proc.returncode  # drift, and the stopped gateways' errors
    data: dict[str, Any] = json.loads(out)
    return data


def close_masters() -> None:
    """Every box answers over a new connection (and a hanging box's sshd is really asked)."""
    sockets = control_dir()
    for socket in sockets.iterdir() if sockets else []:
        subprocess.run(
            ["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "x"],
            capture_output=True,
            check=False,
        )


def test_drift_observes_all_50_boxes_and_reports_each_one_s_lanes(scale_lab: list[str]) -> None:
    close_masters()
    report = report_of(reconcile("drift", "--format", "json", "--no-history"))
    boxes = {b["box"]: b for b in report["boxes"]}
    assert sorted(boxes) == sorted(scale_lab) and len(boxes) == COUNT
    assert {b["observation"] for b in boxes.values()} == {"full"}
    # The containers are created, not started: every box reports its own lanes' state.
    for name, box in boxes.items():
        states = [d for d in box["drifts"] if d["kind"] == "state"]
        assert len(states) >= 5, name


def _children_named(pid: int, name: str) -> int:
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        if comm == name and int(rest.split()[1]) == pid:
            count += 1
    return count


def test_the_concurrency_limit_holds_over_50_boxes(scale_lab: list[str]) -> None:
    close_masters()
    proc = reconcile("drift", "--format", "json", "--no-history", "--max-parallel", "7")
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:  # the ssh clients the run has in flight, every 10 ms
        while not stop.is_set():
            seen.append(_children_named(proc.pid, "ssh"))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        report = report_of(proc)
    finally:
        stop.set()
        watcher.join()
    assert {b["observation"] for b in report["boxes"]} == {"full"}
    assert len(report["boxes"]) == COUNT
    assert max(seen) <= 7  # never more than the limit at once...
    assert max(seen) >= 5  # ...and the limit was used, not one box at a time


@pytest.fixture
def hanging(scale_lab: list[str]) -> Iterator[str]:
    close_masters()
    scale.set_hanging(HANGING, True)
    try:
        yield HANGING
    finally:
        close_masters()
        scale.set_hanging(HANGING, False)


def test_a_hanging_box_costs_its_own_timeout_and_the_others_are_done_before(
    hanging: str, scale_lab: list[str]
) -> None:
    others = [b for b in scale_lab if b != hanging][:11]
    boxes = [*others, hanging]
    timeout = 12.0
    # The others' ssh masters up first (as in a repeated run), so that they finish well
    # within the hanging box's timeout on this loaded machine.
    report_of(reconcile("drift", *others, "--format", "json", "--no-history"))
    # stderr on a terminal: the progress line is drawn there, and says when each box is done.
    leader, follower = pty.openpty()
    started = time.monotonic()
    proc = reconcile(
        "drift", *boxes, "--format", "json", "--no-history", "--timeout", f"{timeout:g}",
        stderr=follower,
    )  # fmt: skip
    os.close(follower)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed with the process
                return
            if not chunk:
                return
            buffer += chunk
            while b"\x1b[K" in buffer:  # each drawing of the line ends with "erase the rest"
                part, buffer = buffer.split(b"\x1b[K", 1)
                lines.append((time.monotonic() - started, part.decode(errors="replace")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=120)
    took = time.monotonic() - started
    reader.join(5)
    os.close(leader)

    assert b"boxes observed" not in out  # the progress line never reaches the report
    report = json.loads(out)
    by_box = {b["box"]: b for b in report["boxes"]}
    assert {by_box[b]["observation"] for b in others} == {"full"}
    assert by_box[hanging]["observation"] != "full"
    assert f"no answer within {timeout:g} s" in json.dumps(by_box[hanging])
    # Costs its own timeout, and nothing more: the run ends soon after it.
    assert timeout <= took < timeout + 8
    shown = {text.strip(): at for at, text in lines}
    total = len(boxes)
    assert f"{total - 1}/{total} boxes observed" in shown
    # Every other box was done (and counted) well before the hanging box's timeout.
    assert shown[f"{total - 1}/{total} boxes observed"] < timeout - 2
