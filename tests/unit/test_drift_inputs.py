"""Drift inputs: everything a drift run takes from the desired state, as plain values, and
remembered only while neither the files nor the code that derived them changed."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from reconciler import drift_inputs as module
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import cached_inputs, drift_inputs, remembered_inputs
from tests.unit.conftest import fresh_python, hosts_inventory


def test_inputs_are_plain_values_equal_to_a_fresh_derivation(repo: Path) -> None:
    fleet = load_fleet(repo, "hosts")
    inputs = drift_inputs(fleet)
    assert inputs.boxes == ("thor", "spark", "orin")
    assert inputs.payload("thor", "k" * 32)["run_key"] == "k" * 32
    assert "run_key" not in inputs.payloads["thor"]  # a run key is never remembered
    assert inputs.targets["spark"].hostname == fleet.connection("spark").ssh_hostname
    assert inputs.bases["orin"].endswith(f":{fleet.boxes['orin'].gateway.port}")
    thor = inputs.expectations["thor"]
    assert thor.contract["hand"].feasible is False  # group_vars/thor.yaml
    assert (
        thor.lanes["vllm-worker"].boot_timeout_s
        == fleet.boxes["thor"].lanes["worker"].boot_timeout_s
    )
    # No validation model anywhere inside: a hit must not need pydantic to unpickle.
    assert b"pydantic" not in pickle.dumps(inputs)
    assert pickle.loads(pickle.dumps(inputs)) == inputs


def test_remembered_inputs_hit_until_a_file_changes(repo: Path) -> None:
    assert cached_inputs(repo, hosts_inventory(repo)) is None
    stored = remembered_inputs(load_fleet(repo, "hosts"), hosts_inventory(repo))
    assert cached_inputs(repo, hosts_inventory(repo)) == stored
    spark = repo / "group_vars" / "spark.yaml"
    spark.write_text(spark.read_text(encoding="utf-8") + "\n# a comment is a change too\n", "utf-8")
    assert cached_inputs(repo, hosts_inventory(repo)) is None


def test_other_code_misses(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    remembered_inputs(load_fleet(repo, "hosts"), hosts_inventory(repo))
    monkeypatch.setattr(module, "CACHE_VERSION", module.CACHE_VERSION + 1)
    assert cached_inputs(repo, hosts_inventory(repo)) is None


def test_a_hit_runs_without_pydantic_or_yaml(repo: Path, tmp_path: Path) -> None:
    """The point of the cache: a repeated drift run imports neither (see BENCHMARKS.md)."""
    remembered_inputs(load_fleet(repo, "hosts"), hosts_inventory(repo))
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from reconciler.drift_inputs import cached_inputs\n"
        "import reconciler.drift, reconciler.report.json_report, reconciler.observe.early\n"
        f"inputs = cached_inputs(Path({str(repo)!r}), Path({str(hosts_inventory(repo))!r}))\n"
        "assert inputs is not None and inputs.boxes == ('thor', 'spark', 'orin')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'ruamel'}))\n"
    )
    assert fresh_python(code, tmp_path / "cache").strip() == "[]"


def test_another_home_misses(repo: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Inventory key paths may start with ~/: remembered targets hold them expanded."""
    remembered_inputs(load_fleet(repo, "hosts"), hosts_inventory(repo))
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    assert cached_inputs(repo, hosts_inventory(repo)) is None


def test_remembered_expectations_load_on_first_use_and_equal_a_fresh_derivation(
    repo: Path, tmp_path: Path
) -> None:
    """A repeated drift sends the boxes their work from the remembered targets and payloads
    before the comparison's types are imported; the expectations come back whole when the
    comparison first asks for one."""
    stored = remembered_inputs(load_fleet(repo, "hosts"), hosts_inventory(repo))
    code = (
        "import sys, pickle\n"
        "from pathlib import Path\n"
        "from reconciler.drift_inputs import cached_inputs\n"
        f"inputs = cached_inputs(Path({str(repo)!r}), Path({str(hosts_inventory(repo))!r}))\n"
        "assert inputs is not None and inputs.payload('thor', 'k' * 32)['run_key'] == 'k' * 32\n"
        "before = sorted(m for m in ('reconciler.compare.context', 'reconciler.desired.entries')"
        " if m in sys.modules)\n"
        "print(before, inputs.expectations['thor'].name)\n"
        "print(pickle.dumps(dict(inputs.expectations)).hex())\n"
    )
    said, expectations = fresh_python(code, tmp_path / "cache").splitlines()
    assert said == "[] thor"
    assert pickle.loads(bytes.fromhex(expectations)) == dict(stored.expectations)
    again = cached_inputs(repo, hosts_inventory(repo))
    assert again == stored and len(again.expectations) == 3  # equal as a whole, too
