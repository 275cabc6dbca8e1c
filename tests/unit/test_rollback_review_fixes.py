"""Review of 2b80bfd (a rollback removes the files and lane containers a converge created since
its snapshot), driven whole through main() against a temp home and a fake docker engine:

- a second rollback to the same snapshot never replaces the copy the first put in `removed/`
  (it may be an operator's only bytes): the new copy gets a fresh name;
- a container is removed as a converge's only by an id a converge recorded making (`made`),
  never by a planned service name: one the operator started by hand stays;
- a `wrote` record that is there but no mapping is damaged, not old: the file is kept, and why;
- a snapshot whose `containers` record is damaged removes only this converge's containers,
  and says the snapshot is damaged;
- a `removed` that cannot hold the files fails the rollback before the first change;
- pruning by count deletes a snapshot with the files a rollback removed to it, and says so
  (review 3; before, such a snapshot was never pruned);
- a file replaced between the compare and the move (an editor's save) is put back and kept.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import load_box_program
from tests.unit.converge_harness import (
    EXTRA,
    EXTRA_V1,
    Engine,
    FileEngine,
    converge_payload,
    meta,
    run_events,
    snapshot_dirs,
)
from tests.unit.converge_helpers import deployment

converge = load_box_program("box_rollback_review_fixes", "reconciler/apply/remote/converge.py")


@pytest.fixture
def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    deploy = deployment(tmp_path, monkeypatch, "FOO=1\n") / ".lobes"
    good = deploy / ".fleet" / "known-good"  # the stored copy a converge restores EXTRA from
    good.mkdir(parents=True, mode=0o700)
    (deploy / ".fleet").chmod(0o700)
    (good / EXTRA).write_bytes(EXTRA_V1)
    return deploy


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


RESTORE = [{"name": EXTRA, "sha256": sha(EXTRA_V1)}]


def result(p: dict[str, Any]) -> dict[str, Any]:
    _, events = run_events(converge, p)
    assert events[-1]["event"] == "result", events[-1]
    return events[-1]


def rollback_to(sid: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    _, events = run_events(converge, converge_payload("rollback", snapshot=sid))
    return events[-1], events


def notes(events: list[dict[str, Any]]) -> str:
    return "\n".join(e.get("message", "") for e in events if e["event"] == "note")


def edit_meta(deploy: Path, sid: str, **changes: Any) -> None:
    path = deploy / ".fleet" / "snapshots" / sid / "meta.json"
    m = json.loads(path.read_text())
    for key, value in changes.items():
        if value is KeyError:
            m.pop(key)
        else:
            m[key] = value
    path.write_text(json.dumps(m))


def removed_dir(deploy: Path, sid: str) -> Path:
    return deploy / ".fleet" / "snapshots" / sid / "removed"


# -- 1: a second rollback to the same snapshot -------------------------------------------------
def test_a_second_rollback_to_a_snapshot_keeps_the_copy_the_first_removed(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh box: C1 creates .env, the operator adds a line, C2 rewrites .env keeping it. The
    first rollback to S1 moves that .env (the operator's line's only copy once S2 goes) aside;
    C3 creates .env again and a second rollback to S1 moves it aside too, under a fresh name."""
    Engine(monkeypatch, converge, deploy)
    (deploy / ".env").unlink()
    s1 = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    with open(deploy / ".env", "a") as f:
        f.write("OPERATOR_NOTE=only-copy\n")
    assert result(converge_payload(managed_env={"FOO": "3"}))["ok"]
    first, _ = rollback_to(s1)
    assert first["removed"] == [".env"]
    operator_copy = (removed_dir(deploy, s1) / ".env").read_bytes()
    assert b"OPERATOR_NOTE" in operator_copy
    assert result(converge_payload(managed_env={"FOO": "4"}))["ok"]
    second, events = rollback_to(s1)
    assert second["ok"] and second["removed"] == [".env"]
    assert (removed_dir(deploy, s1) / ".env").read_bytes() == operator_copy  # never replaced
    assert b"FOO=4" in (removed_dir(deploy, s1) / ".env.2").read_bytes()
    assert "removed/.env.2" in notes(events)
    assert not (deploy / ".env").exists()


def test_a_second_legacy_rollback_keeps_the_operators_bytes_it_removed_first(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot older than the `wrote` record removes whatever the file holds (as it always
    did): the operator's bytes it moved aside survive a second rollback to it."""
    Engine(monkeypatch, converge, deploy)
    s1 = result(converge_payload(restore=RESTORE))["snapshot"]
    edit_meta(deploy, s1, wrote=KeyError)
    (deploy / EXTRA).write_bytes(b"# operator's tuning, only copy\n")
    assert rollback_to(s1)[0]["removed"] == [EXTRA]
    assert result(converge_payload(restore=RESTORE))["ok"]  # a later converge creates it again
    assert rollback_to(s1)[0]["removed"] == [EXTRA]
    assert (removed_dir(deploy, s1) / EXTRA).read_bytes() == b"# operator's tuning, only copy\n"
    assert (removed_dir(deploy, s1) / (EXTRA + ".2")).read_bytes() == EXTRA_V1


# -- 3: a container started by hand ------------------------------------------------------------
def test_a_rollback_removes_no_container_the_operator_started_by_hand(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FileEngine(monkeypatch, converge, deploy)
    s1 = result(converge_payload(restore=RESTORE, services=["extra"]))["snapshot"]
    made = engine.c["extra"]["Id"]
    done, _ = rollback_to(s1)
    assert done["removed_containers"] == ["extra"] and "extra" not in engine.c
    # The operator runs the lane by hand (its own compose file, same project), then a converge
    # that does not touch it, then a second rollback to s1: whose planned services name it.
    engine.up("extra")
    mine = engine.c["extra"]["Id"]
    assert result(converge_payload(managed_env={"FOO": "7"}))["ok"]
    done, _ = rollback_to(s1)
    assert ["docker", "rm", "-f", mine] not in engine.log
    assert engine.c["extra"]["Id"] == mine and done["removed_containers"] == []
    assert "extra" in done["unequal"]  # not the snapshot's, and said so
    # What proved the first one a converge's: the id its converge recorded making.
    assert meta(deploy, s1).get("made", {}).get("extra") == [made]


# -- 5: a damaged `wrote` record ---------------------------------------------------------------
@pytest.mark.parametrize("damaged", [None, [], "x", 0])
def test_a_damaged_wrote_record_keeps_the_file_and_says_why(
    deploy: Path, monkeypatch: pytest.MonkeyPatch, damaged: Any
) -> None:
    Engine(monkeypatch, converge, deploy)
    s1 = result(converge_payload(restore=RESTORE))["snapshot"]
    edit_meta(deploy, s1, wrote=damaged)
    (deploy / EXTRA).write_bytes(b"# operator's edit\n")
    done, events = rollback_to(s1)
    assert done["ok"] and done["removed"] == []
    assert [k["name"] for k in done["kept"]] == [EXTRA]
    assert "damaged" in done["kept"][0]["why"] and s1 in done["kept"][0]["why"]
    assert (deploy / EXTRA).read_bytes() == b"# operator's edit\n"
    assert f"kept {EXTRA}: the record of what a converge wrote is damaged" in notes(events)


# -- 4: a damaged `containers` record ----------------------------------------------------------
def test_a_damaged_containers_record_removes_only_this_converges_containers(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FileEngine(monkeypatch, converge, deploy)
    engine.up("extra")  # running at the snapshot, not rendered: perhaps the operator's
    s1 = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    # Even planned and recorded as made by a converge: with the snapshot's record gone,
    # whether it was there at the snapshot is not known, so it stays.
    made = {"extra": [engine.c["extra"]["Id"]]}
    edit_meta(deploy, s1, containers=None, services=["extra"], made=made)
    done, events = rollback_to(s1)
    assert done["ok"] and done["removed_containers"] == [] and "extra" in engine.c
    assert f"snapshot {s1} is damaged: its record of the containers" in notes(events)


# -- 7: `removed` checked before the first change ----------------------------------------------
def test_a_removed_dir_that_cannot_hold_the_files_fails_the_rollback_before_any_change(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    s1 = result(converge_payload(restore=RESTORE, managed_env={"FOO": "2"}))["snapshot"]
    removed_dir(deploy, s1).write_bytes(b"")  # a damaged snapshot directory
    done, _ = rollback_to(s1)
    assert done["ok"] is False and "nothing was restored" in done["failed"]
    assert (deploy / ".env").read_text() == "FOO=2\n"  # nothing changed: no half rollback
    assert (deploy / EXTRA).read_bytes() == EXTRA_V1


# -- 2: pruning and removed copies -------------------------------------------------------------
def test_pruning_deletes_a_snapshot_with_its_removed_files_and_says_so(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 3: the removed copies go with their snapshot (they piled up for ever before);
    test_review3_converge.py holds the rest."""
    Engine(monkeypatch, converge, deploy)
    s1 = result(converge_payload(restore=RESTORE))["snapshot"]
    result(converge_payload(managed_env={"FOO": "3"}))
    assert rollback_to(s1)[0]["removed"] == [EXTRA]
    aside = removed_dir(deploy, s1) / EXTRA
    assert aside.read_bytes() == EXTRA_V1
    _, events = run_events(converge, converge_payload(managed_env={"FOO": "5"}, keep=1))
    assert events[-1]["ok"]
    assert s1 not in snapshot_dirs(deploy) and not aside.exists()
    assert f"pruned snapshot {s1} with the files a rollback had removed" in notes(events)
    assert len(snapshot_dirs(deploy)) == 1


# -- 6: a file replaced between the compare and the move ---------------------------------------
def test_a_file_saved_over_between_the_compare_and_the_move_is_put_back_and_kept(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    s1 = result(converge_payload(restore=RESTORE))["snapshot"]
    real = converge.read_regular
    target = str(deploy / EXTRA)

    def racing(path: str, *a: Any, **k: Any) -> Any:
        out = real(path, *a, **k)
        if path == target:  # an editor saves by rename right after the compare
            tmp = deploy / "x.tmp"
            tmp.write_bytes(b"# operator just saved this\n")
            os.replace(tmp, target)
        return out

    monkeypatch.setattr(converge, "read_regular", racing)
    done, events = rollback_to(s1)
    assert done["ok"] and done["removed"] == []
    assert [k["name"] for k in done["kept"]] == [EXTRA]
    assert "replaced while the rollback removed it" in done["kept"][0]["why"]
    assert (deploy / EXTRA).read_bytes() == b"# operator just saved this\n"
    assert not any(removed_dir(deploy, s1).iterdir())  # nothing left aside
    assert f"written by converge {s1}" not in notes(events)
