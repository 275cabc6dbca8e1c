"""`reconcile diff` and a gateway-probe fault of one side only (the history review's fourth
finding): thor's loopback probe of `/v1/models` failed in both runs while the controller's own
probe saw the gateway start answering without a key. The report, the metrics and the HTML
carried `auth ... (controller)`; the diff hid it with every gateway entry, as if the
controller's probe had failed too. An auth entry names the probe that saw it: a fault of the
other probe leaves it compared, and the reason says so.

Recorded replays of the captured lab data (examples/lab-incidents), edited as plain JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.history.parts import CONTROLLER, LOOPBACK, probe_of, probe_sides
from tests.unit.history_helpers import reconcile
from tests.unit.test_review4_history import diff_lines, replay, snapshot_of

CONTROLLER_ENTRY = "thor auth gateway GET /v1/models without key (controller)"
LOOPBACK_ENTRY = "thor auth gateway GET /v1/models without key (loopback)"
FAILED = {"status": None, "error": "no answer within 5 s"}


def noauth(loopback: Any, controller: Any) -> Any:
    """An edit: thor's `/v1/models` without a key as its own probe (loopback) and the
    controller's saw it: a status, or FAILED."""

    def reading(value: Any) -> dict[str, Any]:
        return dict(value) if isinstance(value, dict) else {"status": value, "ms": 7}

    def edit(docs: dict[str, Any]) -> None:
        docs["thor"]["collected"]["gateway"]["models_noauth"] = reading(loopback)
        docs["thor"]["controller"]["models_noauth"] = reading(controller)

    return edit


def two_runs(tmp_path: Path, capsys: Any, first: Any, second: Any) -> tuple[list[str], Any]:
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, snapshot_of(tmp_path, "a", first))
    replay(capsys, db, snapshot_of(tmp_path, "b", second))
    _, lines = diff_lines(capsys, db)
    out = reconcile(capsys, "diff", "1", "2", "--history", str(db), "--format", "json")[1]
    return lines, json.loads(out)


def test_the_controllers_own_entry_is_compared_though_the_loopback_probe_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines, doc = two_runs(tmp_path, capsys, noauth(FAILED, 401), noauth(FAILED, 200))
    assert any(line.startswith(f"  + {CONTROLLER_ENTRY}") for line in lines), lines
    assert [e["path"] for e in doc["appeared"]] == ["GET /v1/models without key (controller)"]
    (unseen,) = doc["not_compared"]
    assert unseen["box"] == "thor" and unseen["columns"] == ["gateway"]
    assert unseen["reason"].endswith("(but those the controller probe saw itself)")


def test_the_loopback_entry_stays_not_compared_when_its_own_probe_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The box's probe said 200 in the first run, and did not answer in the second: its entry
    # is not known to have cleared.
    lines, doc = two_runs(tmp_path, capsys, noauth(200, 401), noauth(FAILED, 401))
    assert not any(LOOPBACK_ENTRY in line for line in lines), lines
    assert doc["cleared"] == [] and doc["appeared"] == []


def test_a_controller_probe_fault_leaves_the_loopback_entry_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines, doc = two_runs(tmp_path, capsys, noauth(401, FAILED), noauth(200, FAILED))
    assert any(line.startswith(f"  + {LOOPBACK_ENTRY}") for line in lines), lines
    assert [e["path"] for e in doc["appeared"]] == ["GET /v1/models without key (loopback)"]
    (unseen,) = doc["not_compared"]
    assert unseen["reason"].endswith("(but those the loopback probe saw itself)")


@pytest.mark.parametrize(
    ("texts", "sides"),
    [
        (["gateway models_noauth (loopback): no answer within 5 s"], {LOOPBACK}),
        (["gateway health (from the controller): connection refused"], {CONTROLLER}),
        (["controller probes: status: expected a number"], {CONTROLLER}),
        (["lanes: not in the observation"], {LOOPBACK}),  # read through the box's gateway
        (["docker: Cannot connect", "gateway (loopback): refused"], {LOOPBACK}),
        (["something said by hand"], None),  # names no part: whose, not known
        (None, None),  # the report could not be read
    ],
)
def test_whose_probe_each_fault_text_is(texts: Any, sides: set[str] | None) -> None:
    assert probe_sides(texts) == (None if sides is None else frozenset(sides))


def test_an_entry_names_its_probe_only_when_its_path_does() -> None:
    assert probe_of("GET /v1/models without key (controller)") == CONTROLLER
    assert probe_of("GET /v1/models without key (loopback)") == LOOPBACK
    assert probe_of("WORKER_MAX_MODEL_LEN") is None
