"""Shared by the history, diff and metrics tests: replays of captured lab data through the CLI,
recorded in a store under the test's tmp_path (never the user's state directory)."""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reconciler import cli

ROOT = Path(__file__).resolve().parents[2]
INCIDENTS = ROOT / "examples" / "lab-incidents"
SNAPSHOT = INCIDENTS / "snapshot"
AUDIT_FIXTURES = ROOT / "tests" / "fixtures" / "audit"


def reconcile(capsys: Any, *args: str, root: Path = INCIDENTS) -> tuple[int, str, str]:
    code = cli.main(["--root", str(root), "-i", "lab", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def edited_snapshot(tmp_path: Path, name: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the incidents snapshot with `edit(box files by name)` applied."""
    target = tmp_path / name
    shutil.copytree(SNAPSHOT, target)
    docs = {p.stem: json.loads(p.read_text()) for p in target.glob("*.json") if p.stem != "index"}
    edit(docs)
    for box, doc in docs.items():
        (target / f"{box}.json").write_text(json.dumps(doc, indent=1))
    return target


def unvouched(snapshot: Path) -> None:
    """The snapshot's index without its files' digests: an edited file is then read as any
    file is (with every check), not refused as altered."""
    index = json.loads((snapshot / "index.json").read_text())
    index.pop("sha256", None)
    (snapshot / "index.json").write_text(json.dumps(index))


def undated(report: str) -> dict[str, Any]:
    """A JSON report without its `generated_at`: two runs may straddle a second."""
    doc: dict[str, Any] = json.loads(report)
    doc.pop("generated_at")
    return doc


def container(doc: dict[str, Any], service: str) -> dict[str, Any]:
    return next(c for c in doc["collected"]["docker"]["containers"] if c["service"] == service)


def recreate_worker_and_drop_shell_key(docs: dict[str, Any]) -> None:
    """thor's worker recreated (new id), thor's login shell no longer arms GATEWAY_API_KEY
    (a shell-leak entry clears), spark's login shell exports a new variable."""
    container(docs["thor"], "vllm-worker")["id"] = "0123456789ab"
    docs["thor"]["collected"]["login_shell"]["exports"].pop("GATEWAY_API_KEY")
    docs["spark"]["collected"]["login_shell"]["exports"]["HF_HOME"] = {
        "source": "~/.profile:9",
        "value": "/data/hf",
    }


def replay(capsys: Any, db: Path, snapshot: Path, *more: str, root: Path = INCIDENTS) -> str:
    """A drift replay of `snapshot` recorded in `db`; its report (text)."""
    code, out, err = reconcile(
        capsys, "drift", *more, "--from-snapshot", str(snapshot), "--history", str(db), root=root
    )
    assert code in (1, 2) and "warning" not in err, err
    return out


def unreachable(box: str) -> Callable[[dict[str, Any]], None]:
    """An edit: `box` did not answer (the file a snapshot keeps of a box ssh timed out on)."""

    def edit(docs: dict[str, Any]) -> None:
        docs[box] = {
            "box": box,
            "collected": None,
            "controller": {},
            "elapsed_s": 2.3,
            "error": "ssh: connect to host 10.77.0.11 port 22: Connection timed out",
        }

    return edit


def store_text(db: Path) -> str:
    """Everything a store holds, as text: every column of every table, packed observations
    inflated, any other bytes as they are (as tests/lab/test_history.py searches it for
    secrets)."""
    import sqlite3
    import zlib

    parts: list[str] = []
    conn = sqlite3.connect(db)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):  # the store's own table names
                for cell in row:
                    raw = cell if isinstance(cell, bytes) else str(cell).encode()
                    with contextlib.suppress(zlib.error):
                        raw += zlib.decompress(raw)
                    parts.append(raw.decode("utf-8", "replace"))
    finally:
        conn.close()
    return "\n".join(parts)


def metric_samples(path: Path) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """A metrics file's samples, read by prometheus_client's own parser: {metric: {labels:
    value}}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def samples_of_box(series: dict[tuple[tuple[str, str], ...], float], box: str) -> dict[str, float]:
    """A metric's samples of one box, keyed by its other label's value ("" without)."""
    out = {}
    for labels, value in series.items():
        named = dict(labels)
        if named.pop("box") == box:
            out[next(iter(named.values()), "")] = value
    return out


def as_version(db: Path, version: int) -> None:
    """The store as a reconciler of that schema version left it, the runs' rows and reports as
    they were written: each migration after `version` undone (5: the report back in
    `runs.report` as text, 4: no `boxes.faults`, 3: no `run_sizes`, 2: no `runs.root`)."""
    with sqlite3.connect(db) as conn:
        if version < 5:
            conn.execute(
                "UPDATE runs SET report = CAST(report_utf8 AS TEXT) WHERE report_utf8 IS NOT NULL"
            )
            conn.execute("DROP VIEW run_reports")
            conn.execute("ALTER TABLE runs DROP COLUMN report_utf8")
        if version < 4:
            conn.execute("ALTER TABLE boxes DROP COLUMN faults")
        if version < 3:
            conn.execute("DROP TABLE run_sizes")
        if version < 2:
            conn.execute("ALTER TABLE runs DROP COLUMN root")
        conn.execute("UPDATE schema_version SET version = ?", (version,))
    conn.close()


def stored_reports(db: Path) -> list[str]:
    """Every run's stored report document as text, oldest first (the store's own view; a store
    older than it, schema 4 and before, keeps them in `runs.report`)."""
    with sqlite3.connect(db) as conn:
        view = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'run_reports'").fetchone()
        query = "SELECT report FROM " + ("run_reports ORDER BY run" if view else "runs ORDER BY id")
        found = [r for (r,) in conn.execute(query)]
    conn.close()
    return found
