"""Causes (issue 11 §4): every drift entry gets a cause id, symptoms are linked to the change
that explains them, and text and markdown lead with causes while JSON still lists every entry.

Captured real data: tests/fixtures/causes/fresh_render.json is the freshly rendered three-box
lab (40 differences; tests/fixtures/causes/capture.py), tests/fixtures/plan/*_pristine.json an
older capture of the same state (before gateway keys were provisioned), and
examples/lab-incidents/ the lab with the five field incidents, replayed from its snapshot.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections import Counter
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest

from reconciler import records
from reconciler.compare.causes import Cause, group_causes, link_box, own_cause
from reconciler.compare.drift import (
    Action,
    BoxResult,
    Drift,
    DriftReport,
    Kind,
    SecretValue,
)
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from reconciler.report import render
from reconciler.report.document import DriftReportDoc
from reconciler.report.json_report import to_document
from reconciler.report.summary import sentence, summarize

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
EXAMPLE = ROOT / "examples" / "lab-incidents"


def _value(raw: Any) -> Any:
    if isinstance(raw, dict) and set(raw) == {"secret"}:
        return SecretValue(raw["secret"])
    if isinstance(raw, list):
        return tuple(_value(v) for v in raw)
    return raw


def _drift(raw: dict[str, Any]) -> Drift:
    return Drift(
        **{
            **raw,
            "kind": Kind(raw["kind"]),
            "action": Action(raw["action"]),
            "desired": _value(raw["desired"]),
            "observed": _value(raw["observed"]),
        }
    )


def fresh_render() -> DriftReport:
    doc = json.loads((FIXTURES / "causes" / "fresh_render.json").read_text(encoding="utf-8"))
    boxes = tuple(
        BoxResult(b["box"], b["reachable"], tuple(_drift(d) for d in b["drifts"]))
        for b in doc["boxes"]
    )
    return DriftReport(boxes, doc["inventory"], doc["generated_at"], doc["run_id"])


def pristine() -> DriftReport:
    boxes = []
    for name in ("thor", "spark", "orin"):
        doc = json.loads((FIXTURES / "plan" / f"{name}_pristine.json").read_text())
        boxes.append(BoxResult(name, True, tuple(_drift(d) for d in doc["drifts"])))
    return DriftReport(tuple(boxes), "lab", "2026-11-30T00:00:00Z", "r")


@pytest.fixture(scope="module")
def incidents() -> DriftReport:
    fleet = load_fleet(EXAMPLE, "lab")
    return run_drift(fleet, list(fleet.boxes), from_snapshot=EXAMPLE / "snapshot").report


def by_id(report: DriftReport) -> dict[str, Cause]:
    return {c.id: c for c in group_causes(report.boxes)}


def places(drifts: tuple[Drift, ...]) -> set[tuple[str, str, str, str]]:
    return {(d.box, d.kind.value, d.subject, d.path) for d in drifts}


# -- the freshly rendered lab ------------------------------------------------------------------


def test_fresh_render_is_four_causes_for_forty_differences() -> None:
    report = fresh_render()
    causes = by_id(report)
    assert len(report.drifts) == 40
    assert list(causes) == [
        "envfile:GATEWAY_API_KEY",
        "envfile:HAND_IMAGE",
        "envfile:VLLM_GDN_DECODE_KERNEL",
        "env:CULTURE_VLLM_API_KEY",
    ]
    # Every entry is in exactly one cause.
    grouped = [d for c in causes.values() for d in (*c.changes, *c.symptoms)]
    assert Counter(grouped) == Counter(report.drifts)
    assert summarize(report).causes == 4
    assert sentence(summarize(report)) == (
        "drift: 4 causes, 40 differences on 3 of 3 boxes (env 30, envfile 6, auth 4)"
    )


def test_a_missing_env_key_explains_every_container_that_reads_env() -> None:
    report = fresh_render()
    hand = by_id(report)["envfile:HAND_IMAGE"]
    assert hand.boxes == ("thor", "spark", "orin")  # one cause, three boxes
    assert places(hand.changes) == {
        (box, "envfile", "file:.env", "HAND_IMAGE") for box in ("thor", "spark", "orin")
    }
    # The symptoms: exactly the containers whose environment lacks HAND_IMAGE, on every box.
    lacking = {
        (d.box, d.kind.value, d.subject, d.path)
        for d in report.drifts
        if d.kind is Kind.ENV and d.path == "HAND_IMAGE"
    }
    assert len(lacking) == 12
    assert places(hand.symptoms) == lacking


def test_a_missing_gateway_key_explains_the_gateway_and_its_open_posture() -> None:
    key = by_id(fresh_render())["envfile:GATEWAY_API_KEY"]
    assert key.boxes == ("thor", "orin")
    assert {(d.kind, d.subject, d.path) for d in key.symptoms} == {
        (Kind.ENV, "gateway", "GATEWAY_API_KEY"),
        (Kind.AUTH, "gateway", "GET /v1/models without key (loopback)"),
        (Kind.AUTH, "gateway", "GET /v1/models without key (controller)"),
    }
    assert len(key.symptoms) == 6  # three on each box


def test_an_entry_nothing_explains_is_its_own_cause_collapsed_across_boxes() -> None:
    culture = by_id(fresh_render())["env:CULTURE_VLLM_API_KEY"]
    assert culture.symptoms == ()
    assert len(culture.changes) == 12 and culture.boxes == ("thor", "spark", "orin")


def test_without_the_key_entry_the_open_gateway_is_its_own_cause() -> None:
    """The older capture had no gateway key to compare (its secret file was missing): nothing
    in it explains the open posture, so auth is its own cause, one for both boxes."""
    causes = by_id(pristine())
    assert "envfile:GATEWAY_API_KEY" not in causes
    auth = causes["auth:gateway"]
    assert auth.boxes == ("thor", "orin") and auth.symptoms == ()
    assert len(auth.changes) == 4
    assert places(causes["envfile:GATEWAY_IMAGE"].symptoms) == {
        (d.box, "env", d.subject, "GATEWAY_IMAGE")
        for d in pristine().drifts
        if d.kind is Kind.ENV and d.path == "GATEWAY_IMAGE"
    }


# -- the field incidents -----------------------------------------------------------------------


def test_incidents_window_change_explains_the_lane_the_gateway_and_the_contract(
    incidents: DriftReport,
) -> None:
    window = by_id(incidents)["envfile:WORKER_MAX_MODEL_LEN"]
    assert window.boxes == ("thor",)
    assert {(d.kind, d.subject, d.path) for d in window.symptoms} == {
        (Kind.ARGV, "lane:vllm-worker", "--max-model-len"),
        (Kind.ENV, "lane:vllm-worker", "WORKER_MAX_MODEL_LEN"),
        (Kind.ENV, "gateway", "WORKER_MAX_MODEL_LEN"),
        (Kind.CONTRACT, "gateway", "capabilities.worker.context"),
    }


def test_incidents_hardcoded_flag_explains_the_dead_knob_and_the_stale_window(
    incidents: DriftReport,
) -> None:
    override = by_id(incidents)["compose-file:docker-compose.override.yml"]
    assert override.boxes == ("spark", "orin")  # edited on both boxes: one cause, two changes
    assert places(override.changes) == {
        (box, "compose-file", "file:docker-compose.override.yml", "sha256")
        for box in ("spark", "orin")
    }
    # spark's lane runs the hard-coded window; the gateway still advertises the old one
    # (the pair reversed): both follow from the edited file.
    assert places(override.symptoms) == {
        ("spark", "compose-file", "lane:vllm-primary", "--max-model-len"),
        ("spark", "contract", "gateway", "capabilities.cortex.context"),
    }


def test_incidents_shell_export_explains_the_gateway_carrying_its_key(
    incidents: DriftReport,
) -> None:
    causes = by_id(incidents)
    shell = causes["shell:GATEWAY_API_KEY"]
    assert places(shell.symptoms) == {("thor", "env", "gateway", "GATEWAY_API_KEY")}
    # orin's gateway runs with the .env's empty key: that one follows from the .env.
    key = causes["envfile:GATEWAY_API_KEY"]
    assert ("orin", "env", "gateway", "GATEWAY_API_KEY") in places(key.symptoms)
    assert ("orin", "auth", "gateway", "GET /v1/models without key (loopback)") in places(
        key.symptoms
    )


def test_incidents_unproven_links_stay_their_own_causes(incidents: DriftReport) -> None:
    causes = by_id(incidents)
    for own in ("image:vllm-embed", "port:gateway", "contract:capabilities.senses.proxied"):
        assert causes[own].symptoms == (), own
    assert causes["contract:capabilities.senses.proxied"].boxes == ("thor", "spark")


def test_the_example_readme_shows_what_its_replay_prints(incidents: DriftReport) -> None:
    """examples/lab-incidents/README.md quotes the grouped report: every quoted block is in the
    replay's text (as `reconcile drift` prints it off a terminal: 100 columns), in order."""
    printed = render(incidents, "text", width=100).splitlines()
    readme = (EXAMPLE / "README.md").read_text(encoding="utf-8")
    blocks = [
        [line.removeprefix("    ") for line in block.group(0).splitlines() if line.strip()]
        for block in re.finditer(r"(?:^ {4}[^\n]*\n?)+", readme, re.M)
    ]
    quoted = [lines for lines in blocks if not lines[0].startswith("reconcile ")]
    assert len(quoted) == 4
    for lines in quoted:
        rest = iter(printed)
        missing = [line for line in lines if not any(line == out for out in rest)]
        assert not missing, missing


# -- the reports -------------------------------------------------------------------------------


def test_text_leads_with_causes_and_collapses_boxes_to_one_line() -> None:
    text = render(fresh_render(), "text", width=100)
    lines = text.splitlines()
    heads = [x for x in lines if re.match(r"\S+:\S+: \d+ differences? on ", x)]
    assert heads == [
        "envfile:GATEWAY_API_KEY: 8 differences on thor, orin",
        "envfile:HAND_IMAGE: 15 differences on thor, spark, orin",
        "envfile:VLLM_GDN_DECODE_KERNEL: 5 differences on thor",
        "env:CULTURE_VLLM_API_KEY: 12 differences on thor, spark, orin",
    ]
    block = text.split("envfile:HAND_IMAGE: ", 1)[1].split("\n\n", 1)[0].splitlines()
    rows = [x for x in block if re.match(r"  (cause|symptom) ", x)]
    # Three .env entries and twelve containers: one row each, the change first.
    assert [r.split()[:3] for r in rows] == [
        ["cause", "envfile", "HAND_IMAGE"],
        ["symptom", "env", "HAND_IMAGE"],
    ]
    assert "on: file:.env on thor, spark, orin" in [x.strip() for x in block]
    joined = " ".join(" ".join(block).split())
    assert (
        "on: lane:vllm-embed, lane:vllm-hand, lane:vllm-rerank on thor, spark, orin; "
        "lane:vllm-multimodal on orin; lane:vllm-primary on spark; lane:vllm-worker on thor"
    ) in joined
    assert (
        lines[-1] == "drift: 4 causes, 40 differences on 3 of 3 boxes (env 30, envfile 6, auth 4)"
    )
    assert len(lines) < 60  # was 95 lines, one or more per entry


def test_markdown_groups_by_cause_with_every_place() -> None:
    md = render(fresh_render(), "markdown")
    titles = [x for x in md.splitlines() if x.startswith("### ")]
    assert titles == [
        "### `envfile:GATEWAY_API_KEY`: 8 differences on thor, orin",
        "### `envfile:HAND_IMAGE`: 15 differences on thor, spark, orin",
        "### `envfile:VLLM_GDN_DECODE_KERNEL`: 5 differences on thor",
        "### `env:CULTURE_VLLM_API_KEY`: 12 differences on thor, spark, orin",
    ]
    section = md.split("### `envfile:GATEWAY_API_KEY`", 1)[1].split("###", 1)[0]
    rows = [x for x in section.splitlines() if x.startswith("| cause") or x.startswith("| symp")]
    assert [r.split(" | ")[:3] for r in rows] == [
        ["| cause", "envfile", "`GATEWAY_API_KEY`"],
        ["| symptom", "auth", "`GET /v1/models without key (controller)`"],
        ["| symptom", "auth", "`GET /v1/models without key (loopback)`"],
        ["| symptom", "env", "`GATEWAY_API_KEY`"],
    ]
    assert all("on thor, orin" in r for r in rows)
    assert "`***` | *absent* (changed) |" in rows[0]


def test_json_lists_every_entry_with_its_cause() -> None:
    for report in (fresh_render(), pristine()):
        doc = to_document(report)
        DriftReportDoc.model_validate_json(json.dumps(doc))  # the v2 schema accepts it
        listed = [
            (b["box"], d["kind"], d["subject"], d["path"], d["cause"], d["symptom"])
            for b in doc["boxes"]
            for d in b["drifts"]
        ]
        assert len(listed) == len(report.drifts) == doc["summary"]["drifts"]
        expected = {
            (d.box, d.kind.value, d.subject, d.path, cause.id, symptom)
            for cause in group_causes(report.boxes)
            for symptom, drifts in ((False, cause.changes), (True, cause.symptoms))
            for d in drifts
        }
        assert set(listed) == expected
        assert doc["summary"]["causes"] == len({entry[4] for entry in listed})


def test_incidents_json_lists_every_entry(incidents: DriftReport) -> None:
    doc = json.loads(render(incidents, "json"))
    entries = [d for b in doc["boxes"] for d in b["drifts"]]
    assert len(entries) == len(incidents.drifts)
    assert {d["cause"] for d in entries} == set(by_id(incidents))
    # Ids name what fixes an entry, never a value: no digest, no secret.
    assert not [d["cause"] for d in entries if "hmac" in d["cause"] or "***" in d["cause"]]


def test_causes_do_not_depend_on_entry_order() -> None:
    report = fresh_render()
    want = render(report, "json"), render(report, "text"), render(report, "markdown")
    rng = random.Random(11)
    for _ in range(3):
        shuffled = tuple(
            records.replace(b, drifts=tuple(rng.sample(b.drifts, len(b.drifts))))
            for b in report.boxes
        )
        other = records.replace(report, boxes=shuffled)
        assert (render(other, "json"), render(other, "text"), render(other, "markdown")) == want


# -- the rules themselves ----------------------------------------------------------------------


def _d(kind: Kind, subject: str, path: str, want: Any, got: Any, **kw: Any) -> Drift:
    return Drift("thor", kind, subject, path, want, got, Action.RECREATE, **kw)


def test_a_value_match_must_be_unambiguous() -> None:
    worker = _d(Kind.ENVFILE, "file:.env", "WORKER_MAX_MODEL_LEN", "262144", "131072")
    primary = _d(Kind.ENVFILE, "file:.env", "PRIMARY_MAX_MODEL_LEN", "262144", "131072")
    argv = _d(Kind.ARGV, "lane:vllm-worker", "--max-model-len", "262144", "131072")
    other = _d(Kind.ARGV, "lane:vllm-senses", "--max-model-len", "262144", "131072")
    links = link_box([worker, primary, argv, other])
    # The worker's flag shares the lane's name with WORKER_MAX_MODEL_LEN: linked.
    assert links[2].cause == "envfile:WORKER_MAX_MODEL_LEN" and links[2].symptom
    # A lane neither key names: both match equally, so nothing is proven.
    assert links[3].cause == "argv:vllm-senses" and not links[3].symptom


def test_trivial_values_prove_nothing() -> None:
    knob = _d(Kind.ENVFILE, "file:.env", "X_ASYNC_SCHEDULING", "1", "0")
    flag = _d(Kind.ARGV, "lane:vllm-x", "--enforce-eager", "1", "0")
    assert link_box([knob, flag])[1].cause == "argv:vllm-x"


def test_a_container_carrying_another_value_than_the_shell_follows_the_env() -> None:
    shell = _d(Kind.SHELL_LEAK, "shell", "GATEWAY_API_KEY", None, SecretValue("hmac:aa"))
    envfile = _d(Kind.ENVFILE, "file:.env", "GATEWAY_API_KEY", SecretValue("hmac:bb"), None)
    gateway = _d(Kind.ENV, "gateway", "GATEWAY_API_KEY", SecretValue("hmac:bb"), "")
    assert link_box([shell, envfile, gateway])[2].cause == "envfile:GATEWAY_API_KEY"
    carrying = records.replace(gateway, observed=SecretValue("hmac:aa"))
    assert link_box([shell, envfile, carrying])[2].cause == "shell:GATEWAY_API_KEY"


class NewKind(StrEnum):
    """A kind this module has never heard of (a helper may add one tomorrow)."""

    SPLIT = "argv-split"


def test_a_kind_causes_does_not_know_is_its_own_cause_and_still_reported() -> None:
    odd = Drift("thor", NewKind.SPLIT, "lane:vllm-worker", "entrypoint", "a", "b", Action.REPORT)  # type: ignore[arg-type]
    envfile = _d(Kind.ENVFILE, "file:.env", "HAND_IMAGE", "x", None)
    assert own_cause(odd) == "argv-split:lane:vllm-worker:entrypoint"
    report = DriftReport((BoxResult("thor", True, (odd, envfile)),), "lab", "t", "r")
    causes = group_causes(report.boxes)
    assert [c.id for c in causes] == [
        "envfile:HAND_IMAGE",
        "argv-split:lane:vllm-worker:entrypoint",
    ]
    assert "argv-split:lane:vllm-worker:entrypoint: 1 difference on thor" in render(report, "text")
    assert "drift: 2 causes, 2 differences" in render(report, "markdown")


def test_every_kind_has_a_stable_id_without_values() -> None:
    for kind in Kind:
        drift = _d(kind, "lane:vllm-x", "PATH", SecretValue("hmac:dead"), "clear-value")
        cause = own_cause(drift)
        assert cause == own_cause(records.replace(drift, observed="other"))
        assert "dead" not in cause and "clear-value" not in cause


def test_causes_and_grouping_import_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "import reconciler.compare.causes, reconciler.report.grouped, reconciler.report.summary\n"
        "heavy = {'pydantic', 'rich', 'deepdiff', 'ruamel', 'pyinfra', 'yaml'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
