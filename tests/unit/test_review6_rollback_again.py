"""A rollback run again (or the operator's after the box's own) recreates only what is not
already as the snapshot recorded (converge.py rollback, as_recorded): each retry reloaded every
lane the converge touched and restarted the gateway although the restored files changed
nothing. A converge's own rollback right after a failed boot still recreates what it
recreated; a lane left booting or unhealthy, and a snapshot of an older converge (no recorded
config hash or state), are recreated as before."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import load_box_program
from tests.unit.converge_harness import (
    Engine,
    converge_payload,
    meta,
    run_events,
    run_main,
    snapshot_dirs,
)
from tests.unit.converge_helpers import deployment

converge = load_box_program("box_review6_rollback_again", "reconciler/apply/remote/converge.py")


@pytest.fixture
def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(converge, "_STDOUT_OK", [True])
    return deployment(tmp_path, monkeypatch, "FOO=1\n") / ".lobes"


def ups(eng: Engine) -> list[str]:
    return [a[-1] for a in eng.log if a[:3] == ["docker", "compose", "up"]]


def rollback(sid: str) -> tuple[dict[str, Any], list[str]]:
    """A rollback to `sid`: its result and its notes."""
    _, events = run_events(converge, converge_payload("rollback", snapshot=sid))
    return events[-1], [e["message"] for e in events if e["event"] == "note"]


def applied_then_rolled_back(eng: Engine) -> str:
    """A converge of FOO=2 (the lane and the gateway recreated), rolled back once."""
    sid: str = run_events(converge, converge_payload(services=["vllm-worker"]))[1][-1]["snapshot"]
    eng.log.clear()
    first, _ = rollback(sid)
    assert first["files"] == [".env"] and first["recreated"] == ["vllm-worker", "gateway"]
    assert ups(eng) == ["vllm-worker", "gateway"]
    eng.log.clear()
    return sid


def test_a_rollback_run_again_recreates_nothing_already_restored(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(monkeypatch, converge, deploy)
    sid = applied_then_rolled_back(eng)
    ids = {s: c["Id"] for s, c in eng.c.items()}
    again, notes = rollback(sid)
    assert again["ok"] is True and again["files"] == [] and again["config_equal"] is True
    assert again["recreated"] == [] and ups(eng) == []
    assert {s: c["Id"] for s, c in eng.c.items()} == ids  # the very same containers
    assert any(
        n.startswith("vllm-worker, gateway: not recreated: the restored files leave") and sid in n
        for n in notes
    ), notes
    assert meta(deploy, sid)["status"] == "rolled-back"


def test_the_operators_rollback_after_the_boxs_own_restarts_nothing(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops after the lane was recreated (state unknown): the box rolls itself
    back; the rollback the controller then names finds everything restored."""
    eng = Engine(monkeypatch, converge, deploy)
    real_emit = converge.emit

    def emit(event: str, **fields: Any) -> None:
        real_emit(event, **fields)
        if event == "healthy" and fields.get("service") == "vllm-worker":
            converge._STDOUT_OK[0] = False  # ssh gone: the next step stops and rolls back

    with monkeypatch.context() as m:
        m.setattr(converge, "emit", emit)
        m.setattr(converge, "wait_healthy", lambda box, s, t: emit("healthy", service=s))
        run_main(converge, converge_payload(services=["vllm-worker", "extra"]), io.StringIO())
    sid = snapshot_dirs(deploy)[-1]
    assert meta(deploy, sid)["rollback"]["recreated"] == ["vllm-worker"]
    assert ups(eng) == ["vllm-worker", "vllm-worker"]  # the converge's, its rollback's
    converge._STDOUT_OK[0] = True
    eng.log.clear()
    done, _ = rollback(sid)
    assert done["ok"] is True and done["config_equal"] is True
    assert done["recreated"] == [] and ups(eng) == []


def test_a_lane_made_from_other_files_is_recreated_though_the_files_are_restored_already(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator put .env back by hand before the rollback: the restored files change no
    render, but the containers were made from FOO=2 (another config hash than recorded)."""
    eng = Engine(monkeypatch, converge, deploy)
    sid = run_events(converge, converge_payload(services=["vllm-worker"]))[1][-1]["snapshot"]
    (deploy / ".env").write_text("FOO=1\n")
    eng.log.clear()
    done, _ = rollback(sid)
    assert done["files"] == [] and done["recreated"] == ["vllm-worker", "gateway"]
    assert ups(eng) == ["vllm-worker", "gateway"] and done["config_equal"] is True


def test_a_converges_own_rollback_recreates_the_lane_it_made_from_new_files(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lane booted from FOO=2 and failed: its container has the new config hash."""
    eng = Engine(monkeypatch, converge, deploy)
    real = converge.wait_healthy

    def fails(box: Any, service: str, timeout: int) -> None:
        if ups(eng) == ["vllm-worker"]:
            raise converge.Failed("vllm-worker not healthy after 5s (running/starting)")
        real(box, service, timeout)

    monkeypatch.setattr(converge, "wait_healthy", fails)
    done = run_events(converge, converge_payload(services=["vllm-worker"]))[1][-1]
    assert done["ok"] is False and done["rollback"]["ok"] is True
    assert done["rollback"]["recreated"] == ["vllm-worker"]
    assert ups(eng) == ["vllm-worker", "vllm-worker"] and done["rollback"]["config_equal"]


def test_a_converges_own_rollback_recreates_a_lane_whose_boot_stopped(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recreated with the files as they were (nothing to write): the same config hash as at
    the snapshot, but it stopped while booting, not running as recorded."""
    eng = Engine(monkeypatch, converge, deploy)
    real = converge.wait_healthy

    def stops(box: Any, service: str, timeout: int) -> None:
        if ups(eng) == ["vllm-worker"]:
            eng.c["vllm-worker"]["State"] = {"Status": "exited", "Running": False}
            raise converge.Failed("vllm-worker stopped while booting (exited/-, 0 restarts)")
        real(box, service, timeout)

    monkeypatch.setattr(converge, "wait_healthy", stops)
    done = run_events(
        converge, converge_payload(managed_env={"FOO": "1"}, services=["vllm-worker"])
    )
    rolled = done[1][-1]["rollback"]
    assert rolled["ok"] is True and rolled["recreated"] == ["vllm-worker"]
    assert ups(eng) == ["vllm-worker", "vllm-worker"] and rolled["config_equal"] is True
    assert eng.c["vllm-worker"]["State"]["Running"] is True


def test_a_rollback_run_again_recreates_a_lane_left_unhealthy(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its config hash and running state are the snapshot's, but it was up and healthy then:
    a rollback that failed waiting for it is run again to boot it, not to call it restored."""
    eng = Engine(monkeypatch, converge, deploy)
    sid = applied_then_rolled_back(eng)
    eng.c["vllm-worker"]["State"]["Health"] = {"Status": "unhealthy"}
    again, _ = rollback(sid)
    assert again["ok"] is True and again["recreated"] == ["vllm-worker"]
    assert ups(eng) == ["vllm-worker"]


@pytest.mark.parametrize("keys", [("id", "config_hash"), ("id",)])
def test_a_snapshot_of_an_older_converge_is_recreated_as_before(
    deploy: Path, monkeypatch: pytest.MonkeyPatch, keys: tuple[str, ...]
) -> None:
    """An older converge recorded {id, config_hash}, no state (same_running cannot tell), or
    the record is damaged: nothing proves the container as at the snapshot."""
    eng = Engine(monkeypatch, converge, deploy)
    sid = applied_then_rolled_back(eng)
    path = deploy / ".fleet" / "snapshots" / sid / "meta.json"
    old = json.loads(path.read_text())
    old["containers"] = {s: {k: c[k] for k in keys} for s, c in old["containers"].items()}
    path.write_text(json.dumps(old))
    again, _ = rollback(sid)
    assert again["recreated"] == ["vllm-worker", "gateway"]
    assert ups(eng) == ["vllm-worker", "gateway"]


class NoStartEngine(Engine):
    """The harness engine, whose `compose up --no-start` leaves the new container created."""

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        code, out, err = super().run(argv)
        if argv[:3] == ["docker", "compose", "up"] and "--no-start" in argv:
            self.c[argv[-1]]["State"] = {"Status": "created", "Running": False}
        return code, out, err


def test_a_lane_stopped_at_the_snapshot_and_started_since_is_recreated_not_started(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its config hash is the snapshot's, but it runs and was stopped then."""
    eng = NoStartEngine(monkeypatch, converge, deploy)
    eng.run(["docker", "stop", eng.c["vllm-worker"]["Id"]])
    sid = applied_then_rolled_back(eng)
    assert eng.c["vllm-worker"]["State"]["Running"] is False  # created, not started
    again, _ = rollback(sid)
    assert again["recreated"] == [] and again["config_equal"] is True
    eng.run(["docker", "start", eng.c["vllm-worker"]["Id"]])  # started by hand since
    eng.log.clear()
    again, _ = rollback(sid)
    assert again["recreated"] == ["vllm-worker"] and again["not_started"] == ["vllm-worker"]
    assert ups(eng) == ["vllm-worker"] and eng.c["vllm-worker"]["State"]["Running"] is False
