"""`--since`: a UTC date or time, or an age ("90m", "6h", "7d") counted back from now."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

_AGE = re.compile(r"(\d+)([smhdw])", re.ASCII)  # ASCII digits: int() reads each of them
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# No store holds a run this old (it keeps 30 days by default); a larger age, 300 digits of it,
# overflowed the float it is subtracted from (an OverflowError, not a usage error).
MAX_AGE_S = 100 * 366 * 86400


def parse_since(text: str, now: float | None = None) -> float:
    """Epoch seconds; ValueError saying what is accepted."""
    age = _AGE.fullmatch(text.strip())
    if age:
        digits, unit = age[1].lstrip("0") or "0", age[2]
        # Compared by length first: int() refuses past 4,300 digits, and a float overflows.
        if len(digits) > 12 or int(digits) * _UNIT_S[unit] > MAX_AGE_S:
            raise ValueError(f"expected an age of at most 100 years ({MAX_AGE_S // 86400}d)")
        return (time.time() if now is None else now) - int(digits) * _UNIT_S[unit]
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            "expected a UTC date or time (2026-11-30, 2026-11-30T18:00) or an age (90m, 6h, 7d)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # the history's times are UTC; so is a bare one
    return when.timestamp()
