"""Review 8 of a fleet's own `secret_patterns`, on captured snapshots.

1. A pattern naming a `.env` key the desired state derives with a literal value (`LOBES_MESH_*`:
   LOBES_MESH_NAME from the box's name, _SEEDS, _HEARTBEAT_S from `mesh:`) validated, and every
   drift then said `LOBES_MESH_NAME *** -> *** (not comparable)` on every box (the box hashes
   a secret-named value, the controller holds the clear desired one). A pattern matching the
   tool's own lowercase names (`*`, `box`, `status`) validated too, and a snapshot saved under
   it held `box: ***` and could not be read back. `validate` now refuses both at the pattern's
   line, naming the pattern and what it matches.
2. `reconcile import` ignored the repository's own `secret_patterns`: a value they name was
   printed and written into the adopted group_vars in clear, and a live import did not send
   them to the boxes. It now reads them from the repository's layers, masks what they name,
   sends them, and writes them into the adopted `secret_patterns`.

examples/lab-incidents is the lab's field incidents (a repository and its snapshot);
tests/fixtures/import/lab_desired the pristine lab saved against the lab's desired state.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.desired import secret_names
from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError
from reconciler.importer import observations
from tests.unit.test_import_review8 import LAB_DESIRED, edited_snapshot, lab_root, run

REPO = Path(__file__).resolve().parents[2]
INCIDENTS = REPO / "examples/lab-incidents"
AUDIT = Path(__file__).resolve().parents[1] / "fixtures" / "audit"
FIRST = "secret_patterns: [GATEWAY_API_KEY,"  # all.yaml's list opens so (line 43)


@pytest.fixture(autouse=True)
def _own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A cache of its own, and no fleet patterns left adopted for the next test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    secret_names.adopt_fleet_patterns(())
    yield
    secret_names.adopt_fleet_patterns(())


def _incidents_with(tmp_path: Path, pattern: str) -> tuple[Path, str]:
    """examples/lab-incidents copied, `pattern` first in all.yaml's secret_patterns; returns the
    root and the pattern's FILE:LINE:COL as the loader names it."""
    root = tmp_path / "fleet"
    shutil.copytree(INCIDENTS, root, ignore=shutil.ignore_patterns("snapshot"))
    all_yaml = root / "group_vars/all.yaml"
    text = all_yaml.read_text(encoding="utf-8")
    assert text.count(FIRST) == 1
    text = text.replace(FIRST, f'secret_patterns: ["{pattern}", GATEWAY_API_KEY,', 1)
    all_yaml.write_text(text, encoding="utf-8")
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.startswith("secret_patterns"))
    column = len("secret_patterns: [") + 1
    return root, f"group_vars/all.yaml:{line}:{column}: secret_patterns[0]: '{pattern}' matches"


def _problems(root: Path) -> list[str]:
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(root, "lab")
    return [str(p) for p in caught.value.problems]


# -- 1. validate -------------------------------------------------------------------------------
def test_a_pattern_naming_the_mesh_keys_the_fleet_derives_is_refused_at_its_line(
    tmp_path: Path,
) -> None:
    """Before: `ok: 3 boxes`, then a false drift on every box at every run."""
    root, at = _incidents_with(tmp_path, "LOBES_MESH_*")
    problems = _problems(root)
    assert len(problems) == 1, problems  # one line for the three boxes: the same keys
    assert problems[0].startswith(
        f"{at} LOBES_MESH_NAME (from inventory (box name)), LOBES_MESH_HEARTBEAT_S (from "
        "mesh.heartbeat_s), LOBES_MESH_SEEDS (from inventory (other mesh members)): .env keys "
        "the fleet sets to a literal value"
    ), problems
    assert "narrow the pattern (a secret's value comes through `secrets:`" in problems[0]
    code, printed = run("--root", str(root), "-i", "lab", "validate")
    assert code == 1 and at in printed, printed


def test_the_replay_under_such_a_pattern_refuses_instead_of_a_false_drift(
    tmp_path: Path,
) -> None:
    """thor's LOBES_MESH_NAME as a box observed under the pattern holds it: hashed. Before:
    `envfile LOBES_MESH_NAME *** -> *** (not comparable) rewrite-env`."""
    root, at = _incidents_with(tmp_path, "LOBES_MESH_*")
    snap = tmp_path / "snap"
    shutil.copytree(INCIDENTS / "snapshot", snap)
    thor = json.loads((snap / "thor.json").read_text(encoding="utf-8"))
    line = next(e for e in thor["collected"]["envfile"] if e["key"] == "LOBES_MESH_NAME")
    assert line["value"] == "thor"
    line["value"] = {"secret": "hmac:" + "ab" * 32}  # the collector's form of a secret
    (snap / "thor.json").write_text(json.dumps(thor), encoding="utf-8")
    code, printed = run("--root", str(root), "-i", "lab", "drift", "--from-snapshot", str(snap),
                        "thor")  # fmt: skip
    assert code == 1, printed
    assert at in printed
    assert "not comparable" not in printed


def test_a_pattern_matching_everything_is_refused(tmp_path: Path) -> None:
    """`*`: every managed key and the tool's own names (a saved box file said `box: ***`)."""
    root, at = _incidents_with(tmp_path, "*")
    problems = [p for p in _problems(root) if p.startswith(at)]
    assert any(" MODEL_GEAR_VERSION (from lobes.version)" in p for p in problems), problems
    assert f"{at} 'box', one of the tool's own field names" in "\n".join(problems)


@pytest.mark.parametrize(
    ("pattern", "name"),
    [("box", "box"), ("status", "status"), ("*s", "status"), ("*_s", "elapsed_s")],
)
def test_a_pattern_matching_the_tools_own_names_is_refused(
    tmp_path: Path, pattern: str, name: str
) -> None:
    """Before: valid; a snapshot saved under `box`/`status` read back as `the collector's
    answer is malformed: gateway.health.status: expected an integer`."""
    root, at = _incidents_with(tmp_path, pattern)
    assert _problems(root) == [
        f"{at} {name!r}, one of the tool's own field names (a box file's `box` and "
        "`version`, a probe's `status`): saved snapshots and reports would hide them as *** "
        "and could not be read back; narrow the pattern to the variables it means"
    ]


@pytest.mark.parametrize("pattern", ["*_PW", "DB_*", "[A-Z]*_PW", "SESAME_?", "*_pw", "db_pw"])
def test_a_pattern_naming_only_variables_of_its_own_still_validates(
    tmp_path: Path, pattern: str
) -> None:
    root, _ = _incidents_with(tmp_path, pattern)
    assert pattern in load_fleet(root, "lab").boxes["thor"].secret_patterns


def test_every_field_name_of_a_captured_box_file_is_the_tools_own() -> None:
    """Every key of the captured box files with no upper-case letter that names no variable,
    lane, compose file or secret of the example's own is in the list a pattern may not match:
    a pattern naming one is refused. A lower-case variable's pattern (`*_pw`) names none of
    them (review 8: every pattern that could match a lower-case name was refused, so a fleet
    could not protect `db_pw`)."""
    from reconciler.desired.checks import _OWN_NAMES, own_name_matched

    def keys(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                yield key
                yield from keys(value)
        elif isinstance(node, list):
            for item in node:
                yield from keys(item)

    files = [*(INCIDENTS / "snapshot").glob("*.json"), *AUDIT.glob("*/*.json")]
    found = {k for f in files for k in keys(json.loads(f.read_text(encoding="utf-8")))}
    data = {  # the example's own names: its lanes, roles, compose files, secrets and a port
        k
        for k in found
        if k.startswith(("vllm-", "docker-compose")) or "/" in k or k in _DATA_NAMES
    }
    own = {k for k in found - data if k == k.lower() and all(c not in k for c in ":=@ .")}
    assert {"box", "version", "status", "elapsed_s"} <= own
    assert own <= set(_OWN_NAMES), sorted(own - set(_OWN_NAMES))
    for name in own:
        assert own_name_matched(name) == name
    for pattern in ("*_PW", "[A-Z]*", "GATEWAY_*", "*PASSWORD*", "*_pw", "db_pw", "?"):
        assert own_name_matched(pattern) is None, pattern


_DATA_NAMES = {
    "cortex", "decider", "embedder", "hand", "innereye", "muse", "reranker", "senses", "stt",
    "tts", "worker", "gateway_api_key", "hf_token", "mesh_key", "associate", "calibrated",
    "compatible", "feasible", "kv_cache_dtype", "max_model_len", "mtp", "quant",
    "quantization", "reasoning_parser", "speculative_config", "tool_parser", "tools",
    "weakest_link",
}  # fmt: skip


# -- 2. import ---------------------------------------------------------------------------------
CLEAR = "ClearDbPwValue4711"
RUNNING = "ClearDbPwRunning0815"


def _clear_pw(box: str, data: dict[str, Any]) -> None:
    """thor's `.env` and lanes carry DB_PW in clear, the lanes another value than `.env` (the
    reviewer's snapshot): no floor pattern names it, the fleet's `*_PW` does."""
    if box != "thor":
        return
    collected = data["collected"]
    last = max(line["line"] for line in collected["envfile"])
    collected["envfile"].append({"key": "DB_PW", "line": last + 1, "value": CLEAR})
    for c in collected["docker"]["containers"]:
        if c["name"] != "model-gear-gateway":
            c["env"]["DB_PW"] = RUNNING


def _root_with_patterns(tmp_path: Path, listed: str) -> Path:
    root = lab_root(tmp_path)
    (root / "group_vars").mkdir()
    (root / "group_vars/all.yaml").write_text(
        f"# the fleet's own\nsecret_patterns: {listed}\n", encoding="utf-8"
    )
    return root


def test_an_import_masks_and_keeps_the_repositorys_own_patterns(tmp_path: Path) -> None:
    """Before: `thor: .env:1204 sets DB_PW to 'ClearDbPwValue4711', but ... run with
    'ClearDbPwRunning0815'; adopted what runs`, that value written into group_vars/thor.yaml,
    and the adopted secret_patterns without `*_PW`."""
    snap = edited_snapshot(tmp_path, _clear_pw)
    out = tmp_path / "adopted"
    root = _root_with_patterns(tmp_path, '["*_PW"]')
    code, printed = run("--root", str(root), "-i", "lab", "import", "--from-snapshot", str(snap),
                        "--output", str(out))  # fmt: skip
    assert out.is_dir(), printed
    assert CLEAR not in printed and RUNNING not in printed, printed
    written = {p.name: p.read_text(encoding="utf-8") for p in (out / "group_vars").iterdir()}
    assert not any(CLEAR in text or RUNNING in text for text in written.values())
    assert not any("DB_PW:" in text for text in written.values())
    patterns = next(t for t in written["all.yaml"].splitlines() if t.startswith("secret_patt"))
    assert "'*_PW']  # policy default (not observed), and the repository's own " in patterns
    assert patterns.endswith("(group_vars/all.yaml:2)"), patterns
    assert "*_PW" in load_fleet(out, "lab").boxes["thor"].secret_patterns
    assert code in (0, 2), printed


def test_a_live_import_sends_the_repositorys_own_patterns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the payload carried only the policy's patterns: the box left DB_PW in clear."""
    sent: list[dict[str, Any]] = []

    def observe(inputs: Any, boxes: list[str], run_key: str) -> dict[str, Any]:
        sent.extend(inputs.payloads[b] for b in boxes)
        return {}  # no box answered: the import stops there

    monkeypatch.setattr(observations, "observe", observe)
    root = _root_with_patterns(tmp_path, '["*_PW", "DB_*"]')
    code, printed = run("--root", str(root), "-i", "lab", "import", "--output",
                        str(tmp_path / "adopted"))  # fmt: skip
    assert code == 1 and len(sent) == 3, printed
    for payload in sent:
        assert {"*_PW", "DB_*"} <= set(payload["secret_patterns"])
        assert set(secret_names.FLOOR) <= set(payload["secret_patterns"])


def test_an_import_refuses_a_pattern_the_loader_refuses_at_its_line(tmp_path: Path) -> None:
    """Before: imported, the snapshot's box files then judged under `status`."""
    root = _root_with_patterns(tmp_path, '["*_PW", "status"]')
    out = tmp_path / "adopted"
    code, printed = run("--root", str(root), "-i", "lab", "import", "--from-snapshot",
                        str(LAB_DESIRED), "--output", str(out))  # fmt: skip
    assert code == 1, printed
    assert (
        "group_vars/all.yaml:2:27: secret_patterns[1]: 'status' matches 'status', one of the "
        "tool's own" in printed
    )
    assert not out.exists()


def test_an_import_names_a_pattern_on_derived_keys_at_the_repositorys_line(
    tmp_path: Path,
) -> None:
    """Said at the repository's own line before anything is observed, not at the adopted
    file's in a directory then removed."""
    root = _root_with_patterns(tmp_path, '["LOBES_MESH_*"]')
    out = tmp_path / "adopted"
    code, printed = run("--root", str(root), "-i", "lab", "import", "--from-snapshot",
                        str(LAB_DESIRED), "--output", str(out))  # fmt: skip
    assert code == 1, printed
    assert (
        "group_vars/all.yaml:2:19: secret_patterns[0]: 'LOBES_MESH_*' matches "
        "LOBES_MESH_HEARTBEAT_S, LOBES_MESH_NAME, LOBES_MESH_SEEDS: .env keys"
    ) in printed
    assert not out.exists()


def test_an_import_with_no_group_vars_still_adopts(tmp_path: Path) -> None:
    """An operator with no group_vars yet: the policy's patterns, nothing else."""
    out = tmp_path / "adopted"
    code, printed = run("--root", str(lab_root(tmp_path)), "-i", "lab", "import",
                        "--from-snapshot", str(LAB_DESIRED), "--output", str(out))  # fmt: skip
    assert code == 0, printed
    text = (out / "group_vars/all.yaml").read_text(encoding="utf-8")
    assert "'*PASSWORD*']  # policy default (not observed)\n" in text
