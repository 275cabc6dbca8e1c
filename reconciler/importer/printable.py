"""Paths the import shows (a header comment, a printed line) as one printable line.

A path is the operator's, not ours: on Linux it is bytes, and Python hands one that is not
UTF-8 over with lone surrogates (`\\udcff`), which no UTF-8 file or terminal can take; a
control character in it would end a YAML comment or move a terminal's cursor. Each such
character is written as its Python escape instead, so the text still says which path."""

from __future__ import annotations

import os


def escaped(text: str | os.PathLike[str]) -> str:
    shown = os.fspath(text)
    if shown.isprintable():  # what a terminal and a UTF-8 file take as it is (the usual path)
        return shown
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in shown
    )
