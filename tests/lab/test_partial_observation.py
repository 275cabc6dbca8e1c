"""Issue 11 §3 on the real lab: a box whose sshd is down is still observed where it can be (its
gateway, from the controller), and a box whose sshd died while a ControlPersist master was up
is reported as reachable only through that connection, not as healthy.

The incident is the box's sshd listener stopped by its pidfile (lab/sshd.py), as a crash or an
`systemctl stop ssh` would leave it: sessions already open survive, new connections are refused.
Every test restarts the listener in a `finally` and checks the box takes new connections again.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import lab as labpkg
from lab import config
from reconciler.audit.document import AuditReportDoc
from reconciler.audit.report_json import render_json as audit_json
from reconciler.audit.run import run_audit
from reconciler.compare.drift import Part
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from reconciler.drift_inputs import targets
from reconciler.observe.transport import MASTER_ONLY, Target, run_one, ssh_argv
from reconciler.report.document import DriftReportDoc
from reconciler.report.json_report import render_json
from tests.lab.test_drift import ROOT

pytestmark = pytest.mark.lab

BOXES = ["thor", "spark", "orin"]
DOWN = "spark"


def master(target: Target, operation: str) -> subprocess.CompletedProcess[bytes]:
    """`ssh -O check|exit` on the master connection the reconciler shares with `target`."""
    argv = ssh_argv(target, "true")
    cut = argv.index("--")
    command = [*argv[:cut], "-O", operation, *argv[cut : cut + 2]]
    return subprocess.run(command, capture_output=True, timeout=10, check=False)


@pytest.fixture
def sshd_down(lab: dict[str, Any]) -> Iterator[Target]:
    """DOWN's sshd listener stopped for the test, started again (and checked) afterwards."""
    fleet = load_fleet(ROOT, "lab")
    target = targets(fleet, [DOWN])[DOWN]
    box = config.box(DOWN)
    try:
        yield target
    finally:
        labpkg.sshd.ensure(box)
        fresh = run_one(target, "true", 30)  # a new connection, or the master: both must work
        assert fresh.error is None and fresh.returncode == 0, fresh
        assert master(target, "exit").returncode in (0, 255)
        anew = run_one(target, "true", 30)  # no master now: this one is a new connection
        assert anew.error is None and anew.returncode == 0, anew


def gateway_status(lab: dict[str, Any], box: str) -> int:
    url = f"{lab['boxes'][box]['gateway_url']}/v1/models"
    return httpx.get(url, timeout=5, trust_env=False).status_code


def test_a_box_without_sshd_is_observed_from_its_gateway(lab, sshd_down):
    master(sshd_down, "exit")  # no persisted connection: SSH really cannot reach the box
    labpkg.sshd.stop(config.box(DOWN))
    status = gateway_status(lab, DOWN)
    posture = "keyed" if status == 401 else "open"
    fleet = load_fleet(ROOT, "lab")

    report = run_drift(fleet, BOXES).report
    by_box = {b.box: b for b in report.boxes}
    down = by_box[DOWN]
    assert not down.reachable and down.observation == "partial"
    assert "Connection refused" in down.errors[0] and down.errors[0].part is Part.OBSERVATION
    assert down.partial is not None
    assert f"GET /v1/models without a key {status} ({posture})" in down.partial
    assert down.facts["controller_models_noauth"] == status
    assert {b.observation for name, b in by_box.items() if name != DOWN} == {"full"}
    assert report.exit_code == 1
    doc = DriftReportDoc.model_validate_json(render_json(report))
    assert [b.observation for b in doc.boxes] == [by_box[b].observation for b in BOXES]

    audit = run_audit(fleet, BOXES)
    row = audit.row_of(DOWN)
    assert not row.audited and row.partial and row.posture == posture
    assert DOWN in audit.mesh.with_posture(posture)  # the mesh no longer says "keyed: none"
    assert (
        audit.verdict_of(DOWN)
        .reasons[0]
        .startswith(f"seen from the mesh side only: desired keyed, live {posture}")
    )
    adoc = AuditReportDoc.model_validate_json(audit_json(audit))
    observed = {b.box: b.observation for b in adoc.boxes}
    assert observed == {"thor": "full", "spark": "partial", "orin": "full"}


def test_a_box_whose_sshd_died_under_a_master_is_not_healthy(lab, sshd_down):
    opened = run_one(sshd_down, "true", 30)  # the master connection, persisted
    assert opened.error is None and master(sshd_down, "check").returncode == 0
    labpkg.sshd.stop(config.box(DOWN))

    report = run_drift(load_fleet(ROOT, "lab"), [DOWN]).report
    (result,) = report.boxes
    assert result.reachable and result.observation == "full"  # the master still carries it
    (error,) = [e for e in result.errors if e.part is Part.CONNECTION]
    assert error.what.startswith(MASTER_ONLY)
    assert f"connect to {sshd_down.hostname}:22: Connection refused" in error.what
    assert report.exit_code == 1
