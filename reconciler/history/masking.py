"""Clear secrets taken out of a box's observation: before the store keeps it (`stored`), and
the rule `reconcile diff` applies to every value it compares (observed.py). Pure.

The collector hashes every secret on the box (`{"secret": "hmac:..."}`), but a snapshot saved
by an older collector or with a narrower list, or an edited one, may carry a value in clear:
an environment's `HF_TOKEN='hf_...'`, a `.env` line's or a login export's value, the word after
`--api-key` (or any flag the floor or the fleet's `secret_patterns` name, `--db-cred`) on a
command line, or such a flag, a `Bearer` credential or a `KEY=value` assignment inside a word or
a value (`sh -c 'vllm ... --api-key x'`, `VLLM_ARGS='--db-cred x'`: the collector hashes those in
place too). The store promises never to hold a secret value, so each is `***` before the
observation is packed; the document keeps its shape (lists stay lists, nothing is dropped), so
`reconcile diff` still reads it as a snapshot's box file.

`stored` walks the large, regular parts by their shape (the containers' and images'
environments and command lines, every compose render's (`render`, `render_login`,
`render_current`, `render_login_current`, any `render*`) environments and commands, the `.env`
lines, the login shell's exports): a 1,000-box replay records 1,000 observations of ~3,500
values each, and a walk over every one of them was a tenth of the whole replay. Everything
else (the probes' bodies, the controller's probe records, the secret sources, a section a
newer collector adds, a record's other fields) is small and free-form: it is walked with
`reconcile diff`'s own rule (observed.comparable: a secret name anywhere, at any depth, masks
what it holds; a list keyed by name masks the items a secret names; a command line's secret
flags; every string, whatever its name, passes `masked_value`: a URL's password, `--api-key
x`, `Bearer x` inside a probe body's text), so nothing a diff masks is kept in clear, and the
store keeps the keyed digests (`hmac:...`) a diff masks only because they change every run
(a `{"secret": ...}` holding anything else is an edit: masked). The controller's own digests
of desired secrets (`controller.inline_masks`, under its persistent key) are masked for the
history store only (`stored(..., history=True)`): a snapshot file keeps them for its replays.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from itertools import compress, repeat
from typing import Any

from reconciler.desired.secret_names import when_patterns_change

MASK = "***"
DIGEST = re.compile(r"hmac:[0-9a-f]{64}")  # the collector's keyed digest of a secret
MAX_DEPTH = 32  # an observation nests ~10 levels; deeper parts are kept (and compared) whole
# Lists of objects keyed by the first of these fields they hold (observed.comparable).
LIST_KEYS = ("name", "key", "id", "service")
# A record's own fields that name or locate a secret without holding it: a `.env` line's
# `line`, a login export's `source` (scrubbed: it may quote the line), a secret source's
# `path` and `status`, an audit probe's `status`. Any other field of a record under a secret
# name is masked.
_METADATA = frozenset(
    {"line", "source", "path", "status", "state", "ms", "key_from", "model", "skipped", "exists"}
)
# The collector's own field names that match a secret pattern by their shape (`*_KEYS`,
# `*SECRET*`): they hold names and records, never one value; what is inside them is judged
# by its own names.
COLLECTOR_FIELDS = frozenset({"current_env_keys", "envfile_keys", "secret_sources"})
_FREE_TEXT = frozenset({"error", "source"})  # free text from the box: scrubbed as reports scrub it


# Every name judged so far, and those that name secrets: an environment's names are then
# split by two C calls instead of ~150 calls each; a fleet shares a few hundred names. Bounded:
# a box chooses its names, and past the bound a name is judged each time, not remembered.
_JUDGED: set[str] = set()
_SECRET_NAMES: set[str] = set()
_REMEMBERED = 100_000


def secret_name(key: object) -> bool:
    """A key naming a secret: a variable (`HF_TOKEN`, `hf_token`) or a flag (`--api-key`)."""
    if not isinstance(key, str) or not key:
        return False
    if key in _JUDGED:
        return key in _SECRET_NAMES
    return _judged(key)


def _judged(key: str) -> bool:
    from reconciler.report.values import secret_path

    verdict = bool(secret_path(key))
    if len(_JUDGED) < _REMEMBERED:
        _JUDGED.add(key)
        if verdict:
            _SECRET_NAMES.add(key)
    return verdict


def secret_names(names: Collection[Any]) -> set[str]:
    """Which of these names (a mapping's keys) name secrets."""
    if _JUDGED.issuperset(names):  # nearly always, once a fleet's first box was seen
        return _SECRET_NAMES.intersection(names)
    return {name for name in names if secret_name(name)}


def hashed(value: object) -> bool:
    """The collector's form of a secret: `{"secret": digest}`."""
    return type(value) is dict and len(value) == 1 and isinstance(value.get("secret"), str)


def empty(value: object) -> bool:
    """Nothing to hide: an absent, empty or unset value (drift says "" or null as it is)."""
    return value is None or (isinstance(value, str | list | dict) and not value)


def under_secret(
    name: str,
    value: Any,
    keep: Callable[[str, Any], Any],
    hashed_as: Callable[[Any], Any],
    is_hashed: Callable[[Any], bool] = hashed,
) -> Any:
    """`value`, kept under the secret-named key `name`, with nothing of the secret left:
    - empty: as it is; the collector's hashed form (`is_hashed`): `hashed_as(value)`;
    - a record (a dict: a `.env` line, a login export, a secret source): its metadata fields
      kept through `keep(field, value)`, `key` kept when it is the record's own name, every
      other field masked (its hashed form through `hashed_as`);
    - anything else (a string, a number, a list of words): `***`."""
    if empty(value):
        return value
    if is_hashed(value):
        return hashed_as(value)
    if isinstance(value, dict):
        return {
            field: keep(field, item)
            if field in _METADATA or (field == "key" and item == name)
            else _field(item, hashed_as, is_hashed)
            for field, item in value.items()
        }
    return MASK


def _field(
    value: Any, hashed_as: Callable[[Any], Any], is_hashed: Callable[[Any], bool] = hashed
) -> Any:
    """A record's field that may hold the secret: one level only (a record in a record is
    masked whole), so no crafted nesting makes this recurse."""
    if empty(value):
        return value
    return hashed_as(value) if is_hashed(value) else MASK


def opaque(value: Any, what: str) -> str:
    """A part kept and compared whole: what it is and a digest of its canonical JSON (after
    masking digests: the JSON itself may hold a secret, its digest says only whether it
    changed)."""
    text = json.dumps(value, sort_keys=True, default=str)
    digest = hashlib.sha256(DIGEST.sub(MASK, text).encode()).hexdigest()[:12]
    return f"({what}, sha256 {digest})"


def keyed_by(items: list[Any]) -> str | None:
    """The field a list of records is keyed by: the first of LIST_KEYS every item holds as a
    non-empty string; None: not such a list."""
    if not items or not all(isinstance(i, dict) for i in items):
        return None
    for field in LIST_KEYS:
        if all(isinstance(n, str) and n for n in (i.get(field) for i in items)):
            return field
    return None


# Words of command lines seen to be no secret flag (`vllm`, `--port=8000`): a fleet's command
# lines repeat them, and a line made only of such words has nothing to mask (one C call).
_PLAIN_WORDS: set[str] = set()


def argv(tokens: list[Any]) -> list[Any]:
    """A command line with its secret flags' values masked: `--api-key WORD`,
    `--api-key=WORD`. `tokens` itself when there was nothing to mask."""
    try:
        if _PLAIN_WORDS.issuperset(tokens):
            return tokens
    except TypeError:  # a word that is no string (an edited snapshot): judged below
        pass
    out = _masked_argv(tokens)
    if out is tokens and len(_PLAIN_WORDS) < _REMEMBERED:
        _PLAIN_WORDS.update(t for t in tokens if isinstance(t, str) and not _secret_flag(t))
    return out


def _secret_flag(token: str) -> bool:
    return token[:1] == "-" and len(token) > 1 and secret_name(token.partition("=")[0])


def _masked_argv(tokens: list[Any]) -> list[Any]:
    out: list[Any] | None = None
    masking: str | None = None  # the secret flag whose value the next token may be
    # A secret flag's value was just read: more may follow (vLLM's `--api-key K1 K2`, argparse
    # nargs="+"), every token up to the next one starting with `-`, as the collector's
    # `mask_argv` hashes them now; an older collector sent K2 in clear.
    listing = False
    for i, token in enumerate(tokens):
        new = token
        if masking is not None and isinstance(token, str) and _flag_value(token, masking):
            new, masking, listing = MASK, None, True
        elif (masking is not None or listing) and not isinstance(token, str):
            masking, listing = None, True  # the collector's digest of a value: the list goes on
        elif listing and token[:1] != "-":
            new = MASK
        else:
            masking, listing = None, False
            if isinstance(token, str) and token[:1] == "-" and len(token) > 1:
                flag, equals, word = token.partition("=")
                if secret_name(flag):
                    if equals and word and word != MASK:
                        new = f"{flag}={MASK}"
                    listing = bool(equals)
                    if not equals:
                        masking = flag
            if new is token and isinstance(token, str) and _may_carry(token):
                # `HF_TOKEN=x`, `bash -c 'export GATEWAY_API_KEY=x; vllm ... --api-key y'`
                new = _assigned(token)
        if out is None and new != token:
            out = list(tokens[:i])  # the first token to mask: copy what came before it
        if out is not None:
            out.append(new)
    return tokens if out is None else out


def _flag_value(token: str, flag: str) -> bool:
    """Whether `token`, after the secret flag `flag`, is its value, as the collector's
    `mask_argv` reads it on the box: any token but the next flag's `--` after a flag the
    patterns name (`--api-key -x` holds `-x`: scrub.named_flag), and one that does not start
    with `-` after a flag only its last word names (`--token -v` is two flags)."""
    from reconciler.scrub import named_flag

    if token[:2] == "--":
        return False
    return token[:1] != "-" or named_flag(flag)


def _may_carry(word: str) -> bool:
    """Whether a word or value may hold a secret inside it: an assignment needs its `=` or
    `:`, a flag its `-`, a credential its `Bearer` (or a header's `:`): the reports' guard's
    own test (report/values.py `_words`), a few C searches."""
    return "=" in word or ":" in word or "-" in word or "earer" in word or "EARER" in word


@functools.lru_cache(maxsize=4096)
def _assigned(word: str) -> str:
    """A command word or a value with every secret inside it masked as the reports' guard
    masks it: an assignment to a secret name (`HF_TOKEN=***`), the value of a flag named like a
    secret or named by the floor's or the fleet's patterns (`--api-key ***`, `--db-cred=***`),
    a credential header's or `Bearer`'s; the word itself when there is none. The collector's
    digests inside it (`--db-cred={"secret": "hmac:..."}`) are what it keeps: a word holding
    nothing else is kept as it is (its digests with it), one that also holds a clear secret
    is kept with every digest as `***` (a diff masks them anyway)."""
    from reconciler.scrub import mask_assignments, mask_credentials

    probe = _WIRE_FORM.sub(MASK, word) if '{"secret"' in word else word
    out = mask_credentials(mask_assignments(probe))
    return word if out == probe else out


# The collector's digest written inside a word (`HF_TOKEN={"secret": "hmac:..."}`).
_WIRE_FORM = re.compile(r'\{"secret": "[^"]*"\}')
# Values (an environment's, a `.env` line's, a login export's) seen to hold no secret inside
# them: a fleet's boxes share most of theirs. Apart from _PLAIN_WORDS: a value equal to a
# secret flag (`--api-key`) is plain as a value, but no command line may skip it.
_PLAIN_VALUES: set[str] = set()


def masked_value(value: Any) -> Any:
    """A value under a name that is no secret's, with any secret inside it masked
    (`VLLM_ARGS='--api-key ***'`, `EXTRA='--db-cred ***'`); itself when there is none (and
    anything but a string as it is). The rule `reconcile diff` needs for every string it
    compares too (observed.comparable)."""
    if type(value) is not str or value in _PLAIN_VALUES:
        return value
    out = _assigned(value) if _may_carry(value) else value
    if out == value:  # (_assigned remembers the first equal string it was given)
        if len(_PLAIN_VALUES) < _REMEMBERED:
            _PLAIN_VALUES.add(value)
        return value
    return out


def _masked_values(values: Iterable[Any]) -> dict[str, str]:
    """Of these values, each string holding a secret inside it -> its masked form (`_value`).
    Only the values not seen plain before are looked at, found in C (a set difference): a box's
    ~3,000 environment values are nearly all its fleet's, and a loop over each of them in
    Python doubled the store's cost of an observation."""
    try:
        fresh: Iterable[Any] = set(values) - _PLAIN_VALUES
    except TypeError:  # a value that is no string (an edited snapshot): each one judged
        fresh = [v for v in values if type(v) is str]
    changed: dict[str, str] = {}
    for value in fresh:
        new = masked_value(value)
        if new is not value:
            changed[value] = new
    return changed


# Remembered: a fleet's errors and sources repeat from box to box (~40 us a scrub). Sound
# because the secrets scrub_text also masks are remembered before any box is observed
# (observe/controller_secrets.py), so before anything here runs.
@functools.lru_cache(maxsize=4096)
def scrubbed(text: str) -> str:
    """Free text from a box (an error, a login export's source), as reports scrub it."""
    from reconciler.scrub import scrub_text

    return scrub_text(text)


def _forget_judged() -> None:
    """The fleet's secret patterns changed (secret_names.adopt_fleet_patterns): every name,
    word, part and text judged under the old ones is judged again."""
    for memory in (_JUDGED, _SECRET_NAMES, _PLAIN_WORDS, _PLAIN_VALUES, _CLEAN_PARTS):
        memory.clear()
    scrubbed.cache_clear()
    _assigned.cache_clear()


# -- the stored observation --------------------------------------------------------------------


def stored(doc: Any, *, history: bool = False) -> Any:
    """A box's observation (a snapshot's box file) as the store may keep it: every clear
    secret masked, digests and the shape kept. `doc` itself when there was nothing to mask:
    nothing is copied but the path to a masked value.

    `history`: for the history store, which also masks the controller's digests of desired
    secrets (`controller.inline_masks`: HMACs under the controller's persistent key, so the
    same on every run, beside that key in the state directory). A snapshot file keeps them:
    its replay trusts the masks they vouch for (observe/snapshot_key.py); nothing replays
    from the store."""
    if not isinstance(doc, dict):
        return _anywhere(doc, 0)
    out = _walked(doc, 0, _DOC)
    controller = out.get("controller") if history else None
    if isinstance(controller, dict) and MASK_DIGESTS in controller:
        hidden = hidden_masks(controller[MASK_DIGESTS])
        out = {**out, "controller": {**controller, MASK_DIGESTS: hidden}}
    return out


# The controller's section of digests of desired secrets (observe/snapshot_key.FIELD: not
# imported, the store needs nothing else of that module).
MASK_DIGESTS = "inline_masks"


def hidden_masks(masks: Any) -> Any:
    """`controller.inline_masks` with each digest `***`, under its kind and name (a `.env`
    key, a knob: names, which reports print)."""
    if not isinstance(masks, dict):
        return MASK
    return {
        kind: dict.fromkeys(names, MASK) if isinstance(names, dict) else MASK
        for kind, names in masks.items()
    }


def _with(doc: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """`doc` with `key` set to `value`: a copy only when the value is another object."""
    return doc if doc.get(key) is value else {**doc, key: value}


Walker = Callable[[Any, int], Any]  # a part at its depth -> the part as the store keeps it
_NESTING = (dict, list)


def _walked(doc: dict[str, Any], depth: int, walkers: Mapping[str, Walker]) -> dict[str, Any]:
    """`doc` (at `depth`) with each part named in `walkers` walked by its walker and every
    other part by observed.comparable's rule (`_anywhere`): nothing escapes because it is new
    or not where it was expected. Only what needs a look is looked at, found in C: the keys
    naming secrets (`secret_names`), the values that nest (`compress`), the free texts."""
    if depth >= MAX_DEPTH:
        return _anywhere(doc, depth)  # kept whole (opaque)
    out: dict[str, Any] | None = None
    secret = secret_names(doc)
    if secret and not COLLECTOR_FIELDS.isdisjoint(secret):
        secret = secret - COLLECTOR_FIELDS  # the collector's own records: judged inside
    nested = compress(doc.items(), map(isinstance, doc.values(), repeat(_NESTING)))
    for key, value in nested:
        if key in secret:
            continue  # below
        walker = walkers.get(key)
        if walker is not None:
            new = walker(value, depth + 1)
        elif walkers is _NONE:  # inside a free-form part, already found not clean
            new = _anywhere(value, depth + 1)
        else:
            new = _free(value, depth + 1)
        if new is not value:
            if out is None:
                out = dict(doc)
            out[key] = new
    for key in secret:
        value = doc[key]
        new = _secret_item(key, value, depth + 1)
        if new is not value:
            if out is None:
                out = dict(doc)
            out[key] = new
    # Every other string, as observed.comparable compares it (`masked_value`: a URL's
    # password, `--api-key x`, `Bearer x` in a probe's body or a record's field), and free
    # text scrubbed too. Nearly always each was seen plain before: one C call finds that.
    free = _FREE_TEXT.intersection(doc)
    texts = compress(doc.values(), map(isinstance, doc.values(), repeat(str)))
    if free or not _PLAIN_VALUES.issuperset(texts):
        for key, value in doc.items():
            if type(value) is str and key not in secret:
                new = _kept(key, value)
                if new is not value:
                    if out is None:
                        out = dict(doc)
                    out[key] = new
    return doc if out is None else out


def _collected(collected: Any, depth: int) -> Any:
    """The collector's answer: every `render*` section is a compose render (`render`,
    `render_login`, and `render_current`, `render_login_current` of a saving run)."""
    if not isinstance(collected, dict):
        return _anywhere(collected, depth)
    walkers = _SECTIONS
    renders = [k for k in collected if isinstance(k, str) and k.startswith("render")]
    if renders:
        walkers = {**_SECTIONS, **dict.fromkeys(renders, _render)}
    return _walked(collected, depth, walkers)


def _section(walkers: Mapping[str, Walker]) -> Walker:
    """A walker of a dict by `walkers` (anything else: by the rule anywhere)."""

    def walk(value: Any, depth: int) -> Any:
        if isinstance(value, dict) and not hashed(value):
            return _walked(value, depth, walkers)
        return _anywhere(value, depth)

    return walk


def _each_record(walkers: Mapping[str, Walker]) -> Walker:
    """A walker of a list of records (containers) or a name -> record map (images, compose
    services), each record's parts by `walkers`."""
    record = _section(walkers)

    def walk(value: Any, depth: int) -> Any:
        if isinstance(value, list):
            return _items(value, lambda item: record(item, depth + 1))
        if hashed(value):
            return _anywhere(value, depth)
        return _each(value, lambda item: record(item, depth + 1))

    return walk


def _env_walker(env: Any, depth: int) -> Any:
    """An environment: NAME -> a string, or its digest ({"secret": ...}); every reader refuses
    a snapshot with any other value in one (test_history_review_fixes)."""
    return _environment(env) if isinstance(env, dict) else _anywhere(env, depth)


def _argv_walker(tokens: Any, depth: int) -> Any:
    """A command line: a list of words."""
    return argv(tokens) if isinstance(tokens, list) else _anywhere(tokens, depth)


def _envfile_walker(lines: Any, depth: int) -> Any:
    return _envfile(lines) if isinstance(lines, list) else _anywhere(lines, depth)


def _exports_walker(exports: Any, depth: int) -> Any:
    return _exports(exports) if isinstance(exports, dict) else _anywhere(exports, depth)


_CONTAINER: dict[str, Walker] = {
    "env": _env_walker,
    "cmd": _argv_walker,
    "entrypoint": _argv_walker,
    "args": _argv_walker,
}
_IMAGE: dict[str, Walker] = {"env": _env_walker}
_SERVICE: dict[str, Walker] = {
    "environment": _env_walker,
    "command": _argv_walker,
    "entrypoint": _argv_walker,
}
_docker = _section({"containers": _each_record(_CONTAINER), "images": _each_record(_IMAGE)})
_render = _section({"services": _each_record(_SERVICE)})
_SECTIONS: dict[str, Walker] = {
    "docker": _docker,
    "envfile": _envfile_walker,
    "login_shell": _section({"exports": _exports_walker}),
}  # and every `render*` (_collected)
_DOC: dict[str, Walker] = {"collected": _collected}


# -- anywhere else: observed.comparable's rule -----------------------------------------------------


def _free(value: Any, depth: int) -> Any:
    """A free-form part (a probe's body, the controller's probe records, a section or a field
    no walker knows) at `depth`, walked by the rule anywhere (`_anywhere`); at once itself
    when it is a list of words seen before, or a small part whose JSON was seen clean (a
    large one is taken part by part: a gateway's probes differ between boxes, its roles'
    answers mostly do not)."""
    if type(value) is list and _plain(value):
        return value
    try:
        text: bytes | None = _encode(value)
    except Exception:  # anything msgspec will not write (deeper than it goes): walked
        text = None
    if text is None:
        return _anywhere(value, depth)
    if len(text) > _SMALL_PART:  # a large part (a gateway's probes): its parts one by one
        if type(value) is dict and depth < MAX_DEPTH and not hashed(value):
            return _walked(value, depth, _BY_PART)
        return _anywhere(value, depth)
    if text in _CLEAN_PARTS:
        return value
    out = _anywhere(value, depth)
    if out is value and len(_CLEAN_PARTS) < _REMEMBERED_PARTS:
        _CLEAN_PARTS.add(text)
    return out


# Small parts (a port list, a probe's answer) seen to hold nothing to mask, as their JSON: a
# fleet's repeat from box to box. Sound as `scrubbed`'s memory is, and because an observation
# is JSON (a tuple, which JSON writes as a list, is no part of one).
_CLEAN_PARTS: set[bytes] = set()
_SMALL_PART = 2048
_BY_PART: dict[str, Walker] = {}  # no walker: each part by `_free` (not _NONE: `_anywhere`)
_REMEMBERED_PARTS = 10_000


def _plain(words: list[Any]) -> bool:
    """Words seen to be no secret flag or name (a fleet's names and command lines repeat)."""
    try:
        return _PLAIN_WORDS.issuperset(words)
    except TypeError:  # an item that is no string
        return False


def _anywhere(value: Any, depth: int) -> Any:
    """A free-form part (a probe's body, the controller's probe records, a section or a field
    no walker knows) at `depth`, under observed.comparable's rule: a value under a secret
    name masked wherever it is (`_secret_item`), the items of a list keyed by a secret name
    too, a command line's secret flags; free text scrubbed; keyed digests kept. Past
    MAX_DEPTH levels a part is kept whole as `reconcile diff` compares it (`opaque`)."""
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return opaque(value, f"nested past {MAX_DEPTH} levels")
        if hashed(value):  # the collector's digest kept; anything else in its place masked
            return value if _digested(value) else {"secret": MASK}
        return _walked(value, depth, _NONE)
    if isinstance(value, list):
        if depth >= MAX_DEPTH:
            return opaque(value, f"nested past {MAX_DEPTH} levels")
        return _list(value, depth)
    return value


_NONE: dict[str, Walker] = {}


def _list(items: list[Any], depth: int) -> list[Any]:
    if _plain(items):  # words seen to be no secret flag: nothing to do
        return items
    field = keyed_by(items)
    if field is not None:  # records keyed by name (observed.comparable): under that name
        return _items(items, lambda item: _keyed_item(item[field], item, depth + 1))
    out = items
    for i, item in compress(enumerate(items), map(isinstance, items, repeat(_NESTING))):
        new = _anywhere(item, depth + 1)
        if new is not item:
            if out is items:
                out = list(items)
            out[i] = new
    return argv(out)


def _keyed_item(name: str, item: dict[str, Any], depth: int) -> Any:
    if name not in COLLECTOR_FIELDS and secret_name(name):
        return _secret_item(name, item, depth)
    return _anywhere(item, depth)


def _secret_item(name: str, value: Any, depth: int) -> Any:
    """`value`, kept under the secret name `name`: masked as under_secret masks it, keyed
    digests kept, a record's metadata judged by the rule anywhere."""
    masked = under_secret(
        name, value, lambda field, item: _metadata(field, item, depth), _as_is, _digested
    )
    unchanged = isinstance(value, dict) and isinstance(masked, dict)
    if unchanged and all(masked[k] is v for k, v in value.items()):
        return value
    return masked


def _metadata(field: str, item: Any, depth: int) -> Any:
    """A secret record's metadata field (the record at `depth`), as `_walked` keeps it."""
    if isinstance(item, dict | list):
        return _anywhere(item, depth + 1)
    return _kept(field, item)


def _encode(value: Any) -> bytes:
    """The part's JSON, `_CLEAN_PARTS`' key. msgspec's encoder (C, ~10x json's on these small
    parts) once the run has it loaded: a large replay reads its snapshot files with it
    (fast_json.py). Otherwise json's C encoder: importing msgspec cost a repeated live drift
    ~10 ms, after its boxes answered, for ~0.1 ms a box of encoding it saves. Both write a
    value's JSON, so equal bytes from either are the same part."""
    c_json = sys.modules.get("msgspec.json")
    if c_json is not None:
        encoded: bytes = c_json.encode(value)
        return encoded
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _digested(value: Any) -> bool:
    """A secret as the collector hashed it: `{"secret": digest}` or a bare keyed digest (a
    secret source's or an audit line's `digest`). An edited `{"secret": "hf_..."}` is none:
    the readers check the digests of the parts they know, nothing checks a free-form part's."""
    if hashed(value):
        value = value["secret"]
    return isinstance(value, str) and DIGEST.fullmatch(value) is not None


def _environment(env: dict[str, Any]) -> dict[str, Any]:
    """NAME -> value, each value under a secret name masked (most are "" or hashed: skipped
    before the name is even looked at), and any other value with the secrets inside it masked
    (`VLLM_ARGS='--api-key ***'`: `masked_value`)."""
    out: dict[str, Any] | None = None
    secret = secret_names(env)
    for name in secret:
        value = env[name]
        if empty(value) or hashed(value):
            continue
        if out is None:
            out = dict(env)
        out[name] = under_secret(name, value, _kept, _as_is)
    # The other names' values, all in C: nearly always each one was seen plain before. A copy
    # without the secret names (a handful, their values digests that no set can hold) costs
    # less than skipping them one call per name (map/filterfalse made the store 30% slower).
    rest = env
    if secret:
        rest = dict(env)
        for name in secret:
            del rest[name]
    try:
        if _PLAIN_VALUES.issuperset(rest.values()):
            return env if out is None else out
    except TypeError:  # a value that is no string: judged below
        pass
    others = list(rest)
    changed = _masked_values([env[name] for name in others])
    if changed:  # rare: a clear secret inside a value
        for name in others:
            value = env[name]
            if type(value) is str and value in changed:
                if out is None:
                    out = dict(env)
                out[name] = changed[value]
    return env if out is None else out


def _envfile(lines: list[Any]) -> list[Any]:
    """`.env` lines ({key, line, value}): a secret-named line's value masked, and any other
    line's value with the secrets inside it masked (`VLLM_ARGS=--api-key ***`). Only those
    lines are looked at one by one (a `.env` has ~100 lines, a handful of them secrets)."""
    keys = [line.get("key") if type(line) is dict else None for line in lines]
    secret = secret_names([k for k in keys if type(k) is str])
    values = [line.get("value") if type(line) is dict else None for line in lines]
    # A line's value may carry a secret (`VLLM_ARGS=--api-key x`). Only the strings are
    # looked at (a secret line's digest would send every value through a loop in Python),
    # nearly always all seen plain before: one C call.
    strings = [value for value in values if type(value) is str]
    changed = {} if _PLAIN_VALUES.issuperset(strings) else _masked_values(strings)
    if not secret and not changed:
        return lines
    out: list[Any] | None = None
    for i, key in enumerate(keys):
        value = values[i]
        if type(key) is str and key in secret:
            if empty(value) or hashed(value):
                continue
            new = under_secret(key, lines[i], _kept, _as_is)
        elif type(value) is str and value in changed:
            new = {**lines[i], "value": changed[value]}
        else:
            continue
        if out is None:
            out = list(lines)
        out[i] = new
    return lines if out is None else out


def _exports(exports: dict[str, Any]) -> dict[str, Any]:
    """A login shell's exports: a secret-named one's value masked, every source scrubbed (it
    may quote the line that sets the value)."""

    def export(name: str, item: Any) -> Any:
        if not isinstance(item, dict):
            if secret_name(name):
                return under_secret(name, item, _kept, _as_is)
            return masked_value(item)
        if secret_name(name):
            masked = under_secret(name, item, _kept, _as_is)
            return item if masked == item else masked
        source = item.get("source")
        if isinstance(source, str):
            item = _with(item, "source", _kept("source", source))
        value = item.get("value")
        return _with(item, "value", masked_value(value)) if isinstance(value, str) else item

    out = {name: export(name, item) for name, item in exports.items()}
    return exports if all(out[k] is v for k, v in exports.items()) else out


def _kept(field: str, value: Any) -> Any:
    """A string under a name that is no secret's (a record's metadata field, a probe body's
    value) as observed.comparable compares it: a free-text one scrubbed, any with the secrets
    inside it masked (`masked_value`); the same string when clean."""
    if type(value) is not str:
        return value
    clean = masked_value(scrubbed(value) if field in _FREE_TEXT else value)
    return value if clean == value else clean


def _as_is(value: Any) -> Any:
    return value


def _each(mapping: Mapping[str, Any], fix: Callable[[Any], Any]) -> Any:
    """A name -> item map with `fix` applied to each item; itself when none changed."""
    out = {key: fix(item) for key, item in mapping.items()}
    return mapping if all(out[k] is v for k, v in mapping.items()) else out


def _items(items: list[Any], fix: Callable[[Any], Any]) -> list[Any]:
    out = [fix(item) for item in items]
    return items if all(new is old for new, old in zip(out, items, strict=True)) else out


when_patterns_change(_forget_judged)
