"""Review 8 of `reconcile import`, on captured snapshots.

1. From a snapshot, import compares the saved observations with the written repository as
   `drift --from-snapshot` does (drift.py `_replayed`, `trust_observation`): the errors and the
   differences it lists are the next drift's. A box observed in another deployment directory
   or as another user than the written inventory's is refused (its values are another
   deployment's; the replay compares none of them).
2. A value held in clear under a secret's name (an older or edited snapshot) is a secret: never
   quoted, never written into group_vars.

tests/fixtures/import/lab_desired is the pristine lab saved against the lab's desired state
(round trip: zero); examples/lab-incidents the lab's field incidents.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli import main
from reconciler.desired import secret_names
from reconciler.importer.boxview import BoxView, shown
from reconciler.observe.document import SecretValue
from reconciler.observe.observe import load_snapshot

REPO = Path(__file__).resolve().parents[2]
LAB_DESIRED = REPO / "tests/fixtures/import/lab_desired"
INCIDENTS = REPO / "examples/lab-incidents"


def run(*argv: str) -> tuple[int, str]:
    """`reconcile ARGV` in this process: its exit code and what it printed (both streams)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        code = main(list(argv))
    return code, buffer.getvalue()


def lab_root(tmp_path: Path, edit: Callable[[str], str] = lambda text: text) -> Path:
    """A repository holding only the lab's inventory (all an import reads), edited."""
    root = tmp_path / "root"
    (root / "inventory").mkdir(parents=True)
    text = (REPO / "inventory/lab.yaml").read_text(encoding="utf-8")
    (root / "inventory/lab.yaml").write_text(edit(text), encoding="utf-8")
    return root


def edited_snapshot(tmp_path: Path, change: Callable[[str, dict[str, Any]], None]) -> Path:
    """lab_desired copied, each box file's JSON passed through `change(box, data)`."""
    snap = tmp_path / "snap"
    shutil.copytree(LAB_DESIRED, snap)
    for box in ("thor", "spark", "orin"):
        path = snap / f"{box}.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        change(box, data)
        path.write_text(json.dumps(data), encoding="utf-8")
    return snap


def drift_json(root: Path, snapshot: Path) -> dict[str, Any]:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(io.StringIO()):
        main(["--root", str(root), "-i", "lab", "drift", "--from-snapshot", str(snapshot),
              "--format", "json"])  # fmt: skip
    report: dict[str, Any] = json.loads(buffer.getvalue())
    return report


def assert_import_says_what_drift_says(printed: str, code: int, report: dict[str, Any]) -> None:
    """Every error the next drift reports is listed by import, with as many differences, and
    the exit code says something was found."""
    errors = [f"{b['box']}: {e}" for b in report["boxes"] for e in b["errors"]]
    drifts = report["summary"]["drifts"]
    assert errors or drifts, "a case that finds nothing proves nothing here"
    for error in errors:
        assert f"  {error}\n" in printed, (error, printed)
    if drifts:
        assert f"  {drifts} differences remain" in printed, printed
    else:
        assert "differences remain" not in printed, printed
    assert code == 2, printed


# -- 1. the replay checks -----------------------------------------------------------------------
def test_the_incidents_import_lists_what_the_next_drift_reports(tmp_path: Path) -> None:
    """Before: 39 differences and no error, while the drift of the written repository from the
    same snapshot said 30 and two box errors (thor's secret read from another source than the
    adopted placeholder, spark's render of another desired .env)."""
    out = tmp_path / "adopted"
    code, printed = run("--root", str(INCIDENTS), "-i", "lab", "import", "--from-snapshot",
                        str(INCIDENTS / "snapshot"), "--output", str(out))  # fmt: skip
    report = drift_json(out, INCIDENTS / "snapshot")
    assert report["summary"]["with_errors"] == 2
    assert_import_says_what_drift_says(printed, code, report)


def test_an_edited_box_file_is_said_as_drift_says_it(tmp_path: Path) -> None:
    """A box file whose bytes are not those the index recorded (re-serialised): import exited 0,
    "nothing found", and the drift then said `thor.json changed since it was saved`."""
    snap = tmp_path / "snap"
    shutil.copytree(LAB_DESIRED, snap)
    index = json.loads((snap / "index.json").read_text(encoding="utf-8"))
    index["sha256"] = {
        box: hashlib.sha256((snap / f"{box}.json").read_bytes()).hexdigest()
        for box in index["boxes"]
    }
    (snap / "index.json").write_text(json.dumps(index), encoding="utf-8")
    thor = json.loads((snap / "thor.json").read_text(encoding="utf-8"))
    (snap / "thor.json").write_text(json.dumps(thor, indent=1), encoding="utf-8")
    out = tmp_path / "adopted"
    code, printed = run("--root", str(REPO), "-i", "lab", "import", "--from-snapshot", str(snap),
                        "--output", str(out))  # fmt: skip
    assert "thor: snapshot: thor.json changed since it was saved" in printed
    assert_import_says_what_drift_says(printed, code, drift_json(out, snap))


def test_probes_made_at_another_address_are_said_as_drift_says_them(tmp_path: Path) -> None:
    """The written inventory reaches thor at another address than the controller probed: its
    probes are another gateway's (not compared), which import did not say."""
    root = lab_root(tmp_path, lambda text: text.replace("10.77.0.11", "10.77.0.99"))
    out = tmp_path / "adopted"
    code, printed = run("--root", str(root), "-i", "lab", "import", "--from-snapshot",
                        str(LAB_DESIRED), "--output", str(out))  # fmt: skip
    assert "thor: controller probes: made at http://10.77.0.11:8000; desired" in printed
    assert_import_says_what_drift_says(printed, code, drift_json(out, LAB_DESIRED))


def test_the_pristine_snapshot_still_round_trips_to_nothing(tmp_path: Path) -> None:
    """The replay checks find nothing where the snapshot is the written repository's own."""
    out = tmp_path / "adopted"
    code, printed = run("--root", str(REPO), "-i", "lab", "import", "--from-snapshot",
                        str(LAB_DESIRED), "--output", str(out))  # fmt: skip
    assert code == 0, printed
    report = drift_json(out, LAB_DESIRED)
    assert report["summary"]["exit_code"] == 0, report["summary"]


def _as_lobes(text: str) -> str:
    """The lab inventory with thor deployed as user `lobes` (the production mesh's user)."""
    assert text.count("ssh_user: fl-thor") == 1
    return text.replace("ssh_user: fl-thor", "ssh_user: lobes")


def _line_of(root: Path, needle: str) -> int:
    lines = (root / "inventory/lab.yaml").read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line)


def test_a_box_observed_as_another_user_is_refused(tmp_path: Path) -> None:
    """Before: written, and (with the replay) "adopted" with the replay comparing nothing:
    the snapshot's thor is fl-thor's /home/fl-thor/.lobes, the written inventory's is lobes'."""
    root = lab_root(tmp_path, _as_lobes)
    out = tmp_path / "adopted"
    code, printed = run("--root", str(root), "-i", "lab", "import", "--from-snapshot",
                        str(LAB_DESIRED), "--output", str(out))  # fmt: skip
    assert code == 1, printed
    assert not out.exists()
    line = _line_of(root, "ssh_user: lobes")
    assert (
        "error: thor was observed in /home/fl-thor/.lobes as fl-thor; the repository this "
        f"import writes deploys it to ~/.lobes as lobes (ssh_user, inventory/lab.yaml:{line})"
    ) in printed
    assert "nothing written" in printed
    assert "spark was observed" not in printed and "orin was observed" not in printed


def test_with_partial_the_box_of_another_user_is_left_out(tmp_path: Path) -> None:
    root = lab_root(tmp_path, _as_lobes)
    out = tmp_path / "adopted"
    code, printed = run("--root", str(root), "-i", "lab", "import", "--from-snapshot",
                        str(LAB_DESIRED), "--output", str(out), "--partial")  # fmt: skip
    assert code == 1, printed
    assert "failed, not adopted" in printed
    assert "  thor: was observed in /home/fl-thor/.lobes as fl-thor;" in printed
    inventory = (out / "inventory/lab.yaml").read_text(encoding="utf-8")
    assert "  spark:" in inventory and "  orin:" in inventory
    assert "  thor:" not in inventory


# -- 2. a secret in clear ----------------------------------------------------------------------
GATEWAY_CLEAR = "ClearTextSecretValue123"
RUNNING_CLEAR = "ClearGwKey98765"
MESH_CLEAR = "ClearMeshKey424242"


def test_shown_judges_a_value_by_its_keys_name() -> None:
    assert shown(GATEWAY_CLEAR, "GATEWAY_API_KEY") == "a secret (***)"  # the floor's names
    assert shown("hunter2hunter2", "DB_PASSWORD") == "a secret (***)"  # the floor's globs
    assert shown(SecretValue("hmac:" + "0" * 64), "WORKER_MODEL") == "a secret (***)"
    assert shown("fp8", "WORKER_KV_CACHE_DTYPE") == "'fp8'"
    assert shown("", "GATEWAY_API_KEY") == "''"  # blank: no key (the collector's `masked`)
    assert shown("opaque-value-1", "DB_CRED") == "'opaque-value-1'"
    secret_names.adopt_fleet_patterns(["*_CRED"])  # the fleet's own secret_patterns
    try:
        assert shown("opaque-value-1", "DB_CRED") == "a secret (***)"
    finally:
        secret_names.adopt_fleet_patterns(())


def test_a_clear_secret_is_never_adopted_as_a_value(tmp_path: Path) -> None:
    """`text` (what the adopted group_vars are written from) refuses a clear value under a
    secret's name, and says so; a lane's knob path is named. Before: the value itself."""

    def change(box: str, data: dict[str, Any]) -> None:
        collected = data["collected"]
        for line in collected["envfile"]:
            if line["key"] == "GATEWAY_API_KEY":
                line["value"] = GATEWAY_CLEAR
        for c in collected["docker"]["containers"]:
            c["env"]["GATEWAY_API_KEY"] = GATEWAY_CLEAR

    doc = load_snapshot(edited_snapshot(tmp_path, change))[1]["spark"].document
    assert doc is not None
    view = BoxView("spark", doc)
    assert view.line("GATEWAY_API_KEY") is not None
    assert view.text("GATEWAY_API_KEY", (), "lanes.primary.env.GATEWAY_API_KEY") is None
    assert [f.what for f in view.findings][-1] == (
        "lane primary: GATEWAY_API_KEY is a secret (***) held in clear by the snapshot: not "
        "adopted (the adopted state does not set lanes.primary.env.GATEWAY_API_KEY: the "
        "operator must set it)"
    )
    assert not any(GATEWAY_CLEAR in f.what for f in view.findings)


def _clear_secrets(box: str, data: dict[str, Any]) -> None:
    """What an older or edited snapshot holds: spark's .env key in clear (the gateway runs the
    hashed one), thor's open gateway carrying a key in clear, orin's mesh key in clear in .env
    and in every container alike."""
    collected = data["collected"]
    lines = {line["key"]: line for line in collected["envfile"]}
    containers = collected["docker"]["containers"]
    if box == "spark":
        lines["GATEWAY_API_KEY"]["value"] = GATEWAY_CLEAR
    if box == "thor":
        gateway = next(c for c in containers if c["name"] == "model-gear-gateway")
        gateway["env"]["GATEWAY_API_KEY"] = RUNNING_CLEAR
    if box == "orin":
        lines["LOBES_MESH_KEY"]["value"] = MESH_CLEAR
        for c in containers:
            c["env"]["LOBES_MESH_KEY"] = MESH_CLEAR


def test_an_import_of_clear_secrets_neither_prints_nor_writes_them(tmp_path: Path) -> None:
    """Before: `.env:1194 sets GATEWAY_API_KEY to 'ClearTextSecretValue123'`, `adopted
    'ClearGwKey98765' from model-gear-gateway`, and orin's mesh adopted as off (its clear key
    taken for none)."""
    snap = edited_snapshot(tmp_path, _clear_secrets)
    out = tmp_path / "adopted"
    code, printed = run("--root", str(REPO), "-i", "lab", "import", "--from-snapshot", str(snap),
                        "--output", str(out))  # fmt: skip
    assert code == 2, printed
    written = "".join(p.read_text(encoding="utf-8") for p in sorted(out.rglob("*.yaml")))
    for clear in (GATEWAY_CLEAR, RUNNING_CLEAR, MESH_CLEAR):
        assert clear not in printed
        assert clear not in written
    assert "spark: .env:1194 sets GATEWAY_API_KEY to a secret (***), but " in printed
    assert "thor: GATEWAY_API_KEY is not in .env; model-gear-gateway runs a secret (***)" in printed
    # orin's mesh key: a reference to the .env line holding the same value, never the value.
    assert "orin: lanes embed (embedder), hand (hand), multimodal (senses), rerank " in printed
    assert "multimodal (senses), rerank (reranker); gateway open; mesh on" in printed
    orin = (out / "group_vars/orin.yaml").read_text(encoding="utf-8")
    assert "mesh_key: {source: box_file, path: ~/.lobes/.env, key: LOBES_MESH_KEY}" in orin
    assert "orin: the LOBES_MESH_KEY in use (.env:1186) is held in clear by the snapshot" in printed


@pytest.mark.parametrize("same_in_env", [True, False])
def test_a_clear_key_in_use_is_a_reference(tmp_path: Path, same_in_env: bool) -> None:
    """A keyed gateway whose key in use is in clear: its files cannot be matched by digest.
    The .env line is pointed at where it holds that very value, else the placeholder."""

    def change(box: str, data: dict[str, Any]) -> None:
        if box != "spark":
            return
        collected = data["collected"]
        lines = {line["key"]: line for line in collected["envfile"]}
        lines["GATEWAY_API_KEY"]["value"] = GATEWAY_CLEAR if same_in_env else "AnotherClear777"
        for c in collected["docker"]["containers"]:
            c["env"]["GATEWAY_API_KEY"] = GATEWAY_CLEAR

    snap = edited_snapshot(tmp_path, change)
    out = tmp_path / "adopted"
    code, printed = run("--root", str(REPO), "-i", "lab", "import", "--from-snapshot", str(snap),
                        "--output", str(out))  # fmt: skip
    written = "".join(p.read_text(encoding="utf-8") for p in sorted(out.rglob("*.yaml")))
    for clear in (GATEWAY_CLEAR, "AnotherClear777"):
        assert clear not in printed and clear not in written
    spark = (out / "group_vars/spark.yaml").read_text(encoding="utf-8")
    path = "~/.lobes/.env" if same_in_env else "~/.lobes/.secrets.unfound.env"
    assert f"gateway_api_key: {{source: box_file, path: {path}, key: GATEWAY_API_KEY}}" in spark
    assert "spark: lanes embed (embedder), hand (hand), primary (cortex), rerank (reranker); " \
        "gateway keyed" in printed  # fmt: skip
    assert code == 2, printed
