"""The history store and `reconcile diff` after the review of 2026-12-05: which boxes each run
observed (an unreachable box's entries are not "cleared"), runs of one fleet, no secret in
clear in the store, container events, findings as multisets, no traceback on deep nesting or a
huge age, no quadratic compare, box text escaped on the terminal, and readers that change no
database."""

from __future__ import annotations

import json
import shutil
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest

from reconciler.history.diff import Side, diff_sides, render_text
from reconciler.history.migrations import VERSION
from reconciler.history.observed import comparable
from reconciler.history.record import FindingRow
from reconciler.history.since import parse_since
from reconciler.history.store import observations_of, opened
from tests.unit.cpu_bound import cpu_bound
from tests.unit.history_helpers import (
    INCIDENTS,
    SNAPSHOT,
    as_version,
    container,
    edited_snapshot,
    reconcile,
    recreate_worker_and_drop_shell_key,
    replay,
    store_text,
    unreachable,
    unvouched,
)
from tests.unit.test_history_diff import CANARY, secrets_in_clear


def thor_and_spark() -> dict[str, Any]:
    return {b: json.loads((SNAPSHOT / f"{b}.json").read_text()) for b in ("thor", "spark")}


def copied(docs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(docs))
    return out


# -- 1. which boxes each run observed; runs of one fleet -------------------------------------------


def test_a_box_unreachable_in_one_run_is_not_compared_never_cleared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    replay(capsys, db, edited_snapshot(tmp_path, "timeout", unreachable("thor")))
    code, out, _ = reconcile(capsys, "diff", "--history", str(db))
    assert "  thor: not observed in run 2: not compared" in out
    assert "  - thor " not in out and "  + thor " not in out  # none of its entries "cleared"
    assert code == 2  # thor was reachable, then not: that did change
    assert out.rstrip().endswith("1 boxes not compared")


def test_a_run_of_one_box_leaves_the_others_not_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    replay(capsys, db, SNAPSHOT, "thor")
    code, out, _ = reconcile(capsys, "diff", "--history", str(db), "--format", "json")
    doc = json.loads(out)
    assert (code, doc["cleared"], doc["appeared"]) == (0, [], [])
    assert [(u["box"], u["a"], u["b"]) for u in doc["not_compared"]] == [
        ("spark", "full", "absent"),
        ("orin", "full", "absent"),
    ]


def test_the_default_pair_is_two_runs_of_one_fleet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two repositories, both with inventory/lab.yaml, recorded in one store."""
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(INCIDENTS, a)
    shutil.copytree(INCIDENTS, b)
    night = edited_snapshot(tmp_path, "night", recreate_worker_and_drop_shell_key)
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, a / "snapshot", root=a)
    replay(capsys, db, night, root=b)
    replay(capsys, db, a / "snapshot", root=a)
    code, out, err = reconcile(capsys, "diff", "--history", str(db), root=a)
    assert out.startswith("diff: run 1 (") and " -> run 3 (" in out, err
    assert (code, out.splitlines()[-1]) == (0, "diff: nothing changed")
    code, out, err = reconcile(capsys, "diff", "2", "3", "--history", str(db), root=a)
    assert (code, out) == (1, "")
    assert "compare runs of one fleet" in err and f"inventory/lab.yaml in {a}" in err


def test_a_store_at_schema_version_1_is_read_as_it_is_and_migrated_by_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    replay(capsys, db, SNAPSHOT)
    as_version(db, 1)  # as the reconciler before `root` (and sizes) left it
    before = db.read_bytes()
    code, out, _ = reconcile(capsys, "history", "--history", str(db), "--format", "json")
    assert code == 0 and [r["root"] for r in json.loads(out)["runs"]] == [None, None]
    code, out, _ = reconcile(capsys, "diff", "--history", str(db))
    assert (code, out.splitlines()[-1]) == (0, "diff: nothing changed")
    assert db.read_bytes() == before  # read, never migrated
    replay(capsys, db, SNAPSHOT)  # a run migrates it; its diff pairs with the runs before
    code, out, _ = reconcile(capsys, "diff", "--history", str(db))
    assert (code, out.splitlines()[-1]) == (0, "diff: nothing changed")
    with opened(db, create=False) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(VERSION,)]
        roots = [r[0] for r in conn.execute("SELECT root FROM runs ORDER BY id")]
        measured = [r[0] for r in conn.execute("SELECT run FROM run_sizes ORDER BY run")]
    assert roots == [None, None, str(INCIDENTS)]
    assert measured == [3], "only a run recorded since the migration is measured"


# -- 2. no secret in clear in the store; a value of any shape under a secret name masked ---------


def more_secrets_in_clear(docs: dict[str, Any]) -> None:
    """secrets_in_clear, and a value of every shape under a secret name: a list, a record, a
    number, in a container's env, an image's env and the compose render's environment."""
    secrets_in_clear(docs)
    thor = docs["thor"]["collected"]
    env = container(docs["thor"], "gateway")["env"]
    env["MY_PASSWORD_FILE"] = [CANARY, "second"]
    env["DB_PASSWORD"] = {"nested": CANARY}
    env["PIN_SECRET"] = 4242424242
    next(iter(thor["docker"]["images"].values()))["env"]["HF_TOKEN"] = CANARY
    thor["render"]["services"]["gateway"]["environment"]["GATEWAY_API_KEY"] = CANARY
    thor["render_login"]["services"]["gateway"]["command"] += ["--api-key", CANARY]


def test_the_store_never_holds_a_secret_a_snapshot_carries_in_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clear = edited_snapshot(tmp_path, "clear", more_secrets_in_clear)
    unvouched(clear)
    texts = edited_snapshot(tmp_path, "texts", secrets_in_clear)  # values the parser takes
    unvouched(texts)
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    replay(capsys, db, clear)
    replay(capsys, db, texts)
    held = store_text(db)
    assert CANARY not in held and "4242424242" not in held
    with opened(db, create=False) as conn:
        # A list, a record or a number as an env value: the replay refused thor's file (not
        # observed), and the store keeps only files the replay took (test_observe_review_fixes).
        assert "thor" not in observations_of(conn, 2)
        thor = observations_of(conn, 3)["thor"]
    env = container(thor, "gateway")["env"]  # the document keeps its shape
    assert env["GATEWAY_API_KEY"] == "***"
    assert env["LOBES_MESH_KEY"]["secret"].startswith("hmac:")  # digests kept as they were
    assert thor["collected"]["envfile"][0] == {"key": "HF_TOKEN", "line": 23, "value": "***"}
    code, out, err = reconcile(capsys, "diff", "--history", str(db))
    assert code == 2 and CANARY not in out + err


def test_diff_masks_a_value_of_any_shape_under_a_secret_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clear = edited_snapshot(tmp_path, "clear", more_secrets_in_clear)
    unvouched(clear)
    code, out, err = reconcile(capsys, "diff", "--from-snapshot", str(SNAPSHOT), str(clear))
    assert code == 2 and CANARY not in out + err and "4242424242" not in out
    doc = json.loads((clear / "thor.json").read_text())
    view = comparable(doc)["collected"]
    env = view["docker"]["containers"]["model-gear-gateway"]["env"]
    assert (env["MY_PASSWORD_FILE"], env["PIN_SECRET"]) == ("***", "***")
    assert env["DB_PASSWORD"] == {"nested": "***"}  # a record: its fields masked one by one
    assert CANARY not in json.dumps(view)
    # the collector's own records under secret-shaped names stay readable, digests masked
    assert view["secret_sources"]["hf_token"] == {
        "digest": "***",
        "path": "~/.lobes/.secrets.env",
        "status": "ok",
    }
    assert view["envfile"]["HF_TOKEN"] == {"key": "HF_TOKEN", "line": 23, "value": "***"}
    assert view["current_env_keys"][:2] == ["COMPOSE_FILE", "COMPOSE_PROFILES"]


# -- 3. a container added or removed is said only of the container ------------------------------


def test_an_item_added_inside_a_container_is_no_container_added() -> None:
    before = thor_and_spark()
    after = copied(before)
    gateway = container(after["thor"], "gateway")
    gateway["env"]["NEW_VAR"] = "1"
    gateway["cmd"] = [*gateway["cmd"], "--verbose"]
    containers = after["spark"]["collected"]["docker"]["containers"]
    gone = containers.pop()
    diff = diff_sides(Side("a", observations=before), Side("b", observations=after))
    assert diff.events == (f"spark: container {gone['name']} removed",)
    assert any(c.path.endswith("env[NEW_VAR]") for c in diff.changes)


# -- 4. several findings with one code on one box ------------------------------------------------


def lane(name: str, digest: str = "") -> FindingRow:
    message = f"model-gear-{name} publishes 0.0.0.0:18001->8000/tcp on the host{digest}"
    return FindingRow("orin", "publish.lane", "fail", message)


def test_findings_are_compared_one_by_one_with_their_digests_masked() -> None:
    a = Side("a", findings=(lane("vllm-embed"), lane("vllm-hand", " (digest 1a2b3c…)")))
    b = Side("b", findings=(lane("vllm-hand", " (digest 9f8e7d…)"),))
    diff = diff_sides(a, b)
    assert diff.findings_cleared == (lane("vllm-embed"),)
    assert diff.findings_appeared == ()  # another run's digest is the same finding
    assert diff_sides(b, a).findings_appeared == (lane("vllm-embed"),)


# -- 5. no traceback: deep nesting, a huge age -----------------------------------------------------


def nested(depth: int, leaf: object) -> dict[str, Any]:
    doc: dict[str, Any] = {"a": leaf}
    for _ in range(depth):
        doc = {"a": doc}
    return doc


def _deep_pair(tmp_path: Path, depth: int) -> tuple[Path, Path]:
    def deep(leaf: str) -> Any:
        def edit(docs: dict[str, Any]) -> None:
            container(docs["thor"], "gateway")["labels"] = nested(depth, leaf)

        return edit

    first = edited_snapshot(tmp_path, f"deep{depth}-1", deep("one"))
    second = edited_snapshot(tmp_path, f"deep{depth}-2", deep("two"))
    for snapshot in (first, second):
        unvouched(snapshot)
    return first, second


def test_an_observation_nested_as_deep_as_a_snapshot_allows_is_compared_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = _deep_pair(tmp_path, 30)
    code, out, err = reconcile(capsys, "diff", "--from-snapshot", str(first), str(second))
    assert (code, "Traceback" in err) == (2, False), err
    assert "labels" in out and "not compared" not in out
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, first)
    replay(capsys, db, second)
    code, out, err = reconcile(capsys, "diff", "--history", str(db))
    assert code == 2 and "labels" in out, out + err


def test_an_observation_nested_600_deep_is_that_boxs_fault_never_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A snapshot file nested past the parser's bound (observe/document.py SNAPSHOT_DEPTH) is
    its box's fault on both sides: the box is said not compared, never a traceback."""
    first, second = _deep_pair(tmp_path, 600)
    code, out, err = reconcile(capsys, "diff", "--from-snapshot", str(first), str(second))
    assert (code, "Traceback" in err) == (0, False), err
    assert "not compared" in out, out
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, first)
    replay(capsys, db, second)
    code, out, err = reconcile(capsys, "diff", "--history", str(db))
    assert (code, "Traceback" in err) == (0, False) and "not compared" in out, out + err


def test_a_recursion_deepdiff_still_meets_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def too_deep(*_: object) -> None:
        raise RecursionError

    monkeypatch.setattr("reconciler.history.diff.diff_sides", too_deep)
    code, out, err = reconcile(capsys, "diff", "--from-snapshot", str(SNAPSHOT), str(SNAPSHOT))
    assert (code, out) == (1, "")
    assert err.startswith("error: diff: an observation is nested too deeply to compare")


def test_an_age_past_any_store_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    huge = "9" * 300 + "d"
    with pytest.raises(ValueError, match="at most 100 years"):
        parse_since(huge)
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    code, out, err = reconcile(capsys, "history", "--history", str(db), "--since", huge)
    assert (code, out) == (1, "") and "expected an age of at most 100 years" in err
    code, out, _ = reconcile(capsys, "history", "--history", str(db), "--since", "36500d")
    assert code == 0 and "1 runs in" in out


# -- 6. nothing quadratic ----------------------------------------------------------------------


def test_a_key_repeated_10000_times_is_keyed_in_linear_time() -> None:
    lines = [{"key": "DUP", "line": n, "value": str(n)} for n in range(10_000)]
    with cpu_bound(2.0):  # 14.6 s when each repeat rescanned the labels
        view = comparable({"envfile": lines})
    assert len(view["envfile"]) == 10_000 and view["envfile"]["DUP#10000"]["line"] == 9_999


def test_a_16000_word_command_line_is_compared_whole_in_linear_time() -> None:
    before = thor_and_spark()
    after = copied(before)
    container(before["thor"], "gateway")["cmd"] = ["a", "b"] * 8000  # difflib's worst case
    container(after["thor"], "gateway")["cmd"] = ["b", "a"] * 8000
    with cpu_bound(3.0):  # 15 s with difflib's ordered compare
        diff = diff_sides(Side("a", observations=before), Side("b", observations=after))
    (change,) = diff.changes
    assert (change.path, change.change) == ("docker.containers[model-gear-gateway].cmd", "changed")
    assert str(change.old).startswith("(16000 items, sha256 ")


# -- 7. box text on the terminal ------------------------------------------------------------------


def test_box_text_is_escaped_in_the_diff() -> None:
    before = thor_and_spark()
    after = copied(before)
    gateway = container(after["thor"], "gateway")
    gateway["env"]["X\nfake: line"] = "\x1b[2Jcleared"
    gateway["id"] = "\x1b]0;title\x07"
    docs = {"thor\x1b[31m": after["thor"]}
    diff = diff_sides(
        Side("a\x1b[2J", observations={"thor\x1b[31m": before["thor"]}),
        Side("b", observations=docs),
    )
    text = render_text(diff)
    assert "\x1b" not in text and "\x07" not in text
    assert not any(line.startswith("fake") for line in text.splitlines())
    assert "thor\\x1b[31m: model-gear-gateway recreated" in text


def test_a_run_id_from_a_snapshots_index_is_escaped_in_the_listing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = edited_snapshot(tmp_path, "odd", lambda docs: None)
    index = json.loads((snapshot / "index.json").read_text())
    index["run_id"] = "X\x1b[2J\nfake line"
    (snapshot / "index.json").write_text(json.dumps(index))
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, snapshot)
    code, out, _ = reconcile(capsys, "history", "--history", str(db))
    assert code == 0 and "\x1b" not in out and "X\\x1b[2J\\nfake line" in out
    assert len(out.splitlines()) == 4  # the head, the run, a blank line, the count


# -- 8. readers change nothing; a writer refuses another application's database -------------------


@pytest.fixture
def other_db(tmp_path: Path) -> Path:
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
        conn.execute("INSERT INTO users VALUES ('ann')")
    conn.close()
    db.chmod(0o644)
    return db


@pytest.mark.parametrize("command", [["history"], ["diff"], ["history", "--keep", "5"]])
def test_another_applications_database_is_refused_and_left_as_it_was(
    other_db: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    before = other_db.read_bytes()
    code, out, err = reconcile(capsys, *command, "--history", str(other_db))
    assert (code, out) == (1, "")
    assert err == (
        f"error: history: {other_db} is not a history store of this tool (its tables: users);"
        " it was left as it is: choose another path with --history\n"
    )
    assert other_db.read_bytes() == before
    assert stat.S_IMODE(other_db.stat().st_mode) == 0o644
    assert sorted(p.name for p in other_db.parent.iterdir()) == ["other.db"]


def test_a_run_is_not_recorded_into_another_applications_database(
    other_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = other_db.read_bytes()
    code, _, err = reconcile(
        capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--history", str(other_db)
    )
    assert code == 1  # said before the run (review 8), not a warning after it
    assert err.startswith(f"error: history: {other_db} is not a history store of this tool")
    assert other_db.read_bytes() == before


def test_a_reader_opens_the_store_read_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    replay(capsys, db, SNAPSHOT)
    with sqlite3.connect(db) as conn:  # a store left in another journal mode: not switched
        conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    before = db.read_bytes()
    for command in (["history"], ["diff"], ["history", "thor", "--since", "1h"]):
        code, _, err = reconcile(capsys, *command, "--history", str(db))
        assert code == 0, err
    assert db.read_bytes() == before


def test_an_empty_database_reads_as_no_runs_and_is_not_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    db.touch()
    code, out, _ = reconcile(capsys, "history", "--history", str(db))
    assert code == 0 and out.startswith("no runs recorded in")
    code, _, err = reconcile(capsys, "diff", "--history", str(db))
    assert code == 1 and "fewer than two runs" in err
    assert db.read_bytes() == b""


# -- review of 2026-12-12: every part of an observation masked in the store, as the diff does ---


def secrets_everywhere(docs: dict[str, Any]) -> None:
    """A clear secret in every part a saving run or a probe writes: the box's own renders
    (`render_current`, `render_login_current`: whole compose services), a gateway's and a
    lane's probe body, the controller's probe record, a section a newer collector adds."""
    thor = docs["thor"]["collected"]
    for render in ("render_current", "render_login_current"):
        own = json.loads(json.dumps(thor["render"]))
        gateway = own["services"]["gateway"]
        gateway["environment"]["GATEWAY_API_KEY"] = CANARY
        gateway["command"] = [*gateway.get("command", []), "--api-key", CANARY]
        gateway["entrypoint"] = ["serve", f"--hf-token={CANARY}"]
        thor[render] = own
    thor["gateway"]["capabilities"]["body"]["worker"]["api_key"] = CANARY
    lane = next(iter(thor["lanes"].values()))
    lane["body"] = {"data": [{"id": "m", "auth": {"hf_token": CANARY}}]}
    thor["newer_section"] = {"probe": {"headers": {"X_API_KEY": CANARY}}}
    docs["thor"]["controller"] = {
        "base": "http://10.0.0.1:8000",
        "models_key": {"status": 200, "headers": {"authorization": f"Bearer {CANARY}"}},
    }


def test_the_store_masks_the_own_renders_bodies_and_probe_records_as_the_diff_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from reconciler.history.masking import stored

    docs = thor_and_spark()
    secrets_everywhere(docs)
    doc = docs["thor"]
    kept = stored(doc)
    assert CANARY not in json.dumps(kept)
    assert CANARY not in json.dumps(comparable(doc))  # the diff's view agreed already
    own = kept["collected"]["render_current"]["services"]["gateway"]
    assert own["environment"]["GATEWAY_API_KEY"] == "***"
    assert own["command"][-2:] == ["--api-key", "***"]
    assert own["entrypoint"] == ["serve", "--hf-token=***"]
    assert kept["collected"]["gateway"]["capabilities"]["body"]["worker"]["api_key"] == "***"
    # digests are kept where the diff masks them only because they change every run
    assert kept["collected"]["secret_sources"] == doc["collected"]["secret_sources"]
    assert "hmac:" in json.dumps(kept["collected"]["secret_sources"])
    assert stored(thor_and_spark()["spark"]) == thor_and_spark()["spark"]  # nothing to mask
    # and through a replay: the store holds none of them
    edited = edited_snapshot(tmp_path, "own", secrets_everywhere)
    unvouched(edited)
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, edited)
    with opened(db, create=False) as conn:
        assert "render_current" in observations_of(conn, 1)["thor"]["collected"]
    assert CANARY not in store_text(db)


# -- review of 2026-12-12: SQLite's own statistics tables are no other application's -----------


def test_a_store_after_analyze_is_still_read_and_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, SNAPSHOT)
    replay(capsys, db, SNAPSHOT)
    with sqlite3.connect(db) as conn:  # what a user's `sqlite3 h.sqlite3 ANALYZE` leaves
        conn.execute("ANALYZE")
        conn.execute("PRAGMA optimize")
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert "sqlite_stat1" in tables
    for command in (["history"], ["diff"]):  # readers
        code, _, err = reconcile(capsys, *command, "--history", str(db))
        assert code == 0 and "not a history store" not in err, err
    replay(capsys, db, SNAPSHOT)  # a writer: recorded, no warning
    code, out, _ = reconcile(capsys, "history", "--history", str(db), "--format", "json")
    assert code == 0 and len(json.loads(out)["runs"]) == 3
