"""Exception text made safe for a report: the one way an error string reaches an operator.

An exception's text is not ours: `http.client` quotes a header value it refused (`Invalid header
value b'Bearer <key>\\r\\n'`), h11 and httpx do the same, compose and ssh echo what they could not
parse. Every path that turns an exception or a program's stderr into a report field goes
through here:

- `exception_text(exc)` builds the text from the exception's *type* wherever that says enough
  (a refused connection, a timeout, a name that does not resolve, a TLS failure, a refused
  header), and only otherwise falls back to cleaning its message;
- `scrub_text(text)` cleans any free text: every secret value this process knows is masked,
  anything after `Bearer`/`Authorization`/`X-Api-Key`/`--api-key` is dropped, so is anything
  after a line break (a header line smuggled in by CR/LF), `NAME=value` of a secret-named
  variable keeps only its name, so does a secret-named flag (`--hf-token=x`, `--password x`),
  a URL's password (`http://user:pw@host`) becomes `***`, long random-looking runs (keys,
  tokens) become `***`, control characters go and the text is cut to one short line.

A flag is judged by one rule (`secret_flag`), the collector's too (`Run.secret_flag`): by its
last word (`--token`, `--hf-token`, `--client-secret`: `credential_flag`, `_FLAG_WORD` in a
text), or by the floor's and the fleet's own `secret_patterns` read as the collector reads a
flag (`--db-cred` -> `DB_CRED`: `named_flag`); never one of vLLM's own flags that only read
like one (`PLAIN_FLAGS`: `--allow-credentials` is a switch). The box hashes such a flag's value,
but a snapshot saved by an older collector, before a pattern was added, or edited, holds it in
clear, and every last guard (the reports' mask, the history store's, this scrub) must mask it
as the box would have.

The box programs (observe/remote/collector.py, apply/remote/converge.py) cannot import this
module (they are shipped alone, stdlib only); each carries a short copy of `scrub_text`, kept in
step by tests/unit/test_secret_boundaries.py.

Stdlib only and cheap to import: the repeated-drift path uses it.
"""

from __future__ import annotations

import errno as errno_names
import functools
import os
import re
from collections.abc import Callable, Iterable

from reconciler.desired.secret_names import (
    FLOOR,
    fleet_patterns,
    is_fleet_secret_name,
    when_patterns_change,
)

MASK = "***"
REDACTED = "[redacted]"
LIMIT = 300

# Secret values this process holds (a controller_env secret an apply sends): masked in every
# text scrubbed afterwards, whoever scrubs it.
_KNOWN: set[str] = set()
_SHORTEST = 4  # shorter "secrets" would mask ordinary words; they are refused upstream anyway

# Pattern sources, compiled by re (and cached there) on first use: importing this module costs
# nothing on a run that never scrubs.
# Headers that carry a credential, and the schemes that precede one in them.
_HEADERS = r"(?:proxy-)?authorization|x-api-key"
_SCHEMES = r"bearer|basic"
# A credential follows these: everything from the marker on is dropped.
_CREDENTIAL = (
    rf"(?i:\bbearer\b|\b(?:{_HEADERS})\b|--api-key\b|\bset-cookie\b"
    r"|\bcookie\s*[:=])|\bBasic\s+[A-Za-z0-9+/=]{8,}"
)
# The same credentials where a text is kept whole (a command line in a report): only the value
# goes, `Authorization: Bearer ***`, `X-Api-Key: ***`, `Bearer ***` (`mask_credentials`).
_HEADER_VALUE = rf"(?i:\b({_HEADERS})([\"']?\s*[:=]\s*(?:(?:{_SCHEMES})\s+)?))(?!\*\*\*)"
_SCHEME_VALUE = r"(?i:\b(bearer)(\s+))(?!\*\*\*)"  # `Basic` alone is a word of prose
# The value: quoted (all of it), or up to the next blank (`sk-abc;def` is one token: a `;` or
# `,` inside it ends nothing); a scheme word is never the value (`Authorization: Bearer 'x'`
# masks `'x'`, not `Bearer`). What closes around an unquoted value (`'... Bearer x'`, `x),`)
# is kept (`_mask_credential`).
_CLOSERS = "\"',;)}"
_CREDENTIAL_VALUE = rf"(?!(?i:{_SCHEMES})(?:[\s{_CLOSERS}]|$))('[^']*'|\"[^\"]*\"|\S+)"
# A line break, real or as repr() escapes it: what follows can be an injected header line.
_BREAK = r"[\r\n]|\\r|\\n"
# `NAME=value` first, then `NAME: value` (so `error: HF_TOKEN=x` reaches the HF_TOKEN). The
# colon form takes only a variable written in upper case: in prose a lower-case word before a
# colon is a label (`secret:gateway_api_key` names a secret, it does not hold one). The name may
# be a quoted mapping key (`{'HF_TOKEN': 'x'}`, `{"GATEWAY_API_KEY": "x"}`). Each is a name and
# its separator, then (`_VALUE`) the value: quoted, or up to a blank or one of `,;)}`. A name
# that holds no secret is passed over up to its separator only, so that its value is read too
# (`--env=HF_TOKEN=x`, `ERROR: {'HF_TOKEN': 'x'}`); every character is still read a bounded
# number of times.
_ASSIGNMENTS = (
    r"\b([A-Za-z_][A-Za-z0-9_]*)([\"']?\s*=\s*)",
    r"\b([A-Z_][A-Z0-9_]*)([\"']?\s*:\s*)",
    # A mapping's key in quotes of any case, given quoted text (`{"api_key": "x"}`, as the
    # collector's `mask_assignments` hashes it): a key, not a label. Given a list or a number
    # it holds no secret (`"classifier_from_token": ["no", "yes"]`).
    r"[\"']([A-Za-z_][A-Za-z0-9_]*)([\"']\s*:\s*)(?=[\"'])",
)
_VALUE = r"\"[^\"]*\"|'[^']*'|[^\s,;)}]+"
# The last words of a flag that names a credential (`--hf-token`, `--hf_token`, `--token`,
# `--client-secret`, `--db-password`, `--key`). Only the last word: `--max-num-batched-tokens`,
# `--tokenizer`, `--ssl-keyfile` hold no secret. The collector hashes these flags' values on the
# box and carries a copy (tests/unit/test_secret_boundaries.py keeps the copies equal).
CREDENTIAL_WORDS = ("token", "secret", "password", "passwd", "credentials", "credential", "key")
# vLLM's own flags that read like a credential's and hold none, whatever the rule above or the
# floor says (`*_CREDENTIALS` names `--allow-credentials`, `*_TOKEN` the count
# `--max-prompt-adapter-token` of vLLM < 0.10): the word after the switch is no secret (it is
# the model, `vllm serve --allow-credentials org/model`). The collector carries a copy.
PLAIN_FLAGS = frozenset(
    ("--allow-credentials", "--no-allow-credentials", "--max-prompt-adapter-token")
)
# A command-line flag named so, then its value: after `=` or blanks (quoted, or up to the next
# blank), or the next item of a printed argument list (`'--token', 'x'`). `--api-key` is cut
# above.
_FLAG_WORD = r"(?P<flag>--?(?:[A-Za-z0-9]+[-_])*(?i:" + "|".join(CREDENTIAL_WORDS) + "))"
_FLAG_NAME = r"(?<![\w-])" + _FLAG_WORD
# A flag may be a shell word of its own in quotes (`sh -c 'vllm "--api-key" "x"'`,
# `'--hf-token' 'x'`): the quote just before it (`open`) may close it after its name, then
# comes the separator (the collector's `_inline_secrets` reads it so). After blanks, only `--`
# starts the next flag (`--hf-token -x` holds the value `-x` on the box): a match never takes
# that flag for a value, so the flag is still read on (`--token --hf-token x`). Who reads a
# single leading `-` as "no value" says so in its mask (`_mask_flag`).
_OPEN = r"(?<![\w-])(?:(?<=(?P<open>[\"'])))?"
_CLOSE = r"(?(open)(?P=open)?)"
_FLAG_VALUE = r"(?P<sep>=|\s+(?!--))(?P<value>\"[^\"]*\"|'[^']*'|\S+)"
_SECRET_FLAG = _OPEN + _FLAG_WORD + _CLOSE + _FLAG_VALUE
_ITEM = r"(?P<sep>[\"']\s*,\s*)(?P<quote>[\"'])(?P<value>.*?)(?P=quote)"
_SECRET_ITEM = _FLAG_NAME + _ITEM
# Any long flag and its value, in the same three forms: masked where `named_flag` says the
# floor's or the fleet's patterns name it (the collector's `_ANY_FLAG`, judged as it judges).
_LONG_WORD = r"(?P<flag>--[A-Za-z0-9][A-Za-z0-9_-]*)"
_ANY_FLAG = _OPEN + _LONG_WORD + _CLOSE + _FLAG_VALUE
_ANY_ITEM = r"(?<![\w-])" + _LONG_WORD + _ITEM
# A URL's password (`scheme://user:password@host`), from the user info's first `:` up to the
# authority's last `@` as URL parsers read it (`/`, `?`, `#` end the authority; the user may
# hold an `@`: `me@corp.com:pw@proxy`): the user name stays, it says whose. The scheme starts
# only where a run of scheme characters does (`\b` let every `a` of a box's `a.a.a…` start
# one, each scanned to the end: quadratic).
_USERINFO = r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://[^\s/?#:]*):[^\s/?#]+@"
# What the reports themselves say of a secret (`GATEWAY_API_KEY: set (digest …)`, `: empty`):
# words, never a value, so there is nothing to mask.
_STATE_WORDS = frozenset({"set", "empty", "absent", "unset", "missing", "commented", MASK})
# Keys and tokens: long runs of base64/hex/url-safe characters that mix letters and digits.
# url-safe/hex runs, and standard base64 (with + and /) that mixes cases, so paths stay.
_RUN = (
    r"(?<![A-Za-z0-9+/])(?=\S*[A-Z])(?=\S*[a-z])[A-Za-z0-9+/]{30,}={0,2}"
    r"|[A-Za-z0-9_\-]{24,}"
)
_DIGEST_PREFIX = r"(?:sha256|sha512|hmac):$"


def remember(value: str) -> None:
    """A secret value this process holds: masked in every scrubbed text from now on."""
    if isinstance(value, str) and len(value.strip()) >= _SHORTEST:
        _KNOWN.add(value)
        _KNOWN.add(value.strip())


def scrub_text(text: object, secrets: Iterable[str] = (), limit: int = LIMIT) -> str:
    """One short, printable line that holds no secret value, header or key-shaped run."""
    known = [
        value
        for value in sorted({*_KNOWN, *(s for s in secrets if isinstance(s, str))}, key=len)[::-1]
        if len(value) >= _SHORTEST
    ]
    out = _cut_masked(str(text), limit * 8, known)
    cut = re.search(_CREDENTIAL, out)
    if cut:
        out = out[: cut.start()].rstrip() + " " + REDACTED
    cut = re.search(_BREAK, out)
    if cut:
        rest = out[cut.end() :]
        out = out[: cut.start()].rstrip() + (" " + REDACTED if rest.strip() else "")
    out = mask_assignments(out)
    out = re.sub(_SECRET_FLAG, _mask_flag, out)
    out = _mask_named_flags(out)
    out = re.sub(_SECRET_ITEM, _mask_item, out)
    out = re.sub(_USERINFO, rf"\1:{MASK}@", out)
    out = re.sub(_RUN, _mask_run(out), out)
    out = "".join(c if c.isprintable() else "?" for c in out)
    out = " ".join(out.split())
    return out if len(out) <= limit else out[: limit - 1] + "…"


def _cut_masked(text: str, bound: int, known: list[str]) -> str:
    """`text` cut to `bound` characters (what the regular expressions below then read: a hostile
    megabyte string costs no more than a short one), the known secret values masked first, and
    never the start of a word that went on past the cut (a key or a known value straddling it
    would leave its prefix). Known values are masked in the text up to `bound` plus the longest
    of them (at most `bound` more), so one that starts before the cut is masked whole."""
    window = text[: bound + min(max(map(len, known), default=0), bound)]
    out = window
    for value in known:  # longest first
        out = out.replace(value, MASK)
    if len(out) > bound:
        out, following = out[:bound], out[bound]
    else:
        following = text[len(window) : len(window) + 1]  # "" when the text ended in the window
    if following and not following.isspace() and out[-1:] and not out[-1].isspace():
        kept = out.rsplit(None, 1)
        out = (kept[0] if len(kept) == 2 else "") + " …"  # the cut word goes, all of it
    return out


def mask_assignments(text: str) -> str:
    """`NAME=value` and `NAME: value` (the assignments `scrub_text` masks) with a secret-named
    NAME, as `NAME=***`; the rest of `text` as it is (no cut, no other masking)."""
    if not _may_name_a_secret(text):
        return text
    for assignment in _ASSIGNMENTS:
        text = _masked_assignments(re.compile(assignment), text)
    return text


def mask_credentials(text: str) -> str:
    """A credential inside `text` masked where `scrub_text` would cut the text from it: the
    value of a flag named like a secret (`--api-key x`, `--hf-token=x`, `'--token', 'x'`), of
    a credential header (`Authorization: Bearer x`, `X-Api-Key: x`) and after `Bearer`; the
    rest as it is (the collector hashes the same values inside a command's word), and a URL's
    password (`https://user:***@host`)."""
    if "-" in text:
        text = re.sub(_SECRET_FLAG, _mask_word_flag, text)
        text = re.sub(_SECRET_ITEM, _unless_plain(_mask_item), text)
        # A flag the patterns name holds `-x` too (the collector hashes it: only `--` is the
        # next flag); `--token -v` (a flag only its last word names) stays two flags there.
        text = _mask_named_flags(text, _mask_value)
    if holds_any_folded(text, _CREDENTIAL_WORDS_UPPER):
        text = re.sub(_HEADER_VALUE + _CREDENTIAL_VALUE, _mask_credential, text)
        text = re.sub(_SCHEME_VALUE + _CREDENTIAL_VALUE, _mask_credential, text)
    return mask_userinfo(text)


def mask_userinfo(text: str) -> str:
    """A URL's password in `text` masked (`https://user:***@host`), as scrub_text masks it and
    as the collector hashes it (`_url_passwords`); the rest as it is."""
    if "@" in text and "://" in text:
        text = re.sub(_USERINFO, rf"\1:{MASK}@", text)
    return text


def flag_values(words: tuple[object, ...]) -> list[int]:
    """Of command words (an argv), the index of each one that follows a flag named like a
    secret (`'--api-key', 'x'`: two words, so `mask_credentials` of each one sees neither the
    value after its flag nor the flag before its value): the values to mask. A value may be a
    list (vLLM's `--api-key K1 K2`, argparse nargs="+"): after the value (or the flag's
    `--api-key=K1`), every word up to the next one starting with `-` is one too, as the
    collector hashes them (`mask_argv`); a snapshot of an older collector holds K2 in clear."""
    out: list[int] = []
    i, count = 0, len(words)
    while i < count:
        word = words[i]
        i += 1
        if type(word) is not str or word[:1] != "-":
            continue
        flag, equals, _ = word.partition("=")
        if equals:
            if not secret_flag(flag):
                continue
        elif i < count and _a_value(words[i], word):
            out.append(i)
            i += 1
        elif i < count and (type(words[i]) is not str or words[i] == MASK) and secret_flag(word):
            i += 1  # the collector's digest (a SecretValue) or `***`: masked already
        else:
            continue
        # The flag's value was read: a list of them goes on up to the next word starting with `-`.
        while i < count:
            following = words[i]
            if type(following) is str:
                if following[:1] == "-":
                    break
                if following != MASK:
                    out.append(i)
            i += 1
    return out


def secret_flag(flag: str) -> bool:
    """Whether this flag carries a secret: the one rule every guard masks by and the collector
    hashes by (`Run.secret_flag`, for a long flag): its last word names a credential
    (`credential_flag`: `--token`, `--key`, `--hf-token`), or the floor's or the fleet's
    patterns name it (`named_flag`: `--db-cred` under `*_CRED`), and it is none of vLLM's
    flags that only read like one (`PLAIN_FLAGS`)."""
    return credential_flag(flag) or named_flag(flag)


def credential_flag(flag: str) -> bool:
    """Whether this flag's last word names a credential (`--token`, `--hf_token`, `-key`,
    `--client-secret`), as `_FLAG_WORD` reads a flag in a text: words of ASCII letters and
    digits joined by `-` or `_`. Read without re, in the same code as the collector's copy
    (`credential_flag` there, for a long flag), so the box and the guards judge a flag alike.
    None of `PLAIN_FLAGS`."""
    if flag[:2] == "--":
        name = flag[2:]
    elif flag[:1] == "-":
        name = flag[1:]
    else:
        return False
    words = name.replace("_", "-").split("-")
    return (
        words[-1].lower() in CREDENTIAL_WORDS
        and all(w and w.isascii() and w.isalnum() for w in words)
        and flag not in PLAIN_FLAGS
    )


def named_flag(flag: str) -> bool:
    """Whether the floor's or the fleet's secret patterns name this long flag, read as the
    collector reads one (`Run.secret_flag`: `--db-cred` -> `DB_CRED`, `--hf_token` ->
    `HF_TOKEN`), none of `PLAIN_FLAGS`: a flag whose value the box hashed whatever it starts
    with (`--hf-token -x` holds `-x`), whatever its last word."""
    return flag[:2] == "--" and len(flag) > 2 and flag not in PLAIN_FLAGS and _named_flag(flag)


# Remembered (bounded: a box chooses its flags), forgotten when the fleet's patterns change:
# a fleet's command lines repeat the same few dozen flags on every box.
@functools.lru_cache(maxsize=4096)
def _named_flag(flag: str) -> bool:
    return is_fleet_secret_name(flag[2:].replace("-", "_").upper())


when_patterns_change(_named_flag.cache_clear)


def _mask_named_flags(text: str, mask: Callable[[re.Match[str]], str] | None = None) -> str:
    """`text` with the value of every long flag `named_flag` names masked (`--db-cred ***`,
    `--db-cred=***`, `'--db-cred', '***'`), each flag's value by `mask` (`_mask_flag` for
    free text, `_mask_value` for a command's words). Looked for only where some pattern's
    literal run (`_CRED` of `*_CRED`) is in the text read as flag names are (upper case, `-` as
    `_`): most texts have none, and the scan is then a few C searches."""
    if "--" not in text or not _may_name_a_flag(text):
        return text
    text = re.sub(_ANY_FLAG, _mask_named(mask or _mask_flag), text)
    return re.sub(_ANY_ITEM, _mask_named(_mask_item), text)


def _may_name_a_flag(text: str) -> bool:
    fragments = _pattern_runs()
    if not fragments:  # a pattern with no literal run (`*`): any flag may name a secret
        return True
    return holds_any_folded(text, fragments, dash_is_underscore=True)


def _mask_named(mask: Callable[[re.Match[str]], str]) -> Callable[[re.Match[str]], str]:
    def masked(match: re.Match[str]) -> str:
        return mask(match) if named_flag(match.group("flag")) else match.group(0)

    return masked


def _a_value(word: object, flag: str) -> bool:
    """Whether `word`, after `flag`, is a secret's value to mask (`secret_flag`), as the
    collector reads it: after a flag the patterns name (`named_flag`), any word but the next
    flag (`--`: `--hf-token -x` holds `-x`); after a flag only its last word names (`--token`),
    a `-` ends it too (`--token -v` is two flags, on the box as well). `--api-key ***`: masked
    already."""
    if type(word) is not str or word in _STATE_WORDS:
        return False
    if word[:1] == "-":
        return word[:2] != "--" and named_flag(flag)
    return secret_flag(flag)


def _unless_plain(mask: Callable[[re.Match[str]], str]) -> Callable[[re.Match[str]], str]:
    """`mask`, but for a flag of `PLAIN_FLAGS` (`--allow-credentials model`): kept."""

    def masked(match: re.Match[str]) -> str:
        return match.group(0) if match.group("flag") in PLAIN_FLAGS else mask(match)

    return masked


def _mask_word_flag(match: re.Match[str]) -> str:
    """A flag's value inside a command's word (`mask_credentials`), as the collector hashes it
    there: after `=` whatever it starts with (`--token=-x`), after blanks as `_mask_flag` reads
    it; a flag of `PLAIN_FLAGS` keeps its next word."""
    if match.group("flag") in PLAIN_FLAGS:
        return match.group(0)
    return _mask_value(match) if match.group("sep") == "=" else _mask_flag(match)


def _mask_credential(match: re.Match[str]) -> str:
    name, sep, value = match.groups()
    closing = ""
    if value[0] not in "'\"":
        kept = value.rstrip(_CLOSERS)
        value, closing = kept, value[len(kept) :]
    if not value or value.lower() in _STATE_WORDS:
        return match.group(0)  # `Authorization: missing`: prose
    return f"{name}{sep}{MASK}{closing}"


def _may_name_a_secret(text: str) -> bool:
    """Whether `text` holds some name a secret pattern could match: every pattern's longest
    literal run (`KEY` of `*_KEY`), looked for in the upper-cased text (the floor matches names
    in upper case; a fleet pattern's case is only widened). A few C searches instead of two
    regular-expression scans: the reports' guard reads every drift value with `=` or `:`, and
    a 1,000-box mesh's seeds (a URL per member, each box's own) made the scans 1.6 s of CPU."""
    fragments = _pattern_runs()
    if not fragments:  # a pattern with no literal run (`*`): anything may name a secret
        return True
    return holds_any_folded(text, fragments)


# What `mask_credentials` looks for before its header and scheme expressions.
_CREDENTIAL_WORDS_UPPER = ("BEARER", "AUTHORIZATION", "API-KEY")
# From this length a text is first looked through for each fragment's characters (below).
_LONG_TEXT = 128


def holds_any_folded(
    text: str, fragments: tuple[str, ...], dash_is_underscore: bool = False
) -> bool:
    """Whether some of `fragments` (upper case) is in `text` read in upper case (and with `-`
    read as `_`, `dash_is_underscore`: flags as the collector names them).
    A long ASCII text (a 1,000-box mesh's seeds: 24 KB of URLs, in every box's drift) is first
    looked through for each fragment's characters, in either case, one C search each: a
    fragment one of whose characters the text lacks cannot be in it, and upper-casing the text
    for the rest costs more than those searches (~60 µs for 24 KB, a few times a box). Only
    ASCII: there upper-casing maps each character to one of its own two cases, where Unicode
    also makes `S` of `ſ`. Outside ASCII the text is read upper-cased and lower- then
    upper-cased (`K`, the Kelvin sign, is `k` only lower-cased), so neither reading that
    looked for these words before is missed."""
    if text.isascii():  # O(1): a flag of the string object
        if len(text) >= _LONG_TEXT:
            fragments = tuple(f for f in fragments if _has_letters(text, f, dash_is_underscore))
            if not fragments:
                return False
        readings = [text.upper()]
    else:
        readings = [text.upper(), text.lower().upper()]
    for reading in readings:
        if dash_is_underscore:
            reading = reading.replace("-", "_")
        if any(fragment in reading for fragment in fragments):
            return True
    return False


def _has_letters(text: str, fragment: str, dash_is_underscore: bool) -> bool:
    has = text.__contains__
    return all(any(map(has, forms)) for forms in _forms(fragment, dash_is_underscore))


@functools.lru_cache(maxsize=256)
def _forms(fragment: str, dash_is_underscore: bool) -> tuple[tuple[str, ...], ...]:
    """Each distinct character of `fragment` as the characters a text may hold for it."""
    forms: dict[str, tuple[str, ...]] = {}
    for char in fragment:
        if char == "_" and dash_is_underscore:
            forms[char] = ("_", "-")
        else:
            forms[char] = tuple(dict.fromkeys((char, char.lower())))
    return tuple(forms.values())


def _literal_runs(patterns: Iterable[str]) -> tuple[str, ...]:
    """Each pattern's longest run of literal characters (a bracket expression is no literal),
    upper-cased, each once; () when some pattern has none."""
    runs: list[str] = []
    for pattern in patterns:
        literal = re.split(r"[*?]|\[[^\]]*\]", pattern.upper())
        longest = max(literal, key=len)
        if not longest:
            return ()
        if longest not in runs:
            runs.append(longest)
    # A run holding another is implied by it (`HF_TOKEN` by `_TOKEN`): the others are looked for.
    return tuple(r for r in runs if not any(o != r and o in r for o in runs))


@functools.cache
def _pattern_runs() -> tuple[str, ...]:
    """The literal runs of the floor's and the fleet's patterns (forgotten when they change)."""
    return _literal_runs((*FLOOR, *fleet_patterns()))


when_patterns_change(_pattern_runs.cache_clear)


def _masked_assignments(pattern: re.Pattern[str], text: str) -> str:
    value_of = re.compile(_VALUE)
    out: list[str] = []
    done = at = 0
    while (found := pattern.search(text, at)) is not None:
        name, sep = found.groups()
        at = found.end()  # after the separator: a value not masked is read on
        if not is_fleet_secret_name(name):
            continue
        taken = value_of.match(text, at)
        if taken is None:
            continue
        value = taken.group(0)
        if value in _STATE_WORDS or (":" in sep and len(value) < _SHORTEST):
            continue  # `GATEWAY_API_KEY: set`, `: a secret's value…` is prose, not a key
        out += (text[done:at], MASK)
        done = at = taken.end()
    return "".join(out) + text[done:] if out else text


def _mask_flag(match: re.Match[str]) -> str:
    """A flag's value in free text masked (`_SECRET_FLAG`, `_ANY_FLAG`): `--token -v` is read
    as two flags there (an error's usage line), as the box programs' scrubbers read it."""
    if match.group("value")[:1] == "-":
        return match.group(0)  # `--token -v`: the flag had no value, the next one is a flag
    return _mask_value(match)


def _mask_value(match: re.Match[str]) -> str:
    """A flag's value masked, whatever it starts with (`--hf-token -x`); a quote closing an
    unquoted value is kept (`'--api-key=x'` -> `'--api-key=***'`, `sh -c '... --api-key x'`)."""
    value = match.group("value")
    closing = ""
    if value[0] in "'\"":
        value = value[1:-1]  # `--api-key "***"`: the collector's digest, as the caller shows it
    elif len(value) > 1 and value[-1] in "'\"":
        value, closing = value[:-1], value[-1]
    if value in _STATE_WORDS:
        return match.group(0)  # `--token set`, `--api-key ***`: a state, or masked already
    return match.string[match.start() : match.start("value")] + MASK + closing


def _mask_item(match: re.Match[str]) -> str:
    value = match.group("value")
    if value in _STATE_WORDS or value.startswith("-"):
        return match.group(0)
    quote = match.group("quote")
    return match.string[match.start() : match.start("value")] + MASK + quote


def _mask_run(text: str) -> Callable[[re.Match[str]], str]:
    def mask(match: re.Match[str]) -> str:
        run = match.group(0)
        if re.search(_DIGEST_PREFIX, text[max(0, match.start() - 8) : match.start()]):
            return run  # a content digest names a file or an image, it is not a key
        letters = any(c.isalpha() for c in run)
        digits = any(c.isdigit() for c in run)
        return MASK if letters and digits else run

    return mask


# -- exceptions --------------------------------------------------------------------------------
def exception_text(exc: BaseException, secrets: Iterable[str] = ()) -> str:
    """`Type: reason`, the reason taken from what the exception *is* whenever that is enough."""
    return f"{type(exc).__name__}: {reason(exc, secrets)}"


def reason(exc: BaseException, secrets: Iterable[str] = ()) -> str:
    for link in _chain(exc):
        known = _known_reason(link)
        if known:
            return known
    return scrub_text(exc, secrets) or "no detail"


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and what caused it (httpx wraps the socket's OSError), outermost first."""
    out: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in out and len(out) < 6:
        out.append(link)
        link = link.__cause__ or link.__context__
    return out


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def _known_reason(exc: BaseException) -> str | None:
    names = _names(exc)
    if isinstance(exc, TimeoutError) or any("Timeout" in n for n in names):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset by the peer"
    if "gaierror" in names:
        return "name or address not resolved"
    if "SSLCertVerificationError" in names:
        return "TLS certificate not verified"
    if "SSLError" in names:
        return "TLS handshake failed"
    if names & {"RemoteDisconnected", "RemoteProtocolError", "IncompleteRead"}:
        return "the server closed the connection without a complete answer"
    if names & {"LocalProtocolError", "InvalidHeader"} or _refused_header(exc):
        return "a request header held a character HTTP forbids (its value is not shown)"
    if names & {"InvalidURL", "UnsupportedProtocol"}:
        return "invalid URL"
    if isinstance(exc, OSError) and isinstance(exc.errno, int) and exc.errno > 0:
        code = errno_names.errorcode.get(exc.errno, str(exc.errno))
        return f"{os.strerror(exc.errno).lower()} ({code})"
    return None


def _refused_header(exc: BaseException) -> bool:
    # http.client: ValueError("Invalid header value b'...'") / ("Invalid header name ...").
    return isinstance(exc, ValueError) and str(exc).startswith("Invalid header")
