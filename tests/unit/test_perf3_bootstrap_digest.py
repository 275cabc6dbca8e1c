"""The box program's bootstrap takes the source's digest from the command line: a cached
compiled file stamped with it runs without the shipped source being unpacked and hashed on the
box (~1.2 ms of each box's CPU every run); a miss still compiles what was shipped."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from reconciler.observe.transport import python_command

TAG = sys.implementation.cache_tag


def _run(command: str, home: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HOME": str(home)}
    env["TMPDIR"] = str(tmp)
    return subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True)


def test_a_cached_program_runs_without_unpacking_what_was_shipped(tmp_path: Path) -> None:
    program = tmp_path / "echoer.py"
    program.write_text("import sys\nprint('ran', sys.argv[1])\n", encoding="utf-8")
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(), tmp.mkdir()
    line = python_command(program, "x")
    argv = shlex.split(line)  # python3 -I -S -c BOOTSTRAP x
    digest = hashlib.sha256(program.read_bytes()).hexdigest()
    assert f"a2b_hex('{digest}')" in argv[4]  # the source's digest travels with it
    assert _run(line, home, tmp).stdout == "ran x\n"  # a miss: compiled, cached
    entry = home / ".cache" / "fleet-reconciler" / f"echoer.{TAG}.code"
    assert entry.read_bytes()[:32] == bytes.fromhex(digest)

    # The same digest with a packed text that is not zlib at all: a bootstrap that unpacks
    # the shipped source on a hit fails on it; this one runs the cached code.
    packed = re.compile(r"exec\(_code\(zlib.decompress,'[A-Za-z0-9+/=]+'")
    assert len(packed.findall(argv[4])) == 1
    spoiled = packed.sub("exec(_code(zlib.decompress,'AAAA'", argv[4])
    spoiled = shlex.join([*argv[:4], spoiled, *argv[5:]])
    assert _run(spoiled, home, tmp).stdout == "ran x\n"

    entry.unlink()  # a miss with that text: it is unpacked, and fails loudly
    missed = _run(spoiled, home, tmp)
    assert missed.returncode != 0 and "zlib" in missed.stderr
