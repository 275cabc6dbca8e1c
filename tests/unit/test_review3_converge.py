"""Review 3 of the box-side converge (reconciler/apply/remote/converge.py) and its controller,
driven through the box program's main() on the fake engine (converge_harness) and through the
engine with the box calls faked:

1. the files a rollback moved to a snapshot's `removed/` go with that snapshot when it is
   pruned (they piled up for ever, `.env` copies with secrets among them), and a snapshot a
   kept snapshot's rollback needs (a converge not undone since it) is not pruned;
2. a managed file that is a symlink leading out of the deployment directory (or into its
   `.fleet`) is refused under the lock, named with where it leads, before anything changes
   (before, a converge read through it and copied the target into the deployment);
3. a stray is kept stopped until mark-good removes it: a rollback after the controller's
   failed verification starts it again (before, it was removed at the converge's end, so the
   controller's rollback could not bring it back); the verification passes over it;
4. a converge killed half way (SIGKILL: the flock goes with it) is said by the next one,
   which refuses with nothing changed until it is rolled back to or --accept-interrupted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import boxcall, engine
from reconciler.apply.payload import converge_payload as controller_payload
from reconciler.compare.drift import Action, BoxResult, Drift, DriftReport, Kind
from reconciler.drift import DriftRun
from tests.unit.conftest import load_box_program
from tests.unit.converge_harness import (
    EXTRA,
    EXTRA_V1,
    Engine,
    FileEngine,
    converge_payload,
    killed_rollback,
    meta,
    run_events,
    snapshot_dirs,
)
from tests.unit.converge_helpers import deployment
from tests.unit.test_apply_review_fixes import apply_main, fleet, prep  # noqa: F401 (fixtures)

converge = load_box_program("box_converge_review3", "reconciler/apply/remote/converge.py")
THREE = ("vllm-worker", "gateway", "old-lane")
SECRET = "s3cr3t-value-of-the-token"


@pytest.fixture
def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(converge, "_STDOUT_OK", [True])
    return deployment(tmp_path, monkeypatch, "FOO=1\n") / ".lobes"


def result(p: dict[str, Any]) -> dict[str, Any]:
    return run_events(converge, p)[1][-1]


def notes(events: list[dict[str, Any]]) -> str:
    return "\n".join(e["message"] for e in events if e["event"] == "note")


def sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


class Killed(BaseException):
    """What SIGKILL does to a converge: nothing of it runs after (no except, no status)."""


def killed_converge(monkeypatch: pytest.MonkeyPatch, p: dict[str, Any]) -> str:
    """A converge killed at its pull, after its .env write: its snapshot id."""
    before = set(snapshot_dirs(Path(os.environ["HOME"]) / ".lobes"))

    def kill(box: Any, refs: list[str]) -> None:
        raise Killed

    monkeypatch.setattr(converge, "pull", kill)
    with pytest.raises(Killed):
        run_events(converge, p)
    (sid,) = set(snapshot_dirs(Path(os.environ["HOME"]) / ".lobes")) - before
    return str(sid)


def unkill(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(converge, "pull", REAL_PULL)


REAL_PULL = converge.pull


# -- 1. removed/ copies are pruned with their snapshot -------------------------------------------
def test_an_env_copy_a_rollback_removed_goes_when_its_snapshot_is_pruned(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    (deploy / ".env").unlink()  # absent at s1: the converge creates it, with a secret
    s1 = result(converge_payload(managed_env={"FOO": "2", "API_TOKEN": SECRET},
                                 env_keys=["FOO", "API_TOKEN"]))["snapshot"]  # fmt: skip
    assert result(converge_payload("rollback", snapshot=s1))["removed"] == [".env"]
    aside = deploy / ".fleet" / "snapshots" / s1 / "removed" / ".env"
    assert SECRET in aside.read_text()
    _, events = run_events(converge, converge_payload(managed_env={"FOO": "3"}, keep=1))
    assert events[-1]["ok"] is True
    assert not aside.exists() and s1 not in snapshot_dirs(deploy)
    assert f"pruned snapshot {s1} with the files a rollback had removed to its removed/ (.env)" in (
        notes(events)
    )
    for path in (deploy / ".fleet").rglob("*"):  # no copy of the secret anywhere
        assert not path.is_file() or SECRET not in path.read_text(errors="replace"), path


def test_a_snapshot_a_kept_rollback_needs_is_kept_and_that_rollback_uses_it(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A applied (the newest applied: kept), B killed after it created a compose file, C
    converged over B (--accept-interrupted) and failed (rolled back). keep=1 prunes by count,
    but B's record says what a rollback to A must remove: kept, and that rollback removes it."""
    eng = FileEngine(monkeypatch, converge, deploy)
    a = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    (deploy / ".fleet" / "known-good").mkdir(mode=0o700)
    (deploy / ".fleet" / "known-good" / EXTRA).write_bytes(EXTRA_V1)  # the copy B restores
    b = killed_converge(
        monkeypatch, converge_payload(restore=[{"name": EXTRA, "sha256": sha(EXTRA_V1)}])
    )
    unkill(monkeypatch)
    assert (deploy / EXTRA).read_bytes() == EXTRA_V1  # B created it, then was killed
    assert meta(deploy, b)["wrote"] == {EXTRA: [sha(EXTRA_V1)]}
    monkeypatch.setattr(
        converge, "gateway_problems", lambda box, deadline=None: ["/health version 'x', want v"]
    )
    _, events = run_events(
        converge,
        converge_payload(managed_env={"FOO": "4"}, services=["gateway"], keep=1,
                         accept_interrupted=True),
    )  # fmt: skip
    assert events[-1]["ok"] is False and events[-1]["rollback"]["ok"] is True
    assert {a, b} <= set(snapshot_dirs(deploy))
    assert f"snapshot {b} not pruned: its converge was not undone (interrupted)" in notes(events)
    done = result(converge_payload("rollback", snapshot=a))
    assert done["ok"] is True and done["removed"] == [EXTRA], done
    assert not (deploy / EXTRA).exists() and "extra" not in eng.rendered()


# -- 2. a managed file linked out of the deployment directory -------------------------------------
def _outside(home: Path, deploy: Path) -> tuple[Path, str]:
    target = home / "shared" / "lobes.env"
    target.parent.mkdir()
    target.write_text(f"FOO=1\nOTHER_TOKEN={SECRET}\n")
    return target, "../shared/lobes.env"


def _absolute(home: Path, deploy: Path) -> tuple[Path, str]:
    target = home.parent / "elsewhere" / "env"
    target.parent.mkdir()
    target.write_text(f"FOO=1\nOTHER_TOKEN={SECRET}\n")
    return target, str(target)


def _fleet(home: Path, deploy: Path) -> tuple[Path, str]:
    target = deploy / ".fleet" / "known-good" / ".env"
    target.parent.mkdir(parents=True)
    target.write_text("FOO=1\n")
    return target, ".fleet/known-good/.env"


@pytest.mark.parametrize(
    ("name", "make", "said"),
    [
        (".env", _outside, "outside the deployment directory ~/.lobes (to ../shared/lobes.env)"),
        (".env", _absolute, "outside the deployment directory ~/.lobes (to /"),
        (".env", _fleet, "into the converge's own .fleet/ in the deployment directory ~/.lobes"),
        ("docker-compose.yml", _outside, "outside the deployment directory ~/.lobes"),
    ],
    ids=["relative-out", "absolute", "into-fleet", "compose-file"],
)  # fmt: skip
def test_a_managed_file_linked_out_of_the_deployment_is_refused_before_any_change(
    deploy: Path, monkeypatch: pytest.MonkeyPatch, name: str, make: Any, said: str
) -> None:
    eng = Engine(monkeypatch, converge, deploy)
    target, link = make(deploy.parent, deploy)
    before = target.read_bytes()
    (deploy / name).unlink()
    os.symlink(link, deploy / name)
    code, events = run_events(converge, converge_payload(managed_env={"FOO": "2"}))
    assert code == 1 and events[-1]["ok"] is False
    assert events[-1]["failed"].startswith(f"~/.lobes/{name} is a symlink leading ")
    assert said in events[-1]["failed"] and "nothing" not in events[-1].get("rollback", "")
    assert SECRET not in json.dumps(events)
    # Nothing changed: the link as it was, its target as it was, no snapshot, no container.
    assert os.readlink(deploy / name) == link and target.read_bytes() == before
    assert snapshot_dirs(deploy) == [] and not any("up" in a for a in eng.log)


def test_mark_good_does_not_copy_a_compose_file_linked_out_of_the_deployment(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    sid = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    _, link = _outside(deploy.parent, deploy)
    (deploy / "docker-compose.yml").unlink()
    os.symlink(link, deploy / "docker-compose.yml")
    done = result(converge_payload("mark-good", snapshot=sid))
    assert done["ok"] is False and "is a symlink leading outside" in done["failed"]
    assert not (deploy / ".fleet" / "known-good" / "docker-compose.yml").exists()


# -- 3. a stray is removed at mark-good, not at the converge's end --------------------------------
def test_a_stray_comes_back_from_the_controllers_rollback_after_a_failed_verification(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(monkeypatch, converge, deploy, services=THREE)
    stray = eng.c["old-lane"]["Id"]
    r = result(converge_payload(services=["gateway"], removes=["old-lane"]))
    assert r["ok"] is True and r["strays"] == ["old-lane"]
    assert eng.c["old-lane"]["Id"] == stray and eng.c["old-lane"]["State"]["Running"] is False
    assert meta(deploy, r["snapshot"])["strays"] == {"old-lane": stray}
    # The controller's verification failed: its rollback, another run of the program.
    done = result(converge_payload("rollback", snapshot=r["snapshot"]))
    assert done["ok"] is True and done["started"] == ["old-lane"], done
    assert eng.c["old-lane"]["Id"] == stray and eng.c["old-lane"]["State"]["Running"] is True
    assert done["config_equal"] is True


def test_mark_good_removes_the_kept_strays_and_keeps_one_started_again(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(monkeypatch, converge, deploy, services=(*THREE, "older-lane"))
    eng.run(["docker", "stop", eng.c["older-lane"]["Id"]])  # a stray that was not running
    r = result(converge_payload(services=["gateway"], removes=["old-lane", "older-lane"]))
    assert r["ok"] is True and r["strays"] == ["old-lane", "older-lane"]
    assert "older-lane" in eng.c  # not running: kept too, until mark-good
    eng.run(["docker", "start", eng.c["old-lane"]["Id"]])  # an operator started it again
    code, events = run_events(converge, converge_payload("mark-good", snapshot=r["snapshot"]))
    done = events[-1]
    assert code == 0 and done["strays_removed"] == ["older-lane"]
    assert done["strays_kept"] == ["old-lane"] and "older-lane" not in eng.c
    assert eng.c["old-lane"]["State"]["Running"] is True
    assert "kept the stray container of old-lane: running again" in notes(events)


def _report(*drifts: Drift) -> DriftRun:
    report = DriftReport((BoxResult("thor", True, drifts),), "lab", "2026-01-01T00:00:00Z", "r")
    return DriftRun(report, {})


def _stray(status: str) -> tuple[Drift, Drift]:
    return (
        Drift("thor", Kind.STATE, "lane:old-lane", "container", None, status, Action.REMOVE),
        Drift("thor", Kind.PORT, "lane:old-lane", "8000/tcp", None, "0.0.0.0:9", Action.RECREATE),
    )


def test_the_verification_passes_over_a_kept_stray_only_while_it_is_stopped(
    fleet: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine.time, "sleep", lambda _s: None)
    monkeypatch.setattr(engine.time, "monotonic", iter(range(0, 10**6, 1000)).__next__)
    monkeypatch.setattr(engine, "run_drift", lambda *a, **k: _report(*_stray("exited")))
    assert engine.settle(fleet, ["thor"], {"thor": ["old-lane"]})[1] == []
    assert engine.settle(fleet, ["thor"])[1] != []  # not kept by a converge: drift
    monkeypatch.setattr(engine, "run_drift", lambda *a, **k: _report(*_stray("running")))
    left = engine.settle(fleet, ["thor"], {"thor": ["old-lane"]})[1]
    assert sorted(left) == ["lane:old-lane 8000/tcp", "lane:old-lane container"]


def test_a_converge_with_a_stray_is_verified_marked_good_and_observed_again(
    prep: engine.Prepared,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []
    results = {
        "converge": {"ok": True, "snapshot": "20261129T100000Z", "strays": ["old-lane"]},
        "mark-good": {"ok": True, "strays_removed": ["old-lane"]},
        "rollback": {"ok": True, "snapshot": "20261129T100000Z"},
    }

    def call(_target: object, payload: dict[str, Any], _on: object = None) -> boxcall.BoxCall:
        asked.append(payload["action"])
        answer = {"event": "result", **results[payload["action"]]}
        return boxcall.BoxCall(result=answer, events=[answer])

    def observe(*_a: object, **_k: object) -> DriftRun:
        # The stray is seen stopped until the mark-good removed it.
        return _report() if "mark-good" in asked else _report(*_stray("exited"))

    monkeypatch.setattr(engine, "call_box", call)
    monkeypatch.setattr(engine, "run_drift", observe)
    monkeypatch.setattr(engine.time, "monotonic", iter(range(0, 10**6, 1000)).__next__)
    out = engine.execute(prep, "test")
    assert asked == ["converge", "mark-good"] and out.ok and out.marked_good, out.failed
    assert out.drift_after is not None and out.drift_after.drifts == ()


# -- 4. an interrupted converge is said by the next one -------------------------------------------
def test_the_converge_after_a_killed_one_refuses_naming_its_snapshot(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(monkeypatch, converge, deploy)
    sid = killed_converge(monkeypatch, converge_payload(managed_env={"FOO": "2"}))
    unkill(monkeypatch)
    assert (deploy / ".env").read_text() == "FOO=2\n"  # half converged
    ups = len(eng.log)
    code, events = run_events(converge, converge_payload(managed_env={"FOO": "3"}))
    done = events[-1]
    assert code == 1 and done["ok"] is False
    assert done["interrupted"]["snapshot"] == sid
    assert f"the previous converge (snapshot {sid}, started at " in done["failed"]
    assert "did not finish" in done["failed"] and "--accept-interrupted" in done["failed"]
    # Nothing changed: no snapshot, the .env as the killed converge left it, no docker call.
    assert snapshot_dirs(deploy) == [sid] and (deploy / ".env").read_text() == "FOO=2\n"
    assert len(eng.log) == ups


def test_accept_interrupted_converges_over_it_once(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    sid = killed_converge(monkeypatch, converge_payload(managed_env={"FOO": "2"}))
    unkill(monkeypatch)
    code, events = run_events(
        converge, converge_payload(managed_env={"FOO": "3"}, accept_interrupted=True)
    )
    assert code == 0 and events[-1]["ok"] is True
    assert meta(deploy, sid)["status"] == "interrupted"
    assert f"snapshot {sid}: its converge did not finish" in notes(events)
    assert result(converge_payload(managed_env={"FOO": "4"}))["ok"] is True  # said once
    # Its snapshot still undoes both.
    assert result(converge_payload("rollback", snapshot=sid))["ok"] is True
    assert (deploy / ".env").read_text() == "FOO=1\n"


@pytest.mark.parametrize("to", ["interrupted", "earlier"])
def test_a_rollback_over_the_killed_converge_lets_the_next_one_run(
    deploy: Path, monkeypatch: pytest.MonkeyPatch, to: str
) -> None:
    Engine(monkeypatch, converge, deploy)
    earlier = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    sid = killed_converge(monkeypatch, converge_payload(managed_env={"FOO": "3"}))
    unkill(monkeypatch)
    done = result(converge_payload("rollback", snapshot=sid if to == "interrupted" else earlier))
    assert done["ok"] is True
    assert meta(deploy, sid)["status"] == "rolled-back"
    assert result(converge_payload(managed_env={"FOO": "5"}))["ok"] is True


def test_accept_interrupted_must_be_a_flag() -> None:
    p = converge_payload(accept_interrupted="yes")
    with pytest.raises(converge.Failed, match="accept_interrupted: must be true or false"):
        converge.validate_payload(p)


def test_the_controller_names_both_ways_on_and_sends_the_flag(
    prep: engine.Prepared,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[dict[str, Any]] = []
    sid = "20261129T100000Z"
    refusal = {
        "ok": False,
        "failed": "the previous converge did not finish",
        "interrupted": {"snapshot": sid, "taken_at": "2026-11-29T10:00:00Z", "holder": "bob"},
    }

    def call(_target: object, payload: dict[str, Any], _on: object = None) -> boxcall.BoxCall:
        sent.append(payload)
        answer = {"event": "result", **refusal}
        return boxcall.BoxCall(result=answer, events=[answer])

    monkeypatch.setattr(engine, "call_box", call)
    out = engine.execute(prep, "test")
    assert not out.ok and not out.changed and "accept_interrupted" not in sent[0]
    assert out.failed is not None
    assert f"`reconcile rollback thor --to {sid}`" in out.failed
    assert "`reconcile apply thor --accept-interrupted`" in out.failed
    assert "started at 2026-11-29T10:00:00Z by bob" in out.failed
    prep.accept_interrupted = True
    engine.execute(prep, "test")
    assert sent[1]["accept_interrupted"] is True


def test_reconcile_apply_accept_interrupted_reaches_the_payload(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sent: list[dict[str, Any]] = []

    def call(_target: object, payload: dict[str, Any], _on: object = None) -> boxcall.BoxCall:
        sent.append(payload)
        answer = {"event": "result", "ok": False, "failed": "refused"}
        return boxcall.BoxCall(result=answer, events=[answer])

    monkeypatch.setattr(engine, "call_box", call)
    apply_main(monkeypatch, "thor", "--yes", "--accept-interrupted", "--evidence", str(tmp_path))
    assert [p["action"] for p in sent] == ["converge"] and sent[0]["accept_interrupted"] is True


def test_the_payload_carries_the_flag_only_when_given(prep: engine.Prepared) -> None:  # noqa: F811
    observed = prep.run.observations[prep.box].document
    plain = controller_payload(prep.exp, prep.spec, prep.plan, observed, "me", environ=ENVIRON)
    given = controller_payload(
        prep.exp, prep.spec, prep.plan, observed, "me", environ=ENVIRON, accept_interrupted=True
    )
    assert "accept_interrupted" not in plain and given["accept_interrupted"] is True
    converge.validate_payload(given)


ENVIRON = {"GATEWAY_API_KEY": "k" * 32, "LOBES_MESH_KEY": "m" * 32, "HF_TOKEN": "h" * 32}


def test_a_killed_converge_a_later_applied_one_went_over_is_not_said_again(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A box an older program converged over a killed converge (it went on regardless) was
    verified in that state since: nothing to refuse for."""
    Engine(monkeypatch, converge, deploy)
    sid = killed_converge(monkeypatch, converge_payload(managed_env={"FOO": "2"}))
    unkill(monkeypatch)
    over = result(converge_payload(managed_env={"FOO": "3"}, accept_interrupted=True))
    path = deploy / ".fleet" / "snapshots" / sid / "meta.json"
    path.write_text(json.dumps(dict(meta(deploy, sid), status="running")))  # as before review 3
    assert over["ok"] is True and meta(deploy, over["snapshot"])["status"] == "applied"
    assert result(converge_payload(managed_env={"FOO": "4"}))["ok"] is True


# -- a rollback killed halfway is said by the next converge ----------------------------------------
def test_the_converge_after_a_killed_rollback_refuses_until_it_is_run_again(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollback to the first of two applied converges, killed after its first restored file:
    the box is half restored. The next converge refuses (as after a killed converge), naming
    the rollback; running that rollback again lets converges go on."""
    Engine(monkeypatch, converge, deploy)
    first = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    later = result(converge_payload(managed_env={"FOO": "3"}))["snapshot"]
    killed_rollback(converge, monkeypatch, first)
    assert meta(deploy, first)["status"] == "rolling-back"
    assert meta(deploy, later)["status"] == "applied"  # not reached: the newer one is applied
    code, events = run_events(converge, converge_payload(managed_env={"FOO": "4"}))
    done = events[-1]
    assert code == 1 and done["interrupted"]["snapshot"] == first
    assert f"the previous rollback (to snapshot {first}, started at " in done["failed"]
    assert (deploy / ".env").read_text() == "FOO=3\n"  # nothing changed
    assert result(converge_payload("rollback", snapshot=first))["ok"] is True
    assert meta(deploy, first)["status"] == "rolled-back"
    assert result(converge_payload(managed_env={"FOO": "5"}))["ok"] is True


def test_accept_interrupted_converges_over_a_killed_rollback(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    first = result(converge_payload(managed_env={"FOO": "2"}))["snapshot"]
    killed_rollback(converge, monkeypatch, first)
    _, events = run_events(
        converge, converge_payload(managed_env={"FOO": "3"}, accept_interrupted=True)
    )
    assert events[-1]["ok"] is True
    assert f"snapshot {first}: its rollback to it did not finish" in notes(events)
    assert meta(deploy, first)["status"] == "interrupted"
