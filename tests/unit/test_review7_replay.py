"""A snapshot replayed against a desired state edited since it was saved (review 7, replays).

tests/fixtures/replay_review7/snapshot/ is the lab observed by `drift --save-snapshot` (spark
and thor; orin left out of the index, its facts kept), secrets hashed as saved. Replayed
against the lab's desired state with one thing changed:

1. a secret's source (its key, its file): the snapshot's digest is the old source's, which was
   compared as the new one's (a changed secret reported in sync, a missing file not said);
2. spark's deployment directory or ssh_user: the old directory's answer was compared as the
   new one's (no error where a live drift says the directory does not exist);
4. without BOX arguments, an inventory box the snapshot does not hold left the run unsaid;
6. a box file edited since it was saved: its index digest no longer matched, and nothing said so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.box import Replayed, compare_box, misplaced, replayed
from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import BoxResult, Kind, Part
from reconciler.compare.envfile import stale_sources, under_home
from reconciler.desired.facts import snapshot_facts
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import DriftInputs, drift_inputs
from reconciler.observe.document import Observed, SecretSource, SourceSpec, parse_collected
from reconciler.observe.observe import (
    load_snapshot,
    recorded_digest,
    snapshot_index,
    snapshot_observation,
)
from reconciler.records import replace
from tests.unit.conftest import load_box_program

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = REPO / "tests/fixtures/replay_review7/snapshot"


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def fleet_root(tmp_path: Path, edits: dict[str, tuple[str, str]] | None = None) -> Path:
    """A copy of the lab's desired state, each `file: (old, new)` of `edits` made once."""
    root = tmp_path / "fleet"
    for part in ("group_vars", "inventory"):
        shutil.copytree(REPO / part, root / part)
    for name, (old, new) in (edits or {}).items():
        path = root / name
        text = path.read_text(encoding="utf-8")
        assert text.count(old) == 1, (name, old)
        path.write_text(text.replace(old, new), encoding="utf-8")
    return root


def inputs(root: Path) -> DriftInputs:
    return drift_inputs(load_fleet(root, "lab", facts=snapshot_facts(SNAPSHOT)))


def docs() -> dict[str, Observed]:
    out = {}
    for name, obs in load_snapshot(SNAPSHOT)[1].items():
        assert obs.document is not None and obs.altered is None, name
        out[name] = obs.document
    return out


def against(found: DriftInputs, box: str, altered: str | None = None) -> Replayed:
    """What a replay of `box` is replayed against: the desired state's directory, ssh_user and
    secret sources, as its collector payload tells them."""
    payload = found.payloads[box]
    secrets = dict(payload["box_secrets"])
    secrets.update({n: {"variable": v} for n, v in payload["controller_secrets"].items()})
    return replayed(payload["directory"], found.targets[box].user, secrets, altered)


def replay(found: DriftInputs, box: str, doc: Observed, altered: str | None = None) -> BoxResult:
    """compare_box as a replay calls it."""
    exp: BoxExpectation = found.expectations[box]
    return compare_box(exp, doc, replay=against(found, box, altered))


def errors_of(result: BoxResult, part: Part) -> list[str]:
    return [str(e) for e in result.errors if getattr(e, "part", None) is part]


# -- 1. a secret's source changed since the snapshot was saved ------------------------------------
KEY_CHANGED = {
    "group_vars/all.yaml": ("    key: GATEWAY_API_KEY\n", "    key: LOBES_MESH_KEY\n"),
}
FILE_CHANGED = {
    "group_vars/all.yaml": (
        "  gateway_api_key:             # this box's inbound gateway key (each box has its own)\n"
        "    source: box_file\n    path: ~/.lobes/.secrets.env\n",
        "  gateway_api_key:\n    source: box_file\n    path: ~/.lobes/.gw-secrets.env\n",
    )
}


def test_the_collector_records_each_source_it_read(tmp_path: Path) -> None:
    """Each secret_sources entry says which source it is (names, never a value), also where
    it was not found; the controller reads it back."""
    collector = load_box_program("fleet_collector_rv7", "reconciler/observe/remote/collector.py")
    home = tmp_path / "home"
    (home / ".lobes").mkdir(parents=True)
    (home / ".lobes" / ".secrets.env").write_text("GATEWAY_API_KEY=sk-canary-4f1d2a\n")
    given = str(home / ".lobes" / ".secrets.env")
    run = collector.Run(
        {
            "run_key": "k" * 32,
            "directory": str(home / ".lobes"),
            "box_secrets": {
                "gw": {"path": given, "key": "GATEWAY_API_KEY"},
                "gone": {"path": str(home / "missing.env"), "key": "X"},
            },
            "controller_secrets": {"sent": "FLEET_KEY"},
        }
    )
    shown, _ = collector.secret_sources(run, {})
    assert shown["gw"]["source"] == {"path": given, "expanded": given, "key": "GATEWAY_API_KEY"}
    assert shown["gone"]["source"]["key"] == "X" and shown["gone"]["status"] == "file-missing"
    assert shown["sent"]["source"] == {"variable": "FLEET_KEY"}
    assert "sk-canary" not in json.dumps(shown)
    doc = parse_collected({"secret_sources": shown}, complete=False, version=1)
    assert isinstance(doc, Observed)
    spec = doc.secret_sources["gw"].spec
    assert spec is not None and (spec.path, spec.key) == (given, "GATEWAY_API_KEY")
    sent = doc.secret_sources["sent"].spec
    assert sent is not None and sent.variable == "FLEET_KEY"


def test_the_saved_snapshot_kept_each_sources_record() -> None:
    """The premise of the replays below: the lab's answer, saved masked as every snapshot is,
    still holds each source's record (`source` is a secret record's metadata)."""
    spark = docs()["spark"].secret_sources["gateway_api_key"]
    assert spark.status == "ok" and spark.spec is not None
    assert (spark.spec.path, spark.spec.key) == ("~/.lobes/.secrets.env", "GATEWAY_API_KEY")
    assert spark.spec.expanded == "/home/fl-spark/.lobes/.secrets.env"


def test_an_unchanged_state_reads_every_source(tmp_path: Path) -> None:
    found = inputs(fleet_root(tmp_path))
    for name, doc in docs().items():
        result = replay(found, name, doc)
        assert errors_of(result, Part.SECRET_SOURCE) == [], name
        assert misplaced(doc, against(found, name)) is None


def test_a_secret_read_from_another_key_is_not_compared(tmp_path: Path) -> None:
    """e9a: the key changed. A live drift reads the new key and reports GATEWAY_API_KEY changed;
    the replay compared the old key's digest and called spark's line in sync."""
    found = inputs(fleet_root(tmp_path, KEY_CHANGED))
    result = replay(found, "spark", docs()["spark"])
    (error,) = errors_of(result, Part.SECRET_SOURCE)
    assert error.startswith("secret gateway_api_key: not in this observation's secret_sources")
    assert (
        "the snapshot read another source (~/.lobes/.secrets.env, key GATEWAY_API_KEY; "
        "desired ~/.lobes/.secrets.env, key LOBES_MESH_KEY)"
    ) in error
    assert error.endswith("its .env line not compared")
    assert not [d for d in result.drifts if d.path == "GATEWAY_API_KEY"]
    # the other secrets of the same file are still read
    assert not [e for e in result.errors if "mesh_key" in e or "hf_token" in e]


def test_a_secret_read_from_another_file_is_not_compared(tmp_path: Path) -> None:
    """e9b: the file changed (missing on the box: a live drift says file-missing, exit 1)."""
    found = inputs(fleet_root(tmp_path, FILE_CHANGED))
    for name, doc in docs().items():
        result = replay(found, name, doc)
        (error,) = errors_of(result, Part.SECRET_SOURCE)
        assert "desired ~/.lobes/.gw-secrets.env, key GATEWAY_API_KEY)" in error, name


ENV_LINE = {
    "group_vars/all.yaml": (
        "  gateway_api_key:             # this box's inbound gateway key (each box has its own)\n"
        "    source: box_file\n    path: ~/.lobes/.secrets.env\n",
        "  gateway_api_key:\n    source: box_file\n    path: ~/.lobes/.env\n",
    )
}


def test_a_secret_read_from_the_deployments_env_is_read_from_its_envfile(tmp_path: Path) -> None:
    """`reconcile import` points a key no other file holds at its `.env` line: the answer holds
    that file, so the replay reads it as a live drift does (lab, live against this state:
    spark in sync, thor `secret gateway_api_key: key-missing (~/.lobes/.env)`)."""
    found = inputs(fleet_root(tmp_path, ENV_LINE))
    spark = replay(found, "spark", docs()["spark"])
    assert errors_of(spark, Part.SECRET_SOURCE) == []
    assert not [d for d in spark.drifts if d.path == "GATEWAY_API_KEY"]
    thor = replay(found, "thor", docs()["thor"])
    assert errors_of(thor, Part.SECRET_SOURCE) == [
        "secret gateway_api_key: key-missing (~/.lobes/.env)"
    ]
    assert not [d for d in thor.drifts if d.kind is Kind.ENVFILE and d.path == "GATEWAY_API_KEY"]


def test_an_older_snapshot_tells_its_sources_by_path_alone() -> None:
    """A snapshot saved before the collector recorded its sources: another path (or another
    kind of source) is seen; a key changed alone cannot be."""
    spark = docs()["spark"]
    old = {n: SecretSource(s.status, s.path, s.digest) for n, s in spark.secret_sources.items()}
    older = replace(spark, secret_sources=old)
    same = SourceSpec(path="~/.lobes/.secrets.env", key="GATEWAY_API_KEY")
    assert stale_sources(older, {"gateway_api_key": same}, older.home) == {}
    key = SourceSpec(path="~/.lobes/.secrets.env", key="LOBES_MESH_KEY")
    assert stale_sources(older, {"gateway_api_key": key}, older.home) == {}
    moved = SourceSpec(path="~/.lobes/.gw-secrets.env", key="GATEWAY_API_KEY")
    (why,) = stale_sources(older, {"gateway_api_key": moved}, older.home).values()
    assert why == (
        "the snapshot read another source (~/.lobes/.secrets.env; desired "
        "~/.lobes/.gw-secrets.env, key GATEWAY_API_KEY)"
    )
    sent = SourceSpec(variable="FLEET_GATEWAY_KEY")
    assert stale_sources(older, {"gateway_api_key": sent}, older.home)
    assert stale_sources(spark, {"gateway_api_key": sent}, spark.home)


# -- 2. another deployment directory or ssh_user --------------------------------------------------
DIRECTORY_CHANGED = {
    "group_vars/spark.yaml": ("deployment:\n", "deployment:\n  directory: ~/lobes\n")
}
USER_CHANGED = {"inventory/lab.yaml": ("ssh_user: fl-spark\n", "ssh_user: fl-spark2\n")}


def test_another_deployment_directory_is_not_compared(tmp_path: Path) -> None:
    """e13: a live drift says `deployment directory /home/fl-spark/lobes does not exist`."""
    found = inputs(fleet_root(tmp_path, DIRECTORY_CHANGED))
    result = replay(found, "spark", docs()["spark"])
    assert [str(e) for e in result.errors] == [
        "snapshot: observed /home/fl-spark/.lobes as fl-spark; desired /home/fl-spark/lobes as "
        "fl-spark: not compared"
    ]
    assert result.reachable and result.drifts == ()
    assert replay(found, "thor", docs()["thor"]).drifts  # thor's directory did not change


def test_another_user_is_not_compared(tmp_path: Path) -> None:
    found = inputs(fleet_root(tmp_path, USER_CHANGED))
    result = replay(found, "spark", docs()["spark"])
    (error,) = errors_of(result, Part.DEPLOYMENT)
    assert error.endswith("observed /home/fl-spark/.lobes as fl-spark; desired ~/.lobes as "
                          "fl-spark2: not compared")  # fmt: skip
    assert result.drifts == ()


@pytest.mark.parametrize("home", ["/home/fl-spark", "/home/fl-spark/", "/"])
def test_the_directory_is_expanded_as_the_collector_expands_it(
    home: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer for the desired directory always matches, whatever the box's HOME."""
    monkeypatch.setenv("HOME", home)
    said_home, said_dir = os.path.expanduser("~"), os.path.expanduser("~/.lobes")
    assert under_home("~/.lobes", said_home) == said_dir
    doc = replace(docs()["spark"], home=said_home, deploy_dir=said_dir)
    assert misplaced(doc, Replayed("~/.lobes", "fl-spark")) is None
    assert misplaced(doc, Replayed("~/lobes", "fl-spark")) is not None
    assert misplaced(doc, Replayed(None, None)) is None  # not known: not told apart


# -- 4. an inventory box the snapshot does not hold ------------------------------------------------
def reconcile(*argv: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    env.pop("FLEET_INVENTORY", None)
    env.pop("FLEET_ROOT", None)
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_an_inventory_box_the_snapshot_lacks_is_said(tmp_path: Path) -> None:
    """orin is in the inventory, not in the snapshot: the replay judges spark and thor, as
    before, and says so; named, orin is not observed (exit 1)."""
    root = fleet_root(tmp_path)
    run = reconcile("--root", str(root), "-i", "lab", "drift", "--from-snapshot", str(SNAPSHOT),
                    cache=tmp_path / "cache")  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "drift: 4 causes, 29 differences on 2 of 2 boxes" in run.stdout
    assert (
        "note: the snapshot holds 2 of the inventory's 3 boxes; not in it, not judged: orin"
        in run.stderr
    )
    named = reconcile("--root", str(root), "-i", "lab", "drift", "--from-snapshot",
                      str(SNAPSHOT), "orin", cache=tmp_path / "cache")  # fmt: skip
    assert named.returncode == 1 and "not in the snapshot" in named.stdout
    assert "note:" not in named.stderr


# -- 6. a box file edited since it was saved ------------------------------------------------------
def test_a_box_file_edited_since_it_was_saved_is_said(tmp_path: Path) -> None:
    """h1: thor.json edited by hand (its .env line of GATEWAY_API_KEY added). The replay said
    only that the snapshot held no render of this desired .env, as if the state had changed."""
    snap = tmp_path / "snap"
    shutil.copytree(SNAPSHOT, snap)
    thor = snap / "thor.json"
    raw: dict[str, Any] = json.loads(thor.read_text(encoding="utf-8"))
    raw["collected"]["envfile"].append({"key": "HAND_EDITED", "value": "1", "line": 999})
    thor.write_text(json.dumps(raw), encoding="utf-8")
    index = snapshot_index(snap)
    edited = snapshot_observation("thor", thor, recorded_digest(index, "thor"))
    why = "thor.json changed since it was saved (its sha256 is not the index's)"
    assert edited.altered == why and edited.document is not None
    kept = snapshot_observation("spark", snap / "spark.json", recorded_digest(index, "spark"))
    assert kept.altered is None
    found = inputs(fleet_root(tmp_path))
    result = replay(found, "thor", edited.document, edited.altered)
    assert f"snapshot: {why}" in [str(e) for e in result.errors]
    assert errors_of(result, Part.RENDER)  # whatever else it says: said beside it
    assert any(d.kind is Kind.ENVFILE for d in result.drifts)  # and it is still compared


# -- a replay, end to end (drift.py hands compare what it replays against) ----------------------
def replayed_report(root: Path, snapshot: Path, cache: Path) -> tuple[int, dict[str, Any]]:
    out = cache.parent / "report.json"
    run = reconcile("--root", str(root), "-i", "lab", "drift", "--from-snapshot", str(snapshot),
                    "--format", "json", "-o", str(out), cache=cache)  # fmt: skip
    assert "Traceback" not in run.stderr, run.stderr
    return run.returncode, json.loads(out.read_text(encoding="utf-8"))


def box_errors(report: dict[str, Any]) -> dict[str, list[str]]:
    return {b["box"]: b["errors"] for b in report["boxes"]}


@pytest.mark.parametrize(
    ("edits", "box", "said"),
    [
        (KEY_CHANGED, "spark", "secret gateway_api_key: not in this observation's secret_sources"),
        (FILE_CHANGED, "spark", "desired ~/.lobes/.gw-secrets.env, key GATEWAY_API_KEY"),
        (DIRECTORY_CHANGED, "spark", "snapshot: observed /home/fl-spark/.lobes as fl-spark"),
    ],
    ids=["e9a-key", "e9b-file", "e13-directory"],
)
def test_a_replay_says_what_it_could_not_compare(
    tmp_path: Path, edits: dict[str, tuple[str, str]], box: str, said: str
) -> None:
    """Before: exit 2 and no error (the old source's digest, the old directory's answer)."""
    code, report = replayed_report(fleet_root(tmp_path, edits), SNAPSHOT, tmp_path / "cache")
    assert code == 1
    assert any(said in e for e in box_errors(report)[box]), box_errors(report)


def test_a_replay_of_an_edited_box_file_says_so(tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    shutil.copytree(SNAPSHOT, snap)
    thor = snap / "thor.json"
    thor.write_text(json.dumps(json.loads(thor.read_text(encoding="utf-8"))), encoding="utf-8")
    _, report = replayed_report(fleet_root(tmp_path), snap, tmp_path / "cache")
    assert box_errors(report)["thor"] == [
        "snapshot: thor.json changed since it was saved (its sha256 is not the index's)"
    ]
    assert box_errors(report)["spark"] == []


# -- 3. a box added to the inventory since the snapshot was saved ---------------------------------
def test_a_box_added_since_the_snapshot_keeps_its_own_facts(tmp_path: Path) -> None:
    """e10b: jet added to the inventory (its overlay where the inventory's box_overlay names
    it). Before: `box_overlay: .../snapshot/facts/overlay/jet.yaml does not exist`, exit 1."""
    jet = (
        "  jet:\n    groups: [gpu, jetson]\n    ssh_hostname: 10.77.0.14\n    ssh_user: fl-jet\n"
        "    ssh_port: 22\n    ssh_key: .lab/ssh/id_ed25519\n"
        "    ssh_known_hosts_file: .lab/ssh/known_hosts\n"
    )
    root = fleet_root(tmp_path, {"inventory/lab.yaml": ("\nboxes:\n", f"\nboxes:\n{jet}")})
    # orin's layer, out of the mesh and serving no proxied role (the reviewer's jet.yaml)
    layer = (root / "group_vars" / "orin.yaml").read_text(encoding="utf-8")
    for old, new in (
        ("  cortex: {proxied_to: spark}\n", "  cortex: {feasible: false}\n"),
        (
            "  worker: {proxied_to: thor}\n",
            "  worker: {feasible: false}\n\nmesh:\n  enabled: false\n",
        ),
    ):
        assert layer.count(old) == 1
        layer = layer.replace(old, new)
    (root / "group_vars" / "jet.yaml").write_text(layer, encoding="utf-8")
    overlay = root / ".lab" / "overlay"
    overlay.mkdir(parents=True)
    shutil.copyfile(SNAPSHOT / "facts" / "overlay" / "thor.yaml", overlay / "jet.yaml")
    run = reconcile("--root", str(root), "-i", "lab", "drift", "--from-snapshot", str(SNAPSHOT),
                    cache=tmp_path / "cache")  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "not in it, not judged: jet, orin" in run.stderr
    # saved again, the replay keeps the snapshot's facts, and none for jet: replayed as it was
    again = tmp_path / "again"
    saved = reconcile("--root", str(root), "-i", "lab", "drift", "--from-snapshot",
                      str(SNAPSHOT), "--save-snapshot", str(again), "--no-history",
                      cache=tmp_path / "cache")  # fmt: skip
    assert saved.returncode == 2, saved.stderr
    assert sorted(p.name for p in (again / "facts" / "overlay").iterdir()) == [
        "orin.yaml",
        "spark.yaml",
        "thor.yaml",
    ]


# -- 5. the controller's probes made at another address or port -----------------------------------
PORT_CHANGED = {"group_vars/all.yaml": ("  port: 8000", "  port: 8001")}


def replay_with_probes(found: DriftInputs, box: str) -> BoxResult:
    """compare_box as a replay calls it, the controller's probes of the snapshot included and
    the desired base the controller reaches the box at (drift.replay_checks)."""
    obs = load_snapshot(SNAPSHOT)[1][box]
    assert obs.document is not None and obs.probes.base is not None
    wanted = replace(against(found, box), base=found.bases[box])
    return compare_box(found.expectations[box], obs.document, obs.probes, replay=wanted)


def test_probes_made_where_the_desired_state_reaches_the_gateway_are_compared(
    tmp_path: Path,
) -> None:
    found = inputs(fleet_root(tmp_path))
    for box in ("spark", "thor"):
        result = replay_with_probes(found, box)
        assert errors_of(result, Part.GATEWAY_PROBE) == [], box
        assert result.facts["controller_health"] is not None, box


def test_probes_made_at_another_port_are_not_compared_and_said(tmp_path: Path) -> None:
    """e8b: `gateway.port` changed since the save. The snapshot's controller probes asked
    :8000, another gateway than the desired :8001; their answers were judged as its auth
    posture (`401 -> 200`) without a word."""
    found = inputs(fleet_root(tmp_path, PORT_CHANGED))
    for box in ("spark", "thor"):
        result = replay_with_probes(found, box)
        made = load_snapshot(SNAPSHOT)[1][box].probes.base
        assert made is not None and made.endswith(":8000")
        said = [e for e in errors_of(result, Part.GATEWAY_PROBE) if "controller probes" in e]
        assert said == [
            f"controller probes: made at {made}; desired {made[:-4]}8001: not compared "
            "(the auth posture from the network)"
        ], box
        assert not [d for d in result.drifts if "(controller)" in d.path], box
        assert result.facts["controller_health"] is None
