"""Which parts of a box a drift run did not observe, and so which of its entries it cannot
vouch for. Pure.

A box reached over SSH whose dockerd was down has no lane entries because no container was
inspected, not because its lanes are in sync: its zero is not known. The report's faults say
which part failed (compare/drift.py's Part); the HTML matrix already maps each part to the
columns it answers for (report/html.py `_UNSEEN`), and the history, `reconcile diff`, the
sparklines and the metrics read the same map: one rule for "not observed" everywhere.

A run records each box's fault parts (store schema 4, `boxes.faults`); a run recorded before
has only the number of its errors: a box with errors then counts as not observed in any
column (which part failed is not known), a box without is observed in full.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

LANES = "lanes"  # every lane's column, as the history names it (html.LANES is "")
GATEWAY = "gateway"
BOX_WIDE = "box-wide"
EVERY = frozenset({LANES, GATEWAY, BOX_WIDE})
# How a reason names the columns, in this order.
_WORDS = {LANES: "the lanes", GATEWAY: "the gateway", BOX_WIDE: "the box as a whole"}


def faults_of(errors: Iterable[Any]) -> tuple[str, ...]:
    """The parts a box's faults are about (compare.drift.Part values), each once, in the
    faults' order; a fault made as a plain string names no part (html.unobserved's rule)."""
    from reconciler.compare.drift import Part

    parts = (getattr(e, "part", None) for e in errors)
    return tuple(dict.fromkeys(str(p.value) for p in parts if isinstance(p, Part)))


def known(errors: int, faults: Sequence[str] | None) -> tuple[str, ...] | None:
    """A stored box's fault parts: as recorded, none for a box without errors, None (not
    known) for one recorded with errors before the parts were kept."""
    if faults is not None:
        return tuple(faults)
    return () if errors == 0 else None


def unseen_columns(faults: Sequence[str] | None) -> frozenset[str]:
    """The columns (LANES: every lane, GATEWAY, BOX_WIDE) whose entries `faults` leave not
    observed; None (not known) and a part this code does not know (a newer reconciler's):
    every column."""
    if faults is None:
        return EVERY
    if not faults:
        return frozenset()  # the usual box: nothing to map (and the HTML module not imported)
    from reconciler.compare.drift import Part
    from reconciler.report.html import _UNSEEN
    from reconciler.report.html import LANES as HTML_LANES

    out: set[str] = set()
    for name in faults:
        try:
            part = Part(name)
        except ValueError:
            return EVERY
        out.update(LANES if col == HTML_LANES else col for col in _UNSEEN.get(part, ()))
    return frozenset(out)


def column(subject: str) -> str:
    """The column an entry's subject falls in (html.column_of), every lane as LANES."""
    from reconciler.report.html import column_of

    found = column_of(subject)
    return found if found in (GATEWAY, BOX_WIDE) else LANES


def complete(observation: str, errors: int, faults: Sequence[str] | None) -> bool:
    """Whether a stored box's entry count is the whole of its drift: observed in full, and no
    fault left a column not observed."""
    return observation == "full" and not unseen_columns(known(errors, faults))


def seen_in_full(box: Any) -> bool:
    """The same of a run's box (compare.drift.BoxResult): what the HTML page's badge and its
    sparkline's last point go by."""
    from reconciler.report.html import unobserved

    return bool(box.observation == "full" and not unobserved(box))


def words(columns: Iterable[str]) -> str:
    """`the lanes and the gateway`, as a reason names columns, in a fixed order."""
    found = [word for col, word in _WORDS.items() if col in set(columns)]
    return " and ".join([", ".join(found[:-1]), found[-1]] if len(found) > 1 else found)
