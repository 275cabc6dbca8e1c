"""`reconcile --root REPO -i lab ARGS`, as an operator runs it, in a process of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def reconcile(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", "--root", str(REPO), "-i", "lab", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
