"""Drift inputs: everything a drift run takes from the desired state, as plain values, and
remembered only while neither the files nor the code that derived them changed."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

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


def test_every_protocol_round_trips_the_inputs_in_band(repo: Path) -> None:
    inputs = drift_inputs(load_fleet(repo, "hosts"))
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        again = pickle.loads(pickle.dumps(inputs, protocol))
        assert again == inputs, protocol
        assert dict(again.payloads) == dict(inputs.payloads)


def test_remembered_expectations_and_payloads_are_read_from_the_mapped_file(repo: Path) -> None:
    """The bulk of the entry (each box's expectation and payload) stays in the cache file,
    mapped: opening the entry copies none of it, and a box is unpickled from its own pages."""
    import mmap

    stored = remembered_inputs(load_fleet(repo, "hosts"), hosts_inventory(repo))
    again = cached_inputs(repo, hosts_inventory(repo))
    assert again is not None
    for per_box in (again.expectations, again.payloads):
        assert isinstance(per_box, module._PerBox)
        assert isinstance(per_box._data.obj, mmap.mmap)  # a view of the file, not a copy
        assert per_box._value == {}  # nothing unpickled yet
    assert again.expectations["spark"] == stored.expectations["spark"]
    assert list(again.expectations._value) == ["spark"]  # that box only
    assert again.payload("orin", "k" * 32) == stored.payload("orin", "k" * 32)


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: b"\x80\x05" + data[8:],  # no magic: the format of an older release
        lambda data: data + b"\x00",  # padded
        lambda data: data[:-1],  # cut short
        lambda data: data[:8] + (10**6).to_bytes(8, "little") + data[16:],  # a pickle too long
        lambda data: data[:16] + (2**40).to_bytes(8, "little") + data[24:],  # absurd buffers
        lambda data: b"",  # empty (nothing to map)
    ],
    ids=["no-magic", "padded", "cut", "long-pickle", "many-buffers", "empty"],
)
def test_a_damaged_entry_file_is_a_miss_and_is_written_again(repo: Path, damage: Any) -> None:
    from reconciler.desired.fingerprint import entry_name

    remembered_inputs(load_fleet(repo, "hosts"), hosts_inventory(repo))
    path = entry_name(module.KIND, repo, hosts_inventory(repo)).with_suffix(".pickle")
    path.write_bytes(damage(path.read_bytes()))
    assert cached_inputs(repo, hosts_inventory(repo)) is None
    stored = remembered_inputs(load_fleet(repo, "hosts"), hosts_inventory(repo))
    assert cached_inputs(repo, hosts_inventory(repo)) == stored


def test_mesh_seeds_are_stored_once_not_per_box(tmp_path: Path) -> None:
    """Each box's LOBES_MESH_SEEDS names every other member: stored as text in every box's
    part, the entry grew as the square of the fleet (58 MB at 1,000 boxes). It is stored as a
    reference to the mesh's origins, kept once, and read back as the same text."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.scale_fleet import build_fleet

    sizes = {}
    for count in (30, 60):
        root = tmp_path / f"fleet-{count}"
        build_fleet(root, count)
        inputs = drift_inputs(load_fleet(root, "lab"))
        data = pickle.dumps(inputs, pickle.HIGHEST_PROTOCOL)
        seeds = {e.value for e in inputs.expectations["thor-1"].env if e.key == "LOBES_MESH_SEEDS"}
        (text,) = seeds
        assert isinstance(text, str) and text.count(",") == count - 2  # every other member
        assert text.encode() not in data
        back = pickle.loads(data)
        assert back == inputs  # every box's expectation and payload, seeds included
        assert (
            back.payloads["orin-2"]["managed_env"]["LOBES_MESH_SEEDS"]
            == (inputs.payloads["orin-2"]["managed_env"]["LOBES_MESH_SEEDS"])
        )
        sizes[count] = len(data)
    # Twice the boxes, about twice the bytes (the square would be four times)
    assert sizes[60] < 2.3 * sizes[30], sizes


def test_seeds_other_than_the_meshs_are_stored_as_they_are(repo: Path) -> None:
    """Only a text equal to the box's seeds as the mesh derives them becomes a reference;
    any other (a caller's own inputs) is stored as itself."""
    inputs = drift_inputs(load_fleet(repo, "hosts"))
    odd = "x" * 300
    swapped = {**inputs.payloads["thor"], "managed_env": {"LOBES_MESH_SEEDS": odd}}
    changed = inputs._replace(
        payloads={**inputs.payloads, "thor": swapped},
        mesh_origins=("http://a:1", "y" * 300),
        mesh_position={"thor": 0},
    )
    data = pickle.dumps(changed, pickle.HIGHEST_PROTOCOL)
    assert odd.encode() in data
    back = pickle.loads(data)
    assert back.payloads["thor"]["managed_env"]["LOBES_MESH_SEEDS"] == odd
    assert back.payloads == changed.payloads


def test_an_equal_copy_of_the_seeds_is_stored_as_text_and_read_back_equal(
    tmp_path: Path,
) -> None:
    """A box's seeds become a reference where its values hold the payload's own seeds object
    (a memo slot its pickle fills first, drift_inputs._SEEDS_IN_SLOT_0); an equal text that
    is another object is pickled as itself. Either way each box reads back equal."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.scale_fleet import build_fleet

    build_fleet(tmp_path, 30)
    inputs = drift_inputs(load_fleet(tmp_path, "lab"))
    held = inputs.payloads["thor-1"]["managed_env"]["LOBES_MESH_SEEDS"]
    entries = inputs.expectations["thor-1"].env
    at = next(i for i, e in enumerate(entries) if e.key == "LOBES_MESH_SEEDS")
    assert entries[at].value is held  # one object: the reference covers both
    plain = pickle.dumps(inputs, pickle.HIGHEST_PROTOCOL)
    assert held.encode() not in plain

    from reconciler.desired.entries import EnvEntry
    from reconciler.records import replace

    copy = "".join(list(held))
    assert copy == held and copy is not held

    copied = EnvEntry(entries[at].key, copy, entries[at].origin)
    changed_env = type(entries)([*entries[:at], copied, *entries[at + 1 :]])
    thor_1 = replace(inputs.expectations["thor-1"], env=changed_env)
    changed = inputs._replace(expectations={**inputs.expectations, "thor-1": thor_1})
    data = pickle.dumps(changed, pickle.HIGHEST_PROTOCOL)
    assert data.count(held.encode()) == 1  # the copy, in thor-1's expectation alone
    back = pickle.loads(data)
    assert back == changed
    assert back.expectations["thor-1"] == inputs.expectations["thor-1"]


def test_a_replay_keeps_no_box_expectation_it_compared(repo: Path, tmp_path: Path) -> None:
    """Each box's remembered expectation holds its mesh seeds, which name every member: a
    replay (each worker its share) that kept every box it compared held memory growing as the
    square of the fleet (~17 MB a worker at 1,000 boxes, BENCHMARKS.md's linearity). A box's
    is unpickled for its comparison and dropped after it; asked for again, it is the same."""
    from reconciler.drift import run_drift_on

    remembered_inputs(load_fleet(repo, "hosts"), hosts_inventory(repo))
    inputs = cached_inputs(repo, hosts_inventory(repo))
    assert inputs is not None and isinstance(inputs.expectations, module._PerBox)
    fresh = drift_inputs(load_fleet(repo, "hosts"))
    snapshot = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents" / "snapshot"
    run = run_drift_on(
        inputs, ["thor", "spark", "orin"], from_snapshot=snapshot, keep_observations=False
    )
    assert [b.box for b in run.report.boxes] == ["thor", "spark", "orin"]
    assert inputs.expectations._value == {}  # none kept
    assert inputs.expectations["thor"] == fresh.expectations["thor"]  # asked again: the same
