"""Values as people read them (text and markdown; JSON keeps types and lives elsewhere).

Everything printed here came from a box, so it is untrusted: control characters are escaped
(an ESC sequence in a container's env must not repaint the operator's terminal), and a secret is
`***` wherever it sits, top level or inside a tuple, or inside a word: assigned (`HF_TOKEN=***`),
after a flag named like a secret or named by the fleet's `secret_patterns` (`--api-key ***`,
`--hf-token=***`, `--db-cred ***`) or after `Bearer` or a credential header
(`Authorization: Bearer ***`).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import re
import shlex
from collections.abc import Mapping
from enum import Enum
from typing import Any

from reconciler.compare.drift import (
    GUARD_DIGEST,
    BoxResult,
    Drift,
    DriftReport,
    SecretValue,
    Value,
    comparable,
)
from reconciler.desired.secret_names import is_fleet_secret_name, when_patterns_change
from reconciler.records import replace
from reconciler.scrub import (
    PLAIN_FLAGS,
    flag_values,
    mask_assignments,
    mask_credentials,
    scrub_text,
    secret_flag,
)

MASK = "***"
FREE_TEXT_LIMIT = 1000  # a finding's message may be long; an error is cut sooner by its maker
ABSENT = "(absent)"  # desired None: must not exist; observed None: missing
ELLIPSIS = "…"

# The collector's digest as it travels ("hmac:" + hex). Compare turns `{"secret": digest}` into a
# SecretValue; if one ever slips through inside a string or a dict, reports still mask it.
_WIRE_DIGEST = re.compile(r"hmac:[0-9a-fA-F]{16,}")
# The collector's digest of a value assigned inside a command word (`HF_TOKEN={"secret":
# "hmac:…"}`, the form of an inline flag's): the guard shows it as `HF_TOKEN=***`.
_WIRE_FORM = re.compile(r'\{"secret": "[^"]*"\}')


# Clear values under a secret name are masked with a key of this process: equal values give
# equal digests within one report (changed/unchanged still reads right), nothing across runs.
_GUARD_KEY = os.urandom(32)  # secrets.token_bytes(32), without importing secrets


def guarded(report: DriftReport) -> DriftReport:
    """The report with every clear value under a secret-named path masked, and every assignment
    to a secret name inside any drift's string values (`HF_TOKEN=x` as a command's word, a
    `bash -c` script's `export KEY=x`) shown as `NAME=***`, so is the value of a secret flag or
    credential header there (`--api-key ***`, `Bearer ***`), a flag the fleet's own
    `secret_patterns` name included (`--db-cred ***`: scrub.named_flag, judged as the collector
    judges it): the collector hashes them on the box, but a snapshot saved by an older collector
    or with a narrower list, or an edited one, could still carry one. Reports say `***`
    whatever they were given.

    Only what masking changes is rebuilt: most drifts under a secret path already carry a
    digest, absence or "" (a 1,000-box report has ~7,000 such, each rebuilt for nothing
    before), so a report with nothing to mask is returned as it was."""
    boxes = [guarded_box(box) for box in report.boxes]
    if all(new is old for new, old in zip(boxes, report.boxes, strict=True)):
        return report
    return replace(report, boxes=tuple(boxes))


def guarded_box(box: BoxResult) -> BoxResult:
    """One box of `guarded`: itself when it has nothing to mask. Its facts are masked as its
    drift is: a fact can be the box's own words (the gateway's /health `version` string, which
    a box can make `0.9 Authorization: Bearer x`), printed by JSON and markdown."""
    drifts: list[Drift] | None = None  # made at the first drift masking changes
    for at, drift in enumerate(box.drifts):
        new = _guard(drift) if secret_path(drift.path) else _guard_words(drift)
        if new is not drift:
            if drifts is None:
                drifts = list(box.drifts)
            drifts[at] = new
    facts = _guarded_facts(box.facts)
    if drifts is None and facts is box.facts:
        return box
    if drifts is None:
        return replace(box, facts=facts)
    return replace(box, drifts=tuple(drifts), facts=facts)


def _guarded_facts(facts: dict[str, Any]) -> dict[str, Any]:
    """The facts with every value masked as a drift's under the same name would be (a fact
    named like a secret whole, any other's secret words): the same dict when nothing was."""
    out: dict[str, Any] | None = None
    for name, value in facts.items():
        new = _masked(value) if secret_path(str(name)) else _words(value)
        if new is not value:
            if out is None:
                out = dict(facts)
            out[name] = new
    return facts if out is None else out


# Remembered (bounded): a fleet's drifts share a few paths, asked about by every box's report,
# a replay's workers each asking for their own boxes.
@functools.lru_cache(maxsize=4096)
def secret_path(path: str) -> bool:
    """Whether a value under this path is a secret: "HF_TOKEN", "env.HF_TOKEN", "--hf-token",
    "--token", the variable or flag it belongs to. A flag by the rule the collector hashes by
    (scrub.secret_flag: its last word names a credential, `--token`, `--key`, or the patterns
    name it, `--db-cred` under `*_CRED`; never `--allow-credentials`, a switch): the value of
    `--token x` in a container's command is a drift under `--token`."""
    last = path.rsplit(".", 1)[-1]
    if last[:1] != "-":
        return is_fleet_secret_name(last)
    if last in PLAIN_FLAGS:
        return False
    return secret_flag(last) or is_fleet_secret_name(last.lstrip("-").replace("-", "_").upper())


when_patterns_change(secret_path.cache_clear)


def _guard(drift: Drift) -> Drift:
    """A drift under a secret path, its clear values masked (itself if there were none)."""
    desired, observed = _masked(drift.desired), _masked(drift.observed)
    if desired is drift.desired and observed is drift.observed:
        return drift
    return replace(drift, desired=desired, observed=observed)


def _masked(value: Value) -> Value:
    # A digest as it travels, alone, is masked below (`scrub`); a clear value holding one is not
    # a digest, it is masked here as a whole.
    if isinstance(value, str) and value and not _WIRE_DIGEST.fullmatch(value):
        return SecretValue(
            GUARD_DIGEST + hmac.new(_GUARD_KEY, value.encode(), hashlib.sha256).hexdigest()
        )
    if isinstance(value, tuple | list):
        masked = tuple(_masked(v) for v in value)
        # a tuple with nothing to mask stays the same object: _guard then keeps its drift
        same = type(value) is tuple and all(m is v for m, v in zip(masked, value, strict=True))
        return value if same else masked
    return value


def _guard_words(drift: Drift) -> Drift:
    """A drift under any other path, each assignment to a secret name inside its values masked
    (`HF_TOKEN=x` as a command's word, `export GATEWAY_API_KEY=x; exec "$@"` as a script's):
    itself if there were none."""
    desired, observed = _words(drift.desired), _words(drift.observed)
    if desired is drift.desired and observed is drift.observed:
        return drift
    return replace(drift, desired=desired, observed=observed)


def _words(value: Value) -> Value:
    """A string or a tuple of strings with its secret assignments, flags and credentials masked
    (the same object when there were none); any other value as it is."""
    if type(value) is str:
        # An assignment needs its `=` or `:`, a flag its `-`, a credential its `Bearer` (or a
        # header's `:`/`=`): most values have none of them, and `in` is cheap.
        if (
            "=" not in value
            and ":" not in value
            and "-" not in value
            and "earer" not in value
            and "EARER" not in value
        ):
            return value
        return read_text(value) or value  # "": nothing to mask
    if type(value) is tuple:
        try:
            words = _read_words(value)
        except TypeError:  # an item that cannot be hashed: read without the cache
            words = _masked_words(value)
        return value if words is None else words
    return value


def _masked_words(value: tuple[object, ...]) -> tuple[object, ...] | None:
    """A tuple of words, each masked as a string is and each value of a secret flag given as
    the next word (`'--api-key', 'x'`) masked too: None when there was nothing to mask."""
    words = [_words(v) if type(v) is str else v for v in value]
    for i in flag_values(value):
        words[i] = MASK
    if all(w is v for w, v in zip(words, value, strict=True)):
        return None
    return tuple(words)


# A string longer than this is read without the cache. One that long is a box's own (its desired
# LOBES_MESH_SEEDS name every other member: 30 KB at 1,000 boxes, a different one each box), met
# once: kept here, 8,192 of them were what a replay's memory grew by as the square of the fleet
# (25 MB at 1,000 boxes, one process; issue 12). Its reading costs what it would have anyway.
_CACHED_UP_TO = 1024


def read_text(text: str) -> str:
    """`text` with what the reports' guard masks masked, or "" when there is nothing to mask."""
    return _read(text) if len(text) <= _CACHED_UP_TO else _masked_text(text)


def _masked_text(text: str) -> str:
    out = _WIRE_FORM.sub(MASK, text) if '{"secret"' in text else text
    out = mask_credentials(mask_assignments(out))
    return "" if out == text else out


# Each distinct string read once (bounded: a box chooses its values, each at most _CACHED_UP_TO
# long), as its masked text or "" when there is nothing to mask: a fleet's boxes share their
# command lines and values.
_read = functools.lru_cache(maxsize=8192)(_masked_text)


when_patterns_change(_read.cache_clear)


# The same for a tuple of words (a command line): a fleet's boxes share theirs.
_read_words = functools.lru_cache(maxsize=4096)(_masked_words)
when_patterns_change(_read_words.cache_clear)


# Exact types that are neither a SecretValue nor a Mapping (a subclass still takes the checks).
_NEVER_SECRET = frozenset({str, int, float, bool, type(None), tuple})


def as_secret(value: object) -> SecretValue | None:
    """A SecretValue; or a mapping with a `secret` key (the collector's wire form
    `{"secret": digest}`, or anything shaped like it), as one: better masked than printed."""
    if type(value) in _NEVER_SECRET:  # most values: answered before the ABC check below
        return None
    if isinstance(value, SecretValue):
        return value
    if isinstance(value, Mapping) and "secret" in value:
        if set(value) == {"secret"} and isinstance(value["secret"], str):
            return SecretValue(value["secret"])
        return SecretValue(repr(sorted(value.items(), key=lambda kv: str(kv[0]))))
    return None


def scrub(text: str) -> str:
    # The pattern starts with this literal: without it there is nothing to replace, and `in`
    # is cheaper than the regex machinery (a report scrubs every field of every drift).
    return _WIRE_DIGEST.sub(MASK, text) if "hmac:" in text else text


def free_json(text: str) -> str:
    """A free-text field (an error, a finding, a reason, a note) as JSON keeps it: through the
    scrubber (reconciler/scrub.py) whoever made it, the last line of defence of every report."""
    return scrub(scrub_text(text, limit=FREE_TEXT_LIMIT))


def free_text(text: str) -> str:
    """A free-text field for a terminal or markdown: scrubbed, then cleaned."""
    return clean(free_json(text))


def clean(text: str) -> str:
    """Escape what a terminal or a markdown table would interpret as layout or control."""
    text = scrub(text)
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def display(value: object) -> str:
    if as_secret(value) is not None:
        return MASK
    if value is None:
        return ABSENT
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return clean(str(value.value))
    if isinstance(value, str):
        # Quoted when blank or edged with blanks: `8192 ` against `8192` is a difference, and
        # bare it would read as none (as "" reads as the empty value, not as nothing shown).
        if not value or value[0].isspace() or value[-1].isspace():
            return '"' + clean(value) + '"'
        return clean(value)
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, tuple | list):
        # An argv or a -f chain reads best the way a shell would take it.
        if value and all(isinstance(v, str) for v in value):
            return clean(shlex.join(value))
        return "[" + ", ".join(display(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{display(k)}: {display(v)}" for k, v in value.items()) + "}"
    return clean(str(value))


def is_secret(drift: Drift) -> bool:
    """Whether either side is a secret, also seeing the wire form."""
    return as_secret(drift.desired) is not None or as_secret(drift.observed) is not None


def secret_changed(drift: Drift) -> bool | None:
    """`Drift.secret_changed`, also seeing the wire form: None when neither side is a secret,
    or when the two cannot be compared (a box's digest against this process's digest of a
    clear value: compare/drift.py `comparable`), which is no "unchanged" either."""
    desired, observed = as_secret(drift.desired), as_secret(drift.observed)
    if desired is None and observed is None:
        return None
    if not comparable(desired, observed):
        return None
    return desired != observed  # a secret against a plain value or (absent) has changed


NOT_COMPARABLE = "not comparable"


def secret_tag(drift: Drift) -> str | None:
    """`changed` / `unchanged` for a secret (digests differ or not), `not comparable` for one
    whose digests cannot say; None when neither side is a secret."""
    desired, observed = as_secret(drift.desired), as_secret(drift.observed)
    if desired is None and observed is None:
        return None
    if not comparable(desired, observed):
        return NOT_COMPARABLE
    return "changed" if desired != observed else "unchanged"


def abbreviate_pair(desired: str, observed: str, limit: int) -> tuple[str, str]:
    """Cut two long values to about `limit` characters, keeping where they first differ.

    A speculative config or a digest-pinned image ref differs somewhere in the middle or at the
    end; cutting both at the same offset keeps the differing part in view and aligned.
    """
    if len(desired) <= limit and len(observed) <= limit:
        return desired, observed
    common = 0
    for a, b in zip(desired, observed, strict=False):
        if a != b:
            break
        common += 1
    start = max(0, common - limit // 4)
    return _window(desired, start, limit), _window(observed, start, limit)


def _window(text: str, start: int, limit: int) -> str:
    if len(text) <= limit:  # a short value is shown whole, even beside a long one
        return text
    start = min(start, max(0, len(text) - limit))
    cut = text[start : start + limit]
    if start > 0:
        cut = ELLIPSIS + cut[1:]
    if start + limit < len(text):
        cut = cut[:-1] + ELLIPSIS
    return cut
