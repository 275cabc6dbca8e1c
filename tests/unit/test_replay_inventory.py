"""`drift --from-snapshot` judges the snapshot against the inventory its index names unless one
is chosen (as `reconcile diff --from-snapshot` does): replayed against the default `hosts`, a
lab snapshot read every box as observed elsewhere than desired ("not compared", exit 0)."""

from __future__ import annotations

import json

import pytest

from reconciler import cli
from tests.unit.history_helpers import INCIDENTS, SNAPSHOT


def _replay(capsys: pytest.CaptureFixture[str], *choice: str) -> tuple[int, dict, str]:
    code = cli.main(
        ["--root", str(INCIDENTS), *choice, "drift", "--from-snapshot", str(SNAPSHOT),
         "--format", "json"]
    )  # fmt: skip
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def test_a_replay_without_a_chosen_inventory_takes_the_snapshots(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLEET_INVENTORY", raising=False)
    index = json.loads((SNAPSHOT / "index.json").read_text())
    code, doc, err = _replay(capsys)
    assert doc["inventory"].endswith(index["inventory"]) and "warning" not in err
    assert code == 2 and all(not b["errors"] for b in doc["boxes"]), doc["boxes"]
    again, chosen, _ = _replay(capsys, "-i", "lab")
    assert (again, chosen["boxes"]) == (code, doc["boxes"])


def test_a_chosen_inventory_is_kept_and_said(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLEET_INVENTORY", raising=False)
    _, doc, err = _replay(capsys, "-i", "hosts")
    assert doc["inventory"].endswith("hosts.yaml")
    assert "judged against the inventory hosts" in err and "taken against" in err
    assert any(b["errors"] for b in doc["boxes"])


def test_an_empty_chosen_inventory_is_refused_by_the_load_not_by_the_choice(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty FLEET_INVENTORY names no file (snapshot_inventory.py catches the loader's
    refusal, whose type it imports only then); the load that follows refuses it, once, as an
    error (exit 1)."""
    monkeypatch.setenv("FLEET_INVENTORY", " ")  # -i refuses an empty value itself
    code = cli.main(
        ["--root", str(INCIDENTS), "drift", "--from-snapshot", str(SNAPSHOT), "--format", "json"]
    )
    err = capsys.readouterr().err
    assert code == 1, err
    assert "judged against the inventory" in err  # differs from the index's `lab`: said
    assert err.count("FLEET_INVENTORY is set but empty") == 1, err
    assert "Traceback" not in err
