"""reconciler/box_program.py: the text a box runs is the program with the code it shares written
in where it imports it, and whatever would make that text differ from what the program means
when imported is refused before any box is sent anything."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler import box_program
from reconciler.box_program import PackError, box_source
from reconciler.observe import transport
from tests.unit.conftest import ROOT

PROGRAMS = ("reconciler/observe/remote/collector.py", "reconciler/apply/remote/converge.py")


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A box_shared directory of the test's own, with one module."""
    where = tmp_path / "box_shared"
    where.mkdir()
    (where / "words.py").write_text(
        '"""Shared."""\n\nimport os\n\nSEP = os.sep\n\n\n'
        "def joined(a, b):\n    return a + SEP + b\n"
    )
    monkeypatch.setattr(box_program, "SHARED", where)
    return where


def _program(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prog.py"
    path.write_text(text)
    return path


def test_the_import_becomes_the_module_text_and_runs_with_no_package_to_import(
    tmp_path: Path, shared: Path
) -> None:
    program = _program(
        tmp_path,
        '"""A program."""\n\nimport sys\n\nfrom reconciler.box_shared.words import (\n'
        "    SEP,\n    joined,\n)\n\n\nprint(joined('a', 'b') == 'a' + SEP + 'b', len(sys.argv))\n",
    )
    text = box_source(program)
    assert "reconciler" not in text
    assert text.count((shared / "words.py").read_text()) == 1
    ran = subprocess.run(
        [sys.executable, "-I", "-S", "-c", text, "x"], capture_output=True, text=True, check=True
    )
    assert ran.stdout == "True 2\n"


def test_a_second_import_of_the_same_module_adds_nothing(tmp_path: Path, shared: Path) -> None:
    program = _program(
        tmp_path,
        "from reconciler.box_shared.words import SEP\n"
        "from reconciler.box_shared.words import joined\n",
    )
    assert box_source(program) == (shared / "words.py").read_text()


def test_a_name_the_program_defines_too_is_refused(tmp_path: Path, shared: Path) -> None:
    program = _program(
        tmp_path, "from reconciler.box_shared.words import SEP\n\n\ndef joined(a, b):\n    pass\n"
    )
    with pytest.raises(PackError, match=r"'joined' is also defined in prog\.py"):
        box_source(program)


@pytest.mark.parametrize(
    ("statement", "why"),
    [
        ("from reconciler.box_shared.nothing import x\n", "no shared module 'nothing'"),
        ("from reconciler.box_shared.words import (\n    SEP,\n", "an import that never closes"),
        ("def f():\n    from reconciler.box_shared.words import SEP\n", "imports this package"),
        ("from reconciler.observe import transport\n", "imports this package"),
    ],
)
def test_what_a_box_could_not_import_is_refused(
    tmp_path: Path, shared: Path, statement: str, why: str
) -> None:
    with pytest.raises(PackError, match=why):
        box_source(_program(tmp_path, statement))


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("from __future__ import annotations\n", "legal only at a file's start"),
        ("from reconciler.scrub import scrub_text\n", "imports only the stdlib"),
    ],
)
def test_a_shared_module_the_box_could_not_run_is_refused(
    tmp_path: Path, shared: Path, line: str, why: str
) -> None:
    (shared / "words.py").write_text(line + (shared / "words.py").read_text())
    with pytest.raises(PackError, match=why):
        box_source(_program(tmp_path, "from reconciler.box_shared.words import SEP\n"))


def test_an_edit_of_a_shared_module_changes_what_the_box_is_sent(
    tmp_path: Path, shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The packed text is cached under the files' stamps: a shared module's among them."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    program = _program(tmp_path, "from reconciler.box_shared.words import joined\n")

    def digest() -> str:
        bootstrap = shlex.split(transport.python_command(program, "-"))[4]
        found = re.search(r"a2b_hex\('([0-9a-f]{64})'\)", bootstrap)
        assert found is not None
        return found.group(1)

    before = digest()
    assert digest() == before
    (shared / "words.py").write_text((shared / "words.py").read_text() + "LATER = 1\n")
    assert digest() != before


SHARED_MODULES = sorted(
    str(path.relative_to(ROOT)) for path in (ROOT / "reconciler" / "box_shared").glob("[!_]*.py")
)


@pytest.mark.parametrize("relative", [*PROGRAMS, *SHARED_MODULES])
def test_the_top_level_scan_finds_what_python_defines_there(relative: str) -> None:
    """The name check reads definitions by a text scan; on the real files it finds exactly
    the names Python's own parser finds at the top level."""
    text = (ROOT / relative).read_text(encoding="utf-8")
    parsed: set[str] = set()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            parsed.add(node.name)
        elif isinstance(node, ast.Assign):
            parsed |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            parsed.add(node.target.id)
    assert box_program._top_level(text) == parsed


@pytest.mark.parametrize("relative", PROGRAMS)
def test_each_box_program_packs_into_one_stdlib_text(relative: str) -> None:
    text = box_source(ROOT / relative)
    tree = ast.parse(text)
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert "reconciler" not in imported
    # _sha2: Python 3.12's name of the builtin SHA-256, tried before 3.11's _sha256
    assert imported - set(sys.stdlib_module_names) <= {"_sha2"}
