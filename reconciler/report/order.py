"""The one order every report uses, so two runs over the same fleet diff line by line.

Boxes keep the report's order (the inventory's); causes group the ordered drifts
(report/grouped.py). Drifts follow `Drift.sort_key`; ties (the same
box, kind, subject and path twice) are broken on the remaining fields, because `sorted` is only
stable, and a tie left to input order would make the output depend on how compare happened to
emit it.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter

from reconciler.compare.drift import Drift


def ordered_drifts(drifts: Iterable[Drift]) -> list[Drift]:
    # The full key's order, in two steps: by its first two fields, then each run of ties on
    # them (rare) by the whole key. repr() of every value was ~80% of ordering a 1,000-box
    # report (each box's mesh seeds: 25 MB of repr); now only tied entries pay it.
    keyed = sorted(((_primary(d), d) for d in drifts), key=itemgetter(0))
    ordered = [d for _, d in keyed]
    start = 0
    for end in range(1, len(keyed) + 1):
        if end == len(keyed) or keyed[end][0] != keyed[start][0]:
            if end - start > 1:
                ordered[start:end] = sorted(ordered[start:end], key=_full_key)
            start = end
    return ordered


def _primary(drift: Drift) -> tuple[tuple[str, str, str, str], str]:
    return drift.sort_key(), drift.action.value


def _full_key(drift: Drift) -> tuple[object, ...]:
    # repr() only orders ties; it is never printed (it would show a SecretValue's digest).
    return (
        drift.sort_key(),
        drift.action.value,
        repr(drift.desired),
        repr(drift.observed),
        drift.source or "",
        drift.note or "",
    )
