"""History, diff and metrics on the real lab: drift twice around an incident (thor's login
shell exports GATEWAY_API_KEY and the gateway is recreated from that shell, seed #209), then
`history` lists both runs, `diff` names the new export and the recreated gateway, the metrics
file parses with prometheus_client and holds the expected series, and neither the outputs nor
the store (every column, observations decompressed) hold a lab secret or the incident's key.
thor is reset afterwards (~30 s with the reset)."""

from __future__ import annotations

import sqlite3
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import lab as labpkg
from tests.lab import audit_scenarios as sc
from tests.lab.lab_cli import reconcile

pytestmark = pytest.mark.lab


def store_text(db: Path) -> str:
    """Everything the store holds, as text: every column of every table, blobs inflated."""
    parts: list[str] = []
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            rows = conn.execute(f"SELECT * FROM {table}")  # the store's own table names
            names = [d[0] for d in rows.description]
            for row in rows:
                for name, value in zip(names, row, strict=True):
                    parts.append(_text(name, value))
    conn.close()
    return "\n".join(parts)


def _text(column: str, value: object) -> str:
    if not isinstance(value, bytes):
        return str(value)
    # runs.report_utf8: the report's UTF-8 bytes; observations.document: zlib(JSON).
    return value.decode() if column == "report_utf8" else zlib.decompress(value).decode()


def samples(path: Path) -> dict[str, dict[tuple[Any, ...], float]]:
    out: dict[str, dict[tuple[Any, ...], float]] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_history_diff_and_metrics_around_a_shell_armed_key(
    lab: dict[str, Any], pristine: Any, tmp_path: Path
) -> None:
    db, prom = tmp_path / "state" / "history.sqlite3", tmp_path / "fleet_drift.prom"
    outputs: list[str] = []

    def drift() -> subprocess.CompletedProcess[str]:
        done = reconcile("drift", "thor", "--history", str(db), "--metrics", str(prom))
        outputs.extend([done.stdout, done.stderr, prom.read_text()])
        assert "warning" not in done.stderr, done.stderr
        return done

    first = drift()
    assert first.returncode in (0, 2), first.stderr
    before = samples(prom)
    pristine("thor")
    did = labpkg.incidents.shell_exported_key("thor", "GATEWAY_API_KEY")
    second = drift()
    assert second.returncode == 2, second.stderr

    listed = reconcile("history", "--history", str(db))
    outputs += [listed.stdout, listed.stderr]
    assert listed.returncode == 0
    rows = [line.split() for line in listed.stdout.splitlines()[1:3]]
    assert [r[0] for r in rows] == ["1", "2"] and all("drift" in r for r in rows)
    assert "2 runs in" in listed.stdout

    diff = reconcile("diff", "--history", str(db))
    outputs += [diff.stdout, diff.stderr]
    assert diff.returncode == 2, diff.stderr
    assert "thor: the login shell now exports GATEWAY_API_KEY" in diff.stdout
    assert "thor: model-gear-gateway recreated (container id" in diff.stdout
    assert "+ thor shell-leak shell GATEWAY_API_KEY: *** (changed)" in diff.stdout

    after = samples(prom)
    box = (("box", "thor"),)
    assert after["fleet_drift_box_reachable"][box] == 1
    shell = (("box", "thor"), ("kind", "shell-leak"))
    assert (before["fleet_drift_entries"][shell], after["fleet_drift_entries"][shell]) == (0, 1)
    assert after["fleet_drift_causes"][box] > before["fleet_drift_causes"][box]
    assert after["fleet_drift_observation_errors"][box] == 0
    (stamp,) = after["fleet_drift_last_run_timestamp_seconds"].values()
    (stamp_before,) = before["fleet_drift_last_run_timestamp_seconds"].values()
    assert stamp > stamp_before

    secrets = [*sc.lab_secrets().values(), did["value"]]
    everything = "\n".join([*outputs, store_text(db)])
    leaked = [i for i, value in enumerate(secrets) if value and value in everything]
    assert leaked == [], f"secret #{leaked} found in an output or the store"  # never the value
