"""A box's own words reach the operator scrubbed and cleaned on every path, not only the drift
report's: the audit's text report (a login file's name), `apply`'s mesh check (each box's error
text), `reconcile import`'s findings, and a failed collector's last stderr line (kept in
snapshots). Each box here says something hostile: a secret and terminal control sequences (a
window title, a clear screen, colours) in a field it controls.
"""

from __future__ import annotations

import copy
import io
import itertools
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from reconciler.observe.document import collector_failed
from tests.unit.history_helpers import unvouched
from tests.unit.test_audit_snapshots import FIXTURES, fleet

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
CONTROL = "\x1b]0;owned\x07\x1b[2J\x1b[1;32mall verified\x1b[0m"


def shown_safely(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text
    assert TOKEN not in text


def test_the_audit_reports_scrub_and_clean_a_login_files_line() -> None:
    from reconciler.audit.cli import render
    from reconciler.audit.run import audit_report
    from reconciler.observe.observe import BoxObservation, load_snapshot

    index, found = load_snapshot(FIXTURES / "key_armed_from_login_shell")
    obs = found["thor"]
    collected = copy.deepcopy(obs.collected)
    exports = collected["login_shell"]["exports"]
    exports["GATEWAY_API_KEY"]["source"] = f"~/.bashrc:6 export HF_TOKEN={TOKEN}{CONTROL}"
    found["thor"] = BoxObservation("thor", collected, None, obs.controller, complete=False)
    report = audit_report(fleet({"thor": "open"}), ["thor"], found, index["run_id"])
    for fmt in ("text", "json", "markdown"):  # (the html page: test_html_report)
        said = render(report, fmt)
        shown_safely(said)
        assert "~/.bashrc:6" in said  # still said, as text


def hostile_docker_error(tmp_path: Path, fixture: Path, box: str) -> Path:
    snapshot = tmp_path / "snapshot"
    shutil.copytree(fixture, snapshot)
    doc = json.loads((snapshot / f"{box}.json").read_text())
    doc["collected"]["docker"]["error"] = f"docker ps failed: HF_TOKEN={TOKEN}{CONTROL}"
    (snapshot / f"{box}.json").write_text(json.dumps(doc))
    unvouched(snapshot)  # the file was edited: no digest vouches for it
    return snapshot


def test_applys_mesh_check_shows_each_boxs_error_scrubbed_and_cleaned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler.apply import engine, operation, progress, session
    from reconciler.drift import run_drift

    snapshot = hostile_docker_error(tmp_path, FIXTURES / "key_armed_from_login_shell", "thor")
    monkeypatch.setattr(session, "_fleet", [fleet({"thor": "open"})])  # as `apply` seeds it
    monkeypatch.setattr(
        engine, "run_drift", lambda f, boxes: run_drift(f, boxes, from_snapshot=snapshot)
    )
    clock = itertools.count(0, 1000.0)  # settle() gives up at once, not after 30 s
    monkeypatch.setattr(engine.time, "monotonic", lambda: next(clock))
    err = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", err)
    no_failures = SimpleNamespace(failed_hosts=set())  # pyinfra's state: no box failed
    monkeypatch.setattr(operation, "_failed", lambda box: False)  # thor converged in this run
    assert operation._verify_mesh(no_failures, None, ["thor"]) is False
    said = err.getvalue()
    assert said.startswith("mesh: ") and "docker ps failed: HF_TOKEN=***" in said
    shown_safely(said)


def test_import_shows_the_boxes_words_scrubbed_and_cleaned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from reconciler.cli import main

    snapshot = hostile_docker_error(tmp_path, ROOT / "tests/fixtures/import/pristine", "thor")
    doc = json.loads((snapshot / "thor.json").read_text())
    doc["collected"]["gateway"]["health"]["body"]["version"] = "0.92.0" + CONTROL
    (snapshot / "thor.json").write_text(json.dumps(doc))
    argv = ["--root", str(ROOT), "-i", "lab", "import", "--from-snapshot", str(snapshot)]
    code = main([*argv, "--output", str(tmp_path / "adopted")])
    out, err = capsys.readouterr()
    assert code in (0, 2)  # adopted; 2: something found while importing
    assert "docker ps failed: HF_TOKEN=***" in out and "/health 0.92.0" in out
    shown_safely(out + err)


def test_a_failed_collectors_last_line_is_scrubbed() -> None:
    """A login shell with `set -x` traces the exports it runs on stderr, secrets included."""
    fault = collector_failed(1, f"python3: started\n+ export HF_TOKEN={TOKEN}{CONTROL}\n")
    assert fault.what.startswith("+ export HF_TOKEN=***")
    shown_safely(fault.what)
