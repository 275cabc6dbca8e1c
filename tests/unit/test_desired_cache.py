"""The validated-state cache: a hit only while every input is byte-identical, never a stale or
invalid state, and never a file it cannot trust."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.desired import cache, fingerprint, load
from reconciler.desired.cache import cached_fleet, load_fleet_cached
from reconciler.desired.fleet import Fleet
from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError
from reconciler.drift_inputs import cached_inputs, remembered_inputs
from tests.unit.conftest import hosts_inventory


def test_a_second_load_of_the_same_inputs_is_the_remembered_state(repo: Path) -> None:
    assert cached_fleet(repo, hosts_inventory(repo)) is None  # nothing remembered yet
    first = load_fleet_cached(repo, "hosts")
    hit = cached_fleet(repo, hosts_inventory(repo))
    assert hit is not None
    assert hit.boxes == first.boxes == load_fleet(repo, "hosts").boxes
    assert hit.positions == first.positions  # provenance survives: reports still name lines
    assert hit.inputs == first.inputs


def test_a_hit_does_not_read_yaml(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    load_fleet_cached(repo, "hosts")

    def no_yaml(*_args: object) -> None:
        raise AssertionError("the YAML was loaded again")

    monkeypatch.setattr("reconciler.desired.load.load_fleet", no_yaml)
    assert list(load_fleet_cached(repo, "hosts").boxes) == ["thor", "spark", "orin"]


def test_a_settled_file_with_its_recorded_stamps_is_not_read_again(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files last changed before the entry was stored are checked by their stamps alone."""
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)  # every file here counts as settled
    load_fleet_cached(repo, "hosts")

    def no_read(_path: Path) -> str:
        raise AssertionError("an input file was read again")

    monkeypatch.setattr(fingerprint, "file_digest", no_read)
    assert cached_fleet(repo, hosts_inventory(repo)) is not None


def test_a_touched_but_unchanged_file_is_hashed_and_still_the_same(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)
    load_fleet_cached(repo, "hosts")
    thor = repo / "group_vars" / "thor.yaml"
    os.utime(thor, ns=(1_000_000_000, 1_000_000_000))  # new stamps, the same bytes
    read: list[Path] = []
    digest = fingerprint.file_digest

    def counted(path: Path) -> str | None:
        read.append(path)
        return digest(path)

    monkeypatch.setattr(fingerprint, "file_digest", counted)
    assert cached_fleet(repo, hosts_inventory(repo)) is not None
    assert read == [thor]


def test_a_file_changed_just_before_it_was_stored_is_read_on_every_check(repo: Path) -> None:
    """Within the file system's clock granularity an edit of the same size can keep every
    stamp: a file that recent is recorded without stamps, so an edit right after is seen."""
    thor = repo / "group_vars" / "thor.yaml"
    thor.write_text(thor.read_text(encoding="utf-8"), "utf-8")  # changed just now
    assert fingerprint.fingerprint(repo, [thor])["stamps"] == {str(thor): None}


def test_an_edited_layer_is_loaded_again(repo: Path) -> None:
    load_fleet_cached(repo, "hosts")
    thor = repo / "group_vars" / "thor.yaml"
    text = thor.read_text(encoding="utf-8")
    thor.write_text(text.replace("WORKER_MAX_NUM_SEQS: 1", "WORKER_MAX_NUM_SEQS: 2"), "utf-8")
    assert cached_fleet(repo, hosts_inventory(repo)) is None
    fleet = load_fleet_cached(repo, "hosts")
    assert fleet.boxes["thor"].lanes["worker"].env["WORKER_MAX_NUM_SEQS"] == 2
    assert cached_fleet(repo, hosts_inventory(repo)) is not None  # the new state is remembered


def _load_then(repo: Path, monkeypatch: pytest.MonkeyPatch, change: Callable[[], None]) -> Fleet:
    """A cold `load_fleet_cached` during which `change` lands: after the loader read the
    files, before the state is stored."""
    real = load.load_fleet

    def load_then_change(*args: Any, **kwargs: Any) -> Fleet:
        fleet = real(*args, **kwargs)
        change()
        return fleet

    monkeypatch.setattr(load, "load_fleet", load_then_change)
    try:
        return load_fleet_cached(repo, "hosts")
    finally:
        monkeypatch.setattr(load, "load_fleet", real)


def _max_num_seqs(fleet: Fleet) -> object:
    return fleet.boxes["thor"].lanes["worker"].env["WORKER_MAX_NUM_SEQS"]


def test_an_edit_made_while_loading_is_not_remembered_as_the_state_loaded(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry is fingerprinted by the bytes the loader parsed, not by the file read again
    after the load: an edit landing in between misses on the next run instead of bringing
    back the state of the text before it, run after run."""
    thor = repo / "group_vars" / "thor.yaml"
    text = thor.read_text(encoding="utf-8")
    edited = text.replace("WORKER_MAX_NUM_SEQS: 1", "WORKER_MAX_NUM_SEQS: 2")
    assert _max_num_seqs(_load_then(repo, monkeypatch, lambda: thor.write_text(edited))) == 1
    assert cached_fleet(repo, hosts_inventory(repo)) is None
    assert _max_num_seqs(load_fleet_cached(repo, "hosts")) == 2


def test_a_layer_added_while_loading_misses_on_the_next_run(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The layer listing is the one taken before any layer was read."""
    extra = repo / "group_vars" / "nosuchgroup.yaml"
    _load_then(repo, monkeypatch, lambda: extra.write_text("lobes: {}\n", encoding="utf-8"))
    assert cached_fleet(repo, hosts_inventory(repo)) is None
    with pytest.raises(DesiredStateError, match="nosuchgroup"):
        load_fleet_cached(repo, "hosts")


def test_storing_a_loaded_state_reads_no_input_again(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loader already hashed what it parsed (2,006 files read twice at 1,000 boxes)."""

    def no_read(_path: Path) -> str:
        raise AssertionError("an input file was read again")

    digest = fingerprint.file_digest
    monkeypatch.setattr(fingerprint, "file_digest", no_read)
    fleet = load_fleet_cached(repo, "hosts")
    remembered_inputs(fleet, hosts_inventory(repo))
    monkeypatch.setattr(fingerprint, "file_digest", digest)
    assert cached_fleet(repo, hosts_inventory(repo)) is not None
    assert cached_inputs(repo, hosts_inventory(repo)) is not None


def test_drift_inputs_are_remembered_against_the_bytes_their_state_came_from(
    repo: Path,
) -> None:
    fleet = load_fleet(repo, "hosts")
    thor = repo / "group_vars" / "thor.yaml"
    thor.write_text(thor.read_text(encoding="utf-8").replace("SEQS: 1", "SEQS: 2"), "utf-8")
    remembered_inputs(fleet, hosts_inventory(repo))  # derived from the state before the edit
    assert cached_inputs(repo, hosts_inventory(repo)) is None


def test_a_new_layer_file_misses_even_if_no_recorded_file_changed(repo: Path) -> None:
    load_fleet_cached(repo, "hosts")
    (repo / "group_vars" / "nosuchgroup.yaml").write_text("lobes: {}\n", encoding="utf-8")
    assert cached_fleet(repo, hosts_inventory(repo)) is None
    with pytest.raises(DesiredStateError, match="nosuchgroup"):
        load_fleet_cached(repo, "hosts")


def test_an_invalid_state_is_never_remembered(repo: Path) -> None:
    all_yaml = repo / "group_vars" / "all.yaml"
    all_yaml.write_text(all_yaml.read_text(encoding="utf-8") + "\nbogus_key: 1\n", "utf-8")
    for _ in range(2):  # the second run reports from the files again
        with pytest.raises(DesiredStateError, match="bogus_key"):
            load_fleet_cached(repo, "hosts")
    assert cached_fleet(repo, hosts_inventory(repo)) is None


def test_each_inventory_has_its_own_entry(repo: Path) -> None:
    hosts = load_fleet_cached(repo, "hosts")
    assert cached_fleet(repo, repo / "inventory" / "lab.yaml") is None
    assert cached_fleet(repo, hosts_inventory(repo)) is not None
    assert hosts.inventory_file == "inventory/hosts.yaml"


def test_another_version_of_the_loader_misses(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    load_fleet_cached(repo, "hosts")
    monkeypatch.setattr(cache, "CACHE_VERSION", cache.CACHE_VERSION + 1)
    assert cached_fleet(repo, hosts_inventory(repo)) is None


def test_a_damaged_or_foreign_cache_file_is_a_miss(repo: Path) -> None:
    load_fleet_cached(repo, "hosts")
    [entry] = (Path(os.environ["XDG_CACHE_HOME"]) / "fleet-reconciler").glob("fleet-*.pickle")
    assert entry.stat().st_mode & 0o777 == 0o600
    entry.chmod(0o600)
    data = entry.read_bytes()
    entry.write_bytes(data[: len(data) // 2])
    assert cached_fleet(repo, hosts_inventory(repo)) is None
    assert list(load_fleet_cached(repo, "hosts").boxes) == ["thor", "spark", "orin"]  # rewritten
    assert cached_fleet(repo, hosts_inventory(repo)) is not None
    if os.getuid() == 0:  # only root can give the file away
        os.chown(entry, 65534, 65534)
        assert cached_fleet(repo, hosts_inventory(repo)) is None


def test_each_kind_keeps_only_its_newest_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler.desired.fingerprint import cache_dir, entry_name, write_private

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    paths = []
    for index in range(5):
        path = entry_name("fleet", tmp_path / f"checkout{index}", tmp_path / "hosts.yaml")
        write_private(path.with_suffix(".pickle"), b"x", keep=3)
        os.utime(path.with_suffix(".pickle"), (index, index))  # a clear age order
        paths.append(path.with_suffix(".pickle"))
    other = entry_name("drift-inputs", tmp_path, tmp_path / "hosts.yaml").with_suffix(".pickle")
    write_private(other, b"y", keep=3)
    left = sorted(p.name for p in cache_dir().iterdir())
    assert left == sorted([*(p.name for p in paths[-3:]), other.name])  # the other kind stays


@pytest.fixture
def storing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    from reconciler.desired import fingerprint

    monkeypatch.setattr(fingerprint, "_behind", None)
    fingerprint.store_behind()


@pytest.mark.usefixtures("storing_behind")
def test_a_store_behind_is_written_by_a_child_and_there_once_waited_for(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay asks for it (cli.py): the entry is pickled and written by a forked child while
    the run goes on, and is there, whole, once the run has waited for it."""
    from reconciler.desired import fingerprint

    # As in a replay, where no other thread runs (an earlier test's may still be ending here).
    monkeypatch.setattr(fingerprint, "_alone", lambda: True)

    fleet = load_fleet_cached(repo, "hosts")
    assert fingerprint._behind is not None and len(fingerprint._behind) == 1  # a child's pid
    child = fingerprint._behind[0]
    fingerprint.stored()
    assert fingerprint._behind is None  # waited for, and in place again from now on
    with pytest.raises(ChildProcessError):  # waited for: nothing left of it
        os.waitpid(child, os.WNOHANG)
    hit = cached_fleet(repo, hosts_inventory(repo))
    assert hit is not None and hit.boxes == fleet.boxes


@pytest.mark.usefixtures("storing_behind")
def test_with_another_thread_running_the_store_is_made_in_place(repo: Path) -> None:
    import threading

    from reconciler.desired import fingerprint

    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        load_fleet_cached(repo, "hosts")
        assert fingerprint._behind == []  # no fork beside a running thread
        assert cached_fleet(repo, hosts_inventory(repo)) is not None  # already written
    finally:
        release.set()
        other.join()


def test_a_replay_run_in_process_leaves_nothing_stored_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`main` of a cold replay stores its caches behind its back, then waits for them: when it
    returns they are written, and the next caller in this process stores in place again."""
    from reconciler.cli import main
    from reconciler.desired import fingerprint
    from reconciler.drift_inputs import cached_inputs

    incidents = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(fingerprint, "_alone", lambda: True)  # as the program runs it
    argv = ["--root", str(incidents), "-i", "lab", "drift", "--from-snapshot"]
    assert main([*argv, str(incidents / "snapshot"), "--format", "json"]) == 2
    capsys.readouterr()
    assert fingerprint._behind is None
    assert cached_inputs(incidents, incidents / "inventory" / "lab.yaml") is not None


def test_a_drift_keeps_its_inputs_and_leaves_the_validated_state_to_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A drift reads back its inputs, never the validated state (when its inputs are still
    valid, the state they came from is too): it pickles only what it reads. `audit`, which
    reads the state back, remembers it on its own first run, and a later drift takes it."""
    from reconciler.cli import main

    incidents = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"
    inventory = incidents / "inventory" / "lab.yaml"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    offline = ["--from-snapshot", str(incidents / "snapshot"), "--format", "json", "--no-history"]
    replay = ["--root", str(incidents), "-i", "lab", "drift", *offline]
    assert main(replay) == 2
    assert cached_inputs(incidents, inventory) is not None
    assert cached_fleet(incidents, inventory) is None
    # Exit 1 here: this snapshot's boxes could not be audited (their postures are unknown).
    main(["--root", str(incidents), "-i", "lab", "audit", *offline])
    capsys.readouterr()
    assert cached_fleet(incidents, inventory) is not None

    def no_yaml(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the YAML was loaded again")

    fingerprint.forget("drift-inputs", incidents, inventory)  # the drift's own entry gone
    monkeypatch.setattr("reconciler.desired.load.load_fleet", no_yaml)
    assert main(replay) == 2  # the state audit kept
    assert cached_inputs(incidents, inventory) is not None
