"""A fleet's own `secret_patterns` (beyond the built-in floor) reach the last guards that judge
a name with no box at hand: the reports' mask, the history store's masking and the free-text
scrub. The collector hashes such values on the box, but a snapshot saved before the pattern
was added (or edited) holds them in clear, and a replay of it printed them and stored them."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.desired import secret_names
from reconciler.desired.load import load_fleet
from reconciler.drift import replay_parts
from reconciler.drift_inputs import drift_inputs
from reconciler.history import masking
from reconciler.report.json_parts import render_json_parts
from reconciler.scrub import mask_assignments, scrub_text

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"
CLEAR = "org-clearvalue-9876"
NAME = "OPENAI_ORG"  # matches no floor pattern


@pytest.fixture(autouse=True)
def _no_fleet_patterns() -> Iterator[None]:
    secret_names.adopt_fleet_patterns(())
    yield
    secret_names.adopt_fleet_patterns(())


def _fleet_copy(tmp_path: Path, pattern: bool) -> Path:
    """The example with a clear OPENAI_ORG in thor's gateway container (drift: not desired),
    and with `*_ORG` added to the fleet's secret_patterns when `pattern`."""
    root = tmp_path / "fleet"
    shutil.copytree(EXAMPLE, root)
    box = root / "snapshot" / "thor.json"
    doc = json.loads(box.read_text("utf-8"))
    doc["collected"]["docker"]["containers"][0]["env"][NAME] = CLEAR
    box.write_text(json.dumps(doc), "utf-8")
    if pattern:
        all_yaml = root / "group_vars" / "all.yaml"
        text = all_yaml.read_text("utf-8")
        assert '"*PASSWORD*"]' in text
        all_yaml.write_text(text.replace('"*PASSWORD*"]', '"*PASSWORD*", "*_ORG"]'), "utf-8")
    return root


def _replay(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FLEET_INVENTORY", None)
    argv = ["--root", str(root), "-i", "lab", "drift", "--from-snapshot", str(root / "snapshot")]
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *argv, *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


def _stored_hits(db: Path) -> int:
    hits = 0
    with sqlite3.connect(db) as conn:
        tables = [t for (t,) in conn.execute("select name from sqlite_master where type='table'")]
        for table in tables:
            for row in conn.execute(f'select * from "{table}"'):
                for value in row:
                    raw = value if isinstance(value, bytes) else str(value).encode()
                    with contextlib.suppress(zlib.error):
                        raw += zlib.decompress(raw)
                    hits += CLEAR.encode() in raw
    return hits


def test_without_the_pattern_the_value_is_no_secret_and_shows(tmp_path: Path) -> None:
    """The control: the edited snapshot does carry the value into the report."""
    root = _fleet_copy(tmp_path, pattern=False)
    out = _replay(root, "--format", "json", "--no-history")
    assert out.returncode == 2, out.stderr
    assert CLEAR in out.stdout


@pytest.mark.parametrize("fmt", ["json", "text", "markdown", "html"])
def test_a_replay_masks_a_value_under_the_fleets_own_pattern(tmp_path: Path, fmt: str) -> None:
    root = _fleet_copy(tmp_path, pattern=True)
    db = tmp_path / "history.sqlite3"
    out = _replay(root, "--format", fmt, "--history", str(db))
    assert out.returncode == 2, out.stderr
    assert NAME in out.stdout  # the drift is reported ...
    assert CLEAR not in out.stdout + out.stderr  # ... its value masked
    assert db.exists() and _stored_hits(db) == 0
    if fmt == "json":
        entry = next(
            d for box in json.loads(out.stdout)["boxes"] for d in box["drifts"] if d["path"] == NAME
        )
        assert entry["secret"] is True and entry["observed"]["secret"] is True


def test_a_replay_in_parts_adopts_the_fleets_patterns(tmp_path: Path) -> None:
    """The path a large replay takes (workers forked after the adoption)."""
    root = _fleet_copy(tmp_path, pattern=True)
    inputs = drift_inputs(load_fleet(root, "lab"))
    assert "*_ORG" in inputs.secret_patterns
    text = "".join(render_json_parts(replay_parts(inputs, list(inputs.boxes), root / "snapshot")))
    assert NAME in text and CLEAR not in text


def test_the_inputs_carry_every_boxs_patterns_through_the_cache(tmp_path: Path) -> None:
    root = _fleet_copy(tmp_path, pattern=True)
    inputs = drift_inputs(load_fleet(root, "lab"))
    again = pickle.loads(pickle.dumps(inputs, protocol=5))
    assert again.secret_patterns == inputs.secret_patterns
    assert "*_ORG" in again.secret_patterns


def test_the_stores_masking_judges_a_name_again_when_the_patterns_change() -> None:
    doc = {"collected": {"docker": {"containers": [{"env": {NAME: CLEAR}}]}}}
    assert masking.stored(doc) is doc  # remembered as no secret name ...
    secret_names.adopt_fleet_patterns(["*_ORG"])
    masked = masking.stored(doc)  # ... and judged again under the new patterns
    assert masked["collected"]["docker"]["containers"][0]["env"][NAME] == masking.MASK
    secret_names.adopt_fleet_patterns(())
    assert masking.stored(doc) is doc


def test_the_free_text_scrub_masks_an_assignment_under_the_fleets_pattern() -> None:
    text = f"error: {NAME}={CLEAR} refused"
    assert CLEAR in scrub_text(text)
    secret_names.adopt_fleet_patterns(["*_ORG"])
    assert CLEAR not in scrub_text(text)
    assert CLEAR not in masking.scrubbed(text)


def test_the_floor_is_never_adopted_twice_and_order_is_kept() -> None:
    secret_names.adopt_fleet_patterns(["*_ORG", "HF_TOKEN", "*_ORG", "MY_*"])
    assert secret_names.fleet_patterns() == ("*_ORG", "MY_*")


def test_the_assignment_scan_is_skipped_only_where_no_pattern_could_match() -> None:
    """mask_assignments looks for each pattern's literal run before its regular expressions
    (a 1,000-box mesh's seeds, a URL per member, cost 1.6 s of scans): the skip never hides an
    assignment a pattern names, in any case, nor one a fleet pattern adds."""
    seeds = ",".join(f"http://10.77.{i // 250}.{i % 250}:8000" for i in range(1000))
    assert mask_assignments(seeds) is seeds
    assert mask_assignments("x hf_Token=abcdef1 y") == "x hf_Token=*** y"
    assert mask_assignments(f"{NAME}={CLEAR}") == f"{NAME}={CLEAR}"
    secret_names.adopt_fleet_patterns(["*_ORG"])
    assert mask_assignments(f"{NAME}={CLEAR}") == f"{NAME}=***"
    assert mask_assignments(f"openai_org={CLEAR}") == f"openai_org={CLEAR}"  # fnmatchcase
    secret_names.adopt_fleet_patterns(["*"])  # no literal run: every name is a secret's
    assert mask_assignments("MODE=fast") == "MODE=***"
