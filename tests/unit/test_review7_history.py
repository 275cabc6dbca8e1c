"""The history and the alert rules after the seventh review (history-reviewer): `reconcile diff`
compares an entry's desired value too (an edited desired state said "nothing changed", exit 0);
`reconcile history --keep/--days/--max-mb` says a store whose directory cannot be created as an
error, not a traceback; a reader reads one snapshot of the store (a run recorded meanwhile
applied the retention and deleted the run `diff` was reading); FleetDrift holds a drifting
box's last counts while the box is not observed (it resolved as soon as the box went dark).
On captured lab data (examples/lab-incidents), through the CLI."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from ruamel.yaml import YAML

from reconciler.history import store
from reconciler.history.diff import Side, diff_sides, render_text, to_json
from reconciler.history.record import EntryRow
from tests.unit.history_helpers import (
    INCIDENTS,
    ROOT,
    SNAPSHOT,
    edited_snapshot,
    reconcile,
    recreate_worker_and_drop_shell_key,
    replay,
    unreachable,
    unvouched,
)

PROMTOOL = "/opt/fleet-lab/bin/promtool"  # as tests/unit/test_monitoring_examples.py runs it
MONITORING = ROOT / "examples" / "monitoring"


# -- 1. a desired value that changed is a change ----------------------------------------------


def edited_desired_runs(tmp_path: Path, capsys: Any) -> tuple[Path, Path]:
    """The incidents replayed twice into one store, thor's box-wide VLLM_GDN_DECODE_KERNEL
    edited from triton to flashinfer in between (the reviewer's repro); the fleet's copy."""
    fleet = tmp_path / "fx"
    shutil.copytree(INCIDENTS, fleet)
    db = tmp_path / "fx.sqlite3"
    replay(capsys, db, fleet / "snapshot", root=fleet)
    thor = fleet / "group_vars" / "thor.yaml"
    text = thor.read_text()
    assert "VLLM_GDN_DECODE_KERNEL: triton\n" in text
    thor.write_text(
        text.replace("VLLM_GDN_DECODE_KERNEL: triton\n", "VLLM_GDN_DECODE_KERNEL: flashinfer\n")
    )
    assert "flashinfer" in replay(capsys, db, fleet / "snapshot", root=fleet)
    return db, fleet


def test_an_edited_desired_value_is_a_change_in_text_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, fleet = edited_desired_runs(tmp_path, capsys)
    code, out, err = reconcile(capsys, "diff", "--history", str(db), root=fleet)
    assert code == 2, out + err  # the docs: 2 something changed
    assert "nothing changed" not in out
    assert (
        "  ~ thor envfile file:.env VLLM_GDN_DECODE_KERNEL: desired flashinfer, observed null "
        "[cause envfile:VLLM_GDN_DECODE_KERNEL] (desired triton -> flashinfer; "
        "was desired triton, observed null)"
    ) in out.splitlines(), out
    # The example's renders predate bases: edited, thor's no longer reads as this state's
    # (render_basis.stale_without_basis), so its lanes, and the `KEY=` line only a render's
    # env_file readers tell from no line, are not compared in the second run, and said so.
    assert (
        "  thor: render not observed in run 2: its entries on the lanes and the gateway not "
        "compared" in out.splitlines()
    ), out
    assert out.splitlines()[-1].startswith("diff: 0 entries appeared, 1 cleared, 1 changed"), out
    assert (
        "  - thor envfile file:.env CULTURE_VLLM_API_KEY: desired , observed null "
        "[cause envfile:CULTURE_VLLM_API_KEY]" in out.splitlines()
    ), out
    code, out, _ = reconcile(capsys, "diff", "--history", str(db), "--format", "json", root=fleet)
    doc = json.loads(out)
    assert code == 2 and doc["changed"] is True
    (item,) = doc["reworded"]
    assert item["differs"] == ["desired"]
    assert (item["before"]["desired"], item["after"]["desired"]) == ("triton", "flashinfer")
    assert item["after"]["path"] == "VLLM_GDN_DECODE_KERNEL"


# thor's GATEWAY_API_KEY entries as the incidents' replay stores them (secrets as `***`).
def _secret(desired: str, *, secret: bool = True, changed: bool | None = True) -> EntryRow:
    return EntryRow(
        "thor", "envfile", "file:.env", "GATEWAY_API_KEY", "envfile:GATEWAY_API_KEY", False,
        "rewrite-env", desired, "null", secret, changed,
    )  # fmt: skip


def _diff(before: EntryRow, after: EntryRow) -> tuple[str, dict[str, Any]]:
    a, b = Side("run 1", entries=(before,)), Side("run 2", entries=(after,))
    result = diff_sides(a, b)
    assert result.changed
    return render_text(result), to_json(result)


def test_a_secrets_desired_value_is_said_masked() -> None:
    """A secret now desired (null -> `***`), and one whose store holds a clear desired value
    (hand-edited, or kept clear in the other run): the `~` line says `***`, as it says a
    secret's observed value, never the value."""
    text, doc = _diff(_secret("null"), _secret('"***"'))
    assert "(desired null -> ***; was *** (changed))" in text, text
    assert doc["reworded"][0]["differs"] == ["desired"]
    text, _ = _diff(_secret('"hunter2-clear"'), _secret("null"))
    assert "(desired *** -> null; was *** (changed))" in text, text
    assert "hunter2" not in text
    # Kept as a secret in one run only: the other run's value is that secret's too.
    text, _ = _diff(_secret('"***"'), _secret('"hunter2-clear"', secret=False, changed=None))
    assert "(desired *** -> ***; was *** (changed))" in text, text
    text, _ = _diff(_secret('"***"'), _secret('"***"', changed=False))  # no desired change
    assert "desired ***" not in text and "(was *** (changed))" in text, text


# -- 2. a store whose directory cannot be created ---------------------------------------------


@pytest.mark.parametrize("limit", [["--keep", "5"], ["--days", "3"], ["--max-mb", "9"]])
def test_history_retention_with_a_file_on_the_stores_way_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], limit: list[str]
) -> None:
    (tmp_path / "afile").write_text("")
    db = tmp_path / "afile" / "sub" / "h.sqlite3"
    code, out, err = reconcile(capsys, "history", *limit, "--history", str(db))
    assert code == 1 and not out
    assert err == (
        f"error: history: {db} cannot be used: {tmp_path / 'afile'} is not a directory\n"
    ), err


def test_a_store_that_cannot_be_made_private_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other file-system refusal of opening to write: chmod 0600 not permitted (root
    can chmod anything here, so the refusal is injected where store.opened meets it)."""
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)

    def refused(path: Path) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted", str(path))

    monkeypatch.setattr(store, "restrict", refused)
    code, out, err = reconcile(capsys, "history", "--keep", "5", "--history", str(db))
    assert code == 1 and not out
    assert err == f"error: history: {db} cannot be used: operation not permitted (EPERM)\n", err


# -- 3. a reader reads one snapshot -----------------------------------------------------------


def test_diff_reads_its_runs_from_one_snapshot_while_another_run_prunes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timer's run records a run (another connection, as another process) while `diff`
    reads run 1 statement by statement, and its retention deletes run 1: the diff still
    compares run 1 as it was when the diff opened the store (before: "N entries appeared",
    `(observation): added null`)."""
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    edited = edited_snapshot(tmp_path, "s2", recreate_worker_and_drop_shell_key)
    unvouched(edited)
    replay(capsys, db, edited)
    args = ("diff", "1", "2", "--history", str(db), "--format", "json")
    code, quiet, _ = reconcile(capsys, *args)
    assert code == 2
    read = store.entries_of
    pruned: list[int] = []

    def entries_of(conn: Any, run: int) -> Any:
        if not pruned:  # after run 1's boxes were read, before its entries
            with store.opened(db) as other:
                pruned.append(store.set_retention(other, 1, None))
        return read(conn, run)

    monkeypatch.setattr(store, "entries_of", entries_of)
    code, raced, err = reconcile(capsys, *args)
    assert pruned == [1]  # run 1 is gone from the store
    assert code == 2 and not err, err
    assert json.loads(raced) == json.loads(quiet)


@pytest.mark.parametrize("more", [[], ["--keep", "0"]])
def test_history_lists_one_snapshot_of_its_runs(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    more: list[str],
) -> None:
    """`reconcile history` reads the runs, then each run's boxes: a run pruned in between
    was listed without its boxes. The same after `--keep` applied the retention (0: any
    number, so this one removes nothing)."""
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    replay(capsys, db, SNAPSHOT)
    args = ("history", *more, "--history", str(db), "--format", "json")
    code, quiet, _ = reconcile(capsys, *args)
    assert code == 0 and len(json.loads(quiet)["runs"]) == 2
    read = store.boxes_of
    pruned: list[int] = []

    def boxes_of(conn: Any, run: int) -> Any:
        if not pruned:
            with store.opened(db) as other:
                pruned.append(store.set_retention(other, 1, None))
        return read(conn, run)

    monkeypatch.setattr(store, "boxes_of", boxes_of)
    code, raced, err = reconcile(capsys, *args)
    assert pruned == [1] and code == 0 and "error" not in err, err
    assert json.loads(raced) == json.loads(quiet)


# -- 4. FleetDrift while a drifting box is not observed ---------------------------------------


def drift_metrics(tmp_path: Path, capsys: Any, snapshot: Path) -> dict[str, float]:
    """The drift metrics a replay of `snapshot` writes: {series as promtool reads it: value}."""
    prom = tmp_path / f"{snapshot.name}.prom"
    code, _, err = reconcile(
        capsys, "drift", "--from-snapshot", str(snapshot), "--metrics", str(prom), "--no-history"
    )
    assert code in (1, 2) and "Traceback" not in err, err
    out = {}
    for family in text_string_to_metric_families(prom.read_text()):
        for s in family.samples:
            if s.name.startswith("fleet_drift_box_") or s.name == "fleet_drift_entries":
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


def fired(box: str, value: float) -> dict[str, Any]:
    rules = YAML(typ="safe").load((MONITORING / "fleet-alerts.rules.yml").read_text())
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "FleetDrift")
    words = {k: v.replace("{{ $labels.box }}", box) for k, v in rule["annotations"].items()}
    return {
        "exp_labels": {"box": box, **rule["labels"]},
        "exp_annotations": {k: v.replace("{{ $value }}", f"{value:g}") for k, v in words.items()},
    }


def test_fleet_drift_holds_while_a_drifting_box_is_unreachable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The timer's metrics: the incidents (thor drifts) for 40 minutes, then thor
    unreachable (its entries no longer written, no 0: its zero is not known). promtool: the
    alert that fired on thor still fires 15 minutes later, with its last count (before: it
    resolved as soon as the entries' series went stale)."""
    seen = drift_metrics(tmp_path, capsys, SNAPSHOT)
    dark = edited_snapshot(tmp_path, "dark", unreachable("thor"))
    unvouched(dark)
    unseen = drift_metrics(tmp_path, capsys, dark)
    thor = sum(v for k, v in seen.items() if k.startswith('fleet_drift_entries{box="thor"'))
    assert thor > 0 and not [k for k in unseen if k.startswith('fleet_drift_entries{box="thor"')]
    assert unseen['fleet_drift_box_observed{box="thor"}'] == 0
    others = {  # spark and orin drift in both runs: their alert is the same
        box: sum(v for k, v in unseen.items() if k.startswith(f'fleet_drift_entries{{box="{box}"'))
        for box in ("spark", "orin")
    }
    series = [
        {
            "series": name,
            "values": (f"{seen[name]:g}x39 " if name in seen else "_x39 ")
            + (f"{unseen[name]:g}x30" if name in unseen else "stale _x29"),
        }
        for name in dict.fromkeys([*seen, *unseen])
    ]
    expect = [fired("thor", thor), *(fired(b, v) for b, v in others.items() if v > 0)]
    case = {
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": [{"eval_time": "55m", "alertname": "FleetDrift", "exp_alerts": expect}],
    }
    test = tmp_path / "case.test.yml"
    rules = MONITORING / "fleet-alerts.rules.yml"
    doc = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [case]}
    test.write_text(json.dumps(doc))  # JSON is YAML
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(test)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
