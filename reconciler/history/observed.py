"""Observations made comparable across runs: what `reconcile diff` gives deepdiff. Pure.

A box's observation (a snapshot's box file: the collector's JSON and the controller's probes)
is reduced to what a person would call a change:
- every keyed digest (`hmac:<hex>`, anywhere in a value) becomes `***`: digests are keyed per
  run, so they differ between any two runs, and a diff must never print one anyway;
- a value in clear under a secret name (an environment's `HF_TOKEN`, a `.env` line's or a
  login export's value, the word after `--api-key` or `--api-key=...` on a command line)
  becomes `***` too, as the reports mask it: the collector hashes them on the box, but an
  edited or older snapshot may carry one; and an `error` text is scrubbed as reports scrub it;
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
    """`doc` with digests and clear secrets masked, volatile values dropped, and named lists
    keyed."""
    if isinstance(doc, dict):
        if set(doc) == {"secret"} and isinstance(doc["secret"], str):
            return SECRET  # a hashed value, as the collector writes it: {"secret": digest}
        return {k: _under(k, v) for k, v in doc.items() if k not in VOLATILE}
    if isinstance(doc, list):
        keyed = _keyed(doc)
        if keyed is not None:
            return keyed
        return _argv([comparable(v) for v in doc])
    if isinstance(doc, str):
        return _DIGEST.sub(SECRET, doc)
    return doc


def _under(key: Any, value: Any) -> Any:
    """`value`, kept under `key`, made comparable: masked when the key names a secret."""
    from reconciler.report.values import secret_path

    if isinstance(key, str) and key and secret_path(key):
        if isinstance(value, str | int | float) and value != "" and not isinstance(value, bool):
            return SECRET
        if isinstance(value, dict) and value.get("value") not in (None, ""):
            value = {**value, "value": SECRET}  # a .env line's or a login export's value
    elif key in ("error", "source") and isinstance(value, str):  # free text from the box
        from reconciler.scrub import scrub_text

        value = scrub_text(value)
    return comparable(value)


def _argv(tokens: list[Any]) -> list[Any]:
    """A command line's secret flags' values masked: `--api-key WORD`, `--api-key=WORD`."""
    from reconciler.report.values import secret_path

    out: list[Any] = []
    masking = False
    for token in tokens:
        if masking and isinstance(token, str):
            out.append(SECRET)
            masking = False
            continue
        masking = False
        if isinstance(token, str) and token.startswith("-") and len(token) > 1:
            flag, equals, _ = token.partition("=")
            if secret_path(flag):
                if equals:
                    token = f"{flag}={SECRET}"
                else:
                    masking = True
        out.append(token)
    return out


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
                out[seen] = _under(name, item)  # a .env line keyed HF_TOKEN: its value masked
            return out
    return None
