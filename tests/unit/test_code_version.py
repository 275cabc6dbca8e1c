"""desired/fingerprint.code_version: which code wrote a cache entry. Any change to a source
file must change it (else a cache written by other code would be trusted); nothing else may."""

from __future__ import annotations

import os
import time
from pathlib import Path

from reconciler.desired.fingerprint import code_version


def _package(tmp_path: Path) -> Path:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("X = 1\n")
    (package / "sub" / "mod.py").write_text("def f():\n    return 2\n")
    return package


def test_stable_while_nothing_changes(tmp_path: Path) -> None:
    package = _package(tmp_path)
    first = code_version(package, "salt")
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"compiled")
    (package / "notes.txt").write_text("not code")
    assert code_version(package, "salt") == first
    assert code_version(str(package), "salt") == first  # a str path is the same package
    assert code_version(package, "other salt") != first


def test_an_edit_that_keeps_size_and_mtime_still_changes_it(tmp_path: Path) -> None:
    package = _package(tmp_path)
    module = package / "sub" / "mod.py"
    before = os.stat(module)
    first = code_version(package)
    time.sleep(0.01)  # ctime has nanoseconds here; a step of the clock is enough
    module.write_text("def f():\n    return 3\n")  # same size
    os.utime(module, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime put back
    assert os.stat(module).st_size == before.st_size
    assert os.stat(module).st_mtime_ns == before.st_mtime_ns
    assert code_version(package) != first


def test_a_new_or_removed_module_changes_it(tmp_path: Path) -> None:
    package = _package(tmp_path)
    first = code_version(package)
    (package / "sub" / "new.py").write_text("")
    second = code_version(package)
    assert second != first
    (package / "sub" / "new.py").unlink()
    assert code_version(package) == first  # the same files as at first, untouched
