"""No shell function of ours is named after a command.

A function named like a command shadows it for the rest of the script: `.ci/setup-machine.sh`
once defined `install()` (for apt), so its later `install -m 0755 ... docker-compose` ran apt
instead of /usr/bin/install and the compose plugin was never put in place on a fresh machine.
Every shell script under .ci/, scripts/ and lab/ is read, and every function it defines is
checked against bash's builtins and keywords and every executable on PATH (with the system
directories a root shell has)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT_DIRS = (".ci", "scripts", "lab")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# `name() {`, `name () (`, `function name {`, `function name() {`, also after `;`, `&&`, `||`.
_DEFINITION = re.compile(
    r"(?:^|[;&|]\s*)\s*(?:function\s+([A-Za-z_][\w.:-]*)\s*(?:\(\s*\))?|([A-Za-z_][\w.:-]*)\s*\(\s*\))"
    r"\s*[{(]?"
)


def shell_scripts() -> list[Path]:
    found = []
    for folder in SCRIPT_DIRS:
        for path in sorted((REPO / folder).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if path.suffix == ".sh" or _shebang(path) in {"sh", "bash", "dash"}:
                found.append(path)
    return found


def _shebang(path: Path) -> str:
    with path.open("rb") as handle:
        first = handle.readline(200)
    if not first.startswith(b"#!"):
        return ""
    words = first[2:].decode(errors="replace").split()
    if words and words[0].endswith("/env") and len(words) > 1:
        return words[1]
    return Path(words[0]).name if words else ""


def functions_defined(text: str) -> list[tuple[int, str]]:
    """(line, name) of each function definition; comments are skipped."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        for match in _DEFINITION.finditer(code):
            name = match.group(1) or match.group(2)
            out.append((number, name))
    return out


def _shell_words() -> set[str]:
    done = subprocess.run(
        ["bash", "-c", "compgen -b; compgen -k"], capture_output=True, text=True, check=True
    )
    return set(done.stdout.split())


def command_names(names: set[str]) -> dict[str, str]:
    """Of `names`, those that are a bash builtin or keyword, or an executable on PATH."""
    words = _shell_words()
    path = os.pathsep.join([os.environ.get("PATH", ""), SYSTEM_PATH])
    out = {}
    for name in names:
        if name in words:
            out[name] = "a bash builtin or keyword"
        elif (where := shutil.which(name, path=path)) is not None:
            out[name] = where
    return out


def test_the_scripts_are_found():
    names = {p.relative_to(REPO).as_posix() for p in shell_scripts()}
    assert {".ci/run", ".ci/setup-machine.sh", "scripts/demo.sh"} <= names


@pytest.mark.parametrize("path", shell_scripts(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_function_is_named_after_a_command(path):
    defined = functions_defined(path.read_text(encoding="utf-8"))
    clashes = command_names({name for _, name in defined})
    bad = [f"{path.name}:{line}: {name}() shadows {clashes[name]}" for line, name in defined
           if name in clashes]  # fmt: skip
    assert not bad, "\n".join(bad)


def test_the_check_sees_the_install_function_that_broke_a_fresh_machine():
    # The definition of .ci/setup-machine.sh before the fix, and the other spellings.
    text = (
        '    install() { DEBIAN_FRONTEND=noninteractive apt-get install -y "$@"; }\n'
        "function cp { :; }\n"
        "ok=1; bind () { :; }\n"
        "# echo() { in a comment: not a definition\n"
        "apt_install_missing() { :; }\n"
    )
    defined = functions_defined(text)
    assert [name for _, name in defined] == ["install", "cp", "bind", "apt_install_missing"]
    assert set(command_names({name for _, name in defined})) == {"install", "cp", "bind"}
