"""Review 9, items 6 and 7 through the commands: needs the one-line wirings in
reconciler/history/store.py (pack) and reconciler/history/cli.py (_cmd_history)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.history_helpers import (
    SNAPSHOT,
    edited_snapshot,
    reconcile,
    replay,
    store_text,
    unvouched,
)

DIGEST = "3d09" + "a" * 60


def test_the_store_keeps_no_inline_mask_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def masks(docs: dict[str, Any]) -> None:
        docs["thor"]["controller"]["inline_masks"] = {"envfile": {"VLLM_ARGS": DIGEST}}

    edited = edited_snapshot(tmp_path, "masks", masks)
    unvouched(edited)
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, edited)
    text = store_text(db)
    assert DIGEST not in text and '"inline_masks":{"envfile":{"VLLM_ARGS":"***"}}' in text
    assert json.loads((edited / "thor.json").read_text())["controller"]["inline_masks"]


def test_history_since_past_every_run_says_how_many_there_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    code, out, _ = reconcile(capsys, "history", "--history", str(db), "--since", "2099-01-01")
    assert (code, out) == (0, f"no runs since 2099-01-01 (1 recorded in {db})\n")
    code, out, _ = reconcile(capsys, "history", "--history", str(db), "--since", "7d")
    assert code == 0 and "1 runs in" in out
