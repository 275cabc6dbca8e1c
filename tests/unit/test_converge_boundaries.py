"""Apply and rollback keep their promises (issue 10, class 6), on the box program itself
(reconciler/apply/remote/converge.py) run against a temp home posing as the deploy user's:

- a bad payload value is refused before the lock, the snapshot or any container is touched,
  by the controller (before sending) and by the box, with the same rules;
- a rollback restores only a snapshot of this box, only file names inside the deployment
  directory, only copies whose sha256 is the recorded one, all or nothing;
- snapshot copies and every file written go through a 0600, O_EXCL temporary file that is
  fsynced, renamed, and removed on any failure;
- a rollback that fails records why in the snapshot's status, scrubbed of values.
"""

from __future__ import annotations

import copy
import io
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import boxcall, cli
from reconciler.apply.payload import BadPayload, check, check_snapshot_id, converge_payload
from reconciler.compare.drift import Action, BoxResult, Drift, Kind
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import expectations
from reconciler.observe.document import Observed, parse_collected
from reconciler.plan import plan_box
from tests.unit.conftest import load_box_program
from tests.unit.converge_helpers import COMPOSE, base_payload, deployment, fake_docker

ROOT = Path(__file__).resolve().parents[2]
converge = load_box_program("box_converge_boundaries", "reconciler/apply/remote/converge.py")

SECRET = "s3cret-gateway-key-0123456789"
ENV = f"GATEWAY_API_KEY={SECRET}\nWORKER_MAX_MODEL_LEN=262144\n"
SID = "20261130T120000Z"


# -- a deployment in a temp home -------------------------------------------------------------------
@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = deployment(tmp_path, monkeypatch, ENV)
    (home / ".bashrc").write_text("# the user's own\n")
    return home


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every command the box program runs (docker, compose): none really runs."""
    return fake_docker(monkeypatch, converge)


def payload(action: str = "rollback", **more: Any) -> dict[str, Any]:
    return {**base_payload(action, "alice@ctl pid 1 (reconcile rollback)"), **more}


def make_box(p: dict[str, Any] | None = None) -> Any:
    return converge.Box(p or payload())


def run_main(p: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The box program's main() on `p` as stdin; its result event."""
    out = io.StringIO()
    monkeypatch.setattr("sys.stdin", io.StringIO(p if isinstance(p, str) else json.dumps(p)))
    monkeypatch.setattr("sys.stdout", out)
    converge.main()
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert events[-1]["event"] == "result"
    return events[-1]


def tree(path: Path) -> dict[str, bytes]:
    """Every file under `path` with its bytes (symlinks by their target)."""
    found: dict[str, bytes] = {}
    for p in sorted(path.rglob("*")):
        if p.is_symlink():
            found[str(p.relative_to(path))] = os.readlink(p).encode()
        elif p.is_file():
            found[str(p.relative_to(path))] = p.read_bytes()
    return found


def snapshot(home: Path) -> str:
    """A snapshot of the deployment as a converge takes it."""
    sid, _ = converge.take_snapshot(make_box(), {"holder": "me", "plan": [], "services": []})
    return str(sid)


def snap_dir(home: Path, sid: str) -> Path:
    return home / ".lobes" / ".fleet" / "snapshots" / sid


def edit_meta(home: Path, sid: str, change: Callable[[dict[str, Any]], None]) -> None:
    meta_path = snap_dir(home, sid) / "meta.json"
    meta = json.loads(meta_path.read_text())
    change(meta)
    meta_path.write_text(json.dumps(meta))


def temp_files(path: Path) -> list[str]:
    return [str(p) for p in path.rglob("*") if "fleet-tmp" in p.name or p.name.endswith(".partial")]


# -- payloads: refused before anything, on both sides ----------------------------------------------
def _converge_payload() -> dict[str, Any]:
    fleet = load_fleet(ROOT, "hosts")
    exp = expectations(fleet, ["thor"])["thor"]
    result = BoxResult(
        "thor",
        True,
        (
            Drift("thor", Kind.ENVFILE, "file:.env", "WORKER_MAX_MODEL_LEN", "1", "2",
                  Action.REWRITE_ENV),
            Drift("thor", Kind.AUTH, "gateway", "auth", 401, 200, Action.RECREATE_GATEWAY),
        ),
    )  # fmt: skip
    collected = parse_collected(
        {
            "files": {
                ".env": {"exists": True, "sha256": "a" * 64},
                "docker-compose.yml": {"exists": False},
            },
            "docker": {
                "containers": [
                    {
                        "name": "model-gear-vllm-worker",
                        "service": "vllm-worker",
                        "id": "0123456789ab",
                    }
                ]
            },
        },
        complete=False,
        version=1,
    )
    assert isinstance(collected, Observed)
    plan = plan_box(result, exp)
    return converge_payload(exp, fleet.boxes["thor"], plan, collected, "me", environ={})


GOOD = _converge_payload()


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(p: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = p
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return change


BAD: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("env value with LF", _set("managed_env.WORKER_MAX_MODEL_LEN", "1\nEVIL=1")),
    ("env value with CR", _set("managed_env.WORKER_MAX_MODEL_LEN", "1\rx")),
    ("env value with NUL", _set("managed_env.WORKER_MAX_MODEL_LEN", "1\x00x")),
    ("controller secret with LF",
     _set("managed_env.GATEWAY_API_KEY", {"secret": "k", "value": SECRET + "\n"})),
    ("env value not text", _set("managed_env.WORKER_MAX_MODEL_LEN", ["x"])),
    ("key name", lambda p: p["managed_env"].update({"BAD-KEY": "1"})),
    ("key name with =", lambda p: p["managed_env"].update({"A=B": "1"})),
    ("env_keys not managed", lambda p: p["env_keys"].append("NOT_MANAGED")),
    ("compose file ..", _set("compose_files.0", "../../x.yml")),
    ("compose file absolute", _set("compose_files.0", "/etc/x.yml")),
    ("restore name", lambda p: p["restore"].append({"name": "../.bashrc", "sha256": None})),
    ("restore sha", lambda p: p["restore"].append({"name": "docker-compose.yml", "sha256": "x"})),
    ("service option", lambda p: p["services"].append("--force-recreate")),
    ("service with space", lambda p: p["removes"].append("a b")),
    ("lane service", _set("lane_specs.0.service", "-d")),
    ("image option", lambda p: p["pulls"].append("-oProxyCommand=touch /tmp/x")),
    ("image with space", _set("images.gateway", "lobes/gateway latest")),
    ("image uppercase path", _set("images.gateway", "lobes/Gateway:1")),
    ("timeout zero", _set("lane_specs.0.timeout_s", 0)),
    ("timeout bool", _set("lane_specs.0.timeout_s", True)),
    ("timeout text", _set("gateway.timeout_s", "120")),
    ("timeout huge", _set("gateway.timeout_s", 10**9)),
    ("util", _set("lane_specs.0.util", 1.5)),
    ("directory ..", _set("directory", "~/../other/.lobes")),
    ("directory relative", _set("directory", ".lobes")),
    ("directory option", _set("directory", "-rf")),
    ("secret path ..",
     lambda p: p["box_secrets"].update({"x": {"path": "~/../../etc/shadow", "key": "K"}})),
    ("project", _set("project", "Lobes;rm")),
    ("holder with LF", _set("holder", "me\nEVIL")),
    ("action", _set("action", "shell")),
    ("keep", _set("keep", 0)),
    ("verify port", _set("verify.port", 70000)),
    ("fingerprint container id", _set("fingerprint.containers.vllm-worker", "../x")),
    ("fingerprint file path",
     lambda p: p["fingerprint"]["files"].update({"docker-compose/../../x.yml": None})),
    ("fingerprint file with LF",
     lambda p: p["fingerprint"]["files"].update({"docker-compose\n.yml": None})),
    ("fingerprint file not compose", lambda p: p["fingerprint"]["files"].update({"a b.yml": None})),
]  # fmt: skip


def _bad(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    p = copy.deepcopy(GOOD)
    change(p)
    return p


def test_a_real_converge_payload_passes_both_checks(home):
    check(GOOD)  # the controller's
    converge.validate_payload(GOOD, str(home))  # the box's, against its home


@pytest.mark.parametrize(("name", "change"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_value_is_refused_by_the_controller_and_by_the_box(home, name, change):
    bad = _bad(change)
    with pytest.raises(BadPayload) as controller:
        check(bad)
    with pytest.raises(converge.Failed) as box:
        converge.validate_payload(bad, str(home))
    for message in (str(controller.value), str(box.value)):
        assert SECRET not in message and "EVIL" not in message  # a value is never echoed


def test_a_plan_observed_beside_a_stray_compose_copy_passes_both_checks(home):
    """The collector observes every docker-compose*.yml of the directory, so the plan's
    fingerprint names a `docker-compose copy.yml`: refused by both checks, every converge of
    that box was. A name of the listing (no `/`, no control character) is only digested."""
    stray = _bad(lambda p: p["fingerprint"]["files"].update({"docker-compose copy.yml": "b" * 64}))
    check(stray)
    converge.validate_payload(stray, str(home))


def test_the_box_refuses_a_path_outside_its_own_home(home):
    outside = _bad(lambda p: p["box_secrets"].update({"x": {"path": "/etc/lobes.env", "key": "K"}}))
    check(outside)  # the controller knows only the shape; the box knows its home
    with pytest.raises(converge.Failed, match="inside the deploy user's home"):
        converge.validate_payload(outside, str(home))


@pytest.mark.parametrize(
    ("name", "change"), BAD[:6] + BAD[13:17], ids=[b[0] for b in BAD[:6] + BAD[13:17]]
)
def test_a_bad_payload_leaves_the_box_untouched(home, commands, monkeypatch, name, change):
    """No lock, no snapshot, no docker command, no byte changed: the refusal comes first."""
    before = tree(home)
    result = run_main(_bad(change), monkeypatch)
    assert result["ok"] is False
    assert commands == []
    assert tree(home) == before
    assert not (home / ".lobes" / ".fleet").exists()
    assert SECRET not in json.dumps(result)


def test_a_secret_that_env_cannot_hold_is_refused_before_the_lock(home, commands, monkeypatch):
    """A box_file secret is read on the box: checked there, still before the lock."""
    (home / ".lobes" / ".secrets.env").write_text("GATEWAY_API_KEY='it\\'s $HOME'\n")
    p = copy.deepcopy(GOOD)
    p["box_secrets"] = {
        "gateway_api_key": {"path": "~/.lobes/.secrets.env", "key": "GATEWAY_API_KEY"}
    }
    p["managed_env"] = {"GATEWAY_API_KEY": {"secret": "gateway_api_key"}}
    p["env_keys"] = ["GATEWAY_API_KEY"]
    before = tree(home)
    result = run_main(p, monkeypatch)
    assert result["ok"] is False and "GATEWAY_API_KEY" in result["failed"]
    assert "$HOME" not in result["failed"]
    assert commands == [] and tree(home) == before
    assert not (home / ".lobes" / ".fleet").exists()


def test_a_payload_that_is_not_json_is_one_clean_refusal(home, commands, monkeypatch):
    result = run_main("{not json", monkeypatch)
    assert result == {**result, "ok": False, "failed": "the payload is not JSON"}
    assert commands == []


def test_the_controller_never_connects_for_a_bad_payload(monkeypatch):
    def no_ssh(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("ssh was started for a payload the box would refuse")

    monkeypatch.setattr(boxcall.subprocess, "Popen", no_ssh)
    call = boxcall.call_box(None, _bad(BAD[0][1]))  # type: ignore[arg-type]
    assert call.result["ok"] is False and call.result["failed"].startswith("refused: managed_env")


# -- rollback --to: a snapshot of this box ---------------------------------------------------------
@pytest.mark.parametrize(
    "sid", ["../x", "-rf", "20261130T120000Z/..", "/tmp/snap", "..", "latest", f"{SID}\n", ""]
)
def test_the_controller_refuses_what_is_not_a_snapshot_id_before_sending(sid, monkeypatch, capsys):
    def no_box(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the box was asked")

    monkeypatch.setattr("reconciler.apply.engine.snapshots", no_box)
    with pytest.raises(BadPayload):
        check_snapshot_id(sid)
    assert cli._is_snapshot_of(None, "thor", sid) is False  # type: ignore[arg-type]
    assert "nothing was sent" in capsys.readouterr().err


def test_the_controller_refuses_a_snapshot_the_box_does_not_list(monkeypatch, capsys):
    listed = boxcall.BoxCall(result={"ok": True, "snapshots": [{"id": SID}]})
    monkeypatch.setattr("reconciler.apply.engine.snapshots", lambda *a: listed)
    assert cli._is_snapshot_of(None, "thor", SID) is True  # type: ignore[arg-type]
    assert cli._is_snapshot_of(None, "thor", "20261130T120001Z") is False  # type: ignore[arg-type]
    assert "no snapshot 20261130T120001Z on this box" in capsys.readouterr().err


def test_the_box_refuses_a_snapshot_id_that_is_a_path(home, commands, monkeypatch):
    before = tree(home)
    result = run_main(payload(snapshot="../../.ssh"), monkeypatch)
    assert result["ok"] is False and "not a snapshot id" in result["failed"]
    assert tree(home) == before and commands == []


def test_the_box_refuses_a_symlinked_snapshot_dir(home, commands, monkeypatch):
    sid = snapshot(home)
    elsewhere = home / "elsewhere"
    snap_dir(home, sid).rename(elsewhere)  # a complete snapshot, but outside the snapshots dir
    (home / ".lobes" / ".env").write_text("CHANGED=1\n")
    os.symlink(elsewhere, snap_dir(home, "20991231T235959Z"))
    result = run_main(payload(snapshot="20991231T235959Z"), monkeypatch)
    assert result["ok"] is False and "not a directory of this user" in result["failed"]
    assert (home / ".lobes" / ".env").read_text() == "CHANGED=1\n"


def test_the_box_refuses_a_snapshot_it_does_not_have(home, commands, monkeypatch):
    snapshot(home)
    result = run_main(payload(snapshot="20000101T000000Z"), monkeypatch)
    assert result["ok"] is False and "no snapshot 20000101T000000Z" in result["failed"]


# -- rollback: names inside the deployment dir, copies checked, all or nothing ---------------------
@pytest.mark.parametrize(
    "name",
    ["../../.bashrc", "../.bashrc", "/tmp/evil.yml", "sub/x.yml", "..", "meta.json", "",
     "docker-compose/../../.bashrc.yml", "docker-compose\n.yml"],
)  # fmt: skip
def test_a_crafted_file_name_in_the_metadata_refuses_the_whole_rollback(home, commands, name):
    sid = snapshot(home)
    (home / ".lobes" / ".env").write_text("CHANGED=1\n")
    (snap_dir(home, sid) / "evil").write_text("export EVIL=1\n")
    edit_meta(
        home,
        sid,
        lambda m: m["files"].update(
            {name: {"sha256": converge.sha256_file(str(snap_dir(home, sid) / "evil")), "mode": 420}}
        ),
    )
    before = tree(home.parent)
    result = converge.rollback(make_box(), sid, reason="test")
    assert result["ok"] is False
    assert "not a plain name inside the deployment directory" in result["failed"]
    # Nothing written anywhere: not the crafted target, not even the files that were fine.
    after = tree(home.parent)
    assert {k: v for k, v in after.items() if "meta.json" not in k} == {
        k: v for k, v in before.items() if "meta.json" not in k
    }
    assert (home / ".bashrc").read_text() == "# the user's own\n"
    assert not Path("/tmp/evil.yml").exists()
    meta = json.loads((snap_dir(home, sid) / "meta.json").read_text())
    assert meta["status"] == "rollback-failed"
    assert "not a plain name" in meta["rollback"]["failed"]


def test_a_stray_compose_copy_an_older_snapshot_lists_is_left_as_it_is(home, commands):
    """A snapshot taken before the snapshot kept to plain names lists `docker-compose copy.yml`
    (and has its copy): the rollback refused the whole snapshot for that name. No converge
    wrote it, so there is nothing to put back: the rest is restored, the stray left as it is."""
    deploy = home / ".lobes"
    stray = deploy / "docker-compose copy.yml"
    stray.write_text(COMPOSE)
    sid = snapshot(home)
    (snap_dir(home, sid) / stray.name).write_text(COMPOSE)  # what the older snapshot copied
    entry = {"sha256": converge.sha256_file(str(stray)), "mode": 0o644}
    edit_meta(home, sid, lambda m: m["files"].update({stray.name: entry}))
    (deploy / ".env").write_text("CHANGED=1\n")
    stray.write_text("services: {edited: {}}\n")  # the operator's since
    result = converge.rollback(make_box(), sid, reason="test")
    assert result["ok"] is True and result["files"] == [".env"], result
    assert (deploy / ".env").read_text() == ENV
    assert stray.read_text() == "services: {edited: {}}\n"


def test_a_truncated_copy_never_replaces_env(home, commands):
    """The incident: a copy cut to the 7 bytes `GATEWAY` was put in place of `.env`."""
    sid = snapshot(home)
    (home / ".lobes" / ".env").write_text("GATEWAY_API_KEY=newer\n")
    (snap_dir(home, sid) / ".env").write_bytes(b"GATEWAY")
    result = converge.rollback(make_box(), sid, reason="test")
    assert result["ok"] is False
    assert "does not match its recorded sha256" in result["failed"]
    assert (home / ".lobes" / ".env").read_text() == "GATEWAY_API_KEY=newer\n"
    listed = converge.snapshots(make_box(), converge.Lock(make_box()))["snapshots"]
    assert listed[-1]["status"] == "rollback-failed"
    assert "does not match its recorded sha256" in listed[-1]["failed"]
    assert SECRET not in json.dumps(listed) and "GATEWAY_API_KEY=newer" not in json.dumps(listed)


def test_one_bad_copy_stops_every_file_of_the_rollback(home, commands):
    sid = snapshot(home)
    (home / ".lobes" / ".env").write_text("A=changed\n")
    (home / ".lobes" / "docker-compose.yml").write_text("services: {}\n")
    (snap_dir(home, sid) / "docker-compose.yml").write_text("services: {tampered: {}}\n")
    result = converge.rollback(make_box(), sid, reason="test")
    assert result["ok"] is False
    assert (home / ".lobes" / ".env").read_text() == "A=changed\n"  # .env sorts first: untouched
    assert (home / ".lobes" / "docker-compose.yml").read_text() == "services: {}\n"


def test_a_symlinked_copy_is_not_read(home, commands):
    """A copy that is a symlink could lead anywhere (a key, another user's file)."""
    sid = snapshot(home)
    (home / "key").write_text(ENV)  # the very bytes the metadata recorded
    (snap_dir(home, sid) / ".env").unlink()
    os.symlink(home / "key", snap_dir(home, sid) / ".env")
    (home / ".lobes" / ".env").write_text("A=changed\n")
    result = converge.rollback(make_box(), sid, reason="test")
    assert result["ok"] is False and "nothing was restored" in result["failed"]
    assert (home / ".lobes" / ".env").read_text() == "A=changed\n"


def test_a_good_snapshot_is_restored_byte_for_byte_with_its_modes(home, commands):
    files = ["docker-compose.yml", "docker-compose.extra.yml"]
    sid, _ = converge.take_snapshot(make_box(payload(compose_files=files)), {"holder": "me"})
    (home / ".lobes" / ".env").write_text("A=changed\n")
    (home / ".lobes" / ".env").chmod(0o644)
    (home / ".lobes" / "docker-compose.yml").write_text("services: {}\n")
    (home / ".lobes" / "docker-compose.extra.yml").write_text("x: 1\n")  # did not exist then
    result = converge.rollback(make_box(), sid, reason="test")
    assert result["ok"] is True, result
    assert sorted(result["files"]) == [".env", "docker-compose.extra.yml", "docker-compose.yml"]
    assert (home / ".lobes" / ".env").read_text() == ENV
    assert stat.S_IMODE((home / ".lobes" / ".env").stat().st_mode) == 0o600
    assert (home / ".lobes" / "docker-compose.yml").read_text() == COMPOSE
    assert stat.S_IMODE((home / ".lobes" / "docker-compose.yml").stat().st_mode) == 0o644
    assert not (home / ".lobes" / "docker-compose.extra.yml").exists()
    assert json.loads((snap_dir(home, sid) / "meta.json").read_text())["status"] == "rolled-back"


def test_a_damaged_metadata_file_is_recorded_beside_it_and_listed(home, commands):
    sid = snapshot(home)
    (snap_dir(home, sid) / "meta.json").write_text("{not json")
    result = converge.rollback(make_box(), sid, reason="test")
    assert result["ok"] is False
    assert "unexpected" in result["failed"] and "not json" not in result["failed"]
    status = json.loads((snap_dir(home, sid) / "status.json").read_text())
    assert status["status"] == "rollback-failed"
    listed = converge.snapshots(make_box(), converge.Lock(make_box()))["snapshots"]
    assert [(s["id"], s["status"]) for s in listed] == [(sid, "rollback-failed")]


def test_a_failure_reason_holds_no_secret_value(home, commands, monkeypatch):
    sid = snapshot(home)
    box = make_box()
    box.secrets.append(SECRET)

    def leaky(*args: Any) -> Any:
        raise converge.Failed(f"docker said: bad value {SECRET}")

    monkeypatch.setattr(converge, "hashes_or_empty", leaky)
    result = converge.rollback(box, sid, reason="test")
    assert result["ok"] is False and SECRET not in result["failed"] and "***" in result["failed"]
    assert SECRET not in (snap_dir(home, sid) / "meta.json").read_text()


def test_a_failure_mid_restore_is_recorded_and_leaves_no_temp_file(home, commands, monkeypatch):
    sid = snapshot(home)
    (home / ".lobes" / ".env").write_text("A=changed\n")

    real_replace = os.replace

    def fail(src: str, dst: str) -> None:
        if Path(dst).parent == home / ".lobes":  # the deployment's files, not the status
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(converge.os, "replace", fail)
    result = converge.rollback(make_box(), sid, reason="test")
    assert result["ok"] is False and "No space left on device" in result["failed"]
    assert temp_files(home) == []
    monkeypatch.undo()
    meta = json.loads((snap_dir(home, sid) / "meta.json").read_text())
    assert meta["status"] == "rollback-failed"


# -- snapshot copies and every write: 0600 from the start, fsynced, no temp file left --------------
def test_snapshot_copies_are_private_fsynced_and_match_their_digests(home, commands, monkeypatch):
    synced: set[int] = set()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.add(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(converge.os, "fsync", fsync)
    sid = snapshot(home)
    meta = json.loads((snap_dir(home, sid) / "meta.json").read_text())
    for name in (".env", "docker-compose.yml"):
        copy_ = snap_dir(home, sid) / name
        assert copy_.stat().st_ino in synced, f"{name}'s copy was not fsynced"
        assert stat.S_IMODE(copy_.stat().st_mode) == 0o600
        assert meta["files"][name]["sha256"] == converge.sha256_file(str(copy_))
    assert meta["files"][".env"]["mode"] == 0o600
    assert meta["files"]["docker-compose.yml"]["mode"] == 0o644
    assert snap_dir(home, sid).stat().st_ino in synced  # the directory entries too
    assert snap_dir(home, sid).parent.stat().st_ino in synced


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failed_snapshot_leaves_no_copy_behind(home, commands, monkeypatch, failing):
    def fail(*args: Any) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(converge.os, failing, fail)
    with pytest.raises(OSError):
        snapshot(home)
    monkeypatch.undo()
    snaps = home / ".lobes" / ".fleet" / "snapshots"
    assert list(snaps.iterdir()) == []
    assert temp_files(home) == []


@pytest.mark.parametrize("failing", ["fsync", "replace", "write"])
def test_the_env_writer_leaves_no_temp_file_on_failure(home, monkeypatch, failing):
    def fail(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(converge.os, failing, fail)
    with pytest.raises(OSError):
        converge.write_env(make_box(), ["GATEWAY_API_KEY"], {"GATEWAY_API_KEY": "new-key-value"})
    monkeypatch.undo()
    assert sorted(p.name for p in (home / ".lobes").iterdir()) == [".env", "docker-compose.yml"]
    assert (home / ".lobes" / ".env").read_text() == ENV


def test_a_temp_file_is_0600_from_its_creation(tmp_path, monkeypatch):
    modes: list[int] = []
    real_write = os.write

    def write(fd: int, data: Any) -> int:
        modes.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_write(fd, data)

    monkeypatch.setattr(converge.os, "write", write)
    converge.atomic_write(str(tmp_path / "docker-compose.yml"), b"services: {}\n", 0o644)
    assert modes and set(modes) == {0o600}  # the final 0644 only once complete
    assert stat.S_IMODE((tmp_path / "docker-compose.yml").stat().st_mode) == 0o644


def test_a_planted_temp_name_is_never_written_through(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    names = iter([b"\x00" * 6, b"\x01" * 6])
    monkeypatch.setattr(converge.os, "urandom", lambda n: next(names))
    os.symlink(victim, tmp_path / f".env.fleet-tmp-{'00' * 6}")
    converge.atomic_write(str(tmp_path / ".env"), b"A=1\n", 0o600)
    assert victim.read_text() == "keep\n"
    assert (tmp_path / ".env").read_text() == "A=1\n"


def test_the_fleet_dir_is_refused_when_it_is_a_symlink(home, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, home / ".lobes" / ".fleet")
    with pytest.raises(converge.Failed, match="not a directory of this user"):
        converge.Lock(make_box()).acquire("me")
    assert list(elsewhere.iterdir()) == []


def test_listing_snapshots_creates_nothing(home, commands, monkeypatch):
    before = tree(home)
    result = run_main(payload("snapshots"), monkeypatch)
    assert result["ok"] is True and result["snapshots"] == [] and result["lock"] is None
    assert tree(home) == before and not (home / ".lobes" / ".fleet").exists()


def test_evidence_records_are_private_and_never_overwrite_each_other(tmp_path):
    from reconciler.apply.engine import Outcome
    from reconciler.apply.evidence import write

    fleet = load_fleet(ROOT, "hosts")
    plan = plan_box(BoxResult("thor", True, ()), expectations(fleet, ["thor"])["thor"])
    out = Outcome("thor", ok=True, changed=False, plan=plan, started_at="2026-11-30T12:00:00Z")
    first = write(tmp_path, out, "inventory/hosts.yaml", "me")
    second = write(tmp_path, out, "inventory/hosts.yaml", "me")
    assert first != second and json.loads(first.read_text())["box"] == "thor"
    assert [stat.S_IMODE(p.stat().st_mode) for p in (first, second)] == [0o600, 0o600]


def test_a_temp_file_left_by_a_killed_run_is_swept_under_the_lock(home, commands, monkeypatch):
    left = home / ".lobes" / f".env.fleet-tmp-{'ab' * 6}"
    left.write_text(ENV)  # what a SIGKILL mid-write leaves: no `finally` ran
    sid = snapshot(home)
    result = run_main(payload(snapshot=sid), monkeypatch)
    assert result["ok"] is True, result
    assert not left.exists() and (home / ".lobes" / ".env").read_text() == ENV
