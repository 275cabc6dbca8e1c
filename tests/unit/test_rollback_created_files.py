"""A rollback and the files a converge CREATED (reconciler/apply/remote/converge.py), driven
whole through main() against a temp home and a fake docker engine (converge_harness):

- a converge records, before it writes, the digest of every managed file it writes (`wrote`
  in its snapshot); a rollback removes a path that was absent at the snapshot only when it
  still holds bytes a converge wrote, moving it into the snapshot's `removed/` directory;
- an operator's edit of such a file, or a file made by hand, is kept and named with why;
- a rollback to an older snapshot removes what the later converges created, still theirs;
- a snapshot without the record (an older converge's) rolls back as it always did;
- the container of a lane whose compose file the rollback removed goes with it, by id
  (compose no longer knows the service), in a failed converge's rollback and an operator's;
- the controller reads `removed` / `kept` / `removed_containers` and says them.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import boxcall
from reconciler.apply.answer import rollback_result
from reconciler.apply.summary import _rollback_line
from reconciler.cli import main
from tests.unit.conftest import load_box_program
from tests.unit.converge_harness import (
    EXTRA,
    EXTRA_V1,
    Engine,
    FileEngine,
    converge_payload,
    meta,
    run_events,
)
from tests.unit.converge_helpers import deployment

converge = load_box_program("box_rollback_created_files", "reconciler/apply/remote/converge.py")

EXTRA_V2 = b"services:\n  extra:\n    image: lobes/extra:2\n"
OTHER = "docker-compose.other.yml"
OTHER_V1 = b"services: {}\n"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"


@pytest.fixture
def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    deploy = deployment(tmp_path, monkeypatch, "FOO=1\n") / ".lobes"
    # The stored copies a converge restores from (as a verified converge keeps them).
    good = deploy / ".fleet" / "known-good"
    good.mkdir(parents=True, mode=0o700)
    (deploy / ".fleet").chmod(0o700)
    for data in (EXTRA_V1, EXTRA_V2, OTHER_V1):
        name = OTHER if data == OTHER_V1 else EXTRA
        if data == EXTRA_V2:
            # A second pin of EXTRA lives in a crafted old snapshot's copy (find_copy reads
            # snapshots too): what a later converge may restore over the first.
            old = deploy / ".fleet" / "snapshots" / "20000101T000000Z"
            old.mkdir(parents=True, mode=0o700)
            (old / EXTRA).write_bytes(data)
            (old / "meta.json").write_text(json.dumps({"files": {}, "status": "applied"}))
        else:
            (good / name).write_bytes(data)
    return deploy


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def restore(*pins: tuple[str, bytes]) -> list[dict[str, str]]:
    return [{"name": name, "sha256": sha(data)} for name, data in pins]


def result(p: dict[str, Any]) -> dict[str, Any]:
    _, events = run_events(converge, p)
    assert events[-1]["event"] == "result"
    return events[-1]


def rollback_to(sid: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    _, events = run_events(converge, converge_payload("rollback", snapshot=sid))
    return events[-1], events


def notes(events: list[dict[str, Any]]) -> str:
    return "\n".join(e.get("message", "") for e in events if e["event"] == "note")


# -- the box program ---------------------------------------------------------------------------
def test_a_converge_records_what_it_writes_before_it_writes_it(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    seen: dict[str, Any] = {}
    real = converge.atomic_write

    def spy(path: str, data: bytes, mode: int) -> None:
        if path.endswith("/" + EXTRA):  # the moment the new file is written: already recorded
            sid = converge.list_snapshots(converge.Box(converge_payload()))[-1]
            seen.update(meta(deploy, sid)["wrote"])
        real(path, data, mode)

    monkeypatch.setattr(converge, "atomic_write", spy)
    r = result(converge_payload(restore=restore((EXTRA, EXTRA_V1))))
    assert r["ok"], r
    assert seen[EXTRA] == [sha(EXTRA_V1)]
    written = meta(deploy, r["snapshot"])["wrote"]
    assert written == {".env": [sha((deploy / ".env").read_bytes())], EXTRA: [sha(EXTRA_V1)]}
    assert meta(deploy, r["snapshot"])["files"][EXTRA] is None  # absent when it was taken


def test_a_file_the_converge_created_is_removed_by_its_rollback_and_kept_aside(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    sid = result(converge_payload(restore=restore((EXTRA, EXTRA_V1))))["snapshot"]
    assert (deploy / EXTRA).read_bytes() == EXTRA_V1
    done, events = rollback_to(sid)
    assert done["ok"] is True, done
    assert not (deploy / EXTRA).exists()
    # Reversible: the removed file is in the snapshot's `removed/`, byte for byte.
    aside = deploy / ".fleet" / "snapshots" / sid / "removed" / EXTRA
    assert aside.read_bytes() == EXTRA_V1
    assert done["removed"] == [EXTRA] and done["kept"] == []
    assert sorted(done["files"]) == sorted([".env", EXTRA])
    assert (deploy / ".env").read_text() == "FOO=1\n"
    assert f"removed {EXTRA}" in notes(events) and f"written by converge {sid}" in notes(events)


def test_an_operator_edit_of_a_created_file_is_kept_and_the_rollback_says_why(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    sid = result(converge_payload(restore=restore((EXTRA, EXTRA_V1))))["snapshot"]
    edited = EXTRA_V1 + b"    # tuned by hand\n"
    (deploy / EXTRA).write_bytes(edited)
    done, events = rollback_to(sid)
    assert done["ok"] is True, done
    assert (deploy / EXTRA).read_bytes() == edited
    assert done["removed"] == [] and EXTRA not in done["files"]
    [kept] = done["kept"]
    assert kept["name"] == EXTRA
    assert f"changed since converge {sid} wrote it" in kept["why"]
    assert f"kept {EXTRA}: changed since" in notes(events)
    assert (deploy / ".env").read_text() == "FOO=1\n"  # the rest rolled back all the same


def test_a_file_made_by_hand_after_the_snapshot_is_kept(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The converge's chain names OTHER, absent then; no converge wrote it: an operator did."""
    Engine(monkeypatch, converge, deploy)
    files = ["docker-compose.yml", OTHER]
    sid = result(converge_payload(compose_files=files))["snapshot"]
    assert meta(deploy, sid)["files"][OTHER] is None
    (deploy / OTHER).write_bytes(b"services: {mine: {}}\n")
    done, _ = rollback_to(sid)
    assert done["ok"] is True and (deploy / OTHER).exists()
    assert [k["name"] for k in done["kept"]] == [OTHER]
    assert "written by no converge since" in done["kept"][0]["why"]


def test_a_symlink_in_place_of_a_created_file_is_kept(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    sid = result(converge_payload(restore=restore((EXTRA, EXTRA_V1))))["snapshot"]
    (deploy / "shared.yml").write_bytes(EXTRA_V1)  # the same bytes, through a link
    os.replace(deploy / EXTRA, deploy / "moved.yml")
    os.symlink("shared.yml", deploy / EXTRA)
    done, _ = rollback_to(sid)
    assert os.path.islink(deploy / EXTRA) and done["removed"] == []
    assert "a symlink now" in done["kept"][0]["why"]


def test_a_rollback_to_an_older_snapshot_removes_what_later_converges_created(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    first = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    # A file an operator put there after the first converge: listed by the next snapshot as
    # there, so not one a converge created; it stays.
    (deploy / "docker-compose.mine.yml").write_bytes(b"services: {}\n")
    result(converge_payload(managed_env={"FOO": "3"}, restore=restore((EXTRA, EXTRA_V1))))
    # A third converge rewrites EXTRA (another pin) and creates OTHER.
    third = converge_payload(
        managed_env={"FOO": "4"}, restore=restore((EXTRA, EXTRA_V2), (OTHER, OTHER_V1))
    )
    assert result(third)["ok"]
    assert (deploy / EXTRA).read_bytes() == EXTRA_V2 and (deploy / OTHER).exists()
    done, _ = rollback_to(first)
    assert done["ok"] is True, done
    assert not (deploy / EXTRA).exists() and not (deploy / OTHER).exists()
    assert (deploy / "docker-compose.mine.yml").read_bytes() == b"services: {}\n"
    assert (deploy / ".env").read_text() == "FOO=1\n"
    assert done["removed"] == [EXTRA, OTHER] and done["kept"] == []


def test_a_rollback_to_an_older_snapshot_keeps_an_edit_of_what_a_later_converge_created(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    first = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    second = result(converge_payload(restore=restore((EXTRA, EXTRA_V1))))["snapshot"]
    (deploy / EXTRA).write_bytes(b"services: {}\n")
    done, _ = rollback_to(first)
    assert (deploy / EXTRA).read_bytes() == b"services: {}\n"
    assert done["kept"][0]["name"] == EXTRA
    assert f"changed since converge {second} wrote it" in done["kept"][0]["why"]


def test_a_snapshot_without_the_record_rolls_back_as_before(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken by an older converge (no `wrote`): what it recorded absent is removed whatever it
    holds, as such a rollback always did (kept aside all the same)."""
    Engine(monkeypatch, converge, deploy)
    sid = result(converge_payload(restore=restore((EXTRA, EXTRA_V1))))["snapshot"]
    path = deploy / ".fleet" / "snapshots" / sid / "meta.json"
    old = json.loads(path.read_text())
    old.pop("wrote", None)
    path.write_text(json.dumps(old))
    (deploy / EXTRA).write_bytes(b"edited: 1\n")
    done, _ = rollback_to(sid)
    assert done["ok"] is True and not (deploy / EXTRA).exists()
    assert done["removed"] == [EXTRA] and done["kept"] == []


# -- containers: the lane goes with the compose file that defined it -----------------------------
def lane_converge(**more: Any) -> dict[str, Any]:
    """A converge that creates EXTRA (the lane's file) and the lane's container."""
    return converge_payload(
        **{"restore": restore((EXTRA, EXTRA_V1)), "services": ["extra"], **more}
    )


def test_a_failed_converge_removes_the_lane_it_created_with_its_compose_file(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FileEngine(monkeypatch, converge, deploy)
    monkeypatch.setattr(converge, "gateway_problems", lambda box, deadline=None: ["down"])
    r = result(lane_converge(services=["extra", "gateway"]))
    assert r["ok"] is False
    rolled = r["rollback"]
    assert not (deploy / EXTRA).exists()
    assert "extra" not in engine.c  # not left running from a file that is gone
    assert rolled["removed"] == [EXTRA] and rolled["removed_containers"] == ["extra"]
    assert rolled["config_equal"] is True, rolled


def test_an_operator_rollback_removes_the_lane_whose_compose_file_it_removed(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FileEngine(monkeypatch, converge, deploy)
    sid = result(lane_converge())["snapshot"]
    assert "extra" in engine.c
    created = engine.c["extra"]["Id"]
    done, _ = rollback_to(sid)
    assert done["ok"] is True and not (deploy / EXTRA).exists()
    assert ["docker", "rm", "-f", created] in engine.log
    assert "extra" not in engine.c and done["removed_containers"] == ["extra"]
    assert done["config_equal"] is True, done


def test_a_lane_whose_compose_file_is_kept_keeps_its_container(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator edited the lane's file: kept, so compose still renders the lane, and its
    container is left (and counted unequal, as any container the snapshot did not have)."""
    engine = FileEngine(monkeypatch, converge, deploy)
    sid = result(lane_converge())["snapshot"]
    (deploy / EXTRA).write_bytes(EXTRA_V1 + b"# mine\n")
    done, _ = rollback_to(sid)
    assert (deploy / EXTRA).exists()
    assert "extra" in engine.c and done["removed_containers"] == []
    assert done["unequal"] == ["extra"] and done["config_equal"] is False


# -- the controller --------------------------------------------------------------------------------
SID = "20261130T120000Z"
ANSWER = {
    "event": "result",
    "ok": True,
    "snapshot": SID,
    "files": [".env", EXTRA],
    "removed": [EXTRA],
    "kept": [{"name": OTHER, "why": "changed since converge x wrote it\x1b[2J"}],
    "removed_containers": ["extra"],
    "recreated": [],
    "config_equal": True,
    "unequal": [],
}


def test_the_controller_reads_removed_and_kept_files() -> None:
    done = rollback_result(ANSWER)
    assert done is not None and done.ok
    assert done.removed == (EXTRA,) and done.restored == (".env",)
    assert [(k.name, k.why) for k in done.kept] == [(OTHER, ANSWER["kept"][0]["why"])]
    assert done.removed_containers == ("extra",)
    bad = rollback_result({**ANSWER, "kept": [{"name": OTHER}]})
    assert bad is not None and not bad.ok and "kept[0].why: missing" in (bad.failed or "")
    line = _rollback_line(done)
    assert f"removed {EXTRA}" in line and f"KEPT {OTHER}: changed since" in line
    assert "\x1b" not in line and "containers removed: extra" in line


def test_reconcile_rollback_says_what_it_removed_and_what_it_kept(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    program = f"import sys\nsys.stdin.read()\nprint({json.dumps(ANSWER)!r})\n"
    monkeypatch.setattr(boxcall, "ssh_argv", lambda *a, **k: [sys.executable, "-c", program])
    code = main(["--root", str(EXAMPLE), "-i", "lab", "rollback", "thor"])
    said = capsys.readouterr()
    assert code == 0
    assert f"thor: rolled back to {SID}: .env; removed {EXTRA}" in said.out
    assert f"/.fleet/snapshots/{SID}/removed/" in said.out
    assert "removed the containers of extra" in said.out
    assert f"thor: KEPT {OTHER}, not removed: changed since converge x wrote it" in said.err
    assert "\x1b" not in said.out + said.err
