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
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
