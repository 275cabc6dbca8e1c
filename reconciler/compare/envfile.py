"""`envfile`: the deployed `.env` against the managed keys; `host`: memory headroom."""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Iterator, Mapping
from typing import Any

from reconciler.compare.context import BoxExpectation, secret_of
from reconciler.compare.drift import BoxError, Drift, Part
from reconciler.compare.inline import desired_value, hashed_inline, may_carry_secret, shown
from reconciler.compare.rules import rule
from reconciler.observe.document import EnvLine, Observed
from reconciler.scrub import scrub_text

GIB_KIB = 1024 * 1024


def compare_envfile(
    exp: BoxExpectation, doc: Observed, observed: Mapping[str, EnvLine] | None = None
) -> Iterator[Drift]:
    """`observed`: doc.envfile_by_key(), if the caller has it already."""
    env_rule, mode_rule = rule("envfile.key"), rule("envfile.mode")
    if doc.envfile is None:
        unread = doc.file_errors.get(".env")  # there, but not read: the box's error says why
        yield Drift(
            exp.name,
            env_rule.kind,
            "file:.env",
            "(file)",
            "present",
            None,
            env_rule.action,
            # the box's own words (an OSError's text): scrubbed as any free text from a box
            note=f"the deployment's .env could not be read: {scrub_text(unread)}"
            if unread
            else "the deployment has no .env",
        )
        return
    observed = doc.envfile_by_key() if observed is None else observed
    for entry in exp.env:
        found = observed.get(entry.key)
        seen = found.value if found else None
        secret = secret_of(entry)
        if secret is not None:
            src = doc.secret_sources.get(secret)
            if src is None or src.digest is None:
                # A box error (secret_source_errors), also when the answer has no entry for it:
                # the desired value is unknown.
                # Both sources arrive as the same keyed digest: a box_file secret read on the
                # box, a controller_env one sent to it for this run (observe/controller_secrets).
                continue
            want: Any = src.digest
        elif doc.envfile_desired and isinstance(entry.value, str):
            # A value carrying a secret inline: the line holds it hashed with the run's key,
            # so it compares with the box's mask of the desired value (compare/inline.py).
            want = desired_value(doc, entry.key, entry.value)
        else:
            want = entry.value
        if seen != want and not (want == "" and seen is None and not _empty_is_off(entry.key)):
            note = f"from {entry.origin}" if want is not None else f"{entry.origin}: null"
            shown_want, shown_seen = want, seen
            if _may_hold_secret(want) or _may_hold_secret(seen):
                # A drift never carries a secret in clear (a desired one, or a line of a
                # snapshot saved before the box hashed inline secrets): shown as `***`.
                if hashed_inline(seen) and not hashed_inline(want) and _may_hold_secret(want):
                    # The answer has no mask of this desired value (a snapshot taken against
                    # another one): its secret cannot be compared, which the reader is told.
                    note += "; the box hashed the secret in this line, and this observation "
                    note += "has no digest of the desired value's to compare it with"
                shown_want, shown_seen = shown(want, seen)
            yield Drift(
                exp.name,
                env_rule.kind,
                "file:.env",
                entry.key,
                shown_want,
                shown_seen,
                env_rule.action,
                source=f".env:{found.line}" if found else "absent",
                note=note,
            )
    fact = doc.files.get(".env")
    mode = fact.mode if fact else None
    if mode and mode != "0o600":
        yield Drift(
            exp.name,
            mode_rule.kind,
            "file:.env",
            "mode",
            "0600",
            mode.replace("0o", "0"),
            mode_rule.action,
            note=".env holds secrets: owner-only",
        )


def _may_hold_secret(value: object) -> bool:
    """A text that may hold a secret inline (a cheap look first: most drifting values are a
    window, a model or an image, with no `--`, `=`, `:` nor a credential in them)."""
    if type(value) is not str or not (
        "--" in value or "=" in value or ":" in value or "earer" in value or "EARER" in value
    ):
        return False
    return hashed_inline(value) or may_carry_secret(value)


# lobes' `${VAR-default}` idiom: set-but-empty means OFF, absent means the template default,
# so for these keys "" and absent differ; for every other key compose reads them the same.
EMPTY_IS_OFF = (
    "*_SPECULATIVE_CONFIG",
    "*_CHUNKED_PREFILL",
    "*_ASYNC_SCHEDULING",
    "*_PREFIX_CACHING",
)


# Remembered per key (bounded: a box chooses its keys): a fleet's `.env` files share their
# keys, and this is asked of every managed key the box lacks.
@functools.lru_cache(maxsize=1024)
def _empty_is_off(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in EMPTY_IS_OFF)


def secret_source_errors(exp: BoxExpectation, doc: Observed) -> list[BoxError]:
    """A secret whose box file or key is missing, or a controller_env secret the box was not
    sent (a pyinfra fact's run), cannot be compared or written: an error."""
    errors = []
    used = {secret_of(e) for e in exp.env} - {None}
    for name in sorted(n for n in used if n is not None):
        src = doc.secret_sources.get(name)
        if src is None:
            # Every live run sends the box each secret it reads or stops first, and the box
            # answers for each: an answer without one (a snapshot saved before controller_env
            # secrets were sent, a broken or hostile box) leaves the secret's .env line
            # uncompared (compare_envfile), which is said, never "in sync".
            errors.append(
                BoxError(
                    Part.SECRET_SOURCE,
                    f"secret {name}",
                    "not in this observation's secret_sources: its .env line not compared",
                )
            )
            continue
        if src.status != "ok":
            errors.append(
                BoxError(Part.SECRET_SOURCE, f"secret {name}", f"{src.status} ({src.path})")
            )
    return errors


def compare_host(exp: BoxExpectation, doc: Observed) -> Iterator[Drift]:
    total, available = doc.meminfo.total_kib, doc.meminfo.available_kib
    if not total or available is None or not exp.lanes:
        return
    biggest = max(exp.lanes.values(), key=lambda lane: lane.gpu_memory_utilization)
    floor = exp.mem_floor_gib
    need_kib = int(biggest.gpu_memory_utilization * total + floor * GIB_KIB)
    if available < need_kib:
        host_rule = rule("host.memory")
        yield Drift(
            exp.name,
            host_rule.kind,
            "host",
            "MemAvailable",
            f">= {need_kib / GIB_KIB:.1f} GiB",
            f"{available / GIB_KIB:.1f} GiB",
            host_rule.action,
            source="/proc/meminfo",
            note=f"booting {biggest.service} needs {biggest.gpu_memory_utilization:g} x MemTotal "
            f"+ {floor:g} GiB",
        )
