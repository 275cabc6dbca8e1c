"""Issue 10, class 7, on the controller: the remembered-state caches are pickles, and
unpickling runs code. An entry is read only when it is a regular file of this user with no
group/other permission, in a directory only this user can write; it is written 0600, never
through a name someone else planted. (As root, "another owner" is os.chown to nobody.)"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from reconciler.desired.fingerprint import cache_dir, entry_name, remember, remembered
from tests.unit.conftest import hosts_inventory

NOBODY = 65534
KIND = "ownership-test"


def _stored(repo: Path) -> Path:
    inventory = hosts_inventory(repo)
    remember(KIND, repo, inventory, "code-1", [inventory], {"answer": 42})
    return entry_name(KIND, repo, inventory).with_suffix(".pickle")


def _lookup(repo: Path) -> object:
    return remembered(KIND, repo, hosts_inventory(repo), "code-1")


def test_an_entry_is_written_0600_in_a_0700_directory(repo: Path) -> None:
    old = os.umask(0)
    try:
        path = _stored(repo)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o600
    assert cache_dir().stat().st_mode & 0o777 == 0o700
    assert _lookup(repo) == {"answer": 42}  # the control: a private entry is read back


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda p: os.chown(p, NOBODY, NOBODY), id="file-of-another-owner"),
        pytest.param(lambda p: p.chmod(0o644), id="file-readable-by-others"),
        pytest.param(lambda p: p.chmod(0o620), id="file-group-writable"),
        pytest.param(lambda p: p.parent.chmod(0o777), id="directory-world-writable"),
        pytest.param(lambda p: os.chown(p.parent, NOBODY, NOBODY), id="directory-of-another"),
    ],
)
def test_an_entry_others_could_have_written_is_never_unpickled(
    repo: Path, monkeypatch: pytest.MonkeyPatch, spoil: object
) -> None:
    path = _stored(repo)
    spoil(path)  # type: ignore[operator]
    loads: list[bytes] = []
    monkeypatch.setattr(pickle, "loads", lambda data: loads.append(data))
    assert _lookup(repo) is None
    assert loads == []


def test_a_symlinked_entry_is_not_followed(repo: Path, tmp_path: Path) -> None:
    path = _stored(repo)
    elsewhere = tmp_path / "elsewhere.pickle"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)
    assert _lookup(repo) is None


def test_a_planted_temporary_name_is_not_written_through(repo: Path, tmp_path: Path) -> None:
    path = _stored(repo)
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    planted = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    planted.symlink_to(victim)
    _stored(repo)
    assert victim.read_text() == "untouched"
    assert _lookup(repo) == {"answer": 42}


def test_a_cache_directory_others_can_write_is_not_written(repo: Path) -> None:
    cache_dir().mkdir(parents=True, mode=0o700)
    cache_dir().chmod(0o777)
    _stored(repo)
    assert list(cache_dir().iterdir()) == []


def test_our_cache_directory_others_may_only_read_is_made_private_and_used(repo: Path) -> None:
    """0755 is what os.makedirs gives a parent directory (the collector's compose cache, run
    as this user, used to leave the controller's cache so): every run then found it not
    private and remembered nothing. Ours and closed to writers, it is made 0700."""
    cache_dir().mkdir(parents=True, mode=0o700)
    cache_dir().chmod(0o755)
    _stored(repo)
    assert cache_dir().stat().st_mode & 0o777 == 0o700
    assert _lookup(repo) == {"answer": 42}


def test_the_collectors_cache_leaves_the_directories_above_it_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler.observe.remote import collector

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    old = os.umask(0o022)
    try:
        made = collector._cache_dir()
    finally:
        os.umask(old)
    assert made == str(tmp_path / "home" / ".cache" / "fleet-reconciler" / "compose")
    for level in (".cache", ".cache/fleet-reconciler", ".cache/fleet-reconciler/compose"):
        assert (tmp_path / "home" / level).stat().st_mode & 0o777 == 0o700, level
