"""The box-side converge lock (reconciler/apply/remote/converge.py), on a temp deployment: a
second converge is refused naming the holder and since when; a killed holder's lock is free."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.conftest import load_box_program

ROOT = Path(__file__).resolve().parents[2]
converge = load_box_program("box_converge_lock", "reconciler/apply/remote/converge.py")


@pytest.fixture
def box(tmp_path: Path):
    (tmp_path / ".lobes").mkdir()
    return converge.Box({"directory": str(tmp_path / ".lobes"), "project": "lobes"})


def test_a_second_holder_is_refused_with_who_and_since(box):
    first = converge.Lock(box)
    first.acquire("alice@ctl pid 1 (reconcile apply)")
    since = json.loads(Path(first.path).read_text())["since"]
    with pytest.raises(converge.Failed) as refused:
        converge.Lock(box).acquire("bob@ctl pid 2 (pyinfra)")
    message = str(refused.value)
    assert "locked: another converge of this box is running" in message
    assert "alice@ctl pid 1 (reconcile apply)" in message and since in message
    first.release()
    assert converge.Lock(box).acquire("bob@ctl pid 2 (pyinfra)") == {}


def test_the_lock_lives_in_a_private_fleet_directory(box):
    converge.Lock(box).acquire("me")
    fleet = Path(box.fleet)
    assert fleet.stat().st_mode & 0o777 == 0o700
    assert (fleet / "lock").stat().st_mode & 0o777 == 0o600


def test_a_lock_left_by_a_killed_converge_is_taken_over(box):
    converge.private_dir(box.fleet)
    stale = {"holder": "carol@ctl pid 9 (pyinfra)", "pid": 4242, "host": "thor", "since": "t0"}
    Path(box.fleet, "lock").write_text(json.dumps(stale))  # content, but no flock held
    assert converge.Lock(box).acquire("me") == stale
