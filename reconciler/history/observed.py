"""Observations made comparable across runs: what `reconcile diff` gives deepdiff. Pure.

A box's observation (a snapshot's box file: the collector's JSON and the controller's probes)
is reduced to what a person would call a change:
- every keyed digest (`hmac:<hex>`, anywhere in a value) becomes `***`: digests are keyed per
  run, so they differ between any two runs, and a diff must never print one anyway;
- a value in clear under a secret name (an environment's `HF_TOKEN`, whatever its type, a
  `.env` line's or a login export's value, the word after `--api-key` or `--api-key=...` on a
  command line) becomes `***` too, as the reports mask it (masking.py's rules): the
  collector hashes them on the box, but an edited or older snapshot may carry one; and an
  `error` text is scrubbed as reports scrub it;
- what changes on every run is dropped: timings (`ms`, `timings_ms`, `elapsed_s`), the
  collector's clock (`time`) and the page cache's momentary sizes (`meminfo`);
- lists whose order means nothing are keyed by name: containers by name, images by id,
  `.env` lines by key, so a recreated container is one changed `id`, not a shifted list;
- what deepdiff could not compare in reasonable time or stack is compared whole: a part
  nested deeper than MAX_DEPTH levels (no observation nests more than ten) and a list longer
  than LONG_LIST items (difflib's ordered compare is quadratic: 16,000 words took 15 s) each
  become one opaque value, their digest, so a change is still one change.
"""

from __future__ import annotations

from typing import Any

from reconciler.history import masking

SECRET = masking.MASK
_DIGEST = masking.DIGEST
# Keys whose values differ on every run, wherever they occur.
VOLATILE = frozenset({"ms", "timings_ms", "elapsed_s", "time", "meminfo"})
MAX_DEPTH = masking.MAX_DEPTH  # an observation nests ~10 levels; deeper parts compared whole
LONG_LIST = 1000  # longer lists are compared whole (a compose command is a few dozen words)


def comparable(doc: Any, depth: int = 0) -> Any:
    """`doc` with digests and clear secrets masked, volatile values dropped, and named lists
    keyed."""
    if depth >= MAX_DEPTH and isinstance(doc, dict | list):
        return opaque(doc, f"nested past {MAX_DEPTH} levels")
    if isinstance(doc, dict):
        if masking.hashed(doc):
            return SECRET  # a hashed value, as the collector writes it: {"secret": digest}
        return {k: _under(k, v, depth + 1) for k, v in doc.items() if k not in VOLATILE}
    if isinstance(doc, list):
        keyed = _keyed(doc, depth)
        if keyed is not None:
            return keyed
        out = masking.argv([comparable(v, depth + 1) for v in doc])
        return opaque(out, f"{len(out)} items") if len(out) > LONG_LIST else out
    if isinstance(doc, str):
        # A secret inside a value under a plain name (`VLLM_EXTRA='--api-key x'`), as the
        # store masks it: `diff --from-snapshot` compares snapshots never stored.
        doc = masking.masked_value(doc)
        return _DIGEST.sub(SECRET, doc) if "hmac:" in doc else doc
    return doc


opaque = masking.opaque  # a part compared whole: what it is and a digest of its JSON


def _under(key: Any, value: Any, depth: int) -> Any:
    """`value`, kept under `key`, made comparable: masked when the key names a secret (a
    record's metadata, a `.env` line's `line`, stays readable)."""
    if key not in masking.COLLECTOR_FIELDS and masking.secret_name(key):
        if isinstance(value, dict):  # a record (an audit probe's): its timings dropped too
            value = {k: v for k, v in value.items() if k not in VOLATILE}
        return masking.under_secret(
            key, value, lambda field, item: _under(field, item, depth + 1), lambda _: SECRET
        )
    if key in ("error", "source") and isinstance(value, str):  # free text from the box
        value = masking.scrubbed(value)
    return comparable(value, depth)


def _keyed(items: list[Any], depth: int) -> dict[str, Any] | None:
    field = masking.keyed_by(items)
    if field is None:
        return None
    out: dict[str, Any] = {}
    repeats: dict[str, int] = {}  # per label, the last number given: no rescans
    for item in items:
        name = item[field]
        label = _DIGEST.sub(SECRET, name)
        seen = label
        while seen in out:  # the same name twice (a .env key set twice): both kept
            repeats[label] = repeats.get(label, 1) + 1
            seen = f"{label}#{repeats[label]}"
        out[seen] = _under(name, item, depth + 1)  # a .env line keyed HF_TOKEN: masked
    return out
