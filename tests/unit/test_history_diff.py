"""`reconcile diff` on captured lab data: two replays of the incidents snapshot recorded in a
store (the second edited as a night at the boxes would: a lane recreated, a login-shell export
gone, another one added), and the same two snapshots compared directly."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from reconciler.history.diff import Side, diff_sides
from reconciler.history.observed import comparable
from tests.unit.history_helpers import (
    SNAPSHOT,
    container,
    edited_snapshot,
    reconcile,
    recreate_worker_and_drop_shell_key,
    unvouched,
)

HMAC = re.compile(r"hmac:[0-9a-f]{64}")
RECREATED = "thor: model-gear-vllm-worker recreated (container id c2b6115c075d -> 0123456789ab)"


@pytest.fixture
def night(tmp_path: Path) -> Path:
    return edited_snapshot(tmp_path, "night", recreate_worker_and_drop_shell_key)


def record(capsys: pytest.CaptureFixture[str], db: Path, snapshot: Path) -> None:
    code, _, err = reconcile(
        capsys, "drift", "--from-snapshot", str(snapshot), "--history", str(db)
    )
    assert code == 2 and "warning" not in err, err


def test_the_last_two_runs_say_what_appeared_cleared_and_changed(
    tmp_path: Path, night: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    record(capsys, db, SNAPSHOT)
    record(capsys, db, night)
    code, out, _ = reconcile(capsys, "diff", "--history", str(db))
    assert code == 2
    assert (
        "  - thor shell-leak shell GATEWAY_API_KEY: *** (changed) [cause shell:GATEWAY_API_KEY]"
        in out
    )
    assert RECREATED in out
    assert "thor: the login shell no longer exports GATEWAY_API_KEY" in out
    assert "spark: the login shell now exports HF_HOME" in out
    assert "docker.containers[model-gear-vllm-worker].id: c2b6115c075d -> 0123456789ab" in out
    assert out.rstrip().endswith("3 observed values changed on 2 boxes")
    assert not HMAC.search(out)
    # the same two runs named explicitly, in JSON, the other way round
    code, out, _ = reconcile(capsys, "diff", "2", "1", "--history", str(db), "--format", "json")
    doc = json.loads(out)
    assert code == 2 and doc["changed"] is True
    assert [(e["box"], e["kind"], e["path"]) for e in doc["appeared"]] == [
        ("thor", "shell-leak", "GATEWAY_API_KEY")
    ]
    assert doc["appeared"][0]["observed"] == "***" and doc["appeared"][0]["changed"] is True
    assert not HMAC.search(out)


def test_two_runs_of_the_same_boxes_are_no_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    record(capsys, db, SNAPSHOT)
    record(capsys, db, SNAPSHOT)
    code, out, _ = reconcile(capsys, "diff", "--history", str(db))
    assert (code, out.splitlines()[-1]) == (0, "diff: nothing changed")


def test_two_snapshots_compare_drift_and_observations(
    night: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = reconcile(capsys, "diff", "--from-snapshot", str(SNAPSHOT), str(night))
    assert code == 2
    assert "  - thor shell-leak shell GATEWAY_API_KEY" in out
    assert RECREATED in out
    assert not HMAC.search(out)
    code, out, _ = reconcile(capsys, "diff", "--from-snapshot", str(SNAPSHOT), str(SNAPSHOT))
    assert code == 0 and out.endswith("diff: nothing changed\n")


def test_another_run_key_is_no_change_and_no_digest_is_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Digests are keyed per run: two runs always differ in them, so they are masked first."""

    def rekey(docs: dict[str, object]) -> None:
        # as another run key would: every value's digest differs, equal values stay equal
        text = json.dumps(docs)
        for digest in set(HMAC.findall(text)):
            text = text.replace(digest, "hmac:" + hashlib.sha256(digest.encode()).hexdigest())
        docs.update(json.loads(text))

    other = edited_snapshot(tmp_path, "rekeyed", rekey)
    code, out, _ = reconcile(capsys, "diff", "--from-snapshot", str(SNAPSHOT), str(other))
    assert (code, out.splitlines()[-1]) == (0, "diff: nothing changed")
    assert not HMAC.search(out)


def test_volatile_values_are_not_changes_and_lists_are_keyed_by_name() -> None:
    doc = json.loads((SNAPSHOT / "thor.json").read_text())
    view = comparable(doc)
    assert "timings_ms" not in view["collected"] and "meminfo" not in view["collected"]
    assert "model-gear-vllm-worker" in view["collected"]["docker"]["containers"]
    assert view["collected"]["envfile"]["HF_TOKEN"]["line"] == 23
    assert not HMAC.search(json.dumps(view))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["1"], "give two runs"),
        (["1", "99"], "no single run '99'"),
        (["1", "3"], "compare runs of one command"),
        (["2", "2"], "both references name run 2"),
    ],
)
def test_bad_run_references_are_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    db = tmp_path / "h.sqlite3"
    record(capsys, db, SNAPSHOT)
    record(capsys, db, SNAPSHOT)
    reconcile(capsys, "audit", "--from-snapshot", str(SNAPSHOT), "--history", str(db))
    code, out, err = reconcile(capsys, "diff", *args, "--history", str(db))
    assert (code, out) == (1, "")
    assert message in err


def test_diff_needs_two_runs_and_real_snapshots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    code, _, err = reconcile(capsys, "diff", "--history", str(db))
    assert code == 1 and "no store" in err
    record(capsys, db, SNAPSHOT)
    code, _, err = reconcile(capsys, "diff", "--history", str(db))
    assert code == 1 and "fewer than two runs" in err
    code, _, err = reconcile(capsys, "diff", "--from-snapshot", str(SNAPSHOT), str(tmp_path))
    assert code == 1 and f"{tmp_path}/index.json: not a snapshot's index" in err


def test_restarts_and_images_are_said_in_words_and_a_recreate_once() -> None:
    before = {b: json.loads((SNAPSHOT / f"{b}.json").read_text()) for b in ("spark", "orin")}
    after = json.loads(json.dumps(before))
    container(after["spark"], "gateway")["started_at"] = "2026-12-01T03:00:00Z"
    embed = container(after["orin"], "vllm-embed")
    embed["image_ref"] = "10.77.0.1:5000/vllm/vllm-openai@sha256:" + "0" * 64
    worker = container(after["orin"], "vllm-hand")
    old_id = worker["id"]
    worker["id"], worker["started_at"] = "fedcba987654", "2026-12-01T03:01:00Z"
    diff = diff_sides(Side("a", observations=before), Side("b", observations=after))
    assert diff.events == (
        "orin: model-gear-vllm-embed runs another image "
        "(10.77.0.1:5000/vllm/vllm-openai@sha256:" + "0" * 40 + "…)",
        f"orin: model-gear-vllm-hand recreated (container id {old_id} -> fedcba987654)",
        "spark: model-gear-gateway restarted at 2026-12-01T03:00:00Z",
    )
    assert not diff.appeared and diff.changed


# -- a snapshot carrying secrets in clear (edited, or from an older collector) ---------------------
CANARY = "hf_CANARYx7Qm2Lp9Zr4Tn8Vb3Kd6Wf1Hs5Jy0"


def secrets_in_clear(docs: dict[str, Any]) -> None:
    """Where the collector would have hashed a value, or free text quotes one: thor's gateway
    key in clear, a lane's lower-case hf_token, a .env line, a login export and its source,
    secret flags on a command line, and an error quoting a Bearer header."""
    thor = docs["thor"]["collected"]
    container(docs["thor"], "gateway")["env"]["GATEWAY_API_KEY"] = CANARY
    container(docs["thor"], "vllm-embed")["env"]["hf_token"] = CANARY
    thor["envfile"][0]["value"] = CANARY  # HF_TOKEN=
    export = thor["login_shell"]["exports"]["GATEWAY_API_KEY"]
    export["value"] = CANARY
    export["source"] = f"~/.bashrc:6 export GATEWAY_API_KEY={CANARY}"
    container(docs["thor"], "vllm-worker")["cmd"] += [f"--api-key={CANARY}", "--hf-token", CANARY]
    thor["docker"]["error"] = f"Invalid header value b'Bearer {CANARY}\\r\\n'"


def test_diff_masks_secrets_a_snapshot_carries_in_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edited = edited_snapshot(tmp_path, "clear", secrets_in_clear)
    unvouched(edited)
    for fmt in ("text", "json"):
        code, out, err = reconcile(
            capsys, "diff", "--from-snapshot", str(SNAPSHOT), str(edited), "--format", fmt
        )
        assert code == 2, err  # it did find the changes
        assert CANARY not in out + err
        assert "***" in out
    code, out, err = reconcile(capsys, "diff", "--from-snapshot", str(SNAPSHOT), str(edited))
    assert "login_shell.exports[GATEWAY_API_KEY].source: ~/.bashrc:6 -> ~/.bashrc:6 export " in out


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "html"])
def test_a_login_exports_source_is_scrubbed_in_the_drift_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    def source_quoting_a_key(docs: dict[str, Any]) -> None:  # the value itself stays hashed
        export = docs["thor"]["collected"]["login_shell"]["exports"]["GATEWAY_API_KEY"]
        export["source"] = f"~/.bashrc:6 export GATEWAY_API_KEY={CANARY}"

    edited = edited_snapshot(tmp_path, "source", source_quoting_a_key)
    unvouched(edited)
    code, out, err = reconcile(capsys, "drift", "--from-snapshot", str(edited), "--format", fmt)
    assert code == 2 and CANARY not in out + err
    assert "~/.bashrc:6 export GATEWAY_API_KEY=***" in out.replace("\\", "")  # still said
