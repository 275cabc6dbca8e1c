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
- what changes on every run is dropped, only where it is (`_settled`; a container's
  variable named `time` is compared): the box file's `elapsed_s`, the collector's clock
  (`time`), timings (`timings_ms`) and the page cache's momentary sizes (`meminfo`), a
  probe's `ms`, and in a lane's `/v1/models` body what vLLM makes anew for each request (a
  model card's `created`, its `permission` entries' `id` and `created`);
- what a `--save-snapshot` run adds for its replays is dropped: each render's `basis` (a
  digest of the `.env` with this run's keyed digests of its secrets: another on every run;
  the `.env` is compared as `envfile`) and the render of the box's own `.env`
  (`render_current`, `render_login_current`: only a saving run has one, only when the `.env`
  differs from the desired one; made from the `.env`, the compose files and the login
  shell, each compared on its own), so a saving run and a plain one compare alike;
- the controller's digests of desired secrets (`controller.inline_masks`, keyed with its
  persistent key: observe/snapshot_key.py) become `***`, their names kept: no digest is
  printed;
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
# What differs on every run, each only where it is (`_settled`): a key of that name anywhere
# else (a container's variable `time`, a `.env` key `ms`) is compared.
BOX_VOLATILE = frozenset({"elapsed_s"})  # the box file's own: how long the controller waited
COLLECTOR_VOLATILE = frozenset({"time", "timings_ms", "meminfo"})  # the collector's answer's
PROBE_VOLATILE = "ms"  # a probe's record ({"status": ..., "ms": ...}): its timing
# vLLM's ModelCard and ModelPermission (entrypoints/openai protocol) default `created` to
# int(time.time()) and the permission's `id` to `modelperm-<random uuid>`, made for each
# `GET /v1/models`: a lane's body differs there on every probe.
CARD_VOLATILE = frozenset({"created"})
PERMISSION_VOLATILE = frozenset({"id", "created"})
MASKS = masking.MASK_DIGESTS  # the controller's digests of desired secrets (snapshot_key.py)
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
        if depth == 0:
            doc = _settled(doc)
        return {k: _under(k, v, depth + 1) for k, v in _untimed(doc).items()}
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
        if isinstance(value, dict):  # a record (an audit probe's): its timing dropped too
            value = _untimed(value)
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


def _settled(doc: dict[str, Any]) -> dict[str, Any]:
    """A box file without what differs on every run, or only on a saving run, at the places
    it is (module docstring); copies only what it changes."""
    out = {k: v for k, v in doc.items() if k not in BOX_VOLATILE}
    collected = out.get("collected")
    if isinstance(collected, dict):
        kept = {
            k: v for k, v in collected.items() if k not in COLLECTOR_VOLATILE and not _own_render(k)
        }
        for name, render in kept.items():
            if _render(name) and isinstance(render, dict) and "basis" in render:
                kept[name] = {k: v for k, v in render.items() if k != "basis"}
        lanes = kept.get("lanes")
        if isinstance(lanes, dict):
            kept["lanes"] = {lane: _lane_probe(probe) for lane, probe in lanes.items()}
        out["collected"] = kept
    controller = out.get("controller")
    if isinstance(controller, dict) and MASKS in controller:
        out["controller"] = {**controller, MASKS: masking.hidden_masks(controller[MASKS])}
    return out


def _render(name: Any) -> bool:
    return isinstance(name, str) and name.startswith("render")


def _own_render(name: Any) -> bool:
    """A saving run's render of the box's own `.env` (`render_current`, ...)."""
    return _render(name) and name.endswith("_current")


def _untimed(record: dict[str, Any]) -> dict[str, Any]:
    """`record` without its timing when it is a probe's (an HTTP status or None, a number of
    milliseconds): an environment's `ms` is a string, and compared."""
    ms = record.get(PROBE_VOLATILE)
    status = record.get("status", False)
    probe = type(ms) in (int, float) and (status is None or type(status) is int)
    return {k: v for k, v in record.items() if k != PROBE_VOLATILE} if probe else record


def _lane_probe(probe: Any) -> Any:
    """A lane's `/v1/models` probe with what vLLM makes for each request left out."""
    body = probe.get("body") if isinstance(probe, dict) else None
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        return probe
    return {**probe, "body": {**body, "data": [_card(card) for card in body["data"]]}}


def _card(card: Any) -> Any:
    if not isinstance(card, dict):
        return card
    out = {k: v for k, v in card.items() if k not in CARD_VOLATILE}
    permissions = out.get("permission")
    if isinstance(permissions, list):
        out["permission"] = [
            {k: v for k, v in p.items() if k not in PERMISSION_VOLATILE}
            if isinstance(p, dict)
            else p
            for p in permissions
        ]
    return out
