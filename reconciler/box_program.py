"""The text a box runs: a box program with the code it shares written in.

The two box programs (observe/remote/collector.py, apply/remote/converge.py) each travel over
SSH as one text and run on the box's own python3, which has no copy of this package
(transport.python_command). What they share with each other or with the controller (compose's
`.env` reader, the secret-name floor, the HTTP/1.1 reader) lives once, in reconciler/box_shared/,
and a program imports it as any module would: the controller and the tests that import a
program get it so. `box_source` gives the text a box runs: each
`from reconciler.box_shared.NAME import (...)` statement of the program replaced by
box_shared/NAME.py's own text, once. A box thus runs one namespace, as it always did.

What packing could get wrong is refused here (PackError), before any box is sent anything:
a shared module that defines a name the program (or another shared module) also defines (one
would silently replace the other on the box, not in an import), any other import of this
package left in the text (the box has none), a shared module that imports this package, or
one with a `from __future__` statement (legal only at a file's start).
"""

from __future__ import annotations

import keyword
import os
import re
from pathlib import Path

SHARED = Path(__file__).parent / "box_shared"
_STATEMENT = "from reconciler.box_shared."


class PackError(ValueError):
    """A box program that cannot be made into one text."""


def box_stamp(program: Path) -> tuple[int, ...]:
    """What changes when the text a box runs may change: the program's and every shared
    module's device, inode, size and times (the packed text is cached under it)."""
    stamp: list[int] = []
    for path in (program, *sorted(SHARED.glob("*.py"))):
        info = os.stat(path)
        stamp += [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]
    return tuple(stamp)


def box_source(program: Path) -> str:
    """`program`'s text with each import from reconciler/box_shared replaced by that module's
    text (the first import of a module; a later one of the same module goes)."""
    lines = program.read_text(encoding="utf-8").splitlines(keepends=True)
    out: list[str] = []
    packed: list[str] = []
    at = 0
    while at < len(lines):
        line = lines[at]
        if not line.startswith(_STATEMENT):
            out.append(line)
            at += 1
            continue
        end = at
        if "(" in line:  # `import (` ... `)`: the statement ends on the line closing it
            while ")" not in lines[end]:
                end += 1
                if end == len(lines):
                    raise PackError(f"{program}:{at + 1}: an import that never closes")
        name = line[len(_STATEMENT) :].split(" ", 1)[0]
        if name not in packed:
            packed.append(name)
            out.append(_shared_text(name, program, at + 1))
        at = end + 1
    text = "".join(out)
    for number, row in enumerate(text.splitlines(), 1):
        if row.lstrip().startswith(("from reconciler", "import reconciler")):
            # indented, or in another form: the box has no such package to import
            raise PackError(f"{program}: line {number} of the packed text imports this package")
    if packed:
        _check_names(program, "".join(lines), packed)
    return text


def _shared_text(name: str, program: Path, line: int) -> str:
    path = SHARED / f"{name}.py"
    if not name.isidentifier() or not path.is_file():
        raise PackError(f"{program}:{line}: no shared module {name!r} in {SHARED}")
    text = path.read_text(encoding="utf-8")
    for number, row in enumerate(text.splitlines(), 1):
        if row.startswith("from __future__"):
            raise PackError(f"{path}:{number}: `from __future__` is legal only at a file's start")
        if row.lstrip().startswith(("from reconciler", "import reconciler")):
            raise PackError(f"{path}:{number}: a shared module imports only the stdlib")
    return text if text.endswith("\n") else text + "\n"


def _check_names(program: Path, own: str, packed: list[str]) -> None:
    """No top-level name defined both by the program and by a module packed into it, nor by
    two such modules (an import of a name is no definition): on the box whichever came last
    would silently replace the other."""
    owner = {name: program.name for name in _top_level(own)}
    for module in packed:
        path = SHARED / f"{module}.py"
        for name in _top_level(path.read_text(encoding="utf-8")):
            if name in owner:
                raise PackError(
                    f"{path}: {name!r} is also defined in {owner[name]}: packed into "
                    f"{program.name}, one would replace the other on the box"
                )
            owner[name] = path.name


def _top_level(text: str) -> set[str]:
    """The names a file defines at its top level: a `def`, `class` or assignment starting a
    line (a text scan: parsing the collector costs ~60 ms, this ~2 ms)."""
    found = {made or assigned for made, assigned in _DEFINITION.findall(text)}
    return {name for name in found if not keyword.iskeyword(name)}


# `def NAME(`, `class NAME`, `NAME =`, `NAME: type =` at a line's start (not `NAME == x`).
_DEFINITION = re.compile(
    r"^(?:(?:async\s+)?def\s+|class\s+)([A-Za-z_]\w*)|^([A-Za-z_]\w*)\s*(?::[^=\n]*)?=(?!=)",
    re.M,
)
