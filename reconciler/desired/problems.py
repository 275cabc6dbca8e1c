"""What is wrong with the desired state, and where: the types every loader stage reports with.

Stdlib only, so a command can catch DesiredStateError (and a cached state can carry its key
positions) without importing the YAML parser.
"""

from __future__ import annotations

from dataclasses import dataclass

PathKey = tuple[str | int, ...]


@dataclass(frozen=True, order=True)
class Location:
    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the desired state, with where to fix it."""

    location: Location
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{self.location}: {where}{self.message}"


class DesiredStateError(Exception):
    """Raised with every problem found; nothing has been written anywhere."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(set(problems), key=lambda p: (p.location, p.path, p.message))
        super().__init__("\n".join(str(p) for p in self.problems))


def dotted(path: PathKey) -> str:
    """`lanes.hand.env.KEY`, `boxes.thor.groups[0]`: a key as it is written, except that a
    character that is not printable is shown escaped (printable): a key holding a right-to-left
    override or an escape sequence must not reorder or rewrite the operator's terminal line."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            key = printable(str(part))
            out += f".{key}" if out else key
    return out


def printable(text: str) -> str:
    """`text` with each character that is not printable escaped as Python writes it (`\\u202e`,
    `\\x1b`, `\\n`): file names and keys in an error line are shown, never obeyed."""
    if text.isprintable():  # string work only: called for every file and key reported
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
