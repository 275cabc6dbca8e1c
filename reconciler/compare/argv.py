"""A container's command line compared as what runs: entrypoint + command, one sequence.

Docker runs `Entrypoint + Cmd`; where the line is cut between them does not change the process.
`docker run --entrypoint` takes one word, so a hand-made copy of a compose container carries
`Entrypoint ["bash"]` and a `Cmd` that starts with the wrapper: the same argv, cut elsewhere.
Comparing `command` against `Cmd` position by position reported that as a change of every
position; here it is one finding, and the effective argv is compared as a sequence:

- flags by name, as before (`--max-model-len` 262144 -> 131072 is one finding naming the flag;
  a flag added or dropped is one finding, wherever it sits);
- positionals (the program, the wrapper, the model...) with difflib's sequence matcher, so an
  inserted, removed or replaced run of tokens is one finding, not a shift of every later one.

Pure, no I/O; stdlib difflib only (this runs on every lane of every drift).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from reconciler.compare.drift import Value
from reconciler.compare.inline import shown_flag
from reconciler.compare.values import argv_items, flags_of, same, value
from reconciler.observe.document import EnvValue
from reconciler.records import record_class
from reconciler.scrub import flag_values, secret_flag

Argv = tuple[EnvValue, ...]


@record_class()
class ArgvDiff:
    """One difference of two command lines, in drift terms."""

    path: str  # "--max-model-len", "argv[3]", "argv[2:4]", "entrypoint"
    desired: Value
    observed: Value
    note: str | None = None
    split_only: bool = False  # the argv that runs is equal; only the entrypoint/command cut


def desired_split(
    entrypoint: Sequence[EnvValue] | None,
    command: Sequence[EnvValue] | None,
    observed_entrypoint: Sequence[EnvValue] | None,
    observed_cmd: Sequence[EnvValue] | None,
    image: tuple[Sequence[EnvValue], Sequence[EnvValue]] | None = None,
) -> tuple[Argv, Argv]:
    """(Entrypoint, Cmd) docker gives a container created from a compose service.

    The engine fills what the service leaves out from the image (moby's config merge): an
    unset entrypoint is the image's, and an unset command is the image's too, unless the
    service sets an entrypoint (then Cmd stays empty, as `docker run --entrypoint` does).
    `image`: the image's own (ENTRYPOINT, CMD) when the observation carries them; without
    them an image default is taken as the container runs it (which image runs is the `image`
    rule's finding, not this one).
    """
    default_entry, default_cmd = image if image is not None else (observed_entrypoint, observed_cmd)
    # `entrypoint: []` is not unset: it clears the image's (the merge tells nil apart)
    want_entry = tuple(entrypoint if entrypoint is not None else default_entry or ())
    if command:
        want_cmd = tuple(command)
    elif entrypoint:
        want_cmd = ()
    else:
        want_cmd = tuple(default_cmd or ())
    return want_entry, want_cmd


def diff_argv(
    want_entry: Sequence[EnvValue],
    want_cmd: Sequence[EnvValue],
    got_entry: Sequence[EnvValue],
    got_cmd: Sequence[EnvValue],
) -> list[ArgvDiff]:
    want, got = (*want_entry, *want_cmd), (*got_entry, *got_cmd)
    if want == got:  # the common case, a converged lane: no parsing at all
        return [] if len(want_entry) == len(got_entry) else [_split(want_entry, got_entry)]
    found = [*_positionals(want, got), *_flags(want, got)]
    if not found and len(want_entry) != len(got_entry):
        # Equal as a command (JSON-equal values, flags in another order), cut elsewhere.
        found.append(_split(want_entry, got_entry))
    return found


def _split(want_entry: Sequence[EnvValue], got_entry: Sequence[EnvValue]) -> ArgvDiff:
    # Report-only, not a recreate: the lane runs exactly the argv the render asks for, and a
    # recreate reloads the model (minutes without the lane) to change nothing it does. It is
    # still worth a line: the cut is the mark of a container made by hand (`docker run` copies
    # compose's labels, so compose itself believes the lane is current), and the next converge
    # that recreates the lane for any other reason puts the render's cut back.
    return ArgvDiff(
        "entrypoint",
        value(tuple(want_entry)),
        value(tuple(got_entry)),
        note="entrypoint/command split differs; effective command equal (a hand-made "
        "container: `docker run --entrypoint` takes one word); recreate optional",
        split_only=True,
    )


def _positionals(want: Argv, got: Argv) -> Iterator[ArgvDiff]:
    want_at, got_at = _positionals_at(want), _positionals_at(got)
    a, b = [_key(t) for _, t in want_at], [_key(t) for _, t in got_at]
    if a == b:
        return
    from difflib import SequenceMatcher  # here: most lanes match, and difflib costs ~2 ms

    matcher = SequenceMatcher(None, a, b, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        # Named by where it sits in the desired command line (entrypoint + command), the line
        # a person compares against; an insertion sits before the desired token that follows.
        start = want_at[i1][0] if i1 < len(want_at) else len(want)
        path = f"argv[{start}]" if i2 - i1 <= 1 else f"argv[{start}:{want_at[i2 - 1][0] + 1}]"
        desired = _tokens([t for _, t in want_at[i1:i2]])
        observed = _tokens([t for _, t in got_at[j1:j2]])
        note = {
            "insert": "not in the render: inserted in the running command",
            "delete": "missing from the running command",
            "replace": None,
        }[op]
        yield ArgvDiff(path, desired, observed, note)


def _positionals_at(argv: Argv) -> list[tuple[int, EnvValue]]:
    # (a positional is never a bool: True stands only for a bare flag)
    listed = _listed_secrets(argv)
    return [
        (i, _concealed(argv, i, t) if i in listed else t)
        for i, name, t in argv_items(argv)
        if name is None and not isinstance(t, bool)
    ]


def _listed_secrets(argv: Argv) -> frozenset[int]:
    """Where a secret flag's words are (`--api-key K1 K2`: vLLM's keys are a list, argparse
    nargs="+"; the parse reads K2 as a positional): the words the collector hashes after a
    secret flag (scrub.flag_values, its rule), held in clear by a snapshot of an older
    collector. None in nearly every line: a secret flag's value is a digest already."""
    if not any(type(t) is str and t[:1] == "-" and secret_flag(t.partition("=")[0]) for t in argv):
        return frozenset()
    return frozenset(flag_values(argv))


def _concealed(argv: Argv, at: int, token: EnvValue) -> EnvValue:
    """A clear word of a secret flag's list as a drift may carry it: opaque, as the flag's own
    value is (inline.shown_flag), so a report says `***` and whether it changed."""
    flag = next(t.partition("=")[0] for t in reversed(argv[:at]) if type(t) is str and t[:1] == "-")
    shown, _ = shown_flag(flag, token, None)
    return shown if not isinstance(shown, bool) and shown is not None else token


def _flags(want: Argv, got: Argv) -> Iterator[ArgvDiff]:
    want_flags, got_flags = flags_of(want), flags_of(got)
    for flag in sorted(want_flags.keys() | got_flags.keys()):
        w, g = want_flags.get(flag), got_flags.get(flag)
        if _same_values(w, g):
            continue
        note = None
        if g is None:
            note = "missing from the running command"
        elif w is None:
            note = "not in the render: added to the running command"
        yield ArgvDiff(flag, _one(w), _one(g), note)


def _key(token: EnvValue) -> Any:
    """What the sequence matcher compares: a token, or a JSON-looking token by its content
    (compose and a hand edit may space `{"a": 1}` differently; `same` says they are equal)."""
    if isinstance(token, str) and token[:1] in "{[":
        try:
            return ("json", json.dumps(json.loads(token), sort_keys=True))
        except (ValueError, RecursionError):
            return token
    return token


def _tokens(tokens: list[EnvValue]) -> Value:
    if not tokens:
        return None
    return value(tokens[0]) if len(tokens) == 1 else value(tokens)


def _same_values(a: Sequence[Any] | None, b: Sequence[Any] | None) -> bool:
    if a is None or b is None or len(a) != len(b):
        return False
    return all(same(x, y) for x, y in zip(a, b, strict=True))


def _one(values: Sequence[Any] | None) -> Any:
    if values is None:
        return None
    shown = [value(v) for v in values]
    return shown[0] if len(shown) == 1 else tuple(shown)
