"""`reconcile diff` of two audits, one of which did not observe a mesh member in full (thor
unreachable, or not in the run: `audit spark`): the mesh's findings are judged over its
members, so they are listed as not compared, never said to have cleared or appeared. Before,
the findings of a box not compared were left out, but the `(mesh)` ones always compared: an
unreachable member "cleared" mesh.weakest-link (the weakest member simply was not seen)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reconciler.history.diff import FULL, Side, diff_sides, render_text, to_json
from reconciler.history.record import MESH, FindingRow
from tests.unit.history_helpers import AUDIT_FIXTURES, reconcile, unreachable, unvouched

SCENARIO = AUDIT_FIXTURES / "weakest_link_proven_live"  # thor open, spark and orin keyed


def audited(capsys: pytest.CaptureFixture[str], db: Path, snapshot: Path, *boxes: str) -> None:
    code, _, err = reconcile(
        capsys, "audit", *boxes, "--from-snapshot", str(snapshot), "--history", str(db)
    )
    assert code in (0, 1, 2) and "warning" not in err, err


def thor_unreachable(tmp_path: Path) -> Path:
    target = tmp_path / "thor-down"
    shutil.copytree(SCENARIO, target)
    docs = {"thor": json.loads((target / "thor.json").read_text())}
    unreachable("thor")(docs)
    (target / "thor.json").write_text(json.dumps(docs["thor"]))
    unvouched(target)
    return target


def test_a_member_unreachable_in_one_audit_leaves_the_mesh_findings_not_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    audited(capsys, db, SCENARIO)
    audited(capsys, db, thor_unreachable(tmp_path))
    code, out, _ = reconcile(capsys, "diff", "--history", str(db))
    assert "mesh.weakest-link" not in out, out  # neither cleared nor appeared
    assert "  thor: not observed in run 2: not compared" in out
    assert "  (mesh): thor not observed in full in both runs: its findings not compared" in out
    assert code == 2  # thor was reachable, then not
    assert out.rstrip().endswith("1 boxes not compared, the mesh's findings not compared")
    code, out, _ = reconcile(capsys, "diff", "--history", str(db), "--format", "json")
    doc = json.loads(out)
    assert doc["findings_cleared"] == [] and doc["findings_appeared"] == []
    mesh = [u for u in doc["not_compared"] if u["box"] == MESH]
    assert [(u["a"], u["b"], u["columns"]) for u in mesh] == [("full", "partial", None)]


def test_an_audit_of_one_member_leaves_the_mesh_findings_not_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    audited(capsys, db, SCENARIO)
    audited(capsys, db, SCENARIO, "spark")  # mesh.not-in-run would "appear"
    code, out, _ = reconcile(capsys, "diff", "--history", str(db), "--format", "json")
    doc = json.loads(out)
    assert doc["findings_cleared"] == [] and doc["findings_appeared"] == [], out
    assert [u["box"] for u in doc["not_compared"]] == ["thor", "orin", MESH]
    assert code == 0  # a run of fewer boxes is no change; nor is the mesh seen in it


def finding(box: str, code: str) -> FindingRow:
    return FindingRow(box=box, code=code, severity="fail", message=f"{code} on {box}")


def test_mesh_findings_are_compared_when_every_member_was_observed_in_full() -> None:
    a = Side("a", findings=[finding(MESH, "mesh.weakest-link"), finding("thor", "auth.open")])
    b = Side("b", findings=[finding("thor", "auth.open")])
    diff = diff_sides(a, b)
    assert [f.code for f in diff.findings_cleared] == ["mesh.weakest-link"]
    assert diff.not_compared == ()
    # ... and not when a member was not: neither its nor the mesh's findings
    down = Side("b", boxes={"thor": "none", "spark": FULL}, findings=[])
    both = Side("a", boxes={"thor": FULL, "spark": FULL}, findings=a.findings)
    diff = diff_sides(both, down)
    assert (diff.findings_cleared, diff.findings_appeared) == ((), ())
    assert [u.box for u in diff.not_compared] == ["thor", MESH]
    assert "(mesh): thor not observed in full in both runs" in render_text(diff)
    assert to_json(diff)["not_compared"][1]["b"] == "partial"
    # a drift diff (no finding at all) says nothing of the mesh
    diff = diff_sides(Side("a", boxes={"thor": FULL}), Side("b", boxes={"thor": "none"}))
    assert [u.box for u in diff.not_compared] == ["thor"]
