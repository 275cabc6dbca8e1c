"""`reconcile import` on saved real lab observations (no box is contacted).

tests/fixtures/import/pristine/ is the lab as `lab up` leaves it (lobes' own render), observed by
`reconcile drift --save-snapshot` against a state imported from it, so its render is of the
adopted `.env`; examples/lab-incidents/snapshot is the lab with the field incidents applied.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from reconciler.cli import main
from reconciler.compare.drift import Drift
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from reconciler.importer.factor import factor
from reconciler.importer.images import catalog
from reconciler.importer.sourced import Sourced
from reconciler.observe.observe import load_snapshot

REPO = Path(__file__).resolve().parents[2]
PRISTINE = REPO / "tests/fixtures/import/pristine"
INCIDENTS = REPO / "examples/lab-incidents"


def run_import(
    capsys: pytest.CaptureFixture[str], *args: str, root: Path = REPO
) -> tuple[int, str]:
    code = main(["--root", str(root), "-i", "lab", "import", *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def drift_of(root: Path, snapshot: Path) -> list[Drift]:
    fleet = load_fleet(root, "lab")
    return list(run_drift(fleet, list(fleet.boxes), from_snapshot=snapshot).report.drifts)


def layer(root: Path, name: str) -> Any:
    return YAML().load((root / "group_vars" / f"{name}.yaml").read_text(encoding="utf-8"))


def comment(mapping: Any, key: str) -> str:
    """The end-of-line comment ruamel keeps for `key`."""
    tokens = mapping.ca.items.get(key) or []
    text = "".join(t.value for t in tokens if t is not None and hasattr(t, "value"))
    return text.strip().removeprefix("#").strip()


def env_line(box: str, key: str) -> int:
    doc = load_snapshot(PRISTINE)[1][box].document
    assert doc is not None
    return doc.envfile_by_key()[key].line


# -- the round trip -----------------------------------------------------------------------------
def test_the_adopted_state_validates_and_replays_to_zero_drift(
    pristine_import: tuple[Path, int, str],
) -> None:
    out, code, text = pristine_import
    # The snapshot was saved against live boxes with the state imported from them: adopting it
    # again and replaying it leaves nothing (lobes' render leaves HAND_IMAGE and
    # CULTURE_VLLM_API_KEY out of .env: adopted as `env: {KEY: null}`, test_import_left_out.py).
    assert drift_of(out, PRISTINE) == []
    assert code == 0 and "found while importing" not in text, text
    # The merged state is what runs: every lane, window and share of every box.
    fleet = load_fleet(out, "lab")
    assert fleet.boxes["thor"].lanes["worker"].max_model_len == 262144
    assert fleet.boxes["spark"].contract["worker"].proxied_to == "thor"
    assert fleet.boxes["orin"].lanes["multimodal"].role == "senses"
    assert fleet.boxes["thor"].gateway.auth == "open"  # lobes' render leaves the key unarmed
    assert not any(p.name.startswith(".adopted") for p in out.parent.iterdir())  # no leftovers


def test_every_value_says_where_it_was_found(pristine_import: tuple[Path, int, str]) -> None:
    out, _, _ = pristine_import
    everyone = layer(out, "all")
    embed = everyone["lanes"]["embed"]
    # A value every box shares carries the line of each box's .env when the lines differ.
    where = comment(embed, "max_model_len")
    for box in ("thor", "spark", "orin"):
        assert f".env:{env_line(box, 'EMBED_MAX_MODEL_LEN')}" in where
    assert comment(embed, "role").startswith("docker inspect")
    worker = layer(out, "thor")["lanes"]["worker"]
    assert comment(worker, "max_model_len") == f".env:{env_line('thor', 'WORKER_MAX_MODEL_LEN')}"
    assert comment(layer(out, "thor")["contract"]["worker"], "context") == "GET /capabilities"
    assert comment(everyone["gateway"], "port").startswith("docker inspect")


def test_values_are_factored_into_all_groups_and_boxes(
    pristine_import: tuple[Path, int, str],
) -> None:
    out, _, _ = pristine_import
    everyone, jetson, spark = layer(out, "all"), layer(out, "jetson"), layer(out, "spark")
    assert set(everyone["lanes"]) == {"embed", "rerank", "hand"}  # every box runs them
    assert everyone["images"]["vllm_openai"].startswith("10.77.0.1:5000/vllm/vllm-openai@sha256:")
    assert jetson["contract"]["cortex"]["proxied_to"] == "spark"  # thor and orin, not spark
    assert "cortex" not in everyone.get("contract", {})
    assert set(spark["lanes"]) == {"primary"}
    assert spark["deployment"]["compose_files"] == [
        "docker-compose.yml",
        "docker-compose.shape.yml",
        "docker-compose.override.yml",
    ]


def test_secrets_are_references_never_values_or_digests(
    pristine_import: tuple[Path, int, str],
) -> None:
    out, _, text = pristine_import
    everyone = layer(out, "all")
    assert dict(everyone["secrets"]["mesh_key"]) == {
        "source": "box_file",
        "path": "~/.lobes/.secrets.env",
        "key": "LOBES_MESH_KEY",
    }
    assert dict(everyone["mesh"]["key"]) == {"secret": "mesh_key"}
    written = "".join(p.read_text(encoding="utf-8") for p in out.rglob("*.yaml")) + text
    assert "hmac:" not in written  # not even the run's digests


# -- refusing, forcing, errors -------------------------------------------------------------------
def test_an_existing_output_is_refused_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "adopted"
    out.mkdir()
    (out / "mine.txt").write_text("keep", encoding="utf-8")
    code, text = run_import(capsys, "--from-snapshot", str(PRISTINE), "--output", str(out))
    assert code == 1 and "already exists" in text and "--force" in text
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adopted"]  # nothing built beside it
    # --force replaces only what an import wrote (or nothing): an operator's own file stays.
    code, text = run_import(
        capsys, "--from-snapshot", str(PRISTINE), "--output", str(out), "--force"
    )
    assert code == 1 and "mine.txt" in text
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    (out / "mine.txt").unlink()
    code, _ = run_import(capsys, "--from-snapshot", str(PRISTINE), "--output", str(out), "--force")
    assert code == 0  # written, nothing found
    assert (out / "group_vars" / "all.yaml").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adopted"]


def copied_repository(tmp_path: Path) -> Path:
    """A repository with the lab inventory and the pristine snapshot inside it."""
    repo = tmp_path / "repo"
    (repo / "inventory").mkdir(parents=True)
    (repo / "inventory" / "lab.yaml").write_bytes((REPO / "inventory/lab.yaml").read_bytes())
    shutil.copytree(REPO / "group_vars", repo / "group_vars")
    shutil.copytree(PRISTINE, repo / "snapshot")
    return repo


@pytest.mark.parametrize(
    "output", ["repo", "repo/snapshot", ".", "link-to-repo"], ids=lambda o: o.replace("/", "-")
)
def test_an_output_that_is_or_holds_what_is_read_is_refused_even_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str
) -> None:
    """--force replaces NEWROOT: NEWROOT the repository (or the snapshot, or a directory
    holding them, or a symlink to one) would delete what the import reads."""
    repo = copied_repository(tmp_path)
    (tmp_path / "link-to-repo").symlink_to(repo)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    target = tmp_path / output
    argv = ["--from-snapshot", str(repo / "snapshot"), "--output", str(target), "--force"]
    code, text = run_import(capsys, *argv, root=repo)
    assert code == 1 and f"error: --output {target} holds the " in text
    assert "choose a new directory; nothing written" in text
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_an_output_that_cannot_be_made_is_said_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "adopted"
    code, text = run_import(capsys, "--from-snapshot", str(PRISTINE), "--output", str(out))
    assert code == 1
    assert f"error: --output {out}: " in text and "nothing written" in text
    assert "Traceback" not in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_box_the_snapshot_does_not_hold_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = tmp_path / "snap"
    snapshot.mkdir()
    index = json.loads((PRISTINE / "index.json").read_text(encoding="utf-8"))
    (snapshot / "index.json").write_text(json.dumps({**index, "boxes": ["thor"]}))
    os.symlink(PRISTINE / "thor.json", snapshot / "thor.json")
    out = tmp_path / "adopted"
    code, text = run_import(capsys, "spark", "--from-snapshot", str(snapshot), "--output", str(out))
    assert code == 1 and "spark not in the snapshot" in text and not out.exists()
    code, text = run_import(
        capsys, "nosuch", "--from-snapshot", str(snapshot), "--output", str(out)
    )
    assert code == 1 and "unknown box 'nosuch'" in text and not out.exists()


def test_one_box_alone_is_adopted_with_its_own_inventory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "thor-only"
    code, text = run_import(capsys, "thor", "--from-snapshot", str(PRISTINE), "--output", str(out))
    fleet = load_fleet(out, "lab")
    assert list(fleet.boxes) == ["thor"]
    # Alone, thor's proxied roles name boxes that are not adopted: reported, not written.
    assert "contract cortex: proxied to spark, not a box adopted here" in text
    assert fleet.boxes["thor"].contract.get("cortex") is None
    assert code == 2


# -- the field incidents: found while importing --------------------------------------------------
def test_incidents_are_found_while_importing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "adopted"
    snapshot = INCIDENTS / "snapshot"
    code, text = run_import(
        capsys, "--from-snapshot", str(snapshot), "--output", str(out), root=INCIDENTS
    )
    assert code == 2
    found = text.split("found while importing:", 1)[1]
    # Incident #209: the login shell arms the gateway key; no desired state removes an export.
    assert "thor: a login shell export" in found and "(GATEWAY_API_KEY)" in found
    # Incident #208: the gateway still advertises the window it started with.
    assert "spark: contract cortex: the gateway advertises 262144, its lane runs 131072" in found
    # .env and the running lane disagree: what runs was adopted, the .env line reported.
    assert (
        "PRIMARY_MAX_MODEL_LEN: .env:61 says 262144, model-gear-vllm-primary runs 131072" in found
    )
    fleet = load_fleet(out, "lab")
    assert fleet.boxes["spark"].lanes["primary"].max_model_len == 131072
    # The key thor's gateway runs with was found in the login shell's export: a converge
    # reads the rc file's last assignment of it, which the trace cannot show is the line bash
    # ran, so the reference is the placeholder and the comment says which line exported it
    # (test_import_review5_secrets.py).
    source = fleet.boxes["thor"].secrets["gateway_api_key"]
    assert (source.source, source.path, source.key) == (
        "box_file",
        "~/.lobes/.secrets.unfound.env",
        "GATEWAY_API_KEY",
    )
    assert comment(layer(out, "thor")["secrets"], "gateway_api_key").startswith(
        "placeholder: the GATEWAY_API_KEY in use is exported at ~/.bashrc:6"
    )
    drifts = drift_of(out, snapshot)
    assert {(d.box, d.kind.value, d.path) for d in drifts} >= {
        ("thor", "shell-leak", "GATEWAY_API_KEY"),
        ("spark", "contract", "capabilities.cortex.context"),
    }
    assert "hmac:" not in text


# -- pure parts ----------------------------------------------------------------------------------
def test_catalog_names_never_stand_for_two_images() -> None:
    one = "reg/vllm/vllm-openai@sha256:" + "a" * 64
    two = "reg/vllm/vllm-openai@sha256:" + "b" * 64
    gw = "reg/lobes/gateway@sha256:" + "c" * 64
    names = catalog([one, two, gw, one])
    assert names[gw] == "gateway"
    assert {names[one], names[two]} == {"vllm_openai_aaaaaaaaaaaa", "vllm_openai_bbbbbbbbbbbb"}


def test_factor_gives_each_box_exactly_its_values() -> None:
    def leaf(v: Any) -> Sourced:
        return Sourced(v, "x")

    trees = {
        "a": {"k": leaf(1), "g": leaf("j"), "only": leaf(True)},
        "b": {"k": leaf(1), "g": leaf("j")},
        "c": {"k": leaf(1), "g": leaf("d")},
    }
    groups = {"a": ["gpu", "jetson"], "b": ["gpu", "jetson"], "c": ["gpu", "dgx"]}
    layers = factor(trees, groups, ["gpu", "jetson", "dgx"])
    assert layers["all"] == {"k": leaf(1)}
    assert layers["jetson"] == {"g": leaf("j")}
    assert layers["c"] == {"g": leaf("d")}  # dgx has one member: the box keeps it
    assert layers["a"] == {"only": leaf(True)}
    assert "gpu" not in layers and "b" not in layers


def test_the_drift_path_never_imports_the_importer() -> None:
    """`reconcile drift` runs often and its import time is budgeted (BENCHMARKS.md): the CLI
    parser must not import this package (nor ruamel through it)."""
    import subprocess
    import sys

    code = (
        "import sys, reconciler.cli as c; c.build_parser(); "
        "print(sorted(m for m in sys.modules if m.startswith('reconciler.importer')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
