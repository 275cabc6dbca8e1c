"""What one import did: the files it wrote, the boxes it adopted, what it found."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import BoxResult
from reconciler.importer.sourced import Finding

EXIT_OK, EXIT_ERROR, EXIT_FOUND = 0, 1, 2


@dataclass
class Imported:
    output: Path
    files: list[str]
    boxes: list[str]  # one summary line per adopted box
    findings: list[Finding] = field(default_factory=list)
    results: list[BoxResult] = field(default_factory=list)
    expectations: dict[str, BoxExpectation] = field(default_factory=dict)
    snapshot: bool = False  # compared against saved observations (and their saved renders)
    # `--partial`: each box left out (nothing written for it) -> why, first line first.
    failed: dict[str, list[str]] = field(default_factory=dict)
