"""Unit tests see the repository as it is, whatever the caller's shell selects: an operator's
exported FLEET_INVENTORY=lab (as the README's examples use) must not change their results."""

from __future__ import annotations

import hashlib
import linecache
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

from reconciler.box_program import box_source

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_fleet_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_INVENTORY", raising=False)
    monkeypatch.delenv("FLEET_ROOT", raising=False)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the fleet repository's desired state, with a cache directory of its own."""
    root = tmp_path / "fleet"
    for part in ("inventory", "group_vars"):
        shutil.copytree(ROOT / part, root / part)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return root


def hosts_inventory(root: Path) -> Path:
    return root / "inventory" / "hosts.yaml"


def load_box_program(name: str, relative: str) -> ModuleType:
    """A box-side program loaded here for unit tests as a box runs it: its text with the code
    it shares written in (reconciler/box_program.py), one namespace, so patching one of its
    names patches what its own functions see, as on the box. Its code is named after the
    packed text, which linecache holds: a traceback shows the packed text's own lines, not the
    lines of the program file at the same numbers."""
    program = ROOT / relative
    text = box_source(program)
    filename = f"<packed {relative}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    module = ModuleType(name)
    module.__file__ = str(program)
    exec(compile(text, filename, "exec"), module.__dict__)
    return module


def packed_program(relative: str) -> Path:
    """A box-side program's text as a box runs it (reconciler/box_program.py), in a file of its
    own (named by its digest: xdist workers write the same bytes), for tests that run it as
    the box does: `python3 -I -S FILE`, with no access to this package."""
    text = box_source(ROOT / relative).encode("utf-8")
    where = Path(tempfile.gettempdir()) / f"fleet-box-programs-{os.getuid()}"
    where.mkdir(mode=0o700, exist_ok=True)
    path = where / f"{hashlib.sha256(text).hexdigest()[:16]}-{Path(relative).name}"
    if not path.is_file() or path.read_bytes() != text:
        temporary = path.with_name(f"{path.name}.{os.getpid()}")
        temporary.write_bytes(text)
        os.replace(temporary, path)
    return path


# -- `reconcile import` of the pristine lab's saved snapshot (test_import*.py) ---------------------
IMPORT_SNAPSHOT = ROOT / "tests" / "fixtures" / "import" / "pristine"


@pytest.fixture(scope="module")
def pristine_import(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    """The adopted repository, import's exit code and what it printed."""
    return import_snapshot(IMPORT_SNAPSHOT, tmp_path_factory.mktemp("import") / "adopted")


def import_snapshot(snapshot: Path, out: Path) -> tuple[Path, int, str]:
    """`reconcile -i lab import --from-snapshot SNAPSHOT --output OUT`, in this process: the
    adopted repository, import's exit code and what it printed."""
    import contextlib
    import io

    from reconciler.cli import main

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        code = main(
            ["--root", str(ROOT), "-i", "lab", "import", "--from-snapshot", str(snapshot),
             "--output", str(out)]
        )  # fmt: skip
    return out, code, buffer.getvalue()


def fresh_python(code: str, cache: Path | None = None) -> str:
    """What `code` prints in a new interpreter (import costs and module sets are per process);
    a failure there fails the test with its stderr. `cache`: its XDG_CACHE_HOME, in an
    environment with nothing else of this one's (a repeated run's remembered inputs)."""
    env = None if cache is None else {"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(cache)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env
    )
    assert result.returncode == 0, result.stderr
    return result.stdout
