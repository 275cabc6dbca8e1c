"""`--metrics FILE` on captured lab data: the Prometheus text format parsed back with
prometheus_client's own parser, the series each box gets, labels that never carry a value,
and a file replaced whole or not at all."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconciler.compare.drift import Kind
from tests.unit.history_helpers import AUDIT_FIXTURES, ROOT, SNAPSHOT, reconcile

BOXES = {"thor", "spark", "orin"}
ALLOWED_LABELS = {"box", "kind", "verdict", "part"}  # part: lanes, gateway, box-wide


def samples(path: Path) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def test_drift_metrics_hold_every_series_per_box(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prom = tmp_path / "fleet_drift.prom"
    code, out, _ = reconcile(
        capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--format", "json",
        "--metrics", str(prom), "--no-history",
    )  # fmt: skip
    assert code == 2
    doc = json.loads(out)
    got = samples(prom)
    assert {b["box"]: v for b, v in got["fleet_drift_box_reachable"]} == dict.fromkeys(BOXES, 1)
    entries = got["fleet_drift_entries"]
    assert {(b["box"], b["kind"]) for b, _ in entries} == {
        (x, k.value) for x in BOXES for k in Kind
    }
    by_kind: dict[str, float] = {}
    for labels, value in entries:
        by_kind[labels["kind"]] = by_kind.get(labels["kind"], 0) + value
    assert {k: v for k, v in by_kind.items() if v} == doc["summary"]["by_kind"]
    causes = {b["box"]: v for b, v in got["fleet_drift_causes"]}
    for box in doc["boxes"]:
        assert causes[box["box"]] == len({d["cause"] for d in box["drifts"]})
    assert {b["box"]: v for b, v in got["fleet_drift_observation_errors"]} == dict.fromkeys(
        BOXES, 0
    )
    ((_, stamp),) = got["fleet_drift_last_run_timestamp_seconds"]
    ((_, took),) = got["fleet_drift_last_run_duration_seconds"]
    # A replay is stamped with when its snapshot was taken, not when it was replayed.
    taken = json.loads((SNAPSHOT / "index.json").read_text())["taken_at"]
    when = datetime.strptime(taken, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    assert stamp == when and 0 < took < 60
    assert got["fleet_drift_last_run_exit_code"] == [({}, 2.0)]
    stamps = {b["box"]: v for b, v in got["fleet_drift_box_last_run_timestamp_seconds"]}
    assert stamps == dict.fromkeys(BOXES, stamp)
    collect = {b["box"]: v for b, v in got["fleet_drift_box_collect_duration_seconds"]}
    for box in BOXES:
        saved = json.loads((SNAPSHOT / f"{box}.json").read_text())
        assert collect[box] == saved["collected"]["timings_ms"]["total"] / 1000
    for series in got.values():
        for labels, _ in series:
            assert set(labels) <= ALLOWED_LABELS


def test_audit_metrics_hold_the_verdicts_as_labelled_gauges(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prom = tmp_path / "fleet_audit.prom"
    code, _, _ = reconcile(
        capsys, "audit", "--from-snapshot", str(AUDIT_FIXTURES / "weakest_link_proven_live"),
        "--metrics", str(prom), "--no-history", root=ROOT,
    )  # fmt: skip
    assert code == 2
    got = samples(prom)
    verdicts = {(b["box"], b["verdict"]): v for b, v in got["fleet_audit_verdict"]}
    assert verdicts == {(box, v): float(v == "ok") for box in BOXES for v in ("ok", "warn", "fail")}
    mesh = {b["verdict"]: v for b, v in got["fleet_audit_mesh_verdict"]}
    assert mesh == {"ok": 0.0, "warn": 0.0, "fail": 1.0}  # the weakest link, proven live
    assert {b["box"]: v for b, v in got["fleet_audit_box_reachable"]} == dict.fromkeys(BOXES, 1)
    assert "fleet_audit_last_run_timestamp_seconds" in got


def test_a_box_not_observed_reads_0_with_its_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = tmp_path / "one-box"
    snapshot.mkdir()
    (snapshot / "thor.json").write_text((SNAPSHOT / "thor.json").read_text())
    index = json.loads((SNAPSHOT / "index.json").read_text())
    (snapshot / "index.json").write_text(json.dumps({**index, "boxes": ["thor"]}))
    prom = tmp_path / "m.prom"
    code, _, _ = reconcile(
        capsys, "drift", "thor", "spark", "--from-snapshot", str(snapshot),
        "--metrics", str(prom), "--no-history",
    )  # fmt: skip
    assert code == 1
    got = samples(prom)
    assert {b["box"]: v for b, v in got["fleet_drift_box_reachable"]} == {"thor": 1, "spark": 0}
    errors = {b["box"]: v for b, v in got["fleet_drift_observation_errors"]}
    assert errors["spark"] >= 1 and errors["thor"] == 0
    collected = {b["box"] for b, _ in got["fleet_drift_box_collect_duration_seconds"]}
    assert collected == {"thor"}  # spark gave no answer: no collector time, not a 0


def test_an_unwritable_target_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    code, out, err = reconcile(
        capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--history", str(db),
        "--metrics", str(tmp_path / "missing" / "m.prom"),
    )  # fmt: skip
    assert (code, out) == (1, "")
    assert "does not exist" in err
    assert not db.exists()


def test_the_file_is_replaced_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prom = tmp_path / "m.prom"
    prom.write_text("old\n")
    inode = prom.stat().st_ino
    reconcile(
        capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--metrics", str(prom), "--no-history"
    )
    assert prom.stat().st_ino != inode  # renamed over, never rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.prom"]  # no temporary file left
    assert "fleet_drift_entries" in prom.read_text()
