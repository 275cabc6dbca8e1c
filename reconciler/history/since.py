"""`--since`: a UTC date or time, or an age ("90m", "6h", "7d") counted back from now."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

_AGE = re.compile(r"(\d+)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """Epoch seconds; ValueError saying what is accepted."""
    age = _AGE.fullmatch(text.strip())
    if age:
        return (time.time() if now is None else now) - int(age[1]) * _UNIT_S[age[2]]
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            "expected a UTC date or time (2026-11-30, 2026-11-30T18:00) or an age (90m, 6h, 7d)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # the history's times are UTC; so is a bare one
    return when.timestamp()
