"""The one order every report uses, so two runs over the same fleet diff line by line.

Boxes keep the report's order (the inventory's); causes group the ordered drifts
(report/grouped.py). Drifts follow `Drift.sort_key`; ties (the same
box, kind, subject and path twice) are broken on the remaining fields, because `sorted` is only
stable, and a tie left to input order would make the output depend on how compare happened to
emit it.
"""

from __future__ import annotations

from collections.abc import Iterable

from reconciler.compare.drift import Drift


def ordered_drifts(drifts: Iterable[Drift]) -> list[Drift]:
    return sorted(drifts, key=_full_key)


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
