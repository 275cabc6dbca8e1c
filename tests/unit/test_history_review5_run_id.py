"""A snapshot's index whose `run_id` is no text (a lone surrogate, which JSON's `\\ud800`
escape allows, or a number) is refused by the replay with a clear error naming index.json and
the key, exit 1, as the index's other checks are; and a run the store cannot bind (a value no
UTF-8 can hold) is the usual warning, the run keeping its exit code. Before, a recorded replay
of such a snapshot ended in a traceback (UnicodeEncodeError from SQLite's binding: the
recording caught only the store's and the file system's errors)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.history import hooks
from reconciler.history.record import RunRecord
from reconciler.observe.observe import snapshot_index
from tests.unit.history_helpers import SNAPSHOT, edited_snapshot, reconcile


def with_run_id(tmp_path: Path, run_id: Any) -> Path:
    snapshot = edited_snapshot(tmp_path, "odd-run-id", lambda docs: None)
    index = json.loads((snapshot / "index.json").read_text())
    index["run_id"] = run_id
    (snapshot / "index.json").write_text(json.dumps(index))  # `\ud800` escaped, as JSON may
    return snapshot


@pytest.mark.parametrize("command", ["drift", "audit"])
@pytest.mark.parametrize("run_id", ["r\ud800x", 20261129, None, ["r1"]])
def test_a_run_id_that_is_no_text_is_refused_naming_the_index_and_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, run_id: Any
) -> None:
    snapshot = with_run_id(tmp_path, run_id)
    db = tmp_path / "h.sqlite3"
    code, _, err = reconcile(
        capsys, command, "--from-snapshot", str(snapshot), "--history", str(db)
    )
    assert code == 1, err
    assert f"{snapshot}/index.json: run_id is not UTF-8 text" in err
    assert "Traceback" not in err and not db.exists()  # nothing touched


def test_the_index_keeps_a_run_id_of_any_other_text(tmp_path: Path) -> None:
    """Control characters and newlines are text: readers escape them (test_history_review_fixes:
    the listing; test_audit_review_fixes: the reports)."""
    snapshot = with_run_id(tmp_path, "X\x1b[2J\nfake line \u202e")
    assert snapshot_index(snapshot)["run_id"] == "X\x1b[2J\nfake line \u202e"
    assert snapshot_index(SNAPSHOT)["run_id"] == "20261129T093154Z-11f3b5"


def test_a_run_the_store_cannot_bind_is_a_warning_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = RunRecord(
        run_id="r1",
        command="drift",
        source="snapshot",
        started_at="2026-12-06T10:00:00Z",
        started=0.0,
        duration_s=1.0,
        inventory="inventory/lab\ud800.yaml",  # whatever value of the run no UTF-8 holds
        exit_code=2,
        summary={},
        report={},
        boxes=(),
    )
    hooks._record(tmp_path / "h.sqlite3", run)
    err = capsys.readouterr().err
    assert err.startswith("warning: the run was not recorded in the history: "), err
