""" "Did you mean ...?" for a name the desired state does not know: the nearest known one.

difflib compares the word with every candidate, and similar names (grp00017, grp00071) pass
its quick filters, so each hint costs a comparison per known name. An inventory naming
thousands of unknown groups, or one bad `proxied_to` in a layer 5,000 boxes share, made an
invalid state take minutes to refuse, where the valid one loads in about a second. Every
problem is still reported; only the first MAX_HINTS of a load get a hint (load_fleet sets the
budget for each load; outside one, every call gets its hint).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

MAX_HINTS = 10
_left: ContextVar[int | None] = ContextVar("hints_left", default=None)


@contextmanager
def hint_budget() -> Iterator[None]:
    """MAX_HINTS hints for what runs inside (one load of the desired state)."""
    token = _left.set(MAX_HINTS)
    try:
        yield
    finally:
        _left.reset(token)


def nearest(word: str, options: Sequence[str]) -> str | None:
    """The known name nearest `word` (difflib's 0.6 cutoff), or None; None also once this
    load's hints are spent."""
    left = _left.get()
    if left is not None:
        if left <= 0:
            return None
        _left.set(left - 1)
    near = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return near[0] if near else None
