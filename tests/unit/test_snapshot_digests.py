"""A snapshot's index records each box file's SHA-256 (observe.save_snapshot); a replay reads a
file that still has it without json's per-object duplicate-key check (the tool wrote it from
parsed dicts), and any other file with the full check: an edited file is refused as before."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from reconciler.observe.document import Fault, FaultKind, load_json
from reconciler.observe.observe import (
    load_snapshot,
    recorded_digest,
    save_snapshot,
    snapshot_observation,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents" / "snapshot"
DUPLICATE = '{"collector": 1, "user": "a", "user": "b"}'


def _saved(tmp_path: Path) -> tuple[Path, dict]:
    _, observations = load_snapshot(EXAMPLE)
    directory = tmp_path / "saved"
    save_snapshot(directory, observations, {"run_id": "r1", "inventory": "inventory/lab.yaml"})
    return directory, json.loads((directory / "index.json").read_text(encoding="utf-8"))


def test_each_saved_file_has_its_digest_in_the_index(tmp_path: Path) -> None:
    directory, index = _saved(tmp_path)
    assert sorted(index["sha256"]) == index["boxes"] == ["orin", "spark", "thor"]
    for box, digest in index["sha256"].items():
        assert hashlib.sha256((directory / f"{box}.json").read_bytes()).hexdigest() == digest
        assert recorded_digest(index, box) == digest


def test_a_file_with_its_digest_reads_as_with_the_full_check(tmp_path: Path) -> None:
    directory, index = _saved(tmp_path)
    for box in index["boxes"]:
        fast = snapshot_observation(box, directory / f"{box}.json", recorded_digest(index, box))
        full = snapshot_observation(box, directory / f"{box}.json")
        assert fast.failure is None and full.failure is None
        assert fast.collected == full.collected and fast.controller == full.controller
        assert fast.document is not None and full.document is not None
        assert fast.document.containers[0].env == full.document.containers[0].env


def test_an_edited_file_takes_the_full_check_and_a_repeated_key_is_refused(
    tmp_path: Path,
) -> None:
    directory, index = _saved(tmp_path)
    path = directory / "thor.json"
    path.write_text('{"box": "thor", "collected": ' + DUPLICATE + "}\n", encoding="utf-8")
    obs = snapshot_observation("thor", path, recorded_digest(index, "thor"))
    assert isinstance(obs.failure, Fault) and obs.failure.kind is FaultKind.NOT_JSON
    assert "a key appears twice" in obs.failure.what


def test_a_malformed_digest_in_the_index_is_no_digest() -> None:
    good = "ab" * 32
    assert recorded_digest({"sha256": {"thor": good}}, "thor") == good
    for index in (
        {},
        {"sha256": ["thor"]},
        {"sha256": {"thor": good.upper()}},
        {"sha256": {"thor": good[:-1]}},
        {"sha256": {"thor": "zz" * 32}},
        {"sha256": {"thor": 7}},
        {"sha256": {"spark": good}},
    ):
        assert recorded_digest(index, "thor") is None


def test_without_the_key_check_nan_is_still_refused() -> None:
    fault = load_json('{"elapsed_s": NaN}', keys_unique=True)
    assert isinstance(fault, Fault) and fault.kind is FaultKind.NOT_JSON
    assert load_json(DUPLICATE, keys_unique=True) == {"collector": 1, "user": "b"}
    assert isinstance(load_json(DUPLICATE), Fault)
