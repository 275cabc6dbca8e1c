"""The history options' edges (review 8, docs against behaviour):
- `history --format json` on a store not made yet printed a line of text: a script reading
  the JSON on a fresh machine failed;
- `--history PATH` naming another application's database, or a file that is no database, was
  found only after every box was observed: a warning and exit 2, which a timer counts as a
  success, so it never recorded. docs/history-and-metrics.md says exit 1, the file untouched;
- `--history PATH --no-history` were both taken, and the store named silently not written."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.unit.history_helpers import SNAPSHOT, reconcile


def test_history_as_json_without_a_store_is_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "never" / "h.sqlite3"
    code, out, err = reconcile(capsys, "history", "--format", "json", "--history", str(missing))
    assert code == 0
    assert json.loads(out) == {"store": str(missing), "runs": []}
    assert "no store there yet" in err
    assert not missing.parent.exists()  # nothing made by a reader
    code, out, _ = reconcile(capsys, "history", "--history", str(missing))
    assert (code, out) == (0, f"no runs recorded in {missing} (no store there yet)\n")


def _foreign(path: Path) -> bytes:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('kept')")
    conn.commit()
    conn.close()
    return path.read_bytes()


@pytest.mark.parametrize("kind", ["another application's", "no database"])
def test_a_store_that_would_refuse_the_record_is_said_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    store = tmp_path / "store.db"
    if kind == "no database":
        store.write_bytes(b"a text file, not SQLite\n" * 10)
        before = store.read_bytes()
    else:
        before = _foreign(store)
    report = tmp_path / "report.txt"
    code, out, err = reconcile(
        capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--history", str(store),
        "-o", str(report),
    )  # fmt: skip
    assert (code, out) == (1, "")
    assert err.startswith(f"error: history: {store} is not a ")
    assert not report.exists()  # refused before the replay
    assert store.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store.db"]


def test_history_and_no_history_together_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "h.sqlite3"
    with pytest.raises(SystemExit) as ended:
        reconcile(
            capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--history", str(store),
            "--no-history",
        )  # fmt: skip
    assert ended.value.code == 1  # a usage error (README: exit 1)
    assert "not allowed with argument --history" in capsys.readouterr().err
    assert not store.exists()


def test_a_store_behind_a_directory_the_user_cannot_look_into_is_a_clear_error(
    tmp_path: Path,
) -> None:
    """`--history /root/x/h.sqlite3` run as another user ended in a PermissionError traceback
    (review 8). Root looks anywhere, so the check runs without CAP_DAC_OVERRIDE (setpriv)."""
    import os
    import subprocess
    import sys

    shut = tmp_path / "shut"
    shut.mkdir()
    shut.chmod(0o700)
    if os.geteuid() == 0:
        os.chown(shut, 65534, 65534)
    drop = (
        ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
         "--inh-caps=-dac_override,-dac_read_search"]
        if os.geteuid() == 0
        else []
    )  # fmt: skip
    target = shut / "sub" / "h.sqlite3"
    code = (
        "from reconciler.history.location import HistoryLocationError, history_path\n"
        "try:\n"
        f"    history_path({str(target)!r}, None)\n"
        "except HistoryLocationError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [*drop, sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"history: {target} cannot be used: Permission denied\n"
