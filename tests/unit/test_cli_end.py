"""`reconcile drift`, run as the program, ends with os._exit once its work is out
(cli._end_now): nothing it prints or writes may be lost to that, and no other command ends so."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"
# The program as the console script runs it, with an exit hook that says whether the
# interpreter's own shutdown ran.
PROGRAM = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('interpreter shutdown ran', file=sys.stderr))\n"
    "from reconciler.cli import main\n"
    "sys.exit(main())\n"
)


def _reconcile(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FLEET_INVENTORY", None)
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def _replay(*extra: str) -> list[str]:
    return [
        "--root", str(EXAMPLE), "-i", "lab", "drift",
        "--from-snapshot", str(EXAMPLE / "snapshot"), *extra,
    ]  # fmt: skip


def test_a_drift_ends_at_once_with_its_report_files_and_history_complete(tmp_path: Path) -> None:
    report, metrics, history = tmp_path / "r.json", tmp_path / "m.prom", tmp_path / "h.sqlite3"
    written = _reconcile(
        *_replay("--format", "json", "-o", str(report)),
        "--metrics", str(metrics), "--history", str(history),
    )  # fmt: skip
    assert written.returncode == 2, written.stderr
    assert "interpreter shutdown ran" not in written.stderr  # it ended at once
    printed = _reconcile(*_replay("--format", "json", "--no-history"))
    assert printed.returncode == 2 and "interpreter shutdown ran" not in printed.stderr
    on_stdout, in_file = json.loads(printed.stdout), json.loads(report.read_text("utf-8"))
    for doc in (on_stdout, in_file):
        doc.pop("generated_at")
    assert on_stdout == in_file and on_stdout["summary"]["drifts"] > 0
    assert metrics.read_text("utf-8").endswith("fleet_drift_last_run_exit_code 2.0\n")
    with sqlite3.connect(history) as conn:
        assert conn.execute("SELECT count(*), max(exit_code) FROM runs").fetchone() == (1, 2)


def test_other_commands_end_as_programs_do() -> None:
    validated = _reconcile("--root", str(EXAMPLE), "-i", "lab", "validate")
    assert validated.returncode == 0, validated.stderr
    assert "interpreter shutdown ran" in validated.stderr


def test_validate_names_at_most_a_dozen_boxes_and_counts_the_rest() -> None:
    from reconciler.cli import NAMED, named

    boxes = [f"b{i}" for i in range(NAMED + 5)]
    assert named(boxes[:3]) == "b0, b1, b2"
    assert named(boxes[:NAMED]) == ", ".join(boxes[:NAMED])
    assert named(boxes) == ", ".join(boxes[:NAMED]) + " and 5 more"
