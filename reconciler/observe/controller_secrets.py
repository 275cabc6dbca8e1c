"""controller_env secrets in an observation: read here, hashed on the box like its own secrets.

A box_file secret is read by the collector on the box; a controller_env secret exists only in
this controller's environment. So that drift and audit can check it exactly like a box_file
one (the desired `.env` rendered with it, its keyed digest compared with `.env` and with what
the containers carry, keyed access proved with it on the box's loopback), the collectors are
sent its value when they start: on ssh's stdin, as apply sends it (never in an argv, where
`ps` on either machine would show it), and the box hashes it with the run's key like any
other secret it reads. Values are read from the environment at the moment the collectors
start, per run: the remembered drift inputs (reconciler/drift_inputs.py, pickled to disk)
hold only the secrets' names and variables.

A variable that is not set stops the run before any box is contacted: one error per variable,
naming it and the secret, never a warning per box. Stdlib only: a repeated drift run imports
this before anything heavy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from reconciler.scrub import remember

# What a box accepts on stdin (the collector reads no more): a few keys, never near this.
STDIN_LIMIT_BYTES = 64 * 1024


class MissingControllerSecret(ValueError):
    """A controller_env secret an observation needs is not set in this environment, or holds
    a value no `.env` line can (named, never shown)."""

    def __init__(
        self,
        missing: Mapping[tuple[str, str], list[str]],
        unusable: Mapping[tuple[str, str], tuple[str, list[str]]] | None = None,
    ) -> None:
        self.missing = dict(missing)  # (variable, secret) -> boxes that need it
        self.unusable = dict(unusable or {})  # (variable, secret) -> (why, boxes)
        lines = [
            f"secret {secret}: ${variable} is not set on this controller "
            f"(needed to check {', '.join(boxes)}); no box was contacted"
            for (variable, secret), boxes in sorted(self.missing.items())
        ]
        lines += [
            f"secret {secret}: ${variable} cannot be written to .env: {why} "
            f"(needed to check {', '.join(boxes)}); no box was contacted"
            for (variable, secret), (why, boxes) in sorted(self.unusable.items())
        ]
        super().__init__("\n".join(lines))


def controller_secrets(payload: Mapping[str, Any]) -> dict[str, str]:
    """secret name -> variable, for each controller_env secret a collector payload names."""
    named = payload.get("controller_secrets") or {}
    return {str(k): str(v) for k, v in named.items()} if isinstance(named, dict) else {}


def controller_values(
    payloads: Mapping[str, Mapping[str, Any]], environ: Mapping[str, str]
) -> dict[str, dict[str, str]]:
    """box -> {secret name: value} for every controller_env secret its payload names.

    Raises MissingControllerSecret (before anything is sent anywhere) if any variable is unset
    or empty: an empty key would make every comparison of that secret meaningless."""
    missing: dict[tuple[str, str], list[str]] = {}
    unusable: dict[tuple[str, str], tuple[str, list[str]]] = {}
    out: dict[str, dict[str, str]] = {}
    for box, payload in payloads.items():
        for secret, variable in sorted(controller_secrets(payload).items()):
            value = environ.get(variable)
            if not value or not value.strip():
                missing.setdefault((variable, secret), []).append(box)
                continue
            why = _unwritable(value)
            if why:
                unusable.setdefault((variable, secret), (why, []))[1].append(box)
                continue
            out.setdefault(box, {})[secret] = value
    if missing or unusable:
        raise MissingControllerSecret(missing, unusable)
    for values in out.values():
        for value in values.values():
            remember(value)  # masked in every text this process scrubs from now on
    return out


def _unwritable(value: str) -> str | None:
    """Why a converge could not write `value` to `.env` (the loader's rule for an `env:` value,
    desired/types.check_env_value: CR, LF, NUL, both ' and $, an odd run of trailing
    backslashes), else None. Drift would compare against a `.env` no converge can write, and
    the apply would be refused by the box only once sent. The reason never holds the value."""
    from reconciler.desired.types import check_env_value  # pydantic: only with such a secret

    try:
        check_env_value(value)
    except ValueError as exc:
        return str(exc)
    return None


def stdin_payload(values: Mapping[str, str] | None) -> bytes | None:
    """What the collector reads on stdin (None: nothing to send, stdin stays closed)."""
    if not values:
        return None
    data = json.dumps(dict(values)).encode("utf-8")
    if len(data) > STDIN_LIMIT_BYTES:
        # Named, never shown: the box would refuse it, and the values are secrets.
        raise ValueError(
            f"controller secrets {', '.join(sorted(values))}: more than "
            f"{STDIN_LIMIT_BYTES} bytes together"
        )
    return data
