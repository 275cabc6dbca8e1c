"""Command-line values that name a place, checked as argparse reads them.

An empty `--from-snapshot ""` (a script's unset variable) was no snapshot at all: the run went
to the live boxes instead of replaying; an empty `-o ""` printed the report instead of writing
it; an empty `-i ""` selected the real mesh. So no path argument, and no argument whose absence
means a default, may be empty. A relative DIR was later joined to `--root` where the
snapshot carries its facts, so a directory argument is also made absolute against the working
directory, once, here.
"""

from __future__ import annotations

import argparse
import os


def directory(text: str) -> str:
    """A DIR argument: not empty, absolute (against the working directory)."""
    return os.path.abspath(file_path(text))


def file_path(text: str) -> str:
    """A FILE or PATH argument (-o, --metrics, --history, --evidence, import's --output): not
    empty, as given. An empty one used to mean "not given": `-o "$OUT"` with OUT unset printed
    the report instead of writing it, `--history ""` recorded into the default store."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (is a variable unset?)")
    if "\0" in text:
        raise argparse.ArgumentTypeError("a path with a NUL byte")
    return text


def not_empty(text: str) -> str:
    """Any other value whose absence has a default (-i NAME|PATH, history's --since WHEN): not
    empty, as given. `-i "$INV"` with INV unset selected the default inventory, the real mesh;
    `--since ""` listed every run."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty value (is a variable unset?)")
    if "\0" in text:
        raise argparse.ArgumentTypeError("a value with a NUL byte")
    return text
