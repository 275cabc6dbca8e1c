"""Command-line values that name a place, checked as argparse reads them.

An empty `--from-snapshot ""` (a script's unset variable) was no snapshot at all: the run went
to the live boxes instead of replaying. A relative DIR was later joined to `--root` where the
snapshot carries its facts. So a directory argument is refused when empty and made absolute
against the working directory, once, here.
"""

from __future__ import annotations

import argparse
import os


def directory(text: str) -> str:
    """A DIR argument: not empty, absolute (against the working directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (is a variable unset?)")
    if "\0" in text:
        raise argparse.ArgumentTypeError("a path with a NUL byte")
    return os.path.abspath(text)
