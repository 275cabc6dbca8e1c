"""Ctrl-C (or a failure) while the collectors are being started: the boxes already started
are stopped, since no caller ever receives their handles, and the interrupt goes on."""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.observe import collectors, early
from reconciler.observe.transport import Running, Target

BOXES = ("thor", "spark", "orin")


class _Started(Running):
    def __init__(self, box: str, stopped: list[str]) -> None:
        super().__init__(box, None)
        self._stopped = stopped

    def cancel(self) -> None:
        self._stopped.append(self.box)


def _spawning(stopped: list[str], interrupt_at: str) -> Any:
    def spawn(target: Target, _command: str, _stdin: bytes | None = None) -> Running:
        if target.box == interrupt_at:
            raise KeyboardInterrupt
        return _Started(target.box, stopped)

    return spawn


def _targets() -> dict[str, Target]:
    return {
        box: Target(box, f"10.77.0.{11 + i}", f"fl-{box}", 22, None, None)
        for i, box in enumerate(BOXES)
    }


@pytest.mark.parametrize(
    ("max_parallel", "interrupt_at", "started"),
    [
        (3, "orin", ["thor", "spark"]),  # every box at once: the third start interrupted
        (2, "spark", ["thor"]),  # two at once, orin in line: the second start interrupted
    ],
    ids=["all at once", "in line"],
)
def test_the_boxes_started_before_an_interrupt_are_stopped(
    monkeypatch: pytest.MonkeyPatch, max_parallel: int, interrupt_at: str, started: list[str]
) -> None:
    stopped: list[str] = []
    monkeypatch.setattr(collectors, "spawn", _spawning(stopped, interrupt_at))
    monkeypatch.setattr(collectors, "controller_values", lambda *_a: {})
    monkeypatch.setattr(collectors, "collector_stdin", lambda *_a: b"{}")
    payloads: dict[str, dict[str, Any]] = {box: {} for box in BOXES}
    with pytest.raises(KeyboardInterrupt):
        collectors.start_collectors(_targets(), payloads, {}, max_parallel=max_parallel)
    assert stopped == started


def test_an_interrupt_while_the_probes_start_stops_the_boxes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stopped: list[str] = []
    started = {box: _Started(box, stopped) for box in BOXES}
    monkeypatch.setattr(early, "start_collectors", lambda *_a: started)

    def interrupted(*_a: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(early, "ProbeRun", interrupted)
    inputs: Any = type("Inputs", (), {"targets": _targets(), "bases": dict.fromkeys(BOXES, "")})()
    inputs.payload = lambda box, key: {}
    with pytest.raises(KeyboardInterrupt):
        early.launch(inputs, list(BOXES), "k" * 32, timeout=1.0)
    assert sorted(stopped) == sorted(BOXES)
