"""Clear secrets taken out of a box's observation: before the store keeps it (`stored`), and
the rule `reconcile diff` applies to every value it compares (observed.py). Pure.

The collector hashes every secret on the box (`{"secret": "hmac:..."}`), but a snapshot saved
by an older collector or with a narrower list, or an edited one, may carry a value in clear:
an environment's `HF_TOKEN='hf_...'`, a `.env` line's or a login export's value, the word after
`--api-key` on a command line. The store promises never to hold a secret value, so each is
`***` before the observation is packed; the document keeps its shape (lists stay lists, nothing
is dropped), so `reconcile diff` still reads it as a snapshot's box file.

`stored` walks only where a box's values live (the containers' and images' environments and
command lines, the compose renders' environments and commands, the `.env` lines, the login
shell's exports, free-text errors): a 1,000-box replay records 1,000 observations of ~3,500
values each, and a walk over every one of them was a tenth of the whole replay.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping
from typing import Any

MASK = "***"
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
_FREE_TEXT = ("error", "source")  # free text from the box: scrubbed as reports scrub it


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
    name: str, value: Any, keep: Callable[[str, Any], Any], hashed_as: Callable[[Any], Any]
) -> Any:
    """`value`, kept under the secret-named key `name`, with nothing of the secret left:
    - empty: as it is; the collector's hashed form: `hashed_as(value)`;
    - a record (a dict: a `.env` line, a login export, a secret source): its metadata fields
      kept through `keep(field, value)`, `key` kept when it is the record's own name, every
      other field masked (its hashed form through `hashed_as`);
    - anything else (a string, a number, a list of words): `***`."""
    if empty(value):
        return value
    if hashed(value):
        return hashed_as(value)
    if isinstance(value, dict):
        return {
            field: keep(field, item)
            if field in _METADATA or (field == "key" and item == name)
            else _field(item, hashed_as)
            for field, item in value.items()
        }
    return MASK


def _field(value: Any, hashed_as: Callable[[Any], Any]) -> Any:
    """A record's field that may hold the secret: one level only (a record in a record is
    masked whole), so no crafted nesting makes this recurse."""
    if empty(value):
        return value
    return hashed_as(value) if hashed(value) else MASK


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
    masking = False
    for i, token in enumerate(tokens):
        new = token
        if masking and isinstance(token, str):
            new, masking = MASK, False
        else:
            masking = False
            if isinstance(token, str) and token[:1] == "-" and len(token) > 1:
                flag, equals, word = token.partition("=")
                if secret_name(flag):
                    if equals and word and word != MASK:
                        new = f"{flag}={MASK}"
                    elif not equals:
                        masking = True
        if out is None and new != token:
            out = list(tokens[:i])  # the first token to mask: copy what came before it
        if out is not None:
            out.append(new)
    return tokens if out is None else out


# Remembered: a fleet's errors and sources repeat from box to box (~40 us a scrub). Sound
# because the secrets scrub_text also masks are remembered before any box is observed
# (observe/controller_secrets.py), so before anything here runs.
@functools.lru_cache(maxsize=4096)
def scrubbed(text: str) -> str:
    """Free text from a box (an error, a login export's source), as reports scrub it."""
    from reconciler.scrub import scrub_text

    return scrub_text(text)


# -- the stored observation --------------------------------------------------------------------


def stored(doc: Any) -> Any:
    """A box's observation (a snapshot's box file) as the store may keep it: every clear
    secret masked, digests and the shape kept. `doc` itself when there was nothing to mask:
    nothing is copied but the path to a masked value."""
    if not isinstance(doc, dict):
        return doc
    out = _errors(doc, 0)
    collected = out.get("collected")
    if isinstance(collected, dict):
        out = _with(out, "collected", _collected(collected))
    controller = out.get("controller")
    if isinstance(controller, dict):
        out = _with(out, "controller", _errors(controller, 1))
    return out


def _with(doc: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """`doc` with `key` set to `value`: a copy only when the value is another object."""
    return doc if doc.get(key) is value else {**doc, key: value}


def _collected(collected: dict[str, Any]) -> dict[str, Any]:
    out = _errors(collected, 2)
    docker = out.get("docker")
    if isinstance(docker, dict):
        out = _with(out, "docker", _docker(docker))
    for render in ("render", "render_login"):
        section = out.get(render)
        if isinstance(section, dict) and isinstance(section.get("services"), dict):
            services = _each(section["services"], _service)
            out = _with(out, render, _with(section, "services", services))
    envfile = out.get("envfile")
    if isinstance(envfile, list):
        out = _with(out, "envfile", _envfile(envfile))
    shell = out.get("login_shell")
    if isinstance(shell, dict) and isinstance(shell.get("exports"), dict):
        out = _with(out, "login_shell", _with(shell, "exports", _exports(shell["exports"])))
    return out


def _docker(docker: dict[str, Any]) -> dict[str, Any]:
    out = docker
    containers = docker.get("containers")
    if isinstance(containers, list):
        out = _with(out, "containers", _items(containers, _container))
    images = docker.get("images")
    if isinstance(images, dict):
        out = _with(out, "images", _each(images, lambda image: _fields(image, ("env",), ())))
    return out


def _container(container: Any) -> Any:
    return _fields(container, ("env",), ("cmd", "entrypoint", "args"))


def _service(service: Any) -> Any:
    return _fields(service, ("environment",), ("command", "entrypoint"))


def _fields(doc: Any, environments: tuple[str, ...], command_lines: tuple[str, ...]) -> Any:
    """A container, image or compose service with its environments and command lines masked."""
    if not isinstance(doc, dict):
        return doc
    out = doc
    for key in environments:
        env = doc.get(key)
        if isinstance(env, dict):
            out = _with(out, key, _environment(env))
    for key in command_lines:
        tokens = doc.get(key)
        if isinstance(tokens, list):
            out = _with(out, key, argv(tokens))
    return out


def _environment(env: dict[str, Any]) -> dict[str, Any]:
    """NAME -> value, each value under a secret name masked (most are "" or hashed: skipped
    before the name is even looked at)."""
    out: dict[str, Any] | None = None
    for name in secret_names(env):
        value = env[name]
        if empty(value) or hashed(value):
            continue
        if out is None:
            out = dict(env)
        out[name] = under_secret(name, value, _kept, _as_is)
    return env if out is None else out


def _envfile(lines: list[Any]) -> list[Any]:
    """`.env` lines ({key, line, value}): a secret-named line's value masked. Only the lines
    under a secret name are looked at (a `.env` has ~100 lines, a handful of them secrets)."""
    keys = [line.get("key") if type(line) is dict else None for line in lines]
    secret = secret_names([k for k in keys if isinstance(k, str)])
    if not secret:
        return lines
    out: list[Any] | None = None
    for i, key in enumerate(keys):
        if key not in secret or empty(lines[i].get("value")) or hashed(lines[i].get("value")):
            continue
        if out is None:
            out = list(lines)
        out[i] = under_secret(key, lines[i], _kept, _as_is)
    return lines if out is None else out


def _exports(exports: dict[str, Any]) -> dict[str, Any]:
    """A login shell's exports: a secret-named one's value masked, every source scrubbed (it
    may quote the line that sets the value)."""

    def export(name: str, item: Any) -> Any:
        if not isinstance(item, dict):
            return under_secret(name, item, _kept, _as_is) if secret_name(name) else item
        if secret_name(name):
            masked = under_secret(name, item, _kept, _as_is)
            return item if masked == item else masked
        source = item.get("source")
        return _with(item, "source", _kept("source", source)) if isinstance(source, str) else item

    out = {name: export(name, item) for name, item in exports.items()}
    return exports if all(out[k] is v for k, v in exports.items()) else out


def _kept(field: str, value: Any) -> Any:
    """A record's metadata field: kept, a free-text one scrubbed (the same text when clean)."""
    if field in _FREE_TEXT and isinstance(value, str):
        clean = scrubbed(value)
        return value if clean == value else clean
    return value


def _as_is(value: Any) -> Any:
    return value


def _errors(doc: dict[str, Any], depth: int) -> dict[str, Any]:
    """`doc`'s `error` texts scrubbed, and its sections' down to `depth` levels (the
    collector's errors sit at most two levels into `collected`: `files[.env].error`)."""
    out = doc
    error = doc.get("error")
    if isinstance(error, str):
        out = _with(out, "error", _kept("error", error))
    if depth > 0:
        for key, section in doc.items():
            if isinstance(section, dict):
                out = _with(out, key, _errors(section, depth - 1))
    return out


def _each(mapping: Mapping[str, Any], fix: Callable[[Any], Any]) -> Any:
    """A name -> item map with `fix` applied to each item; itself when none changed."""
    out = {key: fix(item) for key, item in mapping.items()}
    return mapping if all(out[k] is v for k, v in mapping.items()) else out


def _items(items: list[Any], fix: Callable[[Any], Any]) -> list[Any]:
    out = [fix(item) for item in items]
    return items if all(new is old for new, old in zip(out, items, strict=True)) else out
