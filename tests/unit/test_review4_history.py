"""The history and the metrics after the fourth review (/tmp/review/today_defects.md, 2 and the
two metrics items at its end): a run recorded before the fault parts were kept (schema 1-3)
has its parts read back from its stored report's error texts, so `reconcile diff` and the
sparkline no longer hide a box whose login shell once timed out; a fault whose text names no
part is compared as recorded, and said; the metrics count no entry under a part that was not
observed, say which part was not (fleet_drift_box_part_observed), and a login-shell timeout
raises a warning, not the critical FleetBoxNotObserved. On captured lab data
(examples/lab-incidents), the alert rules run by promtool on the metrics a replay wrote."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from ruamel.yaml import YAML

from reconciler.history.parts import column
from reconciler.history.series import drift_counts
from tests.unit.history_helpers import (
    AUDIT_FIXTURES,
    ROOT,
    SNAPSHOT,
    as_version,
    container,
    edited_snapshot,
    metric_samples,
    reconcile,
    replay,
    samples_of_box,
    unvouched,
)

LOGIN_TIMEOUT = "bash -lc timed out after 5 s"  # as the lab's collector wrote it
# dockerd down, as a live collector writes it (docker's CLI fallback: no container listed).
DOCKER_DOWN = {
    "error": "Cannot connect to the Docker daemon at unix:///var/run/docker.sock",
    "containers": [],
    "images": {},
}
PROMTOOL = "/opt/fleet-lab/bin/promtool"  # as tests/unit/test_monitoring_examples.py runs it
MONITORING = ROOT / "examples" / "monitoring"


def login_timeout(*, worker_debug: bool = False) -> Any:
    """An edit: thor's login shell timed out (the exports it had read are kept, as the
    collector keeps them); `worker_debug`: its worker also runs with VLLM_LOGGING_LEVEL=DEBUG,
    a lane entry that appears."""

    def edit(docs: dict[str, Any]) -> None:
        docs["thor"]["collected"]["login_shell"]["error"] = LOGIN_TIMEOUT
        if worker_debug:
            container(docs["thor"], "vllm-worker")["env"]["VLLM_LOGGING_LEVEL"] = "DEBUG"

    return edit


def docker_down(docs: dict[str, Any]) -> None:
    docs["thor"]["collected"]["docker"] = dict(DOCKER_DOWN)


def snapshot_of(tmp_path: Path, name: str, edit: Any) -> Path:
    target = edited_snapshot(tmp_path, name, edit)
    unvouched(target)
    return target


def set_errors(db: Path, run: int, box: str, errors: list[str] | None) -> None:
    """Run `run`'s stored report with `box`'s errors replaced (None: a report that is not
    JSON at all)."""
    with sqlite3.connect(db) as conn:
        (text,) = conn.execute("SELECT report FROM runs WHERE id = ?", (run,)).fetchone()
        if errors is None:
            text = "{not json"
        else:
            doc = json.loads(text)
            next(b for b in doc["boxes"] if b["box"] == box)["errors"] = errors
            text = json.dumps(doc)
        conn.execute("UPDATE runs SET report = ? WHERE id = ?", (text, run))
    conn.close()


def diff_lines(capsys: Any, db: Path, *more: str) -> tuple[int, list[str]]:
    code, out, err = reconcile(capsys, "diff", "1", "2", "--history", str(db), *more)
    assert "Traceback" not in err, err
    return code, out.splitlines()


def timeout_runs(tmp_path: Path, capsys: Any) -> Path:
    """Two recorded replays: thor's login shell timed out in both, its worker runs with a new
    variable in the second."""
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, snapshot_of(tmp_path, "t1", login_timeout()))
    replay(capsys, db, snapshot_of(tmp_path, "t2", login_timeout(worker_debug=True)))
    return db


APPEARED = "  + thor env lane:vllm-worker VLLM_LOGGING_LEVEL: desired null, observed DEBUG"
BOX_WIDE_NOT_COMPARED = (
    "  thor: login_shell not observed in run 1; login_shell not observed in run 2: its "
    "entries on the box as a whole not compared"
)


# -- defect 2: runs recorded before schema 4 ----------------------------------------------------


@pytest.mark.parametrize("version", [1, 3])
def test_an_old_runs_login_shell_timeout_hides_no_lane_entry(
    version: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reviewer's case: thor's login shell timed out in both runs (a box-wide fault), a
    worker variable appeared in the second. Recorded before the parts were kept, the diff
    said nothing appeared ("some part (not recorded which)": every column hidden)."""
    db = timeout_runs(tmp_path, capsys)
    code, current = diff_lines(capsys, db)
    as_version(db, version)
    before = db.read_bytes()
    code_old, old = diff_lines(capsys, db)
    assert code_old == code == 2, old
    assert any(line.startswith(APPEARED) for line in old), old
    assert BOX_WIDE_NOT_COMPARED in old, old
    assert old[-1].startswith("diff: 1 entries appeared, 0 cleared, 0 changed"), old
    assert old[1:] == current[1:]  # what a store of this version reads (the header: times)
    assert db.read_bytes() == before  # read as it is, never migrated
    _, js = reconcile(capsys, "diff", "1", "2", "--history", str(db), "--format", "json")[:2]
    doc = json.loads(js)
    assert [(e["box"], e["subject"], e["path"]) for e in doc["appeared"]] == [
        ("thor", "lane:vllm-worker", "VLLM_LOGGING_LEVEL")
    ]
    assert [(u["box"], u["columns"]) for u in doc["not_compared"]] == [("thor", ["box-wide"])]
    assert doc["notes"] == []


@pytest.mark.parametrize("report", ["names no part", "unreadable"])
def test_an_old_runs_fault_that_names_no_part_is_compared_as_recorded_and_said(
    report: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only when nothing says which part (a text no reconciler wrote, a report that is not
    JSON): that box's entries are compared as recorded, with a note, never all hidden."""
    db = timeout_runs(tmp_path, capsys)
    as_version(db, 3)
    set_errors(db, 1, "thor", ["collector: no reconciler wrote this"] if report[0] == "n" else None)
    code, lines = diff_lines(capsys, db)
    assert code == 2, lines
    note = (
        "  thor: run 1 recorded before fault parts were kept, and a fault of it names no "
        "part: its entries compared as recorded"
    )
    assert note in lines, lines
    assert any(line.startswith(APPEARED) for line in lines), lines
    # Run 2's own fault is still read from its report: the box-wide entries not compared.
    assert (
        "  thor: login_shell not observed in run 2: its entries on the box as a whole not compared"
    ) in lines, lines
    _, js = reconcile(capsys, "diff", "1", "2", "--history", str(db), "--format", "json")[:2]
    assert json.loads(js)["notes"] == [note.strip()]


def test_an_old_runs_docker_down_still_leaves_its_lanes_and_gateway_not_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Read back, dockerd down is still dockerd down: the lanes' and the gateway's "no
    container" entries neither appear nor clear; the box-wide ones are compared."""
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    replay(capsys, db, snapshot_of(tmp_path, "down", docker_down))
    as_version(db, 3)
    code, lines = diff_lines(capsys, db)
    assert code == 2, lines
    assert (
        "  thor: docker not observed in run 2: its entries on the lanes and the gateway "
        "not compared"
    ) in lines, lines
    assert not any(line.startswith(("  + ", "  - ")) for line in lines), lines


def test_the_sparkline_reads_an_old_run_as_the_diff_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Runs recorded before the parts were kept, read back from their reports: a fault that
    leaves no column unseen (orin reached only through its SSH master) is counted (it was
    dropped: every fault hid everything); a login-shell timeout or dockerd down is a gap, as
    in a run recorded now; a fault naming no part keeps the count as recorded."""

    def refused(docs: dict[str, Any]) -> None:
        login_timeout()(docs)
        docs["orin"]["connection"] = "new ssh connections refused (the master still answers)"

    db = tmp_path / "h.sqlite3"
    for n, edit in enumerate([None, refused, docker_down, login_timeout()]):
        replay(capsys, db, SNAPSHOT if edit is None else snapshot_of(tmp_path, f"s{n}", edit))
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT box, entries, errors FROM boxes ORDER BY run").fetchall()
    conn.close()
    assert [e for b, _, e in rows if b == "orin"] == [0, 1, 0, 0]
    entries = {box: [n for b, n, _ in rows if b == box] for box in ("thor", "orin")}
    as_version(db, 3)
    set_errors(db, 4, "thor", ["collector: no reconciler wrote this"])
    thor = entries["thor"]
    assert drift_counts(db, ["thor", "orin"]) == {
        "thor": [thor[0], thor[3]],
        "orin": entries["orin"],
    }


def test_an_audits_fault_hides_nothing_in_its_diff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An audit records no fault parts (it has findings, no entries): any audit box with an
    error read as "some part (not recorded which) not observed ... not compared", in a store
    of any version. Its findings are compared, and nothing is said to be left out."""
    db = tmp_path / "a.sqlite3"
    source = AUDIT_FIXTURES / "fully_keyed_mesh"
    timed_out = tmp_path / "timed-out"
    shutil.copytree(source, timed_out)
    thor = json.loads((timed_out / "thor.json").read_text())
    thor["collected"]["login_shell"]["error"] = LOGIN_TIMEOUT
    (timed_out / "thor.json").write_text(json.dumps(thor))
    unvouched(timed_out)
    for snapshot in (source, timed_out):
        code, _, err = reconcile(
            capsys, "audit", "--from-snapshot", str(snapshot), "--history", str(db), root=ROOT
        )
        assert code in (0, 2) and "warning" not in err, err
    code, out, _ = reconcile(capsys, "diff", "--history", str(db), root=ROOT)
    lines = out.splitlines()
    assert code == 2 and "  + thor: warn audit.unobserved: login_shell: " + LOGIN_TIMEOUT in lines
    assert "not compared" not in out and "compared in part" not in out, out


def thor_with_every_fault(docs: dict[str, Any]) -> None:
    """Every fault compare makes of a box it observed, on one box or another."""
    thor, spark = docs["thor"]["collected"], docs["spark"]["collected"]
    thor["docker"] = dict(DOCKER_DOWN)
    thor["render"] = {"error": "service vllm-hand: invalid interpolation"}
    thor["variables"] = {"error": "compose config --variables exited 1"}
    thor["login_shell"]["error"] = LOGIN_TIMEOUT
    thor["gateway"]["error"] = "curl: (28) Operation timed out"
    thor["gateway"]["health"] = {"status": None, "error": "timed out after 5 s", "ms": 5000}
    thor["file_errors"] = {".env": "not a regular file (a FIFO)"}
    next(iter(thor["secret_sources"].values()))["status"] = "file-missing"
    thor["secret_sources"].pop(list(thor["secret_sources"])[-1])
    for section in ("docker", "render", "variables", "login_shell", "gateway", "lanes"):
        spark.pop(section)
    spark["deploy_dir_exists"] = False
    docs["orin"]["connection"] = "new ssh connections refused (the master still answers)"


def test_each_fault_compare_makes_is_read_back_from_its_text(tmp_path: Path) -> None:
    """What the store keeps of an old run's faults is the report's text: each fault compare
    makes of a box it observed names its part there, as part_of reads it. Held to compare
    itself, so a fault reworded there fails here."""
    from reconciler.compare.drift import Part
    from reconciler.desired.load import load_fleet
    from reconciler.drift import run_drift_on
    from reconciler.drift_inputs import drift_inputs
    from reconciler.history.parts import part_of  # new in review 4
    from reconciler.report.json_report import to_document

    snapshot = snapshot_of(tmp_path, "faults", thor_with_every_fault)
    inputs = drift_inputs(load_fleet(ROOT / "examples" / "lab-incidents", "lab"))
    report = run_drift_on(inputs, ["thor", "spark", "orin"], from_snapshot=snapshot).report
    texts = {b["box"]: b["errors"] for b in to_document(report)["boxes"]}
    seen: set[Part] = set()
    for box in report.boxes:
        assert box.observation == "full", box.errors
        assert len(texts[box.box]) == len(box.errors)
        for error, text in zip(box.errors, texts[box.box], strict=True):
            assert part_of(text) == error.part.value, text
            seen.add(error.part)
    # Every part of a box observed (a box not observed is a whole box, whatever its text);
    # config-hash is said only of a box whose files are the desired ones, which no box of this
    # capture is: tests/unit/test_config_hash.py reads its text back.
    assert seen == set(Part) - {Part.OBSERVATION, Part.CONFIG_HASH}
    assert part_of("collector: no reconciler wrote this") is None


# -- the metrics: entries under a part not observed; which part ---------------------------------


def metrics_of(
    tmp_path: Path, capsys: Any, snapshot: Path, fmt: str = "json"
) -> tuple[dict[str, Any], Path]:
    prom = tmp_path / f"{snapshot.name}-{fmt}.prom"
    code, out, err = reconcile(
        capsys, "drift", "--from-snapshot", str(snapshot), "--format", fmt,
        "--metrics", str(prom), "--no-history",
    )  # fmt: skip
    assert code in (1, 2) and "Traceback" not in err, err
    return (json.loads(out) if fmt == "json" else {}), prom


def test_the_metrics_count_every_entry_found_and_say_the_part_not_observed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """dockerd down: compare says no lane is missing, and what the controller's own probes saw
    of the gateway is drift found. Review 4 left every entry under a part not observed out of
    the counts; that hid a gateway answering without a key whenever its /health timed out
    (review 7). Every entry counts; the part gauge says what was not seen. The same from a
    replay kept as its parts (history/kept_parts.py)."""
    from reconciler import replay_workers

    down = snapshot_of(tmp_path, "down", docker_down)
    doc, prom = metrics_of(tmp_path, capsys, down)
    thor = next(b for b in doc["boxes"] if b["box"] == "thor")
    # No container is said missing (compare knows dockerd did not answer), but what the
    # controller saw of the gateway through its own probes is still reported there.
    assert not [d for d in thor["drifts"] if d["kind"] == "state"]
    unseen = {column(d["subject"]) for d in thor["drifts"]} - {"box-wide"}
    assert unseen, thor["drifts"]
    kept = thor["drifts"]
    got = metric_samples(prom)
    expect = {k: float(sum(1 for d in kept if d["kind"] == k)) for k in {d["kind"] for d in kept}}
    assert samples_of_box(got["fleet_drift_entries"], "thor") == expect
    assert samples_of_box(got["fleet_drift_causes"], "thor") == {
        "": len({d["cause"] for d in kept})
    }
    assert samples_of_box(got["fleet_drift_box_observed"], "thor") == {"": 0.0}
    assert samples_of_box(got["fleet_drift_box_part_observed"], "thor") == {
        "lanes": 0.0,
        "gateway": 0.0,
        "box-wide": 1.0,
    }
    for box in ("spark", "orin"):  # observed in full: every part, every count
        assert samples_of_box(got["fleet_drift_box_part_observed"], box) == dict.fromkeys(
            ("lanes", "gateway", "box-wide"), 1.0
        )
        report = next(b for b in doc["boxes"] if b["box"] == box)
        assert sum(samples_of_box(got["fleet_drift_entries"], box).values()) == len(
            report["drifts"]
        )
    monkeypatch.setattr(replay_workers, "WORKERS_FROM", 2)
    monkeypatch.setenv(replay_workers.WORKERS_ENV, "2")
    _, parts_prom = metrics_of(tmp_path, capsys, down, fmt="text")
    whole = {k: v for k, v in got.items() if "timestamp" not in k and "duration" not in k}
    parts = metric_samples(parts_prom)
    assert {k: parts[k] for k in whole} == whole


def promtool_case(prom: Path, eval_at: str, expect: dict[str, list[str]]) -> dict[str, Any]:
    """A `promtool test rules` case: the drift metrics of `prom` scraped every minute for two
    hours; at `eval_at`, each alert of `expect` firing for those boxes (none for [])."""
    rules = YAML(typ="safe").load((MONITORING / "fleet-alerts.rules.yml").read_text())
    by_name = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    series = []
    for family in text_string_to_metric_families(prom.read_text()):
        for s in family.samples:
            if s.name.startswith("fleet_drift_box_") or s.name == "fleet_drift_entries":
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                series.append({"series": f"{s.name}{{{labels}}}", "values": f"{s.value:g}x120"})
    cases = []
    for alert, boxes in expect.items():
        rule = by_name[alert]
        fired = [
            {
                "exp_labels": {"box": box, **rule["labels"]},
                "exp_annotations": {
                    k: v.replace("{{ $labels.box }}", box) for k, v in rule["annotations"].items()
                },
            }
            for box in boxes
        ]
        cases.append({"eval_time": eval_at, "alertname": alert, "exp_alerts": fired})
    return {"interval": "1m", "input_series": series, "alert_rule_test": cases}


def promtool_passes(tmp_path: Path, *cases: dict[str, Any]) -> None:
    test = tmp_path / "case.test.yml"
    rules = MONITORING / "fleet-alerts.rules.yml"
    doc = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": list(cases)}
    test.write_text(json.dumps(doc))  # JSON is YAML
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(test)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_login_shell_timeout_is_a_warning_dockerd_down_critical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A login-shell timeout (apply tolerates it: it concerns only the box-wide column) left
    thor "not observed" and raised the critical FleetBoxNotObserved. Now its part gauge says
    the lanes and the gateway were seen (their entries counted, 0s not written: the box is
    still not observed in full) and the rules raise FleetBoxPartNotObserved, a warning, after
    an hour; dockerd down still raises the critical alert. promtool evaluates the rules on
    the metrics the replays wrote."""
    doc, timeout_prom = metrics_of(tmp_path, capsys, snapshot_of(tmp_path, "t", login_timeout()))
    got = metric_samples(timeout_prom)
    assert samples_of_box(got["fleet_drift_box_observed"], "thor") == {"": 0.0}
    assert samples_of_box(got["fleet_drift_box_part_observed"], "thor") == {
        "lanes": 1.0,
        "gateway": 1.0,
        "box-wide": 0.0,
    }
    thor = next(b for b in doc["boxes"] if b["box"] == "thor")
    box_wide = [d for d in thor["drifts"] if column(d["subject"]) == "box-wide"]
    assert box_wide, thor["drifts"]  # found while the login shell hung (.env): counted too
    assert sum(samples_of_box(got["fleet_drift_entries"], "thor").values()) == len(thor["drifts"])
    _, down_prom = metrics_of(tmp_path, capsys, snapshot_of(tmp_path, "d", docker_down))
    promtool_passes(
        tmp_path,
        promtool_case(timeout_prom, "30m", {"FleetBoxNotObserved": []}),
        promtool_case(timeout_prom, "50m", {"FleetBoxPartNotObserved": []}),
        promtool_case(timeout_prom, "70m", {"FleetBoxPartNotObserved": ["thor"]}),
        promtool_case(down_prom, "20m", {"FleetBoxNotObserved": ["thor"]}),
        promtool_case(down_prom, "70m", {"FleetBoxPartNotObserved": []}),
    )
