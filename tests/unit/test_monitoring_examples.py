"""examples/monitoring: the alert rules load in Prometheus' own checker (`promtool check rules`,
and `promtool test rules` fires each alert; .ci/setup-machine.sh takes promtool from Debian's
prometheus package), hold to the rule-file format, and name only series that `--metrics`
writes, with label matchers on labels it sets; the systemd units and the cron line run
commands this CLI accepts, every 15 minutes."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from reconciler.cli import build_parser
from reconciler.compare.drift import Kind
from reconciler.metrics import VERDICTS, audit_registry, drift_registry

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "monitoring"
PROMTOOL = "/opt/fleet-lab/bin/promtool"  # .ci/setup-machine.sh; never skipped when missing
RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
LABELS = {"box", "kind", "verdict", "part"}  # part: fleet_drift_box_part_observed


def written_metric_names() -> set[str]:
    """What drift_registry and audit_registry write, built from minimal documents."""
    drift_doc = {
        "summary": {"exit_code": 2},
        "boxes": [{"box": "thor", "reachable": True, "errors": [], "drifts": []}],
    }
    audit_doc = {
        "summary": {"exit_code": 0},
        "boxes": [
            {"box": "thor", "verdict": "ok", "observation": "full", "findings": [], "errors": []}
        ],
        "mesh": {"verdict": "ok"},
    }
    kinds = tuple(k.value for k in Kind)
    names = set()
    for registry in (drift_registry(drift_doc, kinds, 1.0, 1.0), audit_registry(audit_doc, 1, 1)):
        for family in registry.collect():
            names.update(s.name for s in family.samples)
    return names


def rules() -> list[dict[str, Any]]:
    doc = YAML(typ="safe").load((EXAMPLES / "fleet-alerts.rules.yml").read_text())
    assert set(doc) == {"groups"} and isinstance(doc["groups"], list)
    out = []
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "limit", "rules"} and group["name"]
        out.extend(group["rules"])
    return out


def test_the_rule_file_has_the_three_alerts_the_issue_asks_for() -> None:
    found = {r["alert"]: r for r in rules()}
    assert found["FleetDrift"]["for"] == "30m"
    assert "fleet_drift_entries" in found["FleetDrift"]["expr"]
    assert "fleet_drift_box_reachable == 0" in found["FleetBoxUnreachable"]["expr"]
    assert 'fleet_audit_mesh_verdict{verdict="fail"}' in found["FleetMeshAuditFail"]["expr"]


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r.get("alert") or r.get("record"))
def test_each_rule_follows_the_rule_format_and_names_written_series(rule: dict[str, Any]) -> None:
    assert set(rule) <= RULE_KEYS, set(rule) - RULE_KEYS
    assert ("alert" in rule) != ("record" in rule)
    assert NAME.match(rule.get("alert") or rule["record"])
    expr = rule["expr"]
    assert isinstance(expr, str) and expr.strip()
    for duration in (rule.get("for"), rule.get("keep_firing_for")):
        assert duration is None or DURATION.match(str(duration))
    for part in ("labels", "annotations"):
        for key, value in (rule.get(part) or {}).items():
            assert NAME.match(key) and isinstance(value, str)
            assert value.count("{{") == value.count("}}")
            assert set(re.findall(r"\$labels\.(\w+)", value)) <= LABELS | {"instance"}
    # PromQL, loosely: balanced brackets, only series --metrics writes, only its labels
    for open_, close in ("()", "{}", "[]"):
        assert expr.count(open_) == expr.count(close)
    names = set(re.findall(r"\bfleet_[a-z_]+\b", expr))
    assert names and names <= written_metric_names()
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        for label, value in re.findall(r'(\w+)\s*=~?\s*"([^"]*)"', matchers):
            assert label in LABELS
            if label == "verdict":
                assert value in VERDICTS
    for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        assert {g.strip() for g in grouping.split(",")} <= LABELS


def unit(name: str) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in (EXAMPLES / name).read_text().splitlines():
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
        elif line.strip() and not line.startswith("#"):
            assert current is not None and "=" in line, line
            key, value = line.split("=", 1)
            current.append((key, value))
    return sections


def reconcile_argv(command: str) -> list[str]:
    words = shlex.split(command.lstrip("-"))
    assert words[0].endswith("/reconcile")
    return words[1:]


def test_the_timer_runs_the_service_every_15_minutes() -> None:
    timer = dict(unit("fleet-drift.timer")["Timer"])
    assert timer["OnCalendar"] == "*:0/15"
    assert dict(unit("fleet-drift.timer")["Install"])["WantedBy"] == "timers.target"
    service = unit("fleet-drift.service")["Service"]
    assert ("Type", "oneshot") in service and ("SuccessExitStatus", "2") in service
    runs = [reconcile_argv(v) for k, v in service if k == "ExecStart"]
    assert [r[0] for r in runs] == ["drift", "audit"]
    targets = []
    for argv in runs:
        args = build_parser().parse_args(argv)  # the CLI accepts it as written
        assert args.metrics.endswith(".prom") and not args.no_history
        targets.append(args.metrics)
    assert len(set(targets)) == 2  # each command its own file: neither overwrites the other


def test_the_cron_line_runs_the_same_every_15_minutes() -> None:
    lines = [
        line
        for line in (EXAMPLES / "fleet-drift.cron").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    (line,) = lines
    fields = line.split(None, 6)
    assert fields[:5] == ["*/15", "*", "*", "*", "*"]
    inner = re.search(r"sh -c '([^']*)'", line)
    assert inner is not None
    commands = [c.strip() for c in inner.group(1).split(";")]
    parsed = [build_parser().parse_args(reconcile_argv(c)) for c in commands]
    assert [p.command for p in parsed] == ["drift", "audit"]
    assert all(p.metrics.endswith(".prom") for p in parsed)


def test_the_promtool_rule_tests_cover_every_alert() -> None:
    """fleet-alerts.test.yml (`promtool test rules`) tests the rule file, each alert firing."""
    doc = YAML(typ="safe").load((EXAMPLES / "fleet-alerts.test.yml").read_text())
    assert doc["rule_files"] == ["fleet-alerts.rules.yml"]
    fired = {
        case["alertname"]
        for test in doc["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert fired == {r["alert"] for r in rules()}
    for test in doc["tests"]:
        for series in test["input_series"]:
            name = series["series"].split("{", 1)[0]
            assert name in written_metric_names()


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROMTOOL, *args], cwd=EXAMPLES, capture_output=True, text=True, timeout=60, check=False
    )


def test_promtool_loads_the_rule_file() -> None:
    done = _promtool("check", "rules", "fleet-alerts.rules.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"SUCCESS: \d+ rules found", done.stdout + done.stderr)


def test_promtool_fires_each_alert_as_its_tests_expect() -> None:
    done = _promtool("test", "rules", "fleet-alerts.test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr
