"""The remote command line that runs a box program: isolated Python, the program's compiled
code cached only where it is private, and never a stale or damaged cache entry."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.observe.transport import python_command

TAG = sys.implementation.cache_tag


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "echoer.py"
    flags = "sys.flags.isolated, sys.flags.no_site"
    path.write_text(f"import sys\nprint('argument', sys.argv[1], 'flags', {flags})\n", "utf-8")
    return path


def _run(command: str, home: Path, tmp: Path, **extra: str) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(tmp), **extra}
    # python3 on PATH is what a box runs; here it is this interpreter's directory first.
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    result = subprocess.run(
        ["bash", "-c", command], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_program_runs_isolated_with_its_argument(program: Path, tmp_path: Path) -> None:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(), tmp.mkdir()
    out = _run(python_command(program, "it's $HOME"), home, tmp, PYTHONPATH="/nonexistent")
    assert out == "argument it's $HOME flags 1 1\n"  # quoting survives; -I and -S are on


def test_compiled_code_is_cached_privately_and_recompiled_when_stale(
    program: Path, tmp_path: Path
) -> None:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(), tmp.mkdir()
    _run(python_command(program, "one"), home, tmp)
    cache = home / ".cache" / "fleet-reconciler"
    entry = cache / f"echoer.{TAG}.code"
    assert cache.stat().st_mode & 0o777 == 0o700
    digest = hashlib.sha256(program.read_bytes()).digest()
    assert entry.read_bytes()[:32] == digest

    entry.write_bytes(digest + b"not marshal data")  # damaged: compiled over, still runs
    assert _run(python_command(program, "two"), home, tmp).startswith("argument two")
    assert entry.read_bytes()[:32] == digest and len(entry.read_bytes()) > 64

    program.write_text("import sys\nprint('new', sys.argv[1])\n", encoding="utf-8")
    os.utime(program, ns=(1, 1))  # a new version of the program, even within one tick
    assert _run(python_command(program, "three"), home, tmp) == "new three\n"  # not the cache
    assert entry.read_bytes()[:32] == hashlib.sha256(program.read_bytes()).digest()


def test_code_bytes_that_are_not_what_was_compiled_are_never_run(
    program: Path, tmp_path: Path
) -> None:
    """The entry's header names the source; the code after it is checked against its own
    digest too: another program's marshalled code under the right source digest (a damaged
    or tampered file that marshal still reads) is compiled over, never run."""
    import marshal

    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(), tmp.mkdir()
    _run(python_command(program, "one"), home, tmp)
    entry = home / ".cache" / "fleet-reconciler" / f"echoer.{TAG}.code"
    good = entry.read_bytes()
    other = marshal.dumps(compile("print('not the program')", "<x>", "exec"))
    for spoiled in (good[:32] + other, good[:64] + other):  # the source's digest, other code
        entry.write_bytes(spoiled)
        assert _run(python_command(program, "two"), home, tmp).startswith("argument two")
        assert entry.read_bytes() == good  # compiled over


def test_a_cache_directory_others_can_write_is_not_used(program: Path, tmp_path: Path) -> None:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    (home / ".cache" / "fleet-reconciler").mkdir(parents=True)
    (home / ".cache" / "fleet-reconciler").chmod(0o777)
    tmp.mkdir()
    assert _run(python_command(program, "x"), home, tmp).startswith("argument x")
    assert not list((home / ".cache" / "fleet-reconciler").iterdir())
    fallback = tmp / f"fleet-reconciler-{os.getuid()}"
    assert (fallback / f"echoer.{TAG}.code").is_file()  # the private fallback is used instead


# Issue 10, class 7: compiled code is run as the deploy user, so only a file that user alone
# could have written is run. Tests run as root: "another owner" is os.chown to nobody.
NOBODY = 65534


def _planted(program: Path, entry: Path) -> None:
    """A cache entry stamped with the program's own digest, holding other code."""
    import marshal

    evil = compile("print('planted code ran')", "<planted>", "exec")
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.parent.chmod(0o700)
    code = marshal.dumps(evil)
    source = hashlib.sha256(program.read_bytes()).digest()
    entry.write_bytes(source + hashlib.sha256(code).digest() + code)  # a whole, valid entry
    entry.chmod(0o600)


def test_compiled_code_is_written_0600(program: Path, tmp_path: Path) -> None:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(), tmp.mkdir()
    old = os.umask(0)  # even a permissive umask cannot widen it
    try:
        _run(python_command(program, "one"), home, tmp)
    finally:
        os.umask(old)
    entry = home / ".cache" / "fleet-reconciler" / f"echoer.{TAG}.code"
    info = entry.stat()
    assert info.st_mode & 0o777 == 0o600 and info.st_uid == os.getuid()


def test_a_private_cached_file_of_the_user_is_what_runs(program: Path, tmp_path: Path) -> None:
    """The control for the tests below: the planted entry does run when it is the user's own
    and private, so their refusals come from the owner and mode checks."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(), tmp.mkdir()
    _planted(program, home / ".cache" / "fleet-reconciler" / f"echoer.{TAG}.code")
    assert _run(python_command(program, "x"), home, tmp) == "planted code ran\n"


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda entry: os.chown(entry, NOBODY, NOBODY), id="other-owner"),
        pytest.param(lambda entry: entry.chmod(0o620), id="group-writable"),
        pytest.param(lambda entry: entry.chmod(0o602), id="world-writable"),
        pytest.param(lambda entry: entry.chmod(0o644), id="readable-by-others"),
    ],
)
def test_a_cached_file_with_the_wrong_owner_or_mode_is_not_run(
    program: Path, tmp_path: Path, spoil: object
) -> None:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(), tmp.mkdir()
    entry = home / ".cache" / "fleet-reconciler" / f"echoer.{TAG}.code"
    _planted(program, entry)
    spoil(entry)  # type: ignore[operator]
    assert _run(python_command(program, "x"), home, tmp).startswith("argument x")
    info = entry.stat()  # recompiled from the shipped source, written over: ours and 0600
    assert info.st_uid == os.getuid() and info.st_mode & 0o777 == 0o600
    assert _run(python_command(program, "y"), home, tmp).startswith("argument y")


def test_a_cached_symlink_is_not_followed(program: Path, tmp_path: Path) -> None:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(), tmp.mkdir()
    elsewhere = tmp_path / "elsewhere.code"
    _planted(program, elsewhere)
    entry = home / ".cache" / "fleet-reconciler" / f"echoer.{TAG}.code"
    entry.parent.mkdir(parents=True, mode=0o700)
    entry.symlink_to(elsewhere)
    assert _run(python_command(program, "x"), home, tmp).startswith("argument x")
    assert not entry.is_symlink()  # replaced by a real file


def test_a_cache_directory_of_another_owner_is_not_used(program: Path, tmp_path: Path) -> None:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(), tmp.mkdir()
    entry = home / ".cache" / "fleet-reconciler" / f"echoer.{TAG}.code"
    _planted(program, entry)
    os.chown(entry, os.getuid(), os.getgid())
    os.chown(entry.parent, NOBODY, NOBODY)  # the file is fine, its directory is not ours
    assert _run(python_command(program, "x"), home, tmp).startswith("argument x")
    fallback = tmp / f"fleet-reconciler-{os.getuid()}" / f"echoer.{TAG}.code"
    assert fallback.stat().st_mode & 0o777 == 0o600


# -- the packed program, remembered in the controller's cache ----------------------------------
def _packs(program: Path, cache: Path) -> tuple[int, str]:
    """In a new interpreter with `cache` as XDG_CACHE_HOME: how many times zlib.compress ran
    (packing a program is one call) while python_command built `program`'s line, and the line."""
    code = (
        "import pathlib, zlib\n"
        "calls = []\n"
        "_compress = zlib.compress\n"
        "zlib.compress = lambda *a, **k: calls.append(1) or _compress(*a, **k)\n"
        "from reconciler.observe.transport import python_command\n"
        f"line = python_command(pathlib.Path({str(program)!r}), 'x')\n"
        "print(len(calls))\n"
        "print(line)\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    count, line = result.stdout.split("\n", 1)
    return int(count), line


def _entry(cache: Path) -> Path:
    (entry,) = (cache / "fleet-reconciler").glob("packed-*.b64")
    return entry


def test_a_program_is_packed_once_and_then_read_back(program: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, second = _packs(program, cache), _packs(program, cache)
    assert (first[0], second[0]) == (1, 0)  # the second run compressed nothing
    assert second[1] == first[1] == _packs(program, tmp_path / "elsewhere")[1]
    assert _entry(cache).stat().st_mode & 0o777 == 0o600


def test_an_edited_or_damaged_program_entry_is_packed_again(program: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert _packs(program, cache)[0] == 1
    entry = _entry(cache)
    entry.write_bytes(entry.read_bytes()[:-10] + b"AAAAAAAAAA")  # damaged: its digest differs
    assert _packs(program, cache)[0] == 1
    assert _packs(program, cache)[0] == 0  # repaired
    program.write_text(program.read_text("utf-8") + "print('edited')\n", "utf-8")
    count, line = _packs(program, cache)
    assert count == 1  # new stamps, a new entry
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(), tmp.mkdir()
    assert _run(line.strip(), home, tmp).endswith("edited\n")  # the edited program runs


def test_a_packed_entry_others_could_write_is_not_read(program: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert _packs(program, cache)[0] == 1
    _entry(cache).chmod(0o666)
    assert _packs(program, cache)[0] == 1  # not trusted: packed again
