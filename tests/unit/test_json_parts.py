"""A large replay's JSON report written in parts (reconciler/report/json_parts.py): each box's
entry made beside its comparison, then the document around them, must be the very text
`render_json` writes of the whole report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler import records
from reconciler.compare.drift import (
    Action,
    BoxError,
    BoxResult,
    Drift,
    DriftReport,
    Kind,
    Part,
    SecretValue,
)
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from reconciler.report.json_parts import PartsReport, box_part, render_json_parts
from reconciler.report.json_report import render_json
from reconciler.report.summary import summarize

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"
CLEAR = "hf_not-a-digest-but-a-clear-token"


def _as_parts(report: DriftReport) -> PartsReport:
    parts = tuple(box_part(box) for box in report.boxes)
    return PartsReport(parts, report.inventory, report.generated_at, report.run_id)


def _in_parts(report: DriftReport) -> str:
    return "".join(render_json_parts(_as_parts(report)))


def _odd_box(i: int) -> BoxResult:
    # Text json must escape (a line separator, a control character, quotes), non-ASCII text,
    # an integer past 64 bits (json writes it, msgspec cannot: fast_json falls back), a float,
    # a hashed secret and a clear one under a secret name (masked by the report's guard).
    drifts = (
        Drift(
            f"b{i}", Kind.ENVFILE, "file:.env", "K", 'new\u2028\x01 "é"', None, Action.REWRITE_ENV
        ),
        Drift(f"b{i}", Kind.CONTRACT, "gateway", "ctx", 262144, 2**70, Action.RECREATE_GATEWAY),
        Drift(
            f"b{i}",
            Kind.SHELL_LEAK,
            "shell",
            "KEY",
            SecretValue("hmac:" + "a" * 64),
            0.25,
            Action.SCRUB_SHELL,
            note="x",
        ),
        Drift(f"b{i}", Kind.ENVFILE, "file:.env", "HF_TOKEN", CLEAR, "", Action.REWRITE_ENV),
    )
    return BoxResult(f"b{i}", i % 7 != 3, drifts=drifts, facts={"mem": 1.5, "n": i})


def test_the_lab_replay_in_parts_is_the_report() -> None:
    fleet = load_fleet(EXAMPLE, "lab")
    report = run_drift(fleet, list(fleet.boxes), from_snapshot=EXAMPLE / "snapshot").report
    assert report.drifts  # the example's incidents: a report with something in each box
    whole = render_json(report)
    assert _in_parts(report) == whole
    # The parts' causes are the summary's: two boxes fewer, fewer causes counted.
    fewer = records.replace(report, boxes=report.boxes[:1])
    assert _in_parts(fewer) == render_json(fewer) != whole


@pytest.mark.parametrize("boxes", [0, 1, 3, 40])
def test_odd_values_in_parts_are_the_report(boxes: int) -> None:
    report = DriftReport(tuple(_odd_box(i) for i in range(boxes)), "lab", "t", "r")
    text = _in_parts(report)
    assert text == render_json(report)
    assert CLEAR not in text and json.loads(text)["summary"]["boxes"] == boxes


@pytest.mark.parametrize(
    ("reachable", "errors", "drifted", "code"),
    [
        (True, False, False, 0),
        (True, False, True, 2),
        (True, True, False, 1),
        (False, False, False, 1),
        (False, False, True, 1),
    ],
)
def test_parts_keep_the_reports_exit_code_and_summary(
    reachable: bool, errors: bool, drifted: bool, code: int
) -> None:
    # The parts are all a replay keeps of its boxes: its exit code and summary come from them.
    odd = _odd_box(1)
    last = records.replace(
        odd,
        reachable=reachable,
        errors=(BoxError(Part.DOCKER, "docker", "down"),) if errors else (),
        drifts=odd.drifts if drifted else (),
        partial="seen" if not reachable else None,
    )
    clean = records.replace(odd, box="b0", drifts=())
    report = DriftReport((clean, last), "lab", "t", "r")
    parts = _as_parts(report)
    assert parts.exit_code == report.exit_code == code
    tallied = json.loads(_in_parts(report))["summary"]
    whole = summarize(report)
    assert tallied["exit_code"] == whole.exit_code and tallied["drifts"] == whole.drifts
    assert tallied == json.loads(render_json(report))["summary"]
