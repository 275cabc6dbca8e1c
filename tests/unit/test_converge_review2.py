"""Review 2 of apply (/tmp/review-apply's repros), driven through the box program's main() on
the fake engine (converge_harness) and through the controller's box call with a local process
in place of ssh:

1. a connection lost before the first event: the box announces `started` right after the
   lock and changes nothing when it cannot; it stops before its next change (and rolls back)
   once its output is gone; the controller counts a delivered payload without a result as
   STATE UNKNOWN unless ssh proves the program never ran;
2. a converge that fails before recreating anything restarts no healthy lane in its rollback;
3. the containers a converge created (the gateway too) are recorded in its snapshot as they
   are made, so the controller's later rollback removes them as the converge's own would;
4. the `removes` step stops a stray and removes it only after the last step that can fail: a
   rollback starts it again;
5. pruning keeps the newest applied snapshot whatever the failed retries since;
6. a managed file with setuid/setgid/sticky bits is restored with them, not refused.
"""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import boxcall, engine
from reconciler.apply.summary import outcome_lines
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
from tests.unit.test_apply_review_fixes import answering, fleet, prep  # noqa: F401 (fixtures)

converge = load_box_program("box_converge_review2", "reconciler/apply/remote/converge.py")
DIGEST = "registry.local/lobes/vllm@sha256:" + "a" * 64
THREE = ("vllm-worker", "extra", "gateway")


@pytest.fixture
def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Every test starts with the program's output open, whatever one before closed.
    monkeypatch.setattr(converge, "_STDOUT_OK", [True])
    return deployment(tmp_path, monkeypatch, "FOO=1\n") / ".lobes"


class PullFails(Engine):
    """Every image is missing and cannot be pulled."""

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        if argv[:3] == ["docker", "image", "inspect"] or argv[:2] == ["docker", "pull"]:
            self.log.append(argv)
            return 1, "", "manifest unknown"
        return super().run(argv)


def ups(engine_: Engine) -> list[str]:
    return [a[-1] for a in engine_.log if a[:3] == ["docker", "compose", "up"]]


def ids(engine_: Engine) -> dict[str, str]:
    return {s: c["Id"] for s, c in engine_.c.items()}


def result(p: dict[str, Any]) -> dict[str, Any]:
    return run_events(converge, p)[1][-1]


def gateway_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        converge, "gateway_problems", lambda box, deadline=None: ["/health version 'x', want v"]
    )
    monkeypatch.setattr(converge.time, "sleep", lambda _s: None)


# -- 1. the box: its output gone -----------------------------------------------------------------
class Output(io.StringIO):
    """The program's stdout as the controller's connection carries it: every event is kept
    until the first one `gone(event)` is true of; that write, and every one after, fails as a
    write to a closed pipe does."""

    def __init__(self, gone: Any) -> None:
        super().__init__()
        self.gone, self.closed_ = gone, False

    def write(self, text: str) -> int:
        if self.closed_ or self.gone(json.loads(text)):
            self.closed_ = True
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.getvalue().splitlines()]


def run_closed(p: dict[str, Any], gone: Any) -> tuple[int, Output]:
    out = Output(gone)
    return run_main(converge, p, out), out


def test_a_converge_whose_output_is_gone_before_its_first_event_changes_nothing(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(monkeypatch, converge, deploy)
    before = ids(eng)
    code, out = run_closed(converge_payload(services=["vllm-worker"]), lambda e: True)
    assert code == 1 and out.events() == []
    assert (deploy / ".env").read_text() == "FOO=1\n"
    assert snapshot_dirs(deploy) == [] and ups(eng) == [] and ids(eng) == before
    # The lock was released: the next converge, heard, runs.
    assert result(converge_payload())["ok"] is True


def test_a_converge_whose_output_goes_mid_way_stops_before_its_next_change_and_rolls_back(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(monkeypatch, converge, deploy)
    before = ids(eng)
    # .env is written, then the controller is gone: the lane is never recreated.
    code, out = run_closed(
        converge_payload(services=["vllm-worker"]), lambda e: e.get("step") == "recreate"
    )
    assert code == 1
    assert [e["event"] for e in out.events()][:2] == ["started", "snapshot"]
    assert (deploy / ".env").read_text() == "FOO=1\n"  # rolled back
    assert ups(eng) == [] and ids(eng) == before  # nothing recreated, forward or back
    (sid,) = snapshot_dirs(deploy)
    recorded = meta(deploy, sid)
    assert recorded["status"] == "rolled-back"
    assert (
        "connection is gone" in recorded["reason"]
        and "recreating vllm-worker" in recorded["reason"]
    )


def test_a_rollback_whose_output_is_gone_before_its_first_event_changes_nothing(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    sid = result(converge_payload())["snapshot"]
    assert (deploy / ".env").read_text() == "FOO=2\n"
    code, _ = run_closed(converge_payload("rollback", snapshot=sid), lambda e: True)
    assert code == 1 and (deploy / ".env").read_text() == "FOO=2\n"
    assert meta(deploy, sid)["status"] == "applied"


def test_the_first_event_is_started_and_comes_before_the_snapshot(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    _, events = run_events(converge, converge_payload())
    assert [e["event"] for e in events][:2] == ["started", "snapshot"]
    assert events[0]["action"] == "converge"


# -- 1. the controller: a delivered payload without a result -------------------------------------
DROPPED = """
sys.stdin.read()
sys.stderr.write("Connection to 10.77.0.11 closed by remote host.\\n")
sys.exit(255)
"""


def test_a_delivered_payload_without_any_event_is_state_unknown(
    prep: engine.Prepared,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answering(monkeypatch, DROPPED)
    out = engine.execute(prep, "test")
    assert not out.ok and out.state_unknown
    assert out.snapshot is None and "state is unknown" in (out.failed or "")
    last = outcome_lines(out)[-1]
    assert last.startswith("STATE UNKNOWN") and "`reconcile snapshots thor`" in last
    assert out.started_at in last  # which snapshot is this converge's: taken after this


@pytest.mark.parametrize(
    "said",
    [
        "ssh: connect to host 10.77.0.11 port 22: Connection refused",
        "ssh: Could not resolve hostname thor: Name or service not known",
        "deploy@10.77.0.11: Permission denied (publickey).",
        "Host key verification failed.",
        "kex_exchange_identification: read: Connection reset by peer",
        "Connection closed by 10.77.0.11 port 22",
    ],
)
def test_ssh_failing_before_the_program_ran_is_still_plain_unreachable(
    prep: engine.Prepared,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    said: str,
) -> None:
    answering(monkeypatch, f"sys.stdin.read()\nsys.stderr.write({said + chr(10)!r})\nsys.exit(255)")
    out = engine.execute(prep, "test")
    assert not out.state_unknown and not out.changed and out.failed == f"unreachable: {said}"


def test_output_before_a_connect_like_error_is_no_proof_the_program_never_ran(
    prep: engine.Prepared,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answering(
        monkeypatch,
        "sys.stdin.read()\nprint('a banner', flush=True)\n"
        "sys.stderr.write('ssh: connect to host x port 22: Connection refused\\n')\nsys.exit(255)",
    )
    assert engine.execute(prep, "test").state_unknown


def test_a_payload_ssh_never_took_is_a_plain_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    # ssh gone before it read its stdin: a program that started read a cut payload (refused).
    monkeypatch.setattr(boxcall, "_send", lambda proc, payload: False)
    monkeypatch.setattr(
        boxcall, "ssh_argv", lambda *a, **k: [sys.executable, "-c", "import sys; sys.exit(1)"]
    )
    call = boxcall.call_box(None, converge_payload("snapshots"))  # type: ignore[arg-type]
    assert not call.answered and not call.may_have_run


# -- 2. a converge's own rollback recreates only what it touched or what differs from before ------
def test_a_converge_failing_before_any_recreate_restarts_no_healthy_lane(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = PullFails(monkeypatch, converge, deploy, services=THREE)
    before = ids(eng)
    r = result(converge_payload(managed_env={"FOO": "2"}, pulls=[DIGEST]))
    assert r["ok"] is False and r["rollback"]["ok"] is True
    assert r["rollback"]["files"] == [".env"] and (deploy / ".env").read_text() == "FOO=1\n"
    assert r["rollback"]["recreated"] == []
    assert ups(eng) == [] and ids(eng) == before
    assert not [a for a in eng.log if a[:2] == ["docker", "stop"]]
    assert r["rollback"]["config_equal"] is True


def test_a_converge_failing_mid_way_recreates_what_it_touched_and_only_that(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class ExtraFails(Engine):  # the converge's `up` of extra fails, the rollback's works
        def run(self, argv: list[str]) -> tuple[int, str, str]:
            up = argv[:3] == ["docker", "compose", "up"] and argv[-1] == "extra"
            if up and "extra" not in ups(self):
                self.log.append(argv)
                return 1, "", "no room"
            return super().run(argv)

    eng = ExtraFails(monkeypatch, converge, deploy, services=THREE)
    gateway = eng.c["gateway"]["Id"]
    r = result(converge_payload(managed_env={"FOO": "1"}, services=["vllm-worker", "extra"]))
    assert r["ok"] is False
    assert r["rollback"]["recreated"] == ["vllm-worker", "extra"]
    assert eng.c["gateway"]["Id"] == gateway  # neither touched nor rendered differently


# -- 3. created containers recorded as made, the gateway too -----------------------------------
def test_the_controllers_rollback_removes_a_lane_the_converge_created(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(monkeypatch, converge, deploy)
    before = ids(eng)
    r = result(converge_payload(services=["extra"]))
    sid = r["snapshot"]
    made = eng.c["extra"]["Id"]
    recorded = meta(deploy, sid)
    assert recorded["created"] == ["extra"] and made in recorded["made"]["extra"]
    # What engine._roll_back sends after a failed verification: another process, later.
    done = result(converge_payload("rollback", snapshot=sid, reason="verification failed"))
    assert done["ok"] is True and done["removed_containers"] == ["extra"]
    assert ["docker", "rm", "-f", made] in eng.log
    assert "extra" not in eng.c and done["config_equal"] is True
    assert set(ids(eng)) == set(before)


def test_a_created_gateway_is_recorded_and_removed_by_the_converges_own_rollback(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(monkeypatch, converge, deploy, services=("vllm-worker",))
    gateway_fails(monkeypatch)
    r = result(converge_payload(managed_env={"FOO": "1"}, services=["gateway"]))
    assert r["ok"] is False and r["rollback"]["removed_containers"] == ["gateway"]
    assert "gateway" not in eng.c and r["rollback"]["config_equal"] is True
    recorded = meta(deploy, r["snapshot"])
    assert recorded["created"] == ["gateway"] and len(recorded["made"]["gateway"]) == 1


def test_the_controllers_rollback_removes_a_gateway_the_converge_created(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(monkeypatch, converge, deploy, services=("vllm-worker",))
    sid = result(converge_payload(managed_env={"FOO": "1"}, services=["gateway"]))["snapshot"]
    made = eng.c["gateway"]["Id"]
    assert meta(deploy, sid)["made"]["gateway"] == [made]
    done = result(converge_payload("rollback", snapshot=sid))
    assert done["removed_containers"] == ["gateway"] and "gateway" not in eng.c


def test_a_container_made_by_a_converge_that_then_failed_its_health_is_recorded(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Unhealthy(Engine):
        def up(self, service: str) -> None:
            super().up(service)
            if service == "extra" and self.n > 2:
                self.c[service]["State"] = {"Status": "exited", "Running": False}

    eng = Unhealthy(monkeypatch, converge, deploy)
    r = result(converge_payload(managed_env={"FOO": "1"}, services=["extra"]))
    assert r["ok"] is False and "extra stopped while booting" in r["failed"]
    assert r["rollback"]["removed_containers"] == ["extra"] and "extra" not in eng.c
    assert meta(deploy, r["snapshot"])["created"] == ["extra"]
    assert len(meta(deploy, r["snapshot"])["made"]["extra"]) == 1


# -- 4. a stray is stopped, kept until nothing can fail, started again by a rollback -----------
def test_a_stray_stopped_by_a_converge_that_fails_later_is_started_again(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(monkeypatch, converge, deploy, services=("vllm-worker", "gateway", "old-lane"))
    stray = eng.c["old-lane"]["Id"]
    gateway_fails(monkeypatch)
    r = result(converge_payload(services=["gateway"], removes=["old-lane"]))
    assert r["ok"] is False
    assert ["docker", "stop", stray] in eng.log and ["docker", "rm", "-f", stray] not in eng.log
    assert eng.c["old-lane"]["Id"] == stray and eng.c["old-lane"]["State"]["Running"] is True
    assert r["rollback"]["started"] == ["old-lane"] and r["rollback"]["config_equal"] is True
    assert meta(deploy, r["snapshot"])["stopped"] == {"old-lane": stray}


def test_a_stray_is_removed_only_after_the_gateway_is_verified(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped before the gateway's recreate, removed only by the mark-good that follows the
    controller's verification (test_review3_converge.py: not at the converge's end)."""
    eng = Engine(monkeypatch, converge, deploy, services=("vllm-worker", "gateway", "old-lane"))
    stray = eng.c["old-lane"]["Id"]
    r = result(converge_payload(services=["gateway"], removes=["old-lane"]))
    assert r["ok"] is True and r["strays"] == ["old-lane"] and "old-lane" in eng.c
    assert result(converge_payload("mark-good", snapshot=r["snapshot"]))["ok"] is True
    assert "old-lane" not in eng.c
    log = eng.log
    assert log.index(["docker", "stop", stray]) < log.index(["docker", "rm", stray])
    gateway_up = log.index(
        ["docker", "compose", "up", "-d", "--no-deps", "--force-recreate", "gateway"]
    )
    assert gateway_up < log.index(["docker", "rm", stray])


def test_a_stray_that_was_not_running_is_not_started_by_a_rollback(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(monkeypatch, converge, deploy, services=("vllm-worker", "gateway", "old-lane"))
    stray = eng.c["old-lane"]["Id"]
    eng.run(["docker", "stop", stray])
    gateway_fails(monkeypatch)
    r = result(converge_payload(services=["gateway"], removes=["old-lane"]))
    assert r["ok"] is False and r["rollback"]["started"] == []
    assert eng.c["old-lane"]["State"]["Running"] is False
    assert ["docker", "start", stray] not in eng.log


# -- 5. pruning keeps the newest applied snapshot ----------------------------------------------
def test_failed_retries_never_prune_the_snapshot_of_the_last_real_apply(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    good = result(converge_payload(managed_env={"FOO": "2"}))
    assert good["ok"]
    PullFails(monkeypatch, converge, deploy)
    notes: list[str] = []
    for _ in range(10):
        _, events = run_events(converge, converge_payload(managed_env={"FOO": "3"}, pulls=[DIGEST]))
        assert not events[-1]["ok"] and events[-1]["rollback"]["ok"]
        notes += [e["message"] for e in events if e["event"] == "note"]
    assert good["snapshot"] in snapshot_dirs(deploy)
    assert len(snapshot_dirs(deploy)) == 11  # the 10 newest, and the applied one
    assert f"snapshot {good['snapshot']} not pruned: it is the newest applied one" in notes[-1]
    done = result(converge_payload("rollback", snapshot=good["snapshot"]))
    assert done["ok"] is True and (deploy / ".env").read_text() == "FOO=1\n"


# -- 6. special mode bits ------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [0o4644, 0o2644, 0o1644])
def test_a_compose_file_with_special_mode_bits_is_rolled_back_with_them(
    deploy: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    PullFails(monkeypatch, converge, deploy)
    compose = deploy / "docker-compose.yml"
    os.chmod(compose, mode)
    r = result(converge_payload(managed_env={"FOO": "2"}, pulls=[DIGEST]))
    assert r["ok"] is False and r["rollback"]["ok"] is True, r
    assert (deploy / ".env").read_text() == "FOO=1\n"
    assert stat.S_IMODE(compose.stat().st_mode) == mode
    assert meta(deploy, r["snapshot"])["files"]["docker-compose.yml"]["mode"] == mode
