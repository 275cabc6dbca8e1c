"""A snapshot may come from anywhere: every reader of its files keeps the replay's bounds.

The replay itself reads each box's file within SNAPSHOT_FILE_LIMIT and a depth json can parse
(test_audit_hostile.py). These are the other readers: the index (read by every replay, audit
and `diff`), the history's copy of each replayed box, and `diff --from-snapshot`. A hostile
file is said as that file's error, with exit 1 where the run cannot go on, and never a
traceback; a box the report judged missing or broken is not stored as observed.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from reconciler.observe.observe import SNAPSHOT_FILE_LIMIT
from tests.unit.history_helpers import SNAPSHOT, reconcile, undated

DEEP = "[" * 100_000 + "]" * 100_000
HOSTILE: dict[str, Callable[[], bytes]] = {
    "nested past the parser": lambda: DEEP.encode(),
    "oversized": lambda: b'{"pad": "' + b"x" * SNAPSHOT_FILE_LIMIT + b'"}',
    "not UTF-8": lambda: b'{"snapshot": 1, "boxes": ["thor\xff"]}',
}


def copied(tmp_path: Path) -> Path:
    target = tmp_path / "snapshot"
    shutil.copytree(SNAPSHOT, target)
    return target


def stored_observations(db: Path) -> dict[str, object]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT box, document FROM observations").fetchall()
    return {box: json.loads(zlib.decompress(document)) for box, document in rows}


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize(
    "command",
    [["drift", "--format", "json"], ["audit"], ["diff"]],
    ids=["drift", "audit", "diff"],
)
def test_a_hostile_index_is_the_runs_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, command: list[str]
) -> None:
    snapshot = copied(tmp_path)
    (snapshot / "index.json").write_bytes(HOSTILE[case]())
    sides = [str(snapshot), str(SNAPSHOT)] if command == ["diff"] else [str(snapshot)]
    code, out, err = reconcile(capsys, *command, "--from-snapshot", *sides)
    assert code == 1
    assert out == ""
    assert f"error: {snapshot}/index.json: " in err
    if case == "oversized":  # refused by its size, before it is parsed
        assert f"the limit is {SNAPSHOT_FILE_LIMIT}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("case", ["nested past the parser", "oversized"])
def test_a_recorded_replay_stores_no_observation_the_replay_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    snapshot = copied(tmp_path)
    (snapshot / "orin.json").write_bytes(HOSTILE[case]())
    plain = reconcile(capsys, "drift", "--from-snapshot", str(snapshot), "--format", "json")
    db = tmp_path / "h.sqlite3"
    code, out, err = reconcile(
        capsys, "drift", "--from-snapshot", str(snapshot), "--format", "json", "--history", str(db)
    )
    # the same report and exit code as without the history (but the time it was made)
    assert (code, undated(out)) == (plain[0], undated(plain[1]))
    assert '"observation": "none"' in out  # the report judged orin as not observed
    assert "Traceback" not in err and "warning" not in err
    assert sorted(stored_observations(db)) == ["spark", "thor"]


def test_a_recorded_replay_stores_only_the_boxes_its_index_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file beside the index for a box it does not list: the report says the box is missing
    from the snapshot, so the history must not keep that file as the box's observation."""
    snapshot = copied(tmp_path)
    index = (snapshot / "index.json").read_text()
    assert '"orin",' in index or '"orin"\n' in index
    (snapshot / "index.json").write_text(index.replace('"orin",', "").replace(',\n    "orin"', ""))
    db = tmp_path / "h.sqlite3"
    code, out, _ = reconcile(
        capsys, "drift", "--from-snapshot", str(snapshot), "orin", "spark", "thor",
        "--format", "json", "--history", str(db),
    )  # fmt: skip
    assert code != 0 and "not in the snapshot" in out
    assert sorted(stored_observations(db)) == ["spark", "thor"]


@pytest.mark.parametrize("case", ["nested past the parser", "oversized"])
def test_diff_names_a_hostile_box_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    snapshot = copied(tmp_path)
    (snapshot / "spark.json").write_bytes(HOSTILE[case]())
    code, out, err = reconcile(capsys, "diff", "--from-snapshot", str(SNAPSHOT), str(snapshot))
    assert (code, out) == (1, "")
    assert f"error: {snapshot}/spark.json: " in err
    assert "Traceback" not in err
