"""`reconcile import`, review 3: a knob whose value is not what its lane's command line runs is
said (and what runs adopted where a knob can say it), never dropped without a word; and one
box that cannot be imported refuses the import by name, or with `--partial` is left out while
the valid boxes are written, exit 1 all the same.

Captured data: tests/fixtures/import/lab_desired (the lab saved by `drift --save-snapshot`,
with compose's render of each box's own `.env`) and examples/lab-incidents, edited as an
operator's boxes would be.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli import build_parser
from reconciler.compare import render_basis
from reconciler.desired.load import load_fleet
from reconciler.importer.run import run_import
from reconciler.observe.document import parse_collected
from tests.unit.conftest import import_snapshot

REPO = Path(__file__).resolve().parents[2]
LAB_DESIRED = REPO / "tests/fixtures/import/lab_desired"
INCIDENTS = REPO / "examples/lab-incidents"
WORKER = "model-gear-vllm-worker"
SEQS = "WORKER_MAX_NUM_SEQS"  # .env:1186, `--max-num-seqs=1` on the worker's command line
SPEC = "WORKER_SPECULATIVE_CONFIG"  # .env:1187, the whole flag in single quotes
SPEC_WORD = (
    '--speculative-config={"method": "dflash", "num_speculative_tokens": 12, '
    '"model": "z-lab/Qwen3.6-35B-A3B-DFlash"}'
)

Collected = dict[str, Any]


def edited(target: Path, box: str, edit: Callable[[Collected], None]) -> Path:
    """lab_desired copied to `target`, `box`'s answer edited; compose's render of the box's
    own `.env` keeps matching it (its basis follows the edited `.env`, render_basis.py)."""
    shutil.copytree(LAB_DESIRED, target)
    path = target / f"{box}.json"
    saved = json.loads(path.read_text(encoding="utf-8"))
    collected: Collected = saved["collected"]
    edit(collected)
    basis = render_basis.env_basis(render_basis.current_pairs(parse_collected(collected)) or {})
    collected["render_current"]["basis"] = collected["render_login_current"]["basis"] = basis
    path.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return target


def set_knob(collected: Collected, key: str, value: str) -> None:
    """`.env`'s line of `key`, and every container that carries it (env_file), set to `value`."""
    for line in collected["envfile"]:
        if line["key"] == key:
            line["value"] = value
    for container in collected["docker"]["containers"]:
        if key in (container.get("env") or {}):
            container["env"][key] = value


def worker(collected: Collected) -> dict[str, Any]:
    return next(c for c in collected["docker"]["containers"] if c["name"] == WORKER)


def found(printed: str) -> list[str]:
    after = printed.split("found while importing:", 1)[-1]
    return [line.strip() for line in after.splitlines() if line.strip()]


def knob_of(root: Path, key: str) -> object:
    return load_fleet(root, "lab").boxes["thor"].lanes["worker"].env.get(key)


# -- 2. a knob the running command line contradicts ----------------------------------------------
def test_the_captured_lab_says_nothing_of_its_knobs(tmp_path: Path) -> None:
    """The control: every knob of the captured lab is what its lane runs (or no lane's command
    carries it: EMBED_QUANTIZATION=none is the gateway's), so nothing is said of any."""
    _, code, printed = import_snapshot(LAB_DESIRED, tmp_path / "adopted")
    assert code in (0, 2), printed
    assert not [line for line in found(printed) if "QUANTIZATION" in line or SEQS in line]


def test_a_knob_a_compose_file_overrides_is_said_and_what_runs_adopted(tmp_path: Path) -> None:
    """`.env` (and the lanes' environment) say 4, the worker runs `--max-num-seqs=1` (a compose
    file hard-codes it): before, the knob was dropped without a word."""
    snapshot = edited(tmp_path / "snap", "thor", lambda c: set_knob(c, SEQS, "4"))
    root, code, printed = import_snapshot(snapshot, tmp_path / "adopted")
    assert code == 2, printed
    assert (
        f"thor: lane worker: {SEQS}: .env:1186 says '4', {WORKER} runs '--max-num-seqs=1'; "
        "adopted what runs"
    ) in found(printed)
    assert knob_of(root, SEQS) == "1"
    # The written comment names both sources too.
    text = (root / "group_vars" / "thor.yaml").read_text(encoding="utf-8")
    line = next(line for line in text.splitlines() if f"{SEQS}:" in line)
    assert f"docker inspect ({WORKER} command; .env:1186 differs)" in line


def test_a_knob_carrying_its_flag_adopts_what_runs_in_the_same_form(tmp_path: Path) -> None:
    """The speculative config is the whole flag in single quotes in `.env`: what runs is
    adopted in that form, so that compose puts it back on the command line."""
    running = SPEC_WORD.replace('"num_speculative_tokens": 12', '"num_speculative_tokens": 8')

    def edit(collected: Collected) -> None:
        cmd = worker(collected)["cmd"]
        cmd[cmd.index(SPEC_WORD)] = running

    snapshot = edited(tmp_path / "snap", "thor", edit)
    root, code, printed = import_snapshot(snapshot, tmp_path / "adopted")
    assert code == 2, printed
    said = [line for line in found(printed) if line.startswith(f"thor: lane worker: {SPEC}")]
    assert len(said) == 1 and said[0].startswith(f"thor: lane worker: {SPEC}: .env:1187 says ")
    assert said[0].endswith("; adopted what runs"), said
    assert knob_of(root, SPEC) == f"'{running}'"
    # What remains: the box's `.env` line, which a converge rewrites to what runs.
    rewrite = "thor: .env and the running containers disagree: what runs was adopted (rewrite-env)"
    assert f"{rewrite} ({SPEC})" in found(printed)


def test_a_running_value_carrying_a_secret_is_masked_and_not_adopted(tmp_path: Path) -> None:
    """The worker runs a speculative config with a bearer token inside (a snapshot saved
    before the box hashed such values): both sources named, the secret never shown or written,
    nothing adopted, and the path the operator must fill in named."""
    secret = "hf_live_Q7pLm2xVb9"
    running = SPEC_WORD[:-1] + f', "headers": {{"Authorization": "Bearer {secret}"}}}}'

    def edit(collected: Collected) -> None:
        cmd = worker(collected)["cmd"]
        cmd[cmd.index(SPEC_WORD)] = running

    snapshot = edited(tmp_path / "snap", "thor", edit)
    root, code, printed = import_snapshot(snapshot, tmp_path / "adopted")
    assert code == 2, printed
    said = [line for line in found(printed) if SPEC in line]
    assert said == [
        f"thor: lane worker: {SPEC}: .env:1187 says "
        + repr(f"'{SPEC_WORD}'"[:77] + "...")
        + f", {WORKER} runs --speculative-config=***; neither is adopted (the adopted state "
        f"does not set lanes.worker.env.{SPEC}: the operator must set it)"
    ], said
    assert secret not in printed
    written = "".join(p.read_text(encoding="utf-8") for p in (root / "group_vars").glob("*"))
    assert secret not in written and knob_of(root, SPEC) is None


def test_a_lane_running_without_a_flag_its_render_has_is_said(tmp_path: Path) -> None:
    """compose's render of the box's own `.env` puts `--max-num-seqs=1` on the worker's command
    line, the running worker has none (created from another configuration)."""

    def edit(collected: Collected) -> None:
        worker(collected)["cmd"].remove("--max-num-seqs=1")

    snapshot = edited(tmp_path / "snap", "thor", edit)
    root, code, printed = import_snapshot(snapshot, tmp_path / "adopted")
    assert code == 2, printed
    assert (
        f"thor: lane worker: {SEQS}: .env:1186 says '1' and compose's render of it puts "
        f"--max-num-seqs on the command line, but {WORKER} runs without it; nothing adopted "
        f"(the adopted state does not set lanes.worker.env.{SEQS}: the operator must set it)"
    ) in found(printed)
    assert knob_of(root, SEQS) is None


# -- 3. one box that cannot be imported ----------------------------------------------------------
@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    root = tmp_path / "fleet"
    shutil.copytree(INCIDENTS, root)
    return root


def edit_box(fleet: Path, box: str, edit: Callable[[Collected], None]) -> None:
    path = fleet / "snapshot" / f"{box}.json"
    answer = json.loads(path.read_text(encoding="utf-8"))
    edit(answer["collected"])
    path.write_text(json.dumps(answer, indent=1), encoding="utf-8")


def no_profile(collected: Collected) -> None:
    """A box whose `.env` has no LOBES_PROFILE and no container carries one: its adopted
    state lacks `lobes.profile`, which the loader requires."""
    collected["envfile"] = [e for e in collected["envfile"] if e["key"] != "LOBES_PROFILE"]
    for container in collected["docker"]["containers"]:
        (container.get("env") or {}).pop("LOBES_PROFILE", None)


def damaged(fleet: Path, box: str) -> None:
    (fleet / "snapshot" / f"{box}.json").write_text('{"collected": {\n  "docker": [,]\n}')


def run(
    capsys: pytest.CaptureFixture[str], fleet: Path, out: Path, *boxes: str, partial: bool
) -> tuple[int, str]:
    """`reconcile --root FLEET -i lab import [BOX...] --from-snapshot FLEET/snapshot --output
    OUT [--partial]`, parsed by the command line's own parser."""
    argv = ["--root", str(fleet), "-i", "lab", "import", *boxes]
    argv += ["--from-snapshot", str(fleet / "snapshot"), "--output", str(out)]
    args = build_parser("import").parse_args(argv + (["--partial"] if partial else []))
    code = run_import(args)
    printed = capsys.readouterr()
    return code, printed.out + printed.err


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


PROBLEM = "group_vars/orin.yaml:4:1: lobes.profile: required key is missing"


def test_an_invalid_box_refuses_the_import_by_name_and_says_how_to_go_on(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_box(fleet, "orin", no_profile)
    out = tmp_path / "adopted"
    code, text = run(capsys, fleet, out, partial=False)
    assert code == 1 and not out.exists() and listing(tmp_path) == ["fleet"], text
    assert PROBLEM in text and "nothing written" in text
    assert "error: orin: its adopted state does not validate on its own" in text
    # The cause in the box's terms, and the way on.
    assert "found: LOBES_PROFILE is not in .env: lobes.profile must be filled in by hand" in text
    assert "give --partial to import thor, spark and leave out orin (exit 1 all the same)" in text


def test_partial_writes_the_valid_boxes_and_reports_the_invalid_one(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_box(fleet, "orin", no_profile)
    out = tmp_path / "adopted"
    code, text = run(capsys, fleet, out, partial=True)
    assert code == 1, text  # written, yet a script must notice the box it lacks
    assert sorted(load_fleet(out, "lab").boxes) == ["spark", "thor"]
    assert not (out / "group_vars" / "orin.yaml").exists()
    failed = text.split("failed, not adopted", 1)[1].split("found while importing:", 1)[0]
    assert "orin: its adopted state does not validate" in failed and PROBLEM in failed
    assert "adopted 2 boxes:" in text
    # Whoever reads the repository later sees it is partial, and what it lacks.
    for name in ("inventory/lab.yaml", "group_vars/all.yaml", "group_vars/thor.yaml"):
        head = (out / name).read_text(encoding="utf-8").split("\n", 8)
        assert any("PARTIAL (--partial)" in line and "orin (" in line for line in head), name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".adopted")]  # no leftovers


@pytest.mark.parametrize("partial", [False, True], ids=["refused", "partial"])
def test_a_damaged_box_file_is_named_with_its_line(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], partial: bool
) -> None:
    damaged(fleet, "orin")
    out = tmp_path / "adopted"
    code, text = run(capsys, fleet, out, partial=partial)
    assert code == 1, text
    where = "snapshot/orin.json)"  # (the path before it may be scrubbed: a key-shaped run)
    assert "orin" in text and "line 2 column 14" in text and where in text, text
    if partial:
        assert sorted(load_fleet(out, "lab").boxes) == ["spark", "thor"]
        assert "failed, not adopted" in text
    else:
        assert not out.exists() and "nothing written" in text
        assert "--partial" in text and "import thor spark --from-snapshot DIR" in text


def test_partial_with_a_box_the_snapshot_lacks_adopts_the_rest(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index_path = fleet / "snapshot" / "index.json"
    index = json.loads(index_path.read_text(encoding="utf-8"))
    index["boxes"].remove("spark")
    index_path.write_text(json.dumps(index), encoding="utf-8")
    out = tmp_path / "adopted"
    code, text = run(capsys, fleet, out, partial=True)
    assert code == 1 and sorted(load_fleet(out, "lab").boxes) == ["orin", "thor"], text
    assert "spark: not in the snapshot" in text


def test_partial_with_no_valid_box_writes_nothing(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for box in ("thor", "spark", "orin"):
        damaged(fleet, box)
    out = tmp_path / "adopted"
    code, text = run(capsys, fleet, out, partial=True)
    assert code == 1 and not out.exists() and "no box to adopt; nothing written" in text
