"""The history and the metrics after the third review (/tmp/review/hist_defects.md): a part of
a box that was not observed (dockerd down) is neither "cleared" in a diff, nor 0 drift in the
metrics or the sparkline; an audit's listing says the mesh's verdict; the sparkline and the
listing keep fleets apart; a secret that could not be compared is said so; a newer store is
refused before anything touches it; a run id that names several runs is ambiguous; a replay's
metrics carry its snapshot's time. Each on captured lab data (examples/lab-incidents)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from reconciler.history import store
from reconciler.history.migrations import TABLES, VERSION
from reconciler.history.record import BoxRow, EntryRow, RunRecord
from reconciler.history.series import drift_counts
from tests.unit.history_helpers import (
    AUDIT_FIXTURES,
    INCIDENTS,
    ROOT,
    SNAPSHOT,
    as_version,
    edited_snapshot,
    metric_samples,
    reconcile,
    replay,
    samples_of_box,
    unreachable,
    unvouched,
)

DOCKER_DOWN = "docker engine not reachable: [Errno 111] Connection refused"


def docker_down(box: str, *, drop_shell_key: bool = False) -> Any:
    """An edit: `box` answered over SSH, its dockerd did not (the collector's `docker` section
    as it writes an engine that refused the connection). `drop_shell_key`: its login shell
    also no longer exports GATEWAY_API_KEY (a box-wide shell-leak entry clears)."""

    def edit(docs: dict[str, Any]) -> None:
        docs[box]["collected"]["docker"] = {"error": DOCKER_DOWN}
        if drop_shell_key:
            docs[box]["collected"]["login_shell"]["exports"].pop("GATEWAY_API_KEY")

    return edit


def snapshot_of(tmp_path: Path, name: str, edit: Any) -> Path:
    target = edited_snapshot(tmp_path, name, edit)
    unvouched(target)
    return target


def counts_of(capsys: Any, snapshot: Path, root: Path = INCIDENTS) -> dict[str, int]:
    """Each box's drift entries in a replay of `snapshot` (its JSON report)."""
    code, out, _ = reconcile(
        capsys, "drift", "--from-snapshot", str(snapshot), "--format", "json", "--no-history",
        root=root,
    )  # fmt: skip
    assert code in (1, 2)
    return {b["box"]: len(b["drifts"]) for b in json.loads(out)["boxes"]}


# -- 1. a box's part not observed: its entries there are not compared, never cleared ------------


def test_dockerd_down_leaves_the_lanes_and_gateway_not_compared_never_cleared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    down = snapshot_of(tmp_path, "down", docker_down("thor", drop_shell_key=True))
    replay(capsys, db, down)
    code, out, _ = reconcile(capsys, "diff", "--history", str(db))
    assert code == 2, out
    expected = (
        "  thor: docker not observed in run 2: its entries on the lanes and the gateway "
        "not compared"
    )
    assert expected in out.splitlines(), out
    cleared = [line for line in out.splitlines() if line.startswith("  - ")]
    # Only the box-wide entry whose part was observed clears: the login shell's export.
    assert cleared == [line for line in cleared if " shell-leak shell GATEWAY_API_KEY" in line]
    assert len(cleared) == 1, out
    assert not any(" lane:" in line or " gateway " in line for line in cleared)
    assert out.rstrip().endswith("1 boxes compared in part"), out
    code, out, _ = reconcile(capsys, "diff", "--history", str(db), "--format", "json")
    doc = json.loads(out)
    assert [(u["box"], u["columns"]) for u in doc["not_compared"]] == [
        ("thor", ["gateway", "lanes"])
    ]
    assert [(e["box"], e["kind"]) for e in doc["cleared"]] == [("thor", "shell-leak")]
    # The same snapshots compared directly: the same judgement.
    code, out, _ = reconcile(capsys, "diff", "--from-snapshot", str(SNAPSHOT), str(down))
    assert code == 2 and expected.replace("run 2", f"snapshot {down}") in out.splitlines(), out
    assert sum(1 for line in out.splitlines() if line.startswith("  - ")) == 1, out


def test_the_store_keeps_each_boxs_fault_parts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, snapshot_of(tmp_path, "down", docker_down("thor")))
    with store.reading(db) as conn:
        (run,) = store.runs(conn)
        faults = {b.box: b.faults for b in store.boxes_of(conn, run.id)}
    assert faults == {"thor": ("docker",), "spark": (), "orin": ()}
    code, out, _ = reconcile(capsys, "history", "--history", str(db), "--format", "json")
    assert code == 0
    assert {b["box"]: b["faults"] for b in json.loads(out)["runs"][0]["boxes"]}["thor"] == [
        "docker"
    ]


def test_a_version_3_store_is_read_as_it_is_a_box_with_errors_not_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Runs recorded before the parts were kept: a box's parts are read back from its
    report's error texts (review 4: `docker: ...`, so its lanes and gateway are not
    compared, its other entries are); the reader changes nothing; a run migrates it."""
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    replay(capsys, db, snapshot_of(tmp_path, "down", docker_down("thor")))
    as_version(db, 3)
    before = db.read_bytes()
    code, out, _ = reconcile(capsys, "diff", "--history", str(db))
    assert code == 2, out
    assert (
        "  thor: docker not observed in run 2: its entries on the lanes and the gateway "
        "not compared"
    ) in out.splitlines(), out
    assert not any(line.startswith("  - ") for line in out.splitlines()), out
    code, out, _ = reconcile(capsys, "history", "--history", str(db), "--format", "json")
    assert code == 0
    assert [b["faults"] for r in json.loads(out)["runs"] for b in r["boxes"]] == [None] * 6
    full = counts_of(capsys, SNAPSHOT)
    assert drift_counts(db, ["thor", "spark"]) == {
        "thor": [full["thor"]],
        "spark": [full["spark"]] * 2,
    }
    assert db.read_bytes() == before  # read, never migrated
    replay(capsys, db, SNAPSHOT)  # a run migrates it: the runs before are as they were
    with store.opened(db, create=False) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(VERSION,)]
        stored = conn.execute("SELECT run, box, faults FROM boxes ORDER BY run, rowid").fetchall()
    assert [f for run, _, f in stored if run < 3] == [None] * 6
    assert [f for run, _, f in stored if run == 3] == ["[]"] * 3


# -- 2. not observed in full: no 0 in the metrics, a gap in the sparkline ------------------------


def test_metrics_write_no_zero_for_a_box_not_observed_in_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from reconciler.compare.drift import Kind

    snapshot = snapshot_of(tmp_path, "down", docker_down("thor"))
    gone = unreachable("spark")
    gone_dir = snapshot_of(tmp_path, "gone", gone)
    kinds = {k.value for k in Kind}
    for source, box in ((snapshot, "thor"), (gone_dir, "spark")):
        prom = tmp_path / f"{box}.prom"
        code, out, _ = reconcile(
            capsys, "drift", "--from-snapshot", str(source), "--format", "json",
            "--metrics", str(prom), "--no-history",
        )  # fmt: skip
        assert code == 1
        doc = json.loads(out)
        got = metric_samples(prom)
        observed = samples_of_box(got["fleet_drift_box_observed"], box)
        assert observed == {"": 0.0}
        entries = samples_of_box(got["fleet_drift_entries"], box)
        # Only the kinds found (a lower bound), never a 0 that is not known; every entry found
        # counted, under a part not observed too (thor's gateway as the controller probed it,
        # dockerd down: review 7, it was left out).
        found = next(b for b in doc["boxes"] if b["box"] == box)["drifts"]
        expect = {
            k: float(sum(1 for d in found if d["kind"] == k)) for k in {d["kind"] for d in found}
        }
        assert entries == expect and 0.0 not in entries.values()
        assert samples_of_box(got["fleet_drift_observation_errors"], box)[""] >= 1
        for other in {"thor", "spark", "orin"} - {box}:  # observed in full: every kind, 0s too
            assert samples_of_box(got["fleet_drift_box_observed"], other) == {"": 1.0}
            assert set(samples_of_box(got["fleet_drift_entries"], other)) == kinds
    assert samples_of_box(
        metric_samples(tmp_path / "spark.prom")["fleet_drift_box_reachable"], "spark"
    ) == {"": 0.0}
    assert "spark" not in {
        dict(k)["box"] for k in metric_samples(tmp_path / "spark.prom")["fleet_drift_causes"]
    }


def test_a_rule_alerts_on_a_box_reached_but_not_observed_in_full() -> None:
    doc = YAML(typ="safe").load((ROOT / "examples/monitoring/fleet-alerts.rules.yml").read_text())
    rules = {r["alert"]: r for g in doc["groups"] for r in g["rules"]}
    expr = rules["FleetBoxNotObserved"]["expr"]
    assert "fleet_drift_box_observed == 0" in expr and "fleet_drift_box_reachable == 1" in expr


def test_the_sparkline_counts_only_runs_that_observed_the_box_in_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    replay(capsys, db, SNAPSHOT)
    replay(capsys, db, snapshot_of(tmp_path, "gone", unreachable("spark")))
    replay(capsys, db, snapshot_of(tmp_path, "down", docker_down("thor")))
    counts = drift_counts(db, ["thor", "spark", "orin"])
    full = counts_of(capsys, SNAPSHOT)
    # spark unreachable in run 3, thor's dockerd down in run 4: gaps, never a 0 or a part.
    assert counts == {
        "thor": [full["thor"]] * 3,
        "spark": [full["spark"]] * 3,
        "orin": [full["orin"]] * 4,
    }


def test_a_replay_kept_as_its_parts_records_and_counts_the_same_fault_parts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay kept as its boxes' parts (history/kept_parts.py: each box's rows and metrics
    made beside its comparison, the path of a large fleet's JSON replay, here taken by three
    boxes): the same fault parts, the same metrics, as the whole report's path."""
    from reconciler import replay_workers
    from reconciler.drift import replays_in_parts

    monkeypatch.setattr(replay_workers, "WORKERS_FROM", 2)
    monkeypatch.setenv(replay_workers.WORKERS_ENV, "2")
    assert replays_in_parts(3)
    down = snapshot_of(tmp_path, "down", docker_down("thor"))
    found = {}
    for fmt in ("json", "text"):  # parts, then the whole report
        db, prom = tmp_path / f"{fmt}.sqlite3", tmp_path / f"{fmt}.prom"
        code, _, err = reconcile(
            capsys, "drift", "--from-snapshot", str(down), "--format", fmt,
            "--history", str(db), "--metrics", str(prom),
        )  # fmt: skip
        assert code == 1 and "warning" not in err, err
        with store.reading(db) as conn:
            (run,) = store.runs(conn)
            faults = {b.box: b.faults for b in store.boxes_of(conn, run.id)}
        assert faults == {"thor": ("docker",), "spark": (), "orin": ()}
        got = metric_samples(prom)
        found[fmt] = {k: got[k] for k in ("fleet_drift_box_observed", "fleet_drift_entries")}
        assert samples_of_box(got["fleet_drift_box_observed"], "thor") == {"": 0.0}
        assert 0.0 not in samples_of_box(got["fleet_drift_entries"], "thor").values()
    assert found["json"] == found["text"]


# -- 3. an audit's listing: the mesh's verdict and every finding -------------------------------


def test_the_history_lists_an_audits_mesh_verdict_and_its_findings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    weakest = AUDIT_FIXTURES / "weakest_link_proven_live"
    code, out, _ = reconcile(
        capsys, "audit", "--from-snapshot", str(weakest), "--format", "json", "--history",
        str(db), root=ROOT,
    )  # fmt: skip
    assert code == 2
    summary = json.loads(out)["summary"]
    assert (summary["mesh"], summary["findings"]) == ("fail", 1)
    code, out, _ = reconcile(capsys, "history", "--history", str(db))
    line = out.splitlines()[1].split()
    assert "mesh fail; ok" in out.splitlines()[1], out
    assert line[line.index("ok") + 1] == "1", out  # the mesh's finding counted
    code, out, _ = reconcile(capsys, "history", "thor", "--history", str(db))
    assert "mesh" not in out.splitlines()[1] and " ok  " in out.splitlines()[1], out


# -- 4. one store, several fleets: each fleet's own trend, each line says whose ----------------


def fix_context(docs: dict[str, Any]) -> None:
    """thor's .env carries the desired context again: fewer entries on thor."""
    envfile = docs["thor"]["collected"]["envfile"]
    line = next(e for e in envfile if e.get("key") == "WORKER_MAX_MODEL_LEN")
    line["value"] = "262144"


def _other_fleet(tmp_path: Path) -> Path:
    """The incidents' repository copied elsewhere: the same inventory/lab.yaml, another
    fleet."""
    other = tmp_path / "other-fleet"
    shutil.copytree(INCIDENTS, other, ignore=shutil.ignore_patterns("snapshot"))
    return other


def test_the_sparkline_and_the_listing_keep_fleets_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    other = _other_fleet(tmp_path)
    replay(capsys, db, SNAPSHOT)
    replay(capsys, db, SNAPSHOT)
    fixed = snapshot_of(tmp_path, "fixed", fix_context)  # fewer entries on thor
    code, _, err = reconcile(
        capsys, "drift", "--from-snapshot", str(fixed), "--history", str(db), root=other
    )
    assert code == 2 and "warning" not in err, err
    mine = drift_counts(db, ["thor"], inventory="inventory/lab.yaml", root=str(INCIDENTS))
    theirs = drift_counts(db, ["thor"], inventory="inventory/lab.yaml", root=str(other))
    fewer = counts_of(capsys, fixed, root=other)["thor"]
    assert mine == {"thor": [counts_of(capsys, SNAPSHOT)["thor"]] * 2}
    assert theirs == {"thor": [fewer]} and fewer < mine["thor"][0]
    # Without a fleet (a caller that does not know it): every run, as before.
    assert drift_counts(db, ["thor"])["thor"] == [*mine["thor"], fewer]
    assert drift_counts(db, ["thor"], inventory="inventory/hosts.yaml") == {}
    code, out, _ = reconcile(capsys, "history", "--history", str(db))
    lines = out.splitlines()
    assert "fleet" in lines[0].split()
    assert f"inventory/lab.yaml in {INCIDENTS}" in lines[1]
    assert f"inventory/lab.yaml in {other}" in lines[3]


# -- 5. a secret that could not be compared is said so --------------------------------------


def _secret_run(n: int, changed: bool | None) -> RunRecord:
    entry = EntryRow(
        "thor", "envfile", "file:.env", "HF_TOKEN", "envfile:HF_TOKEN", False, "rewrite-env",
        '"***"', '"***"', True, changed,
    )  # fmt: skip
    return RunRecord(
        run_id=f"r{n}", command="drift", source="live", started_at=f"2026-12-06T00:00:0{n}Z",
        started=time.time(), duration_s=1.0, inventory="inventory/lab.yaml", exit_code=2,
        summary={"exit_code": 2}, report={}, root="/x",
        boxes=(BoxRow("thor", True, "full", 1, 1, 0),), entries=(entry,),
    )  # fmt: skip


def test_a_secret_not_comparable_is_never_said_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.sqlite3"
    with store.opened(db) as conn:
        store.record(conn, _secret_run(1, True))
        store.record(conn, _secret_run(2, None))
    code, out, _ = reconcile(capsys, "diff", "--history", str(db))
    assert code == 2
    assert (
        "  ~ thor envfile file:.env HF_TOKEN: *** (not comparable) [cause envfile:HF_TOKEN] "
        "(was *** (changed))"
    ) in out.splitlines(), out
    assert "(unchanged)" not in out


# -- 8. a store from a newer reconciler: refused before anything touches it ----------------------


def _newer_store(db: Path, extra_table: bool) -> None:
    """Every table of this version, at the next schema version, in rollback-journal mode (as
    a newer reconciler's store copied off its machine); `extra_table`: with that version's
    own table too."""
    conn = sqlite3.connect(db, isolation_level=None)
    from reconciler.history.migrations import MIGRATIONS
    from reconciler.history.store import _statements

    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for script in MIGRATIONS:
        for statement in _statements(script):
            conn.execute(statement)
    conn.execute("INSERT INTO schema_version VALUES (?)", (VERSION + 1,))
    if extra_table:
        conn.execute("CREATE TABLE labels (run INTEGER, label TEXT)")
    conn.close()


@pytest.mark.parametrize("extra_table", [False, True], ids=["same-tables", "a-newer-table"])
def test_a_newer_store_is_refused_as_newer_and_never_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra_table: bool
) -> None:
    db = tmp_path / "v.sqlite3"
    _newer_store(db, extra_table)
    before = db.read_bytes()
    assert before[18:20] == b"\x01\x01"  # rollback journal (WAL would be 2, 2)
    newer = f"at schema version {VERSION + 1}, newer than this reconciler knows ({VERSION})"
    code, out, err = reconcile(capsys, "history", "--history", str(db))
    assert (code, out) == (1, "") and newer in err, err
    code, _, err = reconcile(
        capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--history", str(db)
    )
    # Said before the run (review 8), not as a warning after it: exit 1.
    assert code == 1 and err.startswith("error: history: ") and newer in err, err
    assert db.read_bytes() == before, "the store was changed before it was refused"
    assert not Path(f"{db}-wal").exists()


def test_another_applications_schema_version_table_is_still_not_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A newer store holds every table of this one; a database that does not is another
    application's, whatever its own schema_version says."""
    db = tmp_path / "app.sqlite3"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO schema_version VALUES (42)")
        conn.execute("CREATE TABLE users (name TEXT)")
    conn.close()
    assert "users" not in TABLES
    code, _, err = reconcile(capsys, "history", "--history", str(db))
    assert code == 1 and "is not a history store of this tool (its tables: users)" in err, err


# -- suspicions: one run id naming several runs; a replay's metrics' time -----------------------


def test_a_run_id_that_names_several_replays_is_ambiguous(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    replay(capsys, db, snapshot_of(tmp_path, "down", docker_down("thor")))
    run_id = json.loads((SNAPSHOT / "index.json").read_text())["run_id"]
    code, out, err = reconcile(capsys, "diff", run_id, run_id, "--history", str(db))
    assert (code, out) == (1, "")
    assert err == (
        f"error: {run_id!r} names 2 runs in {db} (runs 1, 2; replays of one snapshot share "
        "its run id): name each run by its number\n"
    )
    code, out, _ = reconcile(capsys, "diff", "1", "2", "--history", str(db))
    assert code == 2 and "docker not observed in run 2" in out


def test_a_replays_metrics_carry_the_time_its_snapshot_was_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = json.loads((SNAPSHOT / "index.json").read_text())["taken_at"]
    expect = datetime.strptime(taken, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    for command, source, root in (
        ("drift", SNAPSHOT, INCIDENTS),
        ("audit", AUDIT_FIXTURES / "weakest_link_proven_live", ROOT),
    ):
        if command == "audit":
            index = json.loads((source / "index.json").read_text())
            expect = (
                datetime.strptime(index["taken_at"], "%Y-%m-%dT%H:%M:%SZ")
                .replace(tzinfo=UTC)
                .timestamp()
            )
        prom = tmp_path / f"{command}.prom"
        reconcile(
            capsys, command, "--from-snapshot", str(source), "--metrics", str(prom),
            "--no-history", root=root,
        )  # fmt: skip
        got = metric_samples(prom)
        assert got[f"fleet_{command}_last_run_timestamp_seconds"] == {(): expect}
        stamps = set(got[f"fleet_{command}_box_last_run_timestamp_seconds"].values())
        assert stamps == {expect}, (command, stamps)
