"""Review 5 of the box-side converge (reconciler/apply/remote/converge.py), driven through the
box program's main() on the fake engine (converge_harness), and of the controller's
fingerprint (reconciler/apply/payload.py):

1. a `docker compose run` container left behind (label oneoff=True, exited) is never taken
   for its service's lane: a converge watched it ("stopped while booting") though the lane was
   healthy, its rollback failed the same way, and, listed on the other side, every converge
   was refused as "changed since observed"; of several replicas the lowest numbered is the
   service's, as the drift comparison reads it;
2. a rollback boots a lane whatever the memory gate says of the payload's util (the failed
   converge's new one): it failed the gate the converge failed, left the lane stopped and
   the box refusing every converge;
3. a rollback brings each service back as the snapshot had it: one stopped then is created,
   not started; one crashing then is not waited for; one running then and not now counts as
   unequal;
4. mark-good marks only the box's newest snapshot, while it is `applied`;
5. a converge and its rollback keep a managed file's owner and group.
"""

from __future__ import annotations

import copy
import grp
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.payload import fingerprint
from reconciler.observe.document import Observed, parse_collected
from reconciler.observe.observe import load_snapshot
from tests.unit.conftest import load_box_program
from tests.unit.converge_harness import Engine, converge_payload, meta, run_events
from tests.unit.converge_helpers import deployment

converge = load_box_program("box_converge_review5", "reconciler/apply/remote/converge.py")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"
RUN_COPY = "lobes-vllm-worker-run-d1860c2c170c"  # as compose names a `compose run` container
GIB = 1024 * 1024  # KiB


@pytest.fixture
def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(converge, "_STDOUT_OK", [True])
    return deployment(tmp_path, monkeypatch, "FOO=1\n") / ".lobes"


def result(p: dict[str, Any]) -> dict[str, Any]:
    event: dict[str, Any] = run_events(converge, p)[1][-1]
    return event


def notes(events: list[dict[str, Any]]) -> str:
    return "\n".join(e.get("message", "") for e in events if e["event"] == "note")


def status(c: dict[str, Any]) -> str:
    state: str = c["State"]["Status"]
    return state


# -- 1. a `docker compose run` container, replicas -------------------------------------------------
class MoreEngine(Engine):
    """The harness engine, plus containers of its services that are not the lane's own
    (`more`: each with whether `docker ps` lists it after the lanes: older, as docker lists
    newest first, or before them), answered by `docker ps` and `docker inspect` in that
    order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.more: list[tuple[dict[str, Any], bool]] = []
        super().__init__(*args, **kwargs)

    def add(self, name: str, service: str, last: bool, oneoff: bool = False, up: bool = False):
        cid = hashlib.sha256(name.encode()).hexdigest()
        labels = {"com.docker.compose.service": service}
        labels["com.docker.compose.oneoff"] = "True" if oneoff else "False"
        running = {"Status": "running", "Running": True, "Health": {"Status": "healthy"}}
        state = running if up else {"Status": "exited", "Running": False}
        found = {"Id": cid, "Name": "/" + name, "Config": {"Labels": labels}, "State": state}
        self.more.append((dict(found, RestartCount=0), last))
        return cid

    def listed(self) -> list[dict[str, Any]]:
        first = [c for c, last in self.more if not last]
        return first + list(self.c.values()) + [c for c, last in self.more if last]

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        if argv[:2] == ["docker", "ps"]:
            self.log.append(argv)
            return 0, "\n".join(c["Id"] for c in self.listed()), ""
        if argv[:2] == ["docker", "inspect"]:
            self.log.append(argv)
            by_id = {c["Id"]: c for c in self.listed()}
            return 0, json.dumps([by_id[i] for i in argv[2:] if i in by_id]), ""
        return super().run(argv)


@pytest.mark.parametrize("last", [True, False], ids=["listed-after-the-lane", "listed-before"])
def test_a_compose_run_container_left_behind_is_never_taken_for_the_lane(
    deploy: Path, monkeypatch: pytest.MonkeyPatch, last: bool
) -> None:
    eng = MoreEngine(monkeypatch, converge, deploy)
    eng.add(RUN_COPY, "vllm-worker", last, oneoff=True)
    lane = eng.c["vllm-worker"]["Id"]
    r = result(converge_payload(services=["vllm-worker"]))
    assert r["ok"] is True, r  # was: "vllm-worker stopped while booting (exited/-...)"
    assert meta(deploy, r["snapshot"])["containers"]["vllm-worker"]["id"] == lane[:12]
    back = result(converge_payload("rollback", snapshot=r["snapshot"]))
    assert back["ok"] is True and back["config_equal"] is True, back


def test_of_several_replicas_the_lowest_numbered_is_the_services_container(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As compare/containers.py service_containers reads it, whatever order docker lists."""
    eng = MoreEngine(monkeypatch, converge, deploy, services=("gateway",))
    first = eng.add("lobes-vllm-worker-1", "vllm-worker", last=False, up=True)
    eng.add("lobes-vllm-worker-2", "vllm-worker", last=True, up=True)
    found = converge.containers(converge.Box(converge_payload()))
    assert found["vllm-worker"]["Id"] == first


def observation(ids: dict[str, str]) -> Observed:
    """thor's captured observation with its worker and gateway as the engine's (`ids`) and a
    `docker compose run` copy of the worker beside them (`run`), read as a live answer is."""
    _, observations = load_snapshot(EXAMPLE / "snapshot")
    raw = copy.deepcopy(observations["thor"].collected)
    kept = {c["service"]: c for c in raw["docker"]["containers"]}
    worker = dict(kept["vllm-worker"], id=ids["vllm-worker"])
    run = dict(worker, name=RUN_COPY, id=ids["run"], status="exited")
    raw["docker"]["containers"] = [dict(kept["gateway"], id=ids["gateway"]), run, worker]
    doc = parse_collected(raw, complete=True)
    assert isinstance(doc, Observed), doc
    return doc


@pytest.mark.parametrize("last", [True, False], ids=["listed-after-the-lane", "listed-before"])
def test_the_plans_fingerprint_of_a_box_with_a_compose_run_container_passes_the_boxs_check(
    deploy: Path, monkeypatch: pytest.MonkeyPatch, last: bool
) -> None:
    """The controller's fingerprint of an observation holding the lane and a one-off copy of
    it, checked by the box that holds both: not refused (it was, whenever one side's pick per
    service was the copy); a container made since is still refused, named."""
    eng = MoreEngine(monkeypatch, converge, deploy)
    run = eng.add(RUN_COPY, "vllm-worker", last, oneoff=True)
    ids = {s: eng.c[s]["Id"][:12] for s in ("vllm-worker", "gateway")} | {"run": run[:12]}
    fp = {"files": {}, "containers": fingerprint(observation(ids))["containers"]}
    assert sorted(fp["containers"]["vllm-worker"]) == sorted([ids["vllm-worker"], ids["run"]])
    r = result(converge_payload(services=["vllm-worker"], fingerprint=fp))
    assert r["ok"] is True, r
    # The box changed since: another `compose run` copy (observed after the converge, which
    # recreated the lane and the gateway).
    ids |= {s: eng.c[s]["Id"][:12] for s in ("vllm-worker", "gateway")}
    fp = {"files": {}, "containers": fingerprint(observation(ids))["containers"]}
    eng.add("lobes-vllm-worker-run-0123456789ab", "vllm-worker", last, oneoff=True)
    r = result(converge_payload(services=["vllm-worker"], fingerprint=fp))
    assert (
        r["ok"] is False and "changed since it was observed (container vllm-worker)" in r["failed"]
    )


# -- 2. a rollback's memory gate ------------------------------------------------------------------
def test_a_rollback_boots_the_lane_its_converge_could_not_gate(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """util 0.45 -> 0.6 with 50 of 100 GiB available: the converge fails the gate (right); its
    rollback restores 0.45 and boots the lane (it failed the gate for 0.6 and left it stopped,
    and the next converge was refused as half restored)."""
    (deploy / ".env").write_text("VLLM_GPU_UTIL=0.45\n")
    real_gate = converge.memory_gate
    eng = Engine(monkeypatch, converge, deploy)
    monkeypatch.setattr(converge, "memory_gate", real_gate)
    monkeypatch.setattr(
        converge, "meminfo", lambda: {"MemTotal": 100 * GIB, "MemAvailable": 50 * GIB}
    )
    lanes = [{"service": "vllm-worker", "timeout_s": 5, "util": 0.6}]
    p = converge_payload(
        managed_env={"VLLM_GPU_UTIL": "0.6"},
        env_keys=["VLLM_GPU_UTIL"],
        services=["vllm-worker"],
        lane_specs=lanes,
    )
    _, events = run_events(converge, p)
    r = events[-1]
    assert r["ok"] is False and "vllm-worker needs 60.0 GiB available" in r["failed"]
    assert r["rollback"]["ok"] is True, r["rollback"]
    assert r["rollback"]["config_equal"] is True
    assert "the rollback boots it all the same" in notes(events)
    assert status(eng.c["vllm-worker"]) == "running"
    assert (deploy / ".env").read_text() == "VLLM_GPU_UTIL=0.45\n"
    assert meta(deploy, r["snapshot"])["status"] == "rolled-back"
    # Nothing half restored: the next converge runs (and fails the gate for 0.6 again).
    again = result(p)
    assert "interrupted" not in again and "needs 60.0 GiB" in again["failed"]
    # A converge's own gate still refuses.
    assert status(eng.c["vllm-worker"]) == "running"


# -- 3. each service back as the snapshot had it ---------------------------------------------------
class StateEngine(Engine):
    """The harness engine where `up --no-start` creates without starting (as compose does) and
    the services of `crashing` exit at boot."""

    crashing: tuple[str, ...] = ()

    def up(self, service: str) -> None:
        super().up(service)
        if service in self.crashing:
            self.c[service]["State"] = {"Status": "exited", "Running": False}

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        if argv[:3] == ["docker", "compose", "up"] and "--no-start" in argv:
            self.log.append(argv)
            self.up(argv[-1])
            self.c[argv[-1]]["State"] = {"Status": "created", "Running": False}
            return 0, "", ""
        return super().run(argv)


def stop(eng: Engine, service: str) -> None:
    eng.run(["docker", "stop", eng.c[service]["Id"]])


def test_a_lane_the_operator_had_stopped_is_restored_stopped(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The converge started it (its plan recreated it), the verification failed, the rollback
    leaves it stopped as at the snapshot: created from the restored files, not started."""
    eng = StateEngine(monkeypatch, converge, deploy, services=("vllm-worker", "gateway", "extra"))
    stop(eng, "extra")
    r = result(converge_payload(services=["extra"]))
    assert r["ok"] is True and status(eng.c["extra"]) == "running"
    _, events = run_events(converge, converge_payload("rollback", snapshot=r["snapshot"]))
    back = events[-1]
    assert back["ok"] is True and status(eng.c["extra"]) == "created", back  # was: running
    assert back["config_equal"] is True
    assert back["not_started"] == ["extra"] and "extra" in back["recreated"]
    assert status(eng.c["vllm-worker"]) == "running"
    assert "extra: created, not started, as at snapshot" in notes(events)
    assert ["docker", "compose", "up", "--no-start", "--no-deps", "--force-recreate", "extra"] in (
        eng.log
    )


def test_a_lane_crashing_at_the_snapshot_does_not_fail_the_rollback(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its converge (a START of it) fails, as the lane still crashes; its rollback did too
    (waiting for it healthy), leaving the box refusing every converge as half restored."""
    StateEngine.crashing = ("extra",)
    try:
        eng = StateEngine(
            monkeypatch, converge, deploy, services=("vllm-worker", "gateway", "extra")
        )
        r = result(converge_payload(services=["extra"], managed_env={"FOO": "1"}))
    finally:
        StateEngine.crashing = ()
    assert r["ok"] is False and "extra stopped while booting" in r["failed"]
    assert r["rollback"]["ok"] is True and r["rollback"]["not_started"] == ["extra"], r
    assert status(eng.c["extra"]) == "created"
    assert meta(deploy, r["snapshot"])["status"] == "rolled-back"
    assert result(converge_payload(managed_env={"FOO": "2"}))["ok"] is True


def test_a_lane_running_then_and_stopped_now_is_unequal(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rollback does not recreate the gateway (its files render it as before), which was
    stopped since: not as at the snapshot, and said so (config_equal only compared hashes)."""
    eng = StateEngine(monkeypatch, converge, deploy)
    r = result(converge_payload(services=["vllm-worker"], managed_env={"FOO": "1"}))
    assert r["ok"] is True
    stop(eng, "gateway")
    back = result(converge_payload("rollback", snapshot=r["snapshot"]))
    assert back["ok"] is True and "gateway" not in back["recreated"], back
    assert back["config_equal"] is False and back["unequal"] == ["gateway"]


@pytest.mark.parametrize(
    ("state", "restarts", "mode"),
    [
        ({"Status": "running", "Health": {"Status": "healthy"}}, 5, "wait"),
        ({"Status": "running", "Health": {"Status": "starting"}}, 0, "wait"),
        ({"Status": "running"}, 0, "wait"),
        ({"Status": "running", "Health": {"Status": "unhealthy"}}, 0, "start"),
        ({"Status": "running", "Health": {"Status": "starting"}}, 7, "start"),
        # A crash loop (`restart: unless-stopped`) is `restarting` most of the time: it ran,
        # and Docker's State.Running says so; created, it would never be restarted again.
        ({"Status": "restarting", "Health": {"Status": "starting"}}, 7, "start"),
        ({"Status": "restarting", "Running": True}, 1, "start"),
        ({"Status": "paused", "Running": True}, 0, "start"),
        ({"Status": "exited"}, 0, "create"),
        ({"Status": "created"}, 0, "create"),
    ],
)
def test_how_a_rollback_brings_a_service_back_follows_its_state_at_the_snapshot(
    state: dict[str, Any], restarts: int, mode: str
) -> None:
    inspect = {"Id": "ab" * 32, "Config": {"Labels": {}}, "State": state, "RestartCount": restarts}
    record = converge.container_record(inspect)
    assert converge.restore_mode(json.loads(json.dumps(record))) == mode
    assert converge.restore_mode({"id": "ab", "config_hash": "x"}) == "wait"  # an older record


# -- 4. mark-good: the newest snapshot, applied ---------------------------------------------------
def known_good(deploy: Path) -> dict[str, Any] | None:
    path = deploy / ".fleet" / "known-good" / "meta.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_mark_good_refuses_a_snapshot_rolled_back_since(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a converge and its mark-good the lock is free: another run rolled it back."""
    Engine(monkeypatch, converge, deploy)
    sid = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    assert result(converge_payload("rollback", snapshot=sid))["ok"] is True
    done = result(converge_payload("mark-good", snapshot=sid))
    assert done["ok"] is False, done
    assert f"snapshot {sid} is rolled-back, not applied; nothing was changed" in done["failed"]
    assert meta(deploy, sid)["status"] == "rolled-back" and known_good(deploy) is None


def test_mark_good_refuses_a_snapshot_converged_over_and_marks_the_newest_once(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    older = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    newer = result(converge_payload(managed_env={"FOO": "3"}))["snapshot"]
    done = result(converge_payload("mark-good", snapshot=older))
    assert (
        done["ok"] is False
        and f"snapshot {older} is not the newest ({newer} was taken after it)" in done["failed"]
    )
    assert meta(deploy, older)["status"] == "applied" and known_good(deploy) is None
    assert result(converge_payload("mark-good", snapshot=newer))["ok"] is True
    assert meta(deploy, newer)["status"] == "verified"
    assert (known_good(deploy) or {})["snapshot"] == newer
    again = result(converge_payload("mark-good", snapshot=newer))
    assert again["ok"] is False and f"snapshot {newer} is verified, not applied" in again["failed"]


# -- 5. a managed file's owner and group -----------------------------------------------------------
def other_group() -> int:
    """A group this process may give a file that is not its own group."""
    if os.geteuid() == 0:
        return next((g.gr_gid for g in grp.getgrall() if g.gr_gid != os.getegid()), 4242)
    groups = [g for g in os.getgroups() if g != os.getegid()]
    if not groups:
        pytest.skip("this user is in no other group to give a file")
    return groups[0]


def test_a_converge_and_its_rollback_keep_a_managed_files_group(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gid = other_group()
    Engine(monkeypatch, converge, deploy)
    good = b"services:\n  gateway:\n    image: lobes/gateway:good\n"
    kept = deploy / ".fleet" / "known-good"
    kept.mkdir(parents=True, mode=0o700)
    (deploy / ".fleet").chmod(0o700)
    (kept / "docker-compose.yml").write_bytes(good)
    compose, env = deploy / "docker-compose.yml", deploy / ".env"
    for path in (compose, env):
        os.chown(path, -1, gid)
    compose.chmod(0o640)
    sha = hashlib.sha256(good).hexdigest()
    r = result(
        converge_payload(
            restore=[{"name": "docker-compose.yml", "sha256": sha}], managed_env={"FOO": "2"}
        )
    )
    assert r["ok"] is True and compose.read_bytes() == good and env.read_text() == "FOO=2\n"
    assert (compose.stat().st_gid, env.stat().st_gid) == (gid, gid)  # was: this user's group
    assert meta(deploy, r["snapshot"])["owners"][".env"] == [os.geteuid(), gid]
    os.chown(env, -1, os.getegid())  # lost all the same (by hand): the rollback gives it back
    back = result(converge_payload("rollback", snapshot=r["snapshot"]))
    assert back["ok"] is True and back["files"] == [".env", "docker-compose.yml"], back
    assert (compose.stat().st_gid, env.stat().st_gid) == (gid, gid)
    assert compose.stat().st_mode & 0o777 == 0o640


def test_a_group_that_cannot_be_given_is_said_and_the_write_goes_on(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gid = other_group()
    Engine(monkeypatch, converge, deploy)
    os.chown(deploy / ".env", -1, gid)

    def not_permitted(*_a: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "fchown", not_permitted)
    _, events = run_events(converge, converge_payload(managed_env={"FOO": "2"}))
    assert events[-1]["ok"] is True and (deploy / ".env").read_text() == "FOO=2\n"
    said = f"~/.lobes/.env: could not keep its group gid {gid} (Operation not permitted)"
    assert said in notes(events), notes(events)
