"""The box-side converge after review 7 (/tmp/rev-converge/work's repros):

1. A SIGTERM while the gateway check waits for an answer stops the converge, which rolls back:
   http_status's `except Exception` swallowed the Stopped (and on_stop had disarmed itself, so
   every later stop was ignored too): the converge ended applied.
2. A rollback over a file edited since (a key rotated by hand in `.env`) keeps a copy of the
   edit in the snapshot's `removed/` before restoring, and says so; what a converge wrote is
   restored over without a copy.
3. write_env never writes a `.env` compose refuses: a key appended after a last line with no
   `=` and no line end is refused before anything is stopped, and so is a value ending in an
   odd run of backslashes (`'abc\\'`, which compose reads as never ending).
4. The automatic rollback's reason is capped: the whole list of what a verification left made
   a payload the box's rule refused, and the rollback was never sent.
5. `--accept-interrupted` is recorded only by a converge that is not refused: one refused for
   a stale plan left the interrupted snapshot accepted, and the next plain converge went on.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from reconciler.apply import engine
from reconciler.desired.load import load_fleet
from reconciler.drift import DriftRun, run_drift_on
from reconciler.drift_inputs import drift_inputs
from tests.unit.conftest import load_box_program
from tests.unit.converge_harness import Engine, Killed, converge_payload, meta, run_events
from tests.unit.converge_helpers import deployment

converge = load_box_program("box_converge_review7", "reconciler/apply/remote/converge.py")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"

# What the real `docker compose config` (v2.40.3) read from one line `V1=<written>` of `.env`
# (its service's `environment: {V1: ${V1}}`), captured with a scratch compose file: None where
# compose refused the file ("unterminated quoted value").
COMPOSE_READS = {
    "'abc\\'": None,
    "abc\\": "abc\\",
    '"abc\\\\"': "abc\\",
    '"a b\\\\"': "a b\\",
    '"a\\$b\\\\"': "a$b\\",
    '"it\'s\\\\"': "it's\\",
    '"a\\\\\\\\"': "a\\\\",
    '"x\\\\y"': "x\\y",
    "'sp ace \\\\'": "sp ace \\\\",
}


@pytest.fixture
def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(converge, "_STDOUT_OK", [True])
    return deployment(tmp_path, monkeypatch, "FOO=1\n") / ".lobes"


# -- 1. a stop during the gateway check ---------------------------------------------------------
def test_a_sigterm_while_the_gateway_check_waits_rolls_the_converge_back(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_problems = converge.gateway_problems
    Engine(monkeypatch, converge, deploy)
    monkeypatch.setattr(converge, "gateway_problems", real_problems)  # the real HTTP check
    asked: list[str] = []

    def gateway(url: str, deadline: float) -> tuple[int, bytes]:
        asked.append(url)
        if len(asked) == 1:
            # The first request hangs; the stop lands while it waits (on_stop raises here).
            os.kill(os.getpid(), signal.SIGTERM)
            raise TimeoutError("no whole answer before the deadline")
        return 200, b'{"version": "v"}' if url.endswith("/health") else b"{}"

    monkeypatch.setattr(converge, "http_get", gateway)
    p = converge_payload(
        services=["gateway"],
        gateway={"timeout_s": 30},
        verify={"port": 8080, "version": "v", "auth": "open", "windows": {}},
    )
    code, events = run_events(converge, p)
    r = events[-1]
    assert (code, r["ok"], r.get("failed")) == (1, False, "stopped by SIGTERM"), r
    assert r["rollback"]["ok"] is True
    assert (deploy / ".env").read_text() == "FOO=1\n"
    assert meta(deploy, r["snapshot"])["status"] == "rolled-back"
    assert len(asked) == 1  # stopped at once, not asked again until the gateway answered


# -- 2. a rollback over an edit since ----------------------------------------------------------
def test_a_rollback_over_a_hand_edit_keeps_a_copy_of_it(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    _, events = run_events(converge, converge_payload())  # FOO=1 -> FOO=2, applied
    sid = events[-1]["snapshot"]
    edited = b"FOO=2\nS3_SECRET_KEY=rotated-by-hand-2026\n"
    (deploy / ".env").write_bytes(edited)  # the operator rotates a key the fleet does not manage
    _, events = run_events(converge, converge_payload("rollback", snapshot=sid))
    r = events[-1]
    assert r["ok"] is True and r["files"] == [".env"], r
    assert (deploy / ".env").read_bytes() == b"FOO=1\n"  # the rollback still restores
    copy = deploy / ".fleet" / "snapshots" / sid / "removed" / ".env"
    assert copy.read_bytes() == edited and copy.stat().st_mode & 0o777 == 0o600
    (aside,) = r["set_aside"]
    assert aside["name"] == ".env"
    assert f"~/.lobes/.fleet/snapshots/{sid}/removed/.env" in aside["why"]
    notes = [e["message"] for e in events if e["event"] == "note"]
    assert any(n.startswith(".env edited since snapshot") for n in notes), notes
    assert all("rotated-by-hand" not in json.dumps(e) for e in events)  # never its bytes
    # The controller reads it, and says it where the rollback's outcome is said.
    from reconciler.apply.answer import rollback_result
    from reconciler.apply.summary import _rollback_line as rollback_line

    parsed = rollback_result(r)
    assert parsed is not None and [(k.name, k.why) for k in parsed.set_aside] == [
        (".env", aside["why"])
    ]
    assert (
        f"; SET ASIDE .env: edited by hand since the snapshot; restored over, the edit copied "
        f"into the snapshot's removed/ directory (.fleet/snapshots/{sid}/removed/)"
    ) in rollback_line(parsed)


def test_a_rollback_over_what_the_converge_wrote_keeps_no_copy(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    _, events = run_events(converge, converge_payload())
    sid = events[-1]["snapshot"]
    r = run_events(converge, converge_payload("rollback", snapshot=sid))[1][-1]
    assert r["ok"] is True and r["files"] == [".env"] and r["set_aside"] == [], r
    assert (deploy / ".env").read_bytes() == b"FOO=1\n"
    assert not (deploy / ".fleet" / "snapshots" / sid / "removed").exists()


# -- 3. write_env never writes a .env compose refuses --------------------------------------------
def test_a_key_is_not_appended_after_a_last_line_compose_only_ignores_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(converge, "_STDOUT_OK", [True])
    deploy = deployment(tmp_path, monkeypatch, "FOO=1\nsee docs") / ".lobes"
    eng = Engine(monkeypatch, converge, deploy)
    assert converge._dotenv_read("FOO=1\nsee docs")[1] is None  # compose reads it as it is
    code, events = run_events(
        converge, converge_payload(managed_env={"FOO": "1", "BAR": "2"}, env_keys=["FOO", "BAR"])
    )
    r = events[-1]
    assert code == 1 and r["ok"] is False, r
    assert r["failed"].startswith(".env line 2: docker compose would refuse the file"), r
    assert "see docs" not in r["failed"]  # the line is named, never what it holds
    assert (deploy / ".env").read_bytes() == b"FOO=1\nsee docs"  # nothing written
    # Refused before anything was stopped or recreated.
    assert not [
        a for a in eng.log if a[1] in ("stop", "rm") or a[:3] == ["docker", "compose", "up"]
    ]


@pytest.mark.parametrize("written", sorted(COMPOSE_READS))
def test_the_reader_reads_a_value_as_compose_did(written: str) -> None:
    statements, problem = converge._dotenv_read(f"V1={written}\n")
    got = None if problem is not None else statements[0][1]
    assert got == COMPOSE_READS[written]


@pytest.mark.parametrize("value", ["a\\\\", "x\\y", "sp ace \\\\", "it's", "a$b", "a b"])
def test_a_value_is_quoted_in_a_form_compose_reads_back(value: str) -> None:
    written = converge.quote(value)
    if written in COMPOSE_READS:
        assert COMPOSE_READS[written] == value  # the very form compose was seen to read so
    statements, problem = converge._dotenv_read(f"K={written}\n")
    assert problem is None and statements[0][1] == value, written


def test_a_box_file_secret_ending_in_a_backslash_is_refused_before_anything_stops(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written as quote() writes it (`'abc\\'`, as the collector renders it too), compose would
    refuse the whole `.env`; the converge wrote it, stopped the lanes, and rolled back."""
    (deploy.parent / ".secrets.env").write_text("PW=abc\\\n")
    eng = Engine(monkeypatch, converge, deploy)
    before = (deploy / ".env").read_bytes()
    p = converge_payload(
        managed_env={"DB_PASSWORD": {"secret": "pw"}},
        env_keys=["DB_PASSWORD"],
        box_secrets={"pw": {"path": "~/.secrets.env", "key": "PW"}},
    )
    r = run_events(converge, p)[1][-1]
    assert r["ok"] is False, r
    assert r["failed"].startswith(".env line "), r
    assert "abc" not in r["failed"]  # the line is named, never what it holds
    assert (deploy / ".env").read_bytes() == before
    assert not [
        a for a in eng.log if a[1] in ("stop", "rm") or a[:3] == ["docker", "compose", "up"]
    ]


def test_a_managed_key_that_would_read_otherwise_is_refused_naming_its_line() -> None:
    with pytest.raises(converge.Failed) as caught:
        converge.reads_back("A=1\nB='secret-x'\n", ["B"], {"B": "secret-y"})
    assert str(caught.value) == (
        ".env: B would not read back as the value this converge writes (line 2); nothing was "
        "written"
    )
    converge.reads_back("A=1\nB='secret-y'\n", ["B"], {"B": "secret-y"})  # as desired: passes


# -- 4. the automatic rollback's reason --------------------------------------------------------
def test_the_rollback_after_a_failed_verification_of_many_drifts_is_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet = load_fleet(EXAMPLE, "lab")

    def observed(fleet: Any, boxes: list[str], *_a: object, **_k: object) -> DriftRun:
        return run_drift_on(drift_inputs(fleet), boxes, from_snapshot=EXAMPLE / "snapshot")

    monkeypatch.setattr(engine, "run_drift", observed)
    prep = engine.prepare(fleet, "thor", observed(fleet, ["thor"]))
    sent: list[dict[str, Any]] = []

    def call(_target: object, payload: dict[str, Any], _on: object = None) -> Any:
        converge.validate_payload(payload)  # the box's own rule, as boxcall checks before sending
        sent.append(payload)
        result = {"event": "result", "ok": True, "snapshot": "20261129T100000Z"}
        return SimpleNamespace(result=result, events=[result], dropped=0, may_have_run=False)

    monkeypatch.setattr(engine, "call_box", call)
    left = [f"lane:vllm-worker env.KEY_{i:03d}" for i in range(200)] + ["error: a\nb"]
    out = engine.Outcome("thor", ok=False, changed=True, plan=prep.plan, started_at="now")
    out.snapshot = "20261129T100000Z"
    engine._roll_back(out, prep, "me", left, None)
    (payload,) = sent
    reason = payload["reason"]
    assert reason.startswith("verification failed: lane:vllm-worker env.KEY_000; ")
    assert reason.endswith("; lane:vllm-worker env.KEY_004; and 196 more") and len(reason) < 1000
    assert out.failed is not None and out.failed.count("env.KEY_") == 200  # the operator: all


def test_any_rollback_reason_is_sent_as_one_bounded_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[dict[str, Any]] = []

    def call(_target: object, payload: dict[str, Any], _on: object = None) -> Any:
        converge.validate_payload(payload)
        sent.append(payload)
        return SimpleNamespace(result={"ok": True}, events=[], dropped=0, may_have_run=False)

    monkeypatch.setattr(engine, "call_box", call)
    fleet = load_fleet(EXAMPLE, "lab")
    engine.rollback(fleet, "thor", "20261129T100000Z", "me", reason="why " * 2000 + "\nthen")
    (payload,) = sent
    assert payload["reason"].startswith("why why") and len(payload["reason"]) <= 1500


# -- 5. --accept-interrupted is used only by a converge that goes on -----------------------------
def test_a_refused_converge_does_not_use_up_accept_interrupted(
    deploy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Engine(monkeypatch, converge, deploy)
    real = converge.write_env

    def killed(*_a: object, **_k: object) -> None:
        raise Killed

    monkeypatch.setattr(converge, "write_env", killed)
    with pytest.raises(Killed):
        run_events(converge, converge_payload())
    monkeypatch.setattr(converge, "write_env", real)
    (sid,) = os.listdir(deploy / ".fleet" / "snapshots")
    stale = {"files": {".env": "0" * 64}, "containers": None}  # the box changed since the plan
    r = run_events(converge, converge_payload(accept_interrupted=True, fingerprint=stale))[1][-1]
    assert r["ok"] is False and r["failed"].startswith("the box changed since it was observed")
    assert meta(deploy, sid)["status"] == "running"  # still the interrupted converge's
    r = run_events(converge, converge_payload())[1][-1]
    assert r["ok"] is False and "did not finish" in r["failed"], r
    r = run_events(converge, converge_payload(accept_interrupted=True))[1][-1]
    assert r["ok"] is True and meta(deploy, sid)["status"] == "interrupted", r
