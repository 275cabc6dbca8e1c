"""A large report's box entries kept in a temporary file (reconciler/report/spool.py): read back
as written, in the order kept, whichever process wrote them; kept in memory when no file can be
made or written; and a large replay's own process holding none of them (issue 12: they grow
as the square of the fleet)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from reconciler.report import spool as spool_module
from reconciler.report.spool import Held, ItemSpool, TextSpool

ROOT = Path(__file__).resolve().parents[2]
# Text a report can hold: non-ASCII, a line separator, a lone surrogate (json.dumps writes it
# where a box's answer had one), a NUL.
ODD = 'é \u2028 \ud800 "q" \x00 ✓'


def test_chunks_read_back_in_the_order_kept_with_their_separator() -> None:
    spool = TextSpool(between=",\n")
    first, second = spool.put(["a", ODD]), spool.put(["b" * 70_000])
    empty = spool.put([])
    assert isinstance(first, tuple) and isinstance(second, tuple), "in the file"
    for chunk in (second, empty, first):  # kept in the report's order, not the writes'
        spool.keep(chunk)
    assert list(spool.pieces()) == ["b" * 70_000, ",\n", "a" + ODD]
    assert "".join(spool.pieces()) == "b" * 70_000 + ",\n" + "a" + ODD, "read again alike"
    spool.close()


def test_no_file_keeps_the_text_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    spool = TextSpool(between="|")
    chunk = spool.put(["x", ODD])
    assert chunk == "x" + ODD
    spool.keep(chunk)
    spool.keep(spool.put(["y"]))
    assert "".join(spool.pieces()) == f"x{ODD}|y"


def test_a_full_disk_gives_the_chunk_back_and_keeps_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spool = TextSpool(between="|")
    spool.keep(spool.put(["in the file"]))
    real = os.pwritev

    def full(*args: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spool_module.os, "pwritev", full)
    kept_in_memory = spool.put(["in memory"])
    assert kept_in_memory == "in memory"
    spool.keep(kept_in_memory)
    monkeypatch.setattr(spool_module.os, "pwritev", real)
    spool.keep(spool.put(["in the file again"]))
    assert "".join(spool.pieces()) == "in the file|in memory|in the file again"


def test_a_short_write_is_written_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # pwritev may write less than asked (a signal, a quota): the rest follows it.
    real = os.pwritev

    def one_byte_at_a_time(fd: int, buffers: list[Any], offset: int) -> int:
        return real(fd, [bytes(buffers[0][:1])], offset)

    monkeypatch.setattr(spool_module.os, "pwritev", one_byte_at_a_time)
    spool = TextSpool()
    spool.keep(spool.put(["ab", "", "cé"]))
    assert "".join(spool.pieces()) == "abcé"


def test_processes_forked_from_it_write_apart() -> None:
    """Two forked processes putting chunks at once never overlap: each chunk reads back whole."""
    script = """
import json, os, sys
from reconciler.report.spool import Held, ItemSpool, TextSpool
spool = TextSpool()
read, write = os.pipe()
children = []
for letter in "ab":
    pid = os.fork()
    if pid == 0:
        os.close(read)
        where = [spool.put([letter * (50_000 + i), "|"]) for i in range(200)]
        os.write(write, (json.dumps([letter, where]) + "\\n").encode())
        os._exit(0)
    children.append(pid)
os.close(write)
for pid in children:
    os.waitpid(pid, 0)
lines = os.fdopen(read).read().splitlines()
for letter, where in map(json.loads, lines):
    for i, chunk in enumerate(where):
        spool.keep(tuple(chunk))
        assert list(spool.pieces())[-1] == letter * (50_000 + i) + "|", (letter, i)
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


@pytest.mark.parametrize("workers", ["2", "1"])
def test_a_large_replay_holds_no_entry_of_its_own(tmp_path: Path, workers: str) -> None:
    """A replay of enough boxes for workers keeps its boxes' entries in the spool's file, not in
    its parts (each box's tally and causes only), and prints the very report the whole one
    does: in workers, and in one process too (one core, or FLEET_REPLAY_WORKERS=1), whose
    memory would otherwise grow as the square of the fleet."""
    script = f"""
import json, os, sys
sys.path.insert(0, {str(ROOT)!r})
os.environ["FLEET_REPLAY_WORKERS"] = {workers!r}
from pathlib import Path
from bench.scale_fleet import build_fleet
from reconciler.desired.load import load_fleet
from reconciler.drift import replay_parts, replays_in_parts, run_drift
from reconciler.drift_inputs import drift_inputs
from reconciler.replay_workers import WORKERS_FROM
from reconciler.report.json_parts import render_json_parts
from reconciler.report.json_report import render_json
root = Path({str(tmp_path / "fleet")!r})
build_fleet(root, WORKERS_FROM + 20)
fleet = load_fleet(root, "lab")
boxes = list(fleet.boxes)
assert replays_in_parts(len(boxes))
for keep in (False, True):
    parts = replay_parts(drift_inputs(fleet), boxes, root / "snapshot", keep)
    assert parts.spool is not None and not parts.spool.in_memory
    assert {{p.text for p in parts.parts}} == {{""}}, "no entry held here"
    assert keep == bool(parts.kept) and all(k.part.text == "" for k in parts.kept)
    # A recorded run's drift entries' rows (each holds the box's desired seeds) are spooled too.
    assert keep == (parts.rows is not None) and all(k.entries == [] for k in parts.kept)
    if keep:
        rows = list(parts.rows)
        assert rows == list(parts.rows) and {{r.box for r in rows}} >= {{"thor-1", "orin-39"}}
    counted = replay_parts(drift_inputs(fleet), boxes, root / "snapshot", keep, False)
    assert list(counted.rows or ()) == [], "--metrics alone: no entries' rows kept"
    assert [k.counted for k in counted.kept] == [k.counted for k in parts.kept]
    whole = render_json(run_drift(fleet, boxes, from_snapshot=root / "snapshot").report)
    printed = "".join(render_json_parts(parts))
    generated = lambda text: next(x for x in text.splitlines() if '"generated_at"' in x)
    assert printed.replace(generated(printed), generated(whole)) == whole
    assert "".join(render_json_parts(parts)) == printed, "printed again alike (the history)"
print("ok")
"""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def test_items_read_back_in_the_order_kept_as_often_as_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spool: ItemSpool[object] = ItemSpool()
    first, second = spool.put([("a", 1), ODD]), spool.put([{"b": [2.5, None]}])
    assert isinstance(first, tuple) and isinstance(second, tuple), "in the file"
    spool.keep(second)
    spool.keep(first)
    assert list(spool) == list(spool) == [{"b": [2.5, None]}, ("a", 1), ODD]

    def full(*args: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spool_module.os, "pwritev", full)
    held = spool.put(["kept in memory"])
    assert held == Held(["kept in memory"])
    spool.keep(held)
    assert list(spool)[-1] == "kept in memory"


def test_one_process_packs_its_boxes_in_chunks() -> None:
    """map_chunks in one process hands its results over a chunk at a time, as a worker does:
    never every box's at once."""
    from reconciler.replay_workers import SERIAL_CHUNK, map_chunks

    boxes = [f"b{i}" for i in range(SERIAL_CHUNK * 2 + 5)]
    taken: list[list[str]] = []
    map_chunks(str.upper, boxes, 1, lambda chunk: chunk, taken.append)
    assert [len(chunk) for chunk in taken] == [SERIAL_CHUNK, SERIAL_CHUNK, 5]
    assert [b for chunk in taken for b in chunk] == [b.upper() for b in boxes]
