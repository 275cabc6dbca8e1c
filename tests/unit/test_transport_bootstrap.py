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


def test_a_cache_directory_others_can_write_is_not_used(program: Path, tmp_path: Path) -> None:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    (home / ".cache" / "fleet-reconciler").mkdir(parents=True)
    (home / ".cache" / "fleet-reconciler").chmod(0o777)
    tmp.mkdir()
    assert _run(python_command(program, "x"), home, tmp).startswith("argument x")
    assert not list((home / ".cache" / "fleet-reconciler").iterdir())
    fallback = tmp / f"fleet-reconciler-{os.getuid()}"
    assert (fallback / f"echoer.{TAG}.code").is_file()  # the private fallback is used instead
