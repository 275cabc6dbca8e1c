"""Normalising observed values into the desired side's terms (pure helpers)."""

from __future__ import annotations

import functools
import json
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from reconciler.compare.drift import SecretValue, Value
from reconciler.observe.document import EnvValue


def value(raw: EnvValue | bool | list[Any] | tuple[Any, ...] | None) -> Value:
    """An observed value (from the typed document) -> a drift value: lists become tuples."""
    if isinstance(raw, list | tuple):
        return tuple(value(v) for v in raw)
    return raw


def same(a: Any, b: Any) -> bool:
    """Equal as compose would see them; JSON-looking strings compare by content: their
    canonical dumps (keys sorted), as argv.py's `_key` compares positionals. Not by `==` of
    what json.loads gives: Python has `False == 0` and `True == 1.0`, and a chat template
    (Jinja's `is false`) or a config reads `{"enable_thinking": false}` and
    `{"enable_thinking": 0}` apart. `1` and `1.0` are told apart too: JSON keeps the type
    (an int field refuses 1.0, a template prints "1.0"), and a report of a difference that
    turns out alike costs less than a missed one."""
    if a == b:
        return True
    if isinstance(a, str) and isinstance(b, str) and a[:1] in "{[" and b[:1] in "{[":
        try:
            return _canonical(a) == _canonical(b)
        except (ValueError, RecursionError):  # a box's string may nest past the parser's depth
            return False
    return False


def _canonical(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True)


def changed_keys(
    expected: Mapping[str, EnvValue], observed: Mapping[str, EnvValue]
) -> dict[str, tuple[EnvValue | None, EnvValue | None]]:
    """Two flat mappings (a container's environment) -> {key: (expected, observed)} for every
    key added, removed or changed, absent as None, in key order. Environments are flat
    str -> str maps, so a set of keys is the whole diff; deepdiff's tree walk cost ~0.2 s CPU
    per drift run here.
    The (key, value) pairs in one map and not the other are a set operation in C (the values,
    text and hashed secrets, are hashable; a key whose value differs appears twice)."""
    try:
        differing = {key for key, _ in expected.items() ^ observed.items()}
    except TypeError:  # an unhashable value: key by key
        differing = {
            key
            for key in expected.keys() | observed.keys()
            if key not in expected or key not in observed or expected[key] != observed[key]
        }
    return {key: (expected.get(key), observed.get(key)) for key in sorted(differing)}


Flags = dict[str, list[EnvValue | bool]]  # parse_argv's {flag: [values...]}


def parse_argv(argv: Sequence[EnvValue] | None) -> tuple[list[EnvValue], Flags]:
    """Split a vLLM-style argv into positionals and {flag: [values...]}, as vLLM reads it.

    `--flag=value` and `--flag value` both map to the flag; a bare `--flag` (a boolean) maps to
    True. Secret values (already digests) stay opaque. What vLLM's parser does before argparse
    sees the line is done here too (`_walk`): flag names are normalised, `--model M` is the
    positional M, and dotted flags fold into their JSON flag.
    """
    positionals, flags = _remembered(argv)
    # Copies: the remembered parse is shared by every call with this command line.
    return list(positionals), {name: list(values) for name, values in flags.items()}


def flags_of(argv: Sequence[EnvValue] | None) -> Mapping[str, tuple[EnvValue | bool, ...]]:
    """parse_argv's flags, read-only: {flag: (values...)}, shared by every caller that only
    reads them (no copy to make)."""
    return MappingProxyType(_remembered(argv)[1])


Parsed = tuple[tuple[EnvValue, ...], dict[str, tuple[EnvValue | bool, ...]]]


def _remembered(argv: Sequence[EnvValue] | None) -> Parsed:
    tokens = tuple(argv or ())
    try:
        return _parsed(tokens)
    except TypeError:  # a token that cannot be hashed (not one the typed parse lets through)
        return _frozen(tokens)


def _frozen(items: tuple[EnvValue, ...]) -> Parsed:
    """_parse's answer in tuples: remembered and shared, so nobody can change it."""
    positionals, flags = _parse(items)
    return tuple(positionals), {name: tuple(values) for name, values in flags.items()}


def _parse(items: tuple[EnvValue, ...]) -> tuple[list[EnvValue], Flags]:
    positionals: list[EnvValue] = []
    flags: Flags = {}
    for _, name, parsed in _walk(items):
        if name is not None:
            flags.setdefault(name, []).append(parsed)
        elif not isinstance(parsed, bool):  # True stands only for a bare flag
            positionals.append(parsed)
    return positionals, flags


# Remembered per command line (bounded: a box chooses its commands): a fleet's lanes run a
# handful of distinct command lines, and comparing a box parses each of its lanes' twice (the
# render's and the running one): ~12 us a parse, ~0.1 s of comparing 1,000 boxes.
_parsed = functools.lru_cache(maxsize=1024)(_frozen)


def argv_items(
    argv: Sequence[EnvValue] | None,
) -> Iterator[tuple[int, str | None, EnvValue | bool]]:
    """(index in argv, flag name or None for a positional, value) in the order vLLM reads them:
    parse_argv's walk, with each item's position kept so a sequence diff can name where a
    positional sits (`--model M`'s M where it is written, read beside `serve`; a dotted flag's
    folded JSON at the first of them, read last)."""
    return iter(_walk(tuple(argv or ())))


Item = tuple[int, str | None, EnvValue | bool]

# vLLM's short options for a long one that takes a value (vllm/engine/arg_utils.py: `-q`,
# `-tp`, `-pp`, `-dp`, which the lab's stand-in declares as well, and the data-parallel
# ones): `-tp 2` is `--tensor-parallel-size 2`. `-O` is left out: it stood for
# `--compilation-config` and now for `--optimization-level` (`-O3` glued), by version.
SHORT_FLAGS: Mapping[str, str] = MappingProxyType(
    {
        "-q": "--quantization",
        "-tp": "--tensor-parallel-size",
        "-pp": "--pipeline-parallel-size",
        "-dp": "--data-parallel-size",
        "-dcp": "--decode-context-parallel-size",
        "-dpn": "--data-parallel-rank",
        "-dpr": "--data-parallel-start-rank",
        "-dpl": "--data-parallel-size-local",
        "-dpa": "--data-parallel-address",
        "-dpp": "--data-parallel-rpc-port",
        "-dpb": "--data-parallel-backend",
    }
)


def _names_of(text: str) -> frozenset[str]:
    return frozenset(text.split())


# vLLM's boolean serve flags: argparse's BooleanOptionalAction, which vLLM gives every bool
# field of its config dataclasses (`--x` and `--no-x`), takes no word. So `--enforce-eager M`
# serves M with eager mode on, not a flag valued M and no model. The lab's stand-in declares
# the same (lab/images/vllm_standin.py `_BOOL_FLAGS`; tests/unit/test_argv_flag_arity.py holds
# the two lists alike). A flag not listed here reads the next word as its value, as before.
BOOLEAN_FLAGS = _names_of(
    """
--enforce-eager --enable-prefix-caching --enable-chunked-prefill --async-scheduling
--trust-remote-code --enable-auto-tool-choice --enable-lora --enable-lora-bias
--fully-sharded-loras --language-model-only --enable-mamba-cache-stochastic-rounding
--disable-log-stats --enable-log-requests --disable-log-requests --disable-uvicorn-access-log
--allow-credentials --return-tokens-as-token-ids --disable-frontend-multiprocessing
--enable-request-id-headers --disable-fastapi-docs --enable-prompt-tokens-details
--enable-server-load-tracking --enable-force-include-usage --enable-tokenizer-info-endpoint
--enable-log-outputs --log-error-stack --headless --data-parallel-hybrid-lb
--enable-expert-parallel --enable-eplb --ray-workers-use-nsight --disable-custom-all-reduce
--enable-multimodal-encoder-data-parallel --calculate-kv-scales --kv-sharing-fast-prefill
--disable-sliding-window --disable-cascade-attn --skip-tokenizer-init --enable-prompt-embeds
--enable-sleep-mode --use-tqdm-on-load --disable-mm-preprocessor-cache
--interleave-mm-strings --skip-mm-profiling --disable-chunked-mm-input
--disable-hybrid-kv-cache-manager
"""
)
BOOLEAN_FLAGS |= {"--no-" + flag[2:] for flag in BOOLEAN_FLAGS}

# vLLM's list serve flags (argparse nargs="+"): every word up to the next option is one of its
# values, so `--served-model-name a b M` names two and serves nothing else, and the words are
# the flag's values in their order, not positionals. `--api-key` is a list too, but its words
# are secrets: read by the secret-flag rule (scrub.flag_values; argv.py `_listed_secrets`).
LIST_FLAGS = _names_of(
    "--served-model-name --middleware --logits-processors --ignore-patterns --cuda-graph-sizes"
    " --lora-modules"
)


# argparse's own test for a word that is a negative number, not an option (`-1`, `-.5`), when
# the parser declares no option that looks like one (vLLM's does not).
_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")


def _ends_list(token: EnvValue) -> bool:
    """Whether argparse ends a list flag's words at `token`: an option (`-x`, `--x`), not a
    lone `-` or a negative number."""
    if type(token) is not str or len(token) < 2 or token[0] != "-":
        return False
    return _NEGATIVE_NUMBER.fullmatch(token) is None


def _walk(items: tuple[EnvValue, ...]) -> list[Item]:
    """A command line as vLLM's FlexibleArgumentParser hands it to argparse
    (vllm/utils/argparse_utils.py `parse_args`), so two lines that run the same are read
    alike and one that runs otherwise is read as what runs:

    - a flag's name has `_` read as `-` up to its first `.` (`--max_model_len` is
      `--max-model-len`), a short option as its long one (`SHORT_FLAGS`);
    - `vllm serve ... --model M` serves M: vLLM moves M beside `serve`, as a positional;
    - a dotted flag (`--speculative-config.num_speculative_tokens=3`, or its value as the next
      word, whatever it is) sets one key of its JSON flag: the keys of every dotted flag of one
      flag are merged into one object, JSON-typed, and passed last as that flag, so it replaces
      any `--speculative-config '{...}'` of the line (argparse keeps the last).
    """
    out: list[Item] = []
    model = _model_option(items)
    folded: dict[str, dict[str, Any]] = {}  # flag -> the object its dotted flags make
    folded_at: dict[str, int] = {}
    i, count = 0, len(items)
    while i < count:
        token, at = items[i], i
        i += 1
        if model is not None and at == model[1]:
            i = model[2]  # `--model M`: M is read beside `serve`
            continue
        name = _flag(token)
        if name is None:
            out.append((at, None, token))
            if model is not None and at == model[0]:
                out.append((model[1], None, model[3]))
            continue
        assert isinstance(token, str)  # _flag names only a word
        _, eq, inline = token.partition("=")
        if "." in name:
            # vLLM takes the next word as the value whatever it is (a flag included).
            raw: EnvValue | bool = _secret_inline(inline) if eq else items[i] if i < count else True
            if not eq and i < count:
                i += 1
            if type(raw) is str and _fold(folded, name, raw):
                folded_at.setdefault(name.partition(".")[0], at)
                continue
            out.append((at, name, raw))  # a digest or nothing to fold: as it is written
            continue
        parsed: EnvValue | bool
        if eq:
            parsed = _secret_inline(inline)
        elif name in BOOLEAN_FLAGS:
            parsed = True  # takes no word: the next one is read on its own
        elif name in LIST_FLAGS and i < count and not _ends_list(items[i]):
            while i < count and not _ends_list(items[i]):
                out.append((at, name, items[i]))
                i += 1
            continue
        elif i < count and not _is_flag(items[i]):
            parsed = items[i]
            i += 1
        else:
            parsed = True
        out.append((at, name, parsed))
    for flag, merged in folded.items():
        out.append((folded_at[flag], flag, json.dumps(merged)))
    return out


def _model_option(items: tuple[EnvValue, ...]) -> tuple[int, int, int, str] | None:
    """(where `serve` is, where `--model` is, the index after its value, the model) when the
    line is `[... vllm] serve ... --model M` (vLLM moves the first `--model`'s M beside `serve`
    and warns); None otherwise, or when vLLM would refuse it (no value, a `-` word)."""
    serve = next(
        (
            at
            for at, token in enumerate(items)
            if token == "serve" and (at == 0 or _vllm(items[at - 1]))
        ),
        None,
    )
    if serve is None:
        return None
    for at in range(serve + 1, len(items)):
        token = items[at]
        if type(token) is not str:
            continue
        if token == "--model":
            following = items[at + 1] if at + 1 < len(items) else None
            if type(following) is not str or following.startswith("-"):
                return None
            return serve, at, at + 2, following
        if token.startswith("--model=") and len(token) > len("--model="):
            return serve, at, at + 1, token.removeprefix("--model=")
    return None


def _vllm(word: Any) -> bool:
    """vLLM's CLI (`vllm`, `/usr/local/bin/vllm`), wherever a wrapper puts it in the line
    (lobes' `bash /usr/local/bin/mg-logwrap vllm serve ...`)."""
    return type(word) is str and word.rsplit("/", 1)[-1] == "vllm"


@functools.lru_cache(maxsize=4096)
def _name(key: str) -> str | None:
    """A word's flag name as vLLM reads it (`--max_model_len` -> `--max-model-len`, up to the
    first `.`; `-tp` -> `--tensor-parallel-size`), None for a word that is no flag."""
    if key.startswith("--"):
        head, dot, tail = key[2:].partition(".")
        return "--" + head.replace("_", "-") + dot + tail
    return SHORT_FLAGS.get(key)


def _flag(token: Any) -> str | None:
    if type(token) is not str or token[:1] != "-":
        return None
    return _name(token.partition("=")[0])


def _fold(folded: dict[str, dict[str, Any]], name: str, raw: str) -> bool:
    """`--flag.a.b` = `raw` merged into `folded[--flag]` as vLLM merges it (`+` at the end
    appends to a list: `--flag.a+ x,y`); False when there is no key to set."""
    flag, _, path = name.partition(".")
    if name.endswith("+"):
        path = path[:-1]
        value: Any = raw.split(",")
    else:
        value = _typed(raw)
    if not path:
        return False
    for key in reversed(path.split(".")):
        value = {key: value}
    _merge(folded.setdefault(flag, {}), value)
    return True


def _typed(raw: str) -> Any:
    """A dotted flag's value as vLLM types it: JSON, else a human-readable integer (`80g`,
    `32K`), else the text."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        pass
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", raw.strip())
    if match:
        number, suffix = match.groups()
        if suffix in "kmgt":
            return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
        if "." not in number:
            return int(number) * 1024 ** ("KMGT".index(suffix) + 1)
        return raw  # vLLM refuses a decimal with a binary suffix: the text, as it falls back
    try:
        return int(raw)
    except ValueError:
        return raw


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    """vLLM's recursive_dict_update: objects merge key by key, lists append, else the new one."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] += value
        else:
            into[key] = value


def _is_flag(token: Any) -> bool:
    return isinstance(token, str) and (
        token.startswith("--") or token.partition("=")[0] in SHORT_FLAGS
    )


def _secret_inline(text: str) -> EnvValue:
    # The collector writes `--api-key={"secret": "..."}` so the flag name survives masking.
    if text.startswith('{"secret"'):
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError):
            return text
        digest = raw.get("secret") if isinstance(raw, dict) else None
        if isinstance(digest, str) and len(raw) == 1:
            return SecretValue(digest)
    return text


def knob_tokens(flag: str, knob_value: str) -> list[str]:
    """What a `.env` knob puts on the command line, lexed like compose does.

    `WORKER_MAX_MODEL_LEN=262144` -> `--max-model-len=262144`; a knob that carries its own flag
    (`'--speculative-config={...}'`) is lexed as is.
    """
    text = knob_value.strip()
    if text.startswith(("'", '"', "--")):
        return list(_lexed(text))
    return [f"{flag}={text}"]


@functools.lru_cache(maxsize=4096)
def _lexed(text: str) -> tuple[str, ...]:
    """shlex's tokens of a knob (~0.2 ms each, pure Python): a fleet's boxes mostly share
    their knobs' values, so each distinct one is lexed once per run, not once per box."""
    try:
        return tuple(shlex.split(text))
    except ValueError:
        return (text,)
