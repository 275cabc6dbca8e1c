"""Review 4 (today's defects 3 and 4).

3. `reconcile import` judged each box alone by building a repository per box, and each build
   parsed the whole inventory again (ruamel's round-trip loader): one invalid box of 240 took
   47 s to name, of 1,000 about 13 minutes. The inventory is parsed once now, each box's own
   repository holds that box alone, and the way on names the first few boxes and how many
   more. Counted, not timed: the inventory's parses and what each box's repository holds.
4. deploys/mesh.py gave the mesh verify to the last box in mesh order; when that box's plan
   is blocked its host fails while planning and runs nothing, so the boxes converged before
   it were never verified. The verify goes to the last box whose plan is not blocked, naming
   only the boxes it verifies; and `--limit orin -y` with orin blocked ends saying so, not
   with pyinfra's "No hosts remaining!" (through the fake pyinfra of
   test_deploys_review_fixes; tests/lab/test_deploy_review3.py runs the real one).

Captured data: bench/scale_fleet.py's fleet (examples/lab-incidents' observations under new
names), orin's `.env` without LOBES_PROFILE as in test_review3_importer.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from bench.scale_fleet import build_fleet
from reconciler.cli import main
from reconciler.desired.load import load_fleet
from reconciler.importer import inventory as inventory_module
from reconciler.importer import run as run_module
from tests.unit.test_deploys_review_fixes import (  # noqa: F401 (the fixture `fleet_repo`)
    fake_lines,
    fleet_repo,
    pyinfra,
    said,
)

BOXES = 9  # thor, spark, orin and two copies of each
PROBLEM = "group_vars/orin.yaml:4:1: lobes.profile: required key is missing"


def without_profile(root: Path, box: str) -> None:
    """`box`'s `.env` without LOBES_PROFILE and no container carrying one: its adopted state
    lacks `lobes.profile`, which the loader requires. The index's sha256 follows."""
    path = root / "snapshot" / f"{box}.json"
    answer = json.loads(path.read_text(encoding="utf-8"))
    collected = answer["collected"]
    collected["envfile"] = [e for e in collected["envfile"] if e["key"] != "LOBES_PROFILE"]
    for container in collected["docker"]["containers"]:
        (container.get("env") or {}).pop("LOBES_PROFILE", None)
    data = json.dumps(answer, indent=1).encode("utf-8")
    path.write_bytes(data)
    index_path = root / "snapshot" / "index.json"
    index = json.loads(index_path.read_text(encoding="utf-8"))
    index["sha256"][box] = hashlib.sha256(data).hexdigest()
    index_path.write_text(json.dumps(index), encoding="utf-8")


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "fleet"
    build_fleet(root, BOXES)
    without_profile(root, "orin")
    return root


class Watched:
    """What an import parsed and built: each parse of the inventory (its source file, by
    the module that copies it) and each repository's files."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.parses = 0
        self.built: list[dict[str, str]] = []
        watched = self

        class CountingYAML(YAML):
            def load(self, stream: Any) -> Any:
                watched.parses += 1
                return super().load(stream)

        build = run_module.build

        def recording_build(output: Path, files: dict[str, str]) -> Path:
            self.built.append(dict(files))
            return build(output, files)

        monkeypatch.setattr(inventory_module, "YAML", CountingYAML)
        monkeypatch.setattr(run_module, "build", recording_build)

    def boxes_of_each_build(self) -> list[list[str]]:
        return [list(YAML().load(files["inventory/lab.yaml"])["boxes"]) for files in self.built]


def import_fleet(
    capsys: pytest.CaptureFixture[str], root: Path, out: Path, *more: str
) -> tuple[int, str]:
    argv = ["--root", str(root), "-i", "lab", "import", "--from-snapshot", str(root / "snapshot")]
    code = main([*argv, "--output", str(out), *more])
    printed = capsys.readouterr()
    return code, printed.out + printed.err


# -- 3. one invalid box among many ---------------------------------------------------------------
def test_an_invalid_box_is_named_parsing_the_inventory_once(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    watched = Watched(monkeypatch)
    out = tmp_path / "adopted"
    code, text = import_fleet(capsys, fleet, out)
    assert code == 1 and not out.exists(), text
    assert PROBLEM in text and "nothing written" in text
    refused = [line for line in text.splitlines() if "does not validate on its own" in line]
    assert refused == ["error: orin: its adopted state does not validate on its own"]
    assert "  found: LOBES_PROFILE is not in .env: lobes.profile must be filled in by hand" in text
    # Parsed once for the whole and every box's own repository (it was once per repository:
    # 1 + 1 + BOXES here, each parse the size of the whole inventory).
    assert watched.parses == 1
    # The whole once, then each box alone, each repository holding its box only.
    boxes = watched.boxes_of_each_build()
    assert len(boxes[0]) == BOXES
    assert boxes[1:] == [[name] for name in boxes[0]]


def test_the_way_on_names_the_first_few_boxes_and_how_many_more(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = import_fleet(capsys, fleet, tmp_path / "adopted")
    assert code == 1, text
    shown = [line for line in text.splitlines() if line.startswith("give --partial")]
    assert shown == [
        "give --partial to import thor, spark, thor-1, spark-1, orin-1 (and 3 more) and leave "
        "out orin (exit 1 all the same)"
    ]


def test_partial_adopts_the_rest_parsing_the_inventory_once(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    watched = Watched(monkeypatch)
    out = tmp_path / "adopted"
    code, text = import_fleet(capsys, fleet, out, "--partial")
    assert code == 1, text
    assert watched.parses == 1
    boxes = watched.boxes_of_each_build()
    # The whole, each box alone, then the whole without orin (what is written).
    assert boxes[1:-1] == [[name] for name in boxes[0]]
    assert boxes[-1] == [b for b in boxes[0] if b != "orin"]
    adopted = load_fleet(out, "lab")
    assert sorted(adopted.boxes) == sorted(boxes[-1])
    written = (out / "inventory" / "lab.yaml").read_text(encoding="utf-8")
    assert "# Generated by bench/scale_fleet.py" in written  # the source's comments kept
    assert "PARTIAL (--partial)" in written and "orin (" in written
    key = adopted.inventory.boxes["thor-2"].ssh_key
    assert key == str(fleet / ".lab" / "ssh" / "id_ed25519")  # made absolute


# -- the inventory, parsed once and copied as often as asked ------------------------------------
SOURCE = """\
# head
group_order: [gpu, jetson]
image_overlay: facts/images.yaml # dropped
boxes: # the boxes
  # before thor
  thor:
    groups: [gpu, jetson]  # thor's groups
    gateway_origin: http://old.example:8000 # stale
    ssh_hostname: 10.0.0.1
    ssh_key: keys/thor
  # between thor and spark
  spark: {groups: [gpu], ssh_hostname: 10.0.0.2, ssh_key: /abs/key}
  orin:
    groups: [gpu, jetson]
    ssh_hostname: 10.0.0.3  # orin's address
# the end
"""


def test_a_copy_keeps_only_its_boxes_with_their_comments_and_leaves_the_source_alone(
    tmp_path: Path,
) -> None:
    source = tmp_path / "inventory" / "lab.yaml"
    source.parent.mkdir()
    source.write_text(SOURCE, encoding="utf-8")
    inventory = inventory_module.Inventory(source, tmp_path)
    spark_alone = inventory.copy(["spark"], {})
    assert list(YAML().load(spark_alone)["boxes"]) == ["spark"]
    assert "10.0.0.1" not in spark_alone and "10.0.0.3" not in spark_alone
    # Any order asked, the inventory's order given; an origin the box's .env announces.
    both = inventory.copy(["orin", "thor"], {"orin": "http://orin.example:8000"}, "PARTIAL x")
    body = both.split("\n", 2)[2]
    assert body.startswith("# PARTIAL x\n# head\n")
    data = YAML().load(both)
    assert list(data["boxes"]) == ["thor", "orin"] and "image_overlay" not in data
    assert data["boxes"]["thor"]["ssh_key"] == str(tmp_path / "keys" / "thor")
    assert "gateway_origin" not in data["boxes"]["thor"]
    assert data["boxes"]["orin"]["gateway_origin"] == "http://orin.example:8000"
    for comment in ("# the boxes", "# before thor", "# thor's groups", "# orin's address"):
        assert comment in both, comment
    # Copies made before change nothing of the next: every box, as the source says them.
    every = inventory.copy(["thor", "spark", "orin"], {})
    assert every == inventory_module.copied_inventory(
        source, tmp_path, ["spark", "orin", "thor"], {}
    )
    assert "# between thor and spark" in every and "gateway_origin" not in every
    assert "spark: {groups: [gpu], ssh_hostname: 10.0.0.2, ssh_key: /abs/key}" in every


# -- 4. the mesh verify when the blocked box is last in mesh order ------------------------------
def test_the_mesh_verify_runs_from_the_last_box_whose_plan_is_not_blocked(
    fleet_repo: Path,  # noqa: F811 (the fixture imported above)
) -> None:
    """Mesh order thor, spark, orin; orin's controller secret unset."""
    done = pyinfra(
        fleet_repo, "-y", "inventory.py", "deploys/mesh.py", FAKE_MISSING_SECRET_FOR="orin"
    )
    text = said(done)
    assert done.returncode == 1, text
    assert "orin: not converged: blocked: controller secret: " in text
    converged = [line for line in fake_lines(done) if not line.startswith("[observe")]
    assert converged == ["[converge thor]", "[converge spark]", "[verify thor,spark]"], text
    assert "mesh: verify thor, spark (no drift left)" in text  # the operation names those
    assert "mesh: no drift left on thor, spark" in text


def test_the_only_box_of_a_run_blocked_ends_the_run_saying_so(
    fleet_repo: Path,  # noqa: F811 (the fixture imported above)
) -> None:
    done = pyinfra(
        fleet_repo, "-y", "--limit", "orin", "inventory.py", "deploys/mesh.py",
        FAKE_MISSING_SECRET_FOR="orin",
    )  # fmt: skip
    text = said(done)
    assert done.returncode == 1, text
    assert "No hosts remaining" not in text and "Traceback" not in text
    assert "orin cannot be converged and no other box of this run is left: nothing converged" in (
        text
    )
    assert [line for line in fake_lines(done) if not line.startswith("[observe")] == []
