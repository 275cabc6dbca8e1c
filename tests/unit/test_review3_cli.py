"""Review 3 of the command line (/tmp/review/cli_defects.md, defects 6 and 7).

6. A box whose plan is blocked (here: a controller secret unset) fails its pyinfra host while
   the deploy plans, so `pyinfra ... --dry` exits 1 naming the box and why, as
   `reconcile apply --dry` does; it used to exit 0, the refusal being an operation that only
   ran when executed. With -y the other boxes are still planned; without -y pyinfra asks
   whether to go on, and with no terminal to answer it stops, saying so, exit 1. pyinfra runs
   through test_deploys_review_fixes' wrapper that fakes the boxes.
7. A BOX named twice is taken once, in the order first named: `drift thor thor` observed thor
   twice, counted its differences twice ("on 2 of 2 boxes") and its run was not recorded
   (two rows for one box in the history store). The runs are replays of lab-incidents'
   snapshot, compared with the same run naming the box once.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from reconciler import cli
from tests.unit.history_helpers import INCIDENTS, SNAPSHOT, reconcile
from tests.unit.test_deploys_review_fixes import (  # noqa: F401 (fleet_repo: a fixture)
    fake_lines,
    fleet_repo,
    pyinfra,
    said,
)

SECRET_LINE = (
    "{box}: not converged: blocked: controller secret: secret gateway_key: "
    "$FLEET_TEST_KEY is not set on this controller (needed to check {box}); no box was contacted"
)


# -- 6. a blocked plan fails pyinfra's dry run -------------------------------------------------
def test_a_dry_run_of_a_blocked_box_exits_1_naming_the_box_and_why(
    fleet_repo: Path,  # noqa: F811
) -> None:
    """The reviewer's repro: no -y, stdin not a terminal (a CI gate)."""
    done = pyinfra(
        fleet_repo,
        "inventory.py",
        "deploys/thor.py",
        "deploys/orin.py",  # a second box: pyinfra would go on with it, so it asks first
        "--dry",
        FAKE_MISSING_SECRET_FOR="thor",
    )
    text = said(done)
    assert done.returncode == 1, text
    assert SECRET_LINE.format(box="thor") in text.splitlines()
    assert "thor cannot be converged" in text and "pass -y" in text  # why it stopped there
    assert "Traceback" not in text
    assert [line for line in fake_lines(done) if not line.startswith("[observe")] == []


def test_a_blocked_box_fails_a_dry_run_with_y_and_the_others_are_still_planned(
    fleet_repo: Path,  # noqa: F811
) -> None:
    argv = ("-y", "inventory.py", "deploys/mesh.py", "--dry")
    done = pyinfra(fleet_repo, *argv, FAKE_MISSING_SECRET_FOR="spark")
    text = said(done)
    assert done.returncode == 1, text
    assert SECRET_LINE.format(box="spark") in text.splitlines()
    planned = {m.group(1) for m in re.finditer(r"\[(\w+)\]\s+plan: ", text)}
    assert planned == {"thor", "spark", "orin"}  # spark's plan line says why it is blocked
    assert "Traceback" not in text
    assert [line for line in fake_lines(done) if not line.startswith("[observe")] == []


# -- 7. a BOX named twice is one box -----------------------------------------------------------
def _json_run(capsys: Any, tmp_path: Path, store: str, *args: str) -> tuple[int, Any, str]:
    """One replay as JSON, recorded in a store of its own: exit code, document (without what
    differs from run to run), stderr (with the store's name left out)."""
    where = tmp_path / store
    code, out, err = reconcile(
        capsys, *args, "--format", "json", "--from-snapshot", str(SNAPSHOT), "--history", str(where)
    )
    doc = json.loads(out)
    for key in ("generated_at", "run", "run_id"):
        doc.pop(key, None)
    return code, doc, err.replace(str(where), "STORE")


@pytest.mark.parametrize("command", ["drift", "audit"])
def test_a_box_named_twice_is_observed_counted_and_recorded_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    once = _json_run(capsys, tmp_path, "once.sqlite3", command, "thor", "spark")
    twice = _json_run(capsys, tmp_path, "twice.sqlite3", command, "thor", "spark", "thor")
    assert twice == once
    assert "not recorded" not in twice[2]


def test_a_box_named_twice_is_one_box_in_the_text_summary(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = reconcile(
        capsys, "drift", "thor", "thor", "--from-snapshot", str(SNAPSHOT),
        "--history", str(tmp_path / "h.sqlite3"),
    )  # fmt: skip
    assert code == 2, err
    assert out.count("thor: reachable") == 1
    assert "on 1 of 1 box " in out


class _Stop(Exception):
    """Raised by the faked launch: the boxes it was given are all this test needs."""


def test_a_live_drift_sends_a_box_named_twice_one_collector(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The live run starts the collectors before loading anything (observe/early.py), from the
    BOX arguments as given: they are taken once before that."""
    from reconciler.observe import early

    asked: dict[str, Any] = {}

    def start(root: Path, inventory: Path, boxes: list[str] | None, key: str) -> None:
        asked["start"] = boxes
        return None  # nothing remembered: the run loads the desired state, then launches

    def launch(inputs: Any, boxes: list[str], key: str) -> None:
        asked["launch"] = boxes
        raise _Stop

    monkeypatch.setattr(early, "start", start)
    monkeypatch.setattr(early, "launch", launch)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    argv = ["--root", str(INCIDENTS), "-i", "lab", "drift", "spark", "thor", "spark"]
    with pytest.raises(_Stop):
        cli.main([*argv, "--history", str(tmp_path / "h.sqlite3")])
    assert asked == {"start": ["spark", "thor"], "launch": ["spark", "thor"]}
