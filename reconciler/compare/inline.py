"""Values that carry a secret inline: `VLLM_ARGS=--api-key sk-...`, `CURL_HDR=Bearer x`. Pure.

A key that is no secret may still hold one inside its value. The collector hashes such a
secret in place (`--api-key {"secret": "hmac:..."}`), in a `.env` line as in a container's
environment, with the run's key, which the controller never holds. So a desired value in
clear cannot be masked here to compare with the line: the box masks the managed keys' desired
values too (the answer's `envfile_desired`), and the line is compared with that. A snapshot
replayed against another desired state holds the masks of the values it was taken against:
one is used only when its text outside the secrets is the desired value's (`fits`).

What a drift shows of such a value is never the secret: a hashed one as `***` (the reports'
guard masks the inline form), a clear one (a snapshot saved by an older collector) as an
opaque SecretValue keyed by this process. Stdlib only: every drift comparison imports it.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import itertools
import os
import re
from collections.abc import Sequence

from reconciler.compare.drift import LOCAL_DIGEST
from reconciler.observe.document import EnvValue, Observed, SecretValue
from reconciler.scrub import holds_any_folded, mask_assignments, mask_userinfo, secret_flag

# The collector's inline form of a hashed secret, exactly as its json_dumps writes it.
_MARK = '{"secret": "hmac:'
_HASHED = re.compile(r'\{"secret": "hmac:[0-9a-f]{64}"\}')
# A flag and its value (`--hf-token=x`, `--api-key x`), as the collector's `_inline_secrets`
# reads one: a flag that is not inside a longer word, then `=` or blanks and a word that is no
# flag; whether the flag names a secret is `_secret_flag`'s.
_FLAG = re.compile(r"(?<![A-Za-z0-9_-])--([A-Za-z0-9_][A-Za-z0-9_-]*)(?:=|\s+)(?!--)\S")
# `Bearer x`, `Authorization: x` (the collector's `_may_credential` markers).
_CREDENTIAL_WORDS = ("BEARER", "AUTHORIZATION")  # looked for first, without re
_CREDENTIAL = re.compile(r"(?i)(?<![a-z0-9])(?:bearer\s+\S|authorization[\"']?\s*[:=]\s*\S)")
# Where a hashed secret sat in the clear value: what the collector's `_value_span` and
# `mask_assignments` take for a value, a quoted text, the inside of quotes, or a run up to a
# blank, a quote or one of `,;)}`. Each is taken whole as the box takes it (an atomic group,
# possessive runs): no backtracking, so a box's mask costs a linear match whatever it holds.
_SECRET_PLACE = r"""(?>"[^"]*+"|'[^']*+'|(?<=")[^"]++(?=")|(?<=')[^']++(?=')|[^\s,;)}'"]++)"""
# A URL's password (the collector's `_url_passwords`): after `scheme://user:`, up to the
# authority's last `@` (an `@` is taken only while another follows before the authority ends).
# The scheme only where a run of scheme characters starts (the lookbehind): searched without
# it, every position of a long run was a start scanned to its end (a box's 64 KB value of
# letters made `fits` quadratic: minutes). The user may hold `@` (`me@corp.com:pw@proxy`:
# the user info ends at the authority's last `@`), and the password a quote (RFC 3986).
_URL_USER = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#:'\"]*:\Z")
_URL_PASSWORD = r"""(?:[^\s/?#@]|@(?=[^\s/?#@]*+@))++"""
_MOST_SECRETS = 8  # per value: a mask with more is from no desired state (it is not compared)
# Clear values are made opaque with a key of this process: equal values stay equal within one
# report (changed/unchanged reads right), and nothing can be matched across runs.
_KEY = os.urandom(32)


def hashed_inline(value: object) -> bool:
    """A text holding a secret the collector hashed in place."""
    return type(value) is str and _MARK in value


def fits(masked: str, plain: str) -> bool:
    """Whether `masked` (the box's mask of some value) is `plain` with secrets hashed: the text
    between its hashed secrets is `plain`'s, and each secret's place in `plain` holds what the
    collector takes for one (`_value_span`, `mask_assignments`): a quoted text, the inside of
    quotes, or a run without blanks and `,;)}`. So a desired value edited beside its secret
    (`--api-key x` -> `--api-key x --port 9`) does not fit the mask of the old one."""
    runs = _HASHED.split(masked)
    if len(runs) == 1:
        return masked == plain
    if len(runs) > _MOST_SECRETS + 1 or not all(runs[1:-1]):
        # More secrets than a value holds, or two with nothing between them: no mask the
        # collector makes (a value is followed by a blank, a quote, a flag or a name).
        return False
    pattern = re.escape(runs[0])
    for before, after in itertools.pairwise(runs):
        in_url = after.startswith("@") and _URL_USER.search(before) is not None
        pattern += (_URL_PASSWORD if in_url else _SECRET_PLACE) + re.escape(after)
    return re.fullmatch(pattern, plain, re.DOTALL) is not None


def desired_value(doc: Observed, key: str, value: str) -> str:
    """What `.env`'s line of managed `key` is compared with: the box's mask of the desired
    `value` where the answer has one for it, else `value` itself."""
    masked = doc.envfile_desired.get(key) if doc.envfile_desired else None
    return masked if masked is not None and fits(masked, value) else value


def may_carry_secret(text: str) -> bool:
    """Whether a clear text may hold a secret the collector would hash inline: a flag named
    like a secret with a value, a credential after `Bearer`/`Authorization`, an assignment to
    a secret name. Judged more widely than the box does: it only hides, never compares."""
    if "--" in text:
        for found in _FLAG.finditer(text):
            if _secret_flag(found.group(1)):
                return True
    if holds_any_folded(text, _CREDENTIAL_WORDS) and _CREDENTIAL.search(text):
        return True
    if "://" in text and mask_userinfo(text) != text:
        return True  # a URL's password (`http://user:pw@proxy`)
    return ("=" in text or ":" in text) and mask_assignments(text) != text


def _secret_flag(name: str) -> bool:
    """The collector's `secret_flag` (scrub.secret_flag, the one rule): a flag whose last word
    names a credential (`--token`, `--api-key`) or whose name a secret pattern names, never one
    of vLLM's that only reads like one (`--allow-credentials`)."""
    return secret_flag("--" + name)


def concealed(value: EnvValue | None) -> EnvValue | None:
    """`value` as a drift may carry it: a text holding a secret (hashed inline, or in clear)
    as an opaque SecretValue; anything else as it is."""
    if type(value) is not str:
        return value
    if _MARK in value:  # holds only the box's digests: nothing to hash again
        return SecretValue(value)
    if may_carry_secret(value):
        return _local(value)
    return value


def _local(value: str) -> SecretValue:
    """A clear value as a digest keyed by this process (LOCAL_DIGEST: the reports know it is
    comparable with another such digest only, never with the box's: compare/drift.py)."""
    return SecretValue(LOCAL_DIGEST + hmac.new(_KEY, value.encode(), hashlib.sha256).hexdigest())


def shown(
    desired: EnvValue | None, observed: EnvValue | None
) -> tuple[EnvValue | None, EnvValue | None]:
    """(desired, observed) of a drift on a value that may carry a secret inline. Two hashed
    texts that differ outside their secrets are kept (the reports show each secret as `***`
    in place, and what else changed); otherwise each text holding a secret becomes a
    SecretValue, so the drift reads `***` and whether the secret `changed`."""
    if hashed_inline(desired) and hashed_inline(observed):
        assert isinstance(desired, str) and isinstance(observed, str)
        if _HASHED.sub("", desired) != _HASHED.sub("", observed):
            return desired, observed
    return concealed(desired), concealed(observed)


def conceal_clear(value: EnvValue | None) -> EnvValue | None:
    """`value` with a secret it carries in clear made opaque; a hashed one (`***` in every
    report) and anything else as it is."""
    if type(value) is str and _MARK not in value and may_carry_secret(value):
        return concealed(value)
    return value


# -- a lane's knobs on the command line (compare/composefiles.py's dead knobs) ------------------
# The render's command is masked on the box word by word (the collector's `mask_argv`): a bare
# flag named like a secret hides the words after it whole, up to the next flag (`{"secret":
# ...}` each, SecretValues here: vLLM's --api-key takes several),
# `--hf-token=x` keeps its flag name, any other word has its inline secrets hashed in place.
# So a knob whose desired value carries a secret is compared with the box's mask of its words
# (the answer's `knobs_desired`), asked for by the payload's `knob_argv`.


@functools.lru_cache(maxsize=4096)
def knob_may_carry_secret(knob: str, words: tuple[str, ...]) -> bool:
    """Whether a knob's desired value `knob` (its command-line `words`, knob_tokens') may hold
    a secret the box hashes: judged on the text as written and on the words lexed (quotes
    gone), more widely than the box does. Remembered per value: a fleet's boxes share them."""
    if not (
        "--" in knob or "=" in knob or ":" in knob or "earer" in knob or "EARER" in knob
    ):  # a window, a dtype, a name: no regex for them
        return False
    return may_carry_secret(knob) or may_carry_secret(" ".join(words))


def fits_argv(masked: Sequence[EnvValue], plain: Sequence[str]) -> bool:
    """Whether `masked` (the box's mask of some knob's words) is `plain` with its secrets
    hashed, word by word: a word the box hid whole stands for a word that is no flag, and a
    word holding hashed secrets `fits` its clear one. A snapshot replayed against another
    desired value holds the mask of the old one, which then does not fit."""
    if len(masked) != len(plain):
        return False
    for mask, word in zip(masked, plain, strict=True):
        if type(mask) is str:
            if mask != word and not (_MARK in mask and fits(mask, word)):
                return False
        elif word.startswith("--"):  # the box hides a flag's value, never a flag
            return False
    return True


def shown_flag(
    flag: str, desired: EnvValue | bool | None, observed: EnvValue | bool | None
) -> tuple[EnvValue | bool | None, EnvValue | bool | None]:
    """(desired, observed) of a flag of a knob that may carry a secret, as a drift may carry
    them: the value of a flag named like a secret (`--api-key sk-x`) is the secret itself,
    with nothing in it that `may_carry_secret` could tell, so it is always opaque; any other
    value as `shown` has it."""
    if _secret_flag(flag.removeprefix("--")):
        return _opaque(desired), _opaque(observed)
    want = desired if not isinstance(desired, bool) else None
    seen = observed if not isinstance(observed, bool) else None
    want_shown, seen_shown = shown(want, seen)
    return (
        desired if isinstance(desired, bool) else want_shown,
        observed if isinstance(observed, bool) else seen_shown,
    )


def _opaque(value: EnvValue | bool | None) -> EnvValue | bool | None:
    if type(value) is not str:
        return value  # a SecretValue (hidden on the box), a bare flag, absent
    if _MARK in value:
        return SecretValue(value)
    return _local(value)
