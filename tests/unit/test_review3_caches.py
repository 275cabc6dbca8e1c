"""Review 3, the controller's caches: what decides a remembered state (the whole package's code
and the parsing libraries, the inventory's name as given), a damaged part of a remembered
entry, what an interrupted store, replay or snapshot save leaves behind, and the snapshot
mask key made by two runs at once or by one that was stopped."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.desired import fingerprint
from reconciler.desired.cache import cached_fleet, load_fleet_cached
from reconciler.desired.fingerprint import cache_dir, entry_name, remember, write_private
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import KIND, cached_inputs, remembered_inputs
from tests.unit.conftest import hosts_inventory

ROOT = Path(__file__).resolve().parents[2]
INCIDENTS = ROOT / "examples" / "lab-incidents"


def _run(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


# -- defect 4: a code change outside reconciler/desired/ that would refuse the state -----------


def test_an_upgrade_that_refuses_the_state_is_not_served_the_state_it_accepted(
    repo: Path, tmp_path: Path
) -> None:
    """The state pins COMPOSE_PARALLEL_LIMIT (a tuning knob, accepted). A newer release counts
    it among the variables that move compose off the deployment (compare/shell.py, which the
    loader's checks import): the next run must refuse the state, as `validate` does, not take
    the validated state remembered by the release before."""
    code = tmp_path / "code"
    shutil.copytree(ROOT / "reconciler", code / "reconciler", symlinks=True)
    thor = repo / "group_vars" / "thor.yaml"
    thor.write_text(thor.read_text().replace("\nenv:\n", '\nenv:\n  COMPOSE_PARALLEL_LIMIT: "4"\n'))
    load = (
        "import reconciler\n"
        f"assert reconciler.__file__.startswith({str(code)!r}), reconciler.__file__\n"
        "from pathlib import Path\n"
        "from reconciler.desired.cache import load_fleet_cached\n"
        "from reconciler.desired.problems import DesiredStateError\n"
        "try:\n"
        f"    load_fleet_cached(Path({str(repo)!r}), 'hosts')\n"
        "except DesiredStateError as exc:\n"
        "    print('refused:', exc.problems[0])\n"
        "else:\n"
        "    print('loaded')\n"
    )
    cache = str(tmp_path / "cache")
    first = _run(load, code, XDG_CACHE_HOME=cache)
    assert first.stdout.strip() == "loaded", first.stderr
    shell = code / "reconciler" / "compare" / "shell.py"
    text = shell.read_text()
    assert '    "COMPOSE_IGNORE_ORPHANS",\n' in text
    upgraded = text.replace(
        '    "COMPOSE_IGNORE_ORPHANS",\n',
        '    "COMPOSE_IGNORE_ORPHANS",\n    "COMPOSE_PARALLEL_LIMIT",\n',
    )
    shell.write_text(upgraded)
    second = _run(load, code, XDG_CACHE_HOME=cache)
    assert second.stdout.startswith("refused:"), second.stdout + second.stderr
    assert "COMPOSE_PARALLEL_LIMIT" in second.stdout


def test_another_install_of_the_yaml_parser_misses_both_caches(tmp_path: Path) -> None:
    """ruamel.yaml (and its C parser) read every file: another version may read a file
    otherwise, or refuse it. A reinstall writes its files anew; both caches' code versions
    change, without importing it (a repeated drift checks its entry before any YAML import)."""
    site = tmp_path / "site"
    (site / "ruamel" / "yaml").mkdir(parents=True)
    init = site / "ruamel" / "yaml" / "__init__.py"
    init.write_text("version_info = (0, 18, 1)\n")
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(site)!r})\n"
        "import os\n"
        "from reconciler.desired import cache\n"
        "from reconciler import drift_inputs\n"
        "before = cache._code_version(), drift_inputs._code()\n"
        f"init = {str(init)!r}\n"
        "with open(init + '.new', 'w') as out:\n"
        "    out.write('version_info = (0, 18, 2)\\n')\n"
        "os.replace(init + '.new', init)\n"
        "after = cache._code_version(), drift_inputs._code()\n"
        "print(before[0] != after[0], before[1] != after[1], 'ruamel.yaml' in sys.modules)\n"
    )
    done = _run(code, ROOT, XDG_CACHE_HOME=str(tmp_path / "cache"))
    assert done.stdout.split() == ["True", "True", "False"], done.stderr


# -- defect 5: two names of one inventory file ---------------------------------------------------


def test_each_name_of_an_inventory_file_is_reported_as_it_was_given(repo: Path) -> None:
    (repo / "inventory" / "current.yaml").symlink_to("hosts.yaml")
    current = repo / "inventory" / "current.yaml"
    assert load_fleet_cached(repo, "current").inventory_file == "inventory/current.yaml"
    assert load_fleet_cached(repo, "hosts").inventory_file == "inventory/hosts.yaml"
    hit = cached_fleet(repo, hosts_inventory(repo))
    assert hit is not None and hit.inventory_file == "inventory/hosts.yaml"
    remembered_inputs(load_fleet(repo, "current"), current)
    assert cached_inputs(repo, hosts_inventory(repo)) is None  # not current.yaml's entry
    remembered_inputs(load_fleet(repo, "hosts"), hosts_inventory(repo))
    for path, shown in ((current, "current"), (hosts_inventory(repo), "hosts")):
        inputs = cached_inputs(repo, path)
        assert inputs is not None and inputs.inventory_file == f"inventory/{shown}.yaml"


# -- defect 7: a damaged part of the remembered drift inputs -------------------------------------


def _entry(repo: Path) -> Path:
    return entry_name(KIND, repo, hosts_inventory(repo)).with_suffix(".pickle")


def _damage(path: Path, change: Any) -> None:
    data = path.read_bytes()
    stamp = path.stat()
    path.write_bytes(change(data))
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # as the reviewer's repro


def test_a_zeroed_tail_of_the_entry_gives_the_right_inputs_and_is_stored_anew(
    repo: Path,
) -> None:
    stored = remembered_inputs(load_fleet(repo, "hosts"), hosts_inventory(repo))
    cut = int(len(_entry(repo).read_bytes()) * 0.6)
    _damage(_entry(repo), lambda data: data[:cut] + bytes(len(data) - cut))
    again = cached_inputs(repo, hosts_inventory(repo))
    assert again is not None  # the part read as it opens is whole: the boxes' are read later
    for box in stored.boxes:
        assert again.payload(box, "k" * 32) == stored.payload(box, "k" * 32)
        assert again.expectations[box] == stored.expectations[box]
    assert not _entry(repo).exists()  # dropped: the next run loads and stores it again
    assert cached_inputs(repo, hosts_inventory(repo)) is None


def test_a_part_damaged_into_another_valid_pickle_is_not_taken_for_the_box(repo: Path) -> None:
    """Damage that still unpickles (a letter changed in a string) gives another value, which
    only the part's checksum tells from the stored one."""
    stored = remembered_inputs(load_fleet(repo, "hosts"), hosts_inventory(repo))
    part = pickle.dumps(stored.expectations["spark"], pickle.HIGHEST_PROTOCOL)
    data = _entry(repo).read_bytes()
    at = data.find(part)
    assert at > 0 and b"spark.lan" in part
    inside = at + part.index(b"spark.lan")
    _damage(_entry(repo), lambda data: data[:inside] + b"spbrk" + data[inside + 5 :])
    again = cached_inputs(repo, hosts_inventory(repo))
    assert again is not None
    assert again.expectations["spark"] == stored.expectations["spark"]


def test_a_remembered_pickle_damaged_into_another_valid_one_is_a_miss(repo: Path) -> None:
    remembered_inputs(load_fleet(repo, "hosts"), hosts_inventory(repo))
    shown = b"\x8c\x14inventory/hosts.yaml"  # the state's inventory_file, in the entry's pickle
    assert _entry(repo).read_bytes().count(shown) == 1
    _damage(_entry(repo), lambda data: data.replace(shown, shown[:-1] + b"k"))
    assert cached_inputs(repo, hosts_inventory(repo)) is None


def test_a_replay_over_a_damaged_entry_reports_as_an_undamaged_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reviewer's repro: the last 40% of the drift inputs' file zeroed (size and mtime
    kept) made every later replay end in a traceback (UnpicklingError), until an input changed."""
    from reconciler.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    inventory = INCIDENTS / "inventory" / "lab.yaml"
    argv = ["--root", str(INCIDENTS), "-i", "lab", "drift", "--from-snapshot"]
    argv += [str(INCIDENTS / "snapshot"), "--format", "json", "--no-history"]

    def replay() -> dict[str, Any]:
        assert main(argv) == 2
        report = json.loads(capsys.readouterr().out)
        report.pop("generated_at")
        return dict(report)

    first = replay()
    path = entry_name(KIND, INCIDENTS, inventory).with_suffix(".pickle")
    assert cached_inputs(INCIDENTS, inventory) is not None
    cut = int(path.stat().st_size * 0.6)
    _damage(path, lambda data: data[:cut] + bytes(len(data) - cut))
    assert replay() == first
    assert replay() == first  # stored anew by the run after the damaged one
    assert cached_inputs(INCIDENTS, inventory) is not None


# -- defect 8: an interrupted store --------------------------------------------------------------


def _temporaries() -> list[str]:
    return sorted(p.name for p in cache_dir().glob(".*.tmp"))


def test_an_interrupted_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def interrupted() -> Iterator[bytes]:
        yield b"x" * 65536
        raise KeyboardInterrupt

    path = entry_name("fleet", tmp_path, tmp_path / "hosts.yaml").with_suffix(".pickle")
    with pytest.raises(KeyboardInterrupt):
        write_private(path, interrupted())  # type: ignore[arg-type]  # (an iterable is written)
    assert _temporaries() == [] and not path.exists()


@pytest.fixture
def storing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fingerprint, "_behind", None)
    monkeypatch.setattr(fingerprint, "_alone", lambda: True)  # as the program runs it
    fingerprint.store_behind()


@pytest.mark.usefixtures("storing_behind")
def test_ctrl_c_while_a_child_stores_leaves_no_temporary_file(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C reaches the whole process group, the child storing an entry behind the run's
    back too: its half-written file (31 MB at 1,000 boxes) was left, never removed."""
    packed = fingerprint._packed

    class Slow:  # the entry's buffers, the second one long in coming
        def __init__(self, entry: Any) -> None:
            self.buffers = packed(entry)

        def __iter__(self) -> Iterator[Any]:
            yield self.buffers[0]
            time.sleep(60)
            yield from self.buffers[1:]

    monkeypatch.setattr(fingerprint, "_packed", Slow)
    remember("fleet", repo, hosts_inventory(repo), "code", [], {"value": 1})
    assert fingerprint._behind is not None
    [child] = fingerprint._behind
    deadline = time.monotonic() + 30
    while not _temporaries() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _temporaries(), "the child never began writing"
    os.kill(child, signal.SIGINT)
    fingerprint.stored()
    assert _temporaries() == []
    assert list(cache_dir().glob("fleet-*.pickle")) == []


def test_a_killed_writers_temporary_file_is_removed_by_the_next_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    dead = subprocess.Popen(["true"])
    dead.wait()  # a process id no process has now
    first = entry_name("fleet", tmp_path / "a", tmp_path / "hosts.yaml").with_suffix(".pickle")
    write_private(first, b"a")
    left = first.with_name(f".{first.name}.{dead.pid}.tmp")
    running = first.with_name(f".{first.name}.{os.getppid()}.tmp")  # a live writer's
    other = first.with_name(f".drift-inputs-{first.name[6:]}.{dead.pid}.tmp")  # another kind's
    for path in (left, running, other):
        path.write_bytes(b"half")
    second = entry_name("fleet", tmp_path / "b", tmp_path / "hosts.yaml").with_suffix(".pickle")
    write_private(second, b"b")
    assert _temporaries() == sorted([running.name, other.name])
    assert first.read_bytes() == b"a" and second.read_bytes() == b"b"


# -- defect 9: Ctrl-C during a replay with workers -----------------------------------------------


def test_ctrl_c_during_a_replay_with_workers_prints_no_traceback(tmp_path: Path) -> None:
    """One worker is comparing the first chunk, the other has done every other chunk and waits
    for more: Ctrl-C made the idle one die with a traceback of its own, the pool break and its
    manager thread raise InvalidStateError on the cancelled chunks. Now the chunks not started
    are cancelled and the one running is let finish (a real chunk: a fraction of a second)."""
    interrupted_replay(tmp_path)


def interrupted_replay(tmp_path: Path, handled: bool = False) -> None:
    """A replay's workers (map_boxes over 160 boxes, 2 workers) sent Ctrl-C while one compares
    the first chunk: the replay ends with 130, and nothing prints a traceback. `handled`: the
    replay runs under the command's SIGINT handler (interrupts.handled), as cli.main runs it."""
    started = tmp_path / "started"
    replay = "map_boxes(job, [f'box-{i}' for i in range(160)], 2)\n"
    code = (
        "import os, sys, time\n"
        "from reconciler import interrupts\n"
        "from reconciler.replay_workers import map_boxes\n"
        "def job(name):\n"
        "    if name == 'box-0':\n"
        f"        open({str(started)!r}, 'a').close()\n"
        "        time.sleep(3)\n"
        "    return name\n"
        "try:\n"
        + ("    with interrupts.handled():\n        " + replay if handled else "    " + replay)
        + "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
        "    sys.exit(130)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own, as a terminal's: Ctrl-C reaches them all
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert started.exists(), "no worker started"
        time.sleep(1)  # the other worker through the other chunks, waiting for more
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert (process.returncode, out.strip()) == (130, "interrupted"), err
    assert "Traceback" not in err and "Error" not in err, err


# -- the snapshot mask key (the reviewer's suspicion, confirmed) ---------------------------------


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    from reconciler.observe.snapshot_key import key_path

    return key_path()


class _Writer:
    """The key file's writer, its write failing (a full disk) or run while another run reads
    the key (`during`)."""

    def __init__(self, real: Any, during: Any) -> None:
        self.real, self.during = real, during

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.real.close()

    def write(self, data: bytes) -> int:
        self.during()
        return int(self.real.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@contextlib.contextmanager
def _writing(during: Any) -> Iterator[None]:
    """os.fdopen giving `_Writer`s, inside the `with`."""
    real_fdopen = os.fdopen
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fdopen", lambda fd, *a, **k: _Writer(real_fdopen(fd, *a, **k), during))
        yield


def test_a_run_reading_the_key_while_another_makes_it_finds_none_or_all_of_it(
    state_home: Path,
) -> None:
    from reconciler.observe.snapshot_key import KEY_BYTES, load_key

    seen: list[Any] = []

    def another_run_reads() -> None:
        try:
            seen.append(load_key(create=False))
        except ValueError as exc:
            seen.append(exc)

    with _writing(another_run_reads):
        key = load_key(create=True)
    assert key is not None and len(key) == KEY_BYTES
    assert seen == [None]  # no key yet (never an empty file, refused as no key)
    assert load_key(create=False) == key


def test_a_save_stopped_while_making_the_key_leaves_no_key_file_that_refuses_every_save(
    state_home: Path,
) -> None:
    from reconciler.observe.snapshot_key import KEY_BYTES, load_key

    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    with _writing(full_disk), pytest.raises(OSError):
        load_key(create=True)
    assert not state_home.exists()
    assert [p.name for p in state_home.parent.iterdir()] == []  # nor its temporary file
    key = load_key(create=True)
    assert key is not None and len(key) == KEY_BYTES


def test_an_empty_key_file_an_earlier_release_left_is_replaced_by_a_save(
    state_home: Path,
) -> None:
    from reconciler.observe.snapshot_key import KEY_BYTES, SnapshotKeyError, load_key

    state_home.parent.mkdir(mode=0o700, parents=True)
    state_home.touch(mode=0o600)
    with pytest.raises(SnapshotKeyError):  # a replay: nothing of it is vouched for
        load_key(create=False)
    key = load_key(create=True)
    assert key is not None and len(key) == KEY_BYTES
    assert state_home.read_bytes() == key and state_home.stat().st_mode & 0o777 == 0o600


# -- a save stopped by SIGTERM (the reviewer's second suspicion, confirmed) -----------------------


def test_a_save_stopped_by_sigterm_leaves_the_previous_snapshot_and_no_copy(
    tmp_path: Path,
) -> None:
    target = tmp_path / "snap"
    writing = tmp_path / "writing"
    code = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from reconciler.observe import observe\n"
        "from reconciler.observe.observe import load_snapshot, save_snapshot\n"
        f"_, boxes = load_snapshot(Path({str(INCIDENTS / 'snapshot')!r}))\n"
        f"target = Path({str(target)!r})\n"
        "save_snapshot(target, boxes, {'run_id': 'first'})\n"
        "plain = observe._box_file\n"
        "def slow(name, obs):\n"
        f"    open({str(writing)!r}, 'a').close()\n"
        "    time.sleep(60)\n"
        "    return plain(name, obs)\n"
        "observe._box_file = slow\n"
        "save_snapshot(target, boxes, {'run_id': 'second'})\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not writing.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writing.exists(), "the second save never began"
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGTERM, err  # ended by the signal, as before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap", "writing"]
    index = json.loads((target / "index.json").read_text())
    assert index["run_id"] == "first" and sorted(index["boxes"]) == ["orin", "spark", "thor"]
