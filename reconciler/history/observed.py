"""Observations made comparable across runs: what `reconcile diff` gives deepdiff. Pure.

A box's observation (a snapshot's box file: the collector's JSON and the controller's probes)
is reduced to what a person would call a change:
- every keyed digest (`hmac:<hex>`, anywhere in a value) becomes `***`: digests are keyed per
  run, so they differ between any two runs, and a diff must never print one anyway;
- what changes on every run is dropped: timings (`ms`, `timings_ms`, `elapsed_s`), the
  collector's clock (`time`) and the page cache's momentary sizes (`meminfo`);
- lists whose order means nothing are keyed by name: containers by name, images by id,
  `.env` lines by key, so a recreated container is one changed `id`, not a shifted list.
"""

from __future__ import annotations

import re
from typing import Any

SECRET = "***"
_DIGEST = re.compile(r"hmac:[0-9a-f]{64}")
# Keys whose values differ on every run, wherever they occur.
VOLATILE = frozenset({"ms", "timings_ms", "elapsed_s", "time", "meminfo"})
# Lists of objects keyed by the first of these fields they hold.
_LIST_KEYS = ("name", "key", "id", "service")


def comparable(doc: Any) -> Any:
    """`doc` with digests masked, volatile values dropped, and named lists keyed."""
    if isinstance(doc, dict):
        if set(doc) == {"secret"} and isinstance(doc["secret"], str):
            return SECRET  # a hashed value, as the collector writes it: {"secret": digest}
        return {k: comparable(v) for k, v in doc.items() if k not in VOLATILE}
    if isinstance(doc, list):
        keyed = _keyed(doc)
        if keyed is not None:
            return keyed
        return [comparable(v) for v in doc]
    if isinstance(doc, str):
        return _DIGEST.sub(SECRET, doc)
    return doc


def _keyed(items: list[Any]) -> dict[str, Any] | None:
    if not items or not all(isinstance(i, dict) for i in items):
        return None
    for field in _LIST_KEYS:
        names = [i.get(field) for i in items]
        if all(isinstance(n, str) and n for n in names):
            out: dict[str, Any] = {}
            for name, item in zip(names, items, strict=True):
                label = _DIGEST.sub(SECRET, name)
                seen, n = label, 1
                while seen in out:  # the same name twice (a .env key set twice): both kept
                    n += 1
                    seen = f"{label}#{n}"
                out[seen] = comparable(item)
            return out
    return None
