"""`envfile`: the deployed `.env` against the managed keys; `host`: memory headroom."""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from reconciler.compare.containers import service_containers
from reconciler.compare.context import BoxExpectation, secret_of
from reconciler.compare.drift import Action, BoxError, Drift, Part
from reconciler.compare.inline import desired_value, hashed_inline, may_carry_secret, shown
from reconciler.compare.rules import rule
from reconciler.compare.values import flags_of
from reconciler.observe.document import (
    Container,
    EnvLine,
    Observed,
    SecretSource,
    SecretValue,
    Service,
    SourceSpec,
)
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
    readers: list[Service] | None = None  # the services that read .env whole: asked once, if ever
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
        if seen == want:
            continue
        read_whole = False
        if want == "" and seen is None and not _empty_is_off(entry.key):
            # `KEY=` and no line interpolate alike (`${KEY:-}`), but a service that reads the
            # file through `env_file:` gets KEY="" from one and no KEY from the other, unless
            # something it reads after the file (its `environment:`, a later env_file such as
            # lobes' `.secrets.env`) sets KEY: then its render shows that value.
            if readers is None:
                services = _rendered(doc) or {}
                kept = _kept_keys(exp, observed)
                readers = [services[s] for s in env_file_readers(services, kept)]
            if not any(r.environment.get(entry.key, "") == "" for r in readers):
                continue
            read_whole = True
        note = f"from {entry.origin}" if want is not None else f"{entry.origin}: null"
        if read_whole:
            note += f"; read through env_file, `{entry.key}=` sets it empty, no line not at all"
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


def env_file_readers(services: Mapping[str, Service] | None, keys: AbstractSet[str]) -> list[str]:
    """The services that read the `.env` whole, through `env_file:`: their rendered environment
    holds every key of `keys` (assignments of the `.env` their render was made from). compose's
    render names no `env_file:`, it puts the file's every line in the environment (lobes' lanes:
    ~100 keys; its gateway sets its own `environment:` and lacks many). None without a key to
    tell them by, or without a render: empty."""
    if not services or not keys:
        return []
    return sorted(name for name, spec in services.items() if spec.environment.keys() >= keys)


def _rendered(doc: Observed) -> Mapping[str, Service] | None:
    """A render's services, to tell the env_file readers by: the desired `.env`'s, else (a
    snapshot that holds none: render_basis.for_desired) the box's own, which has the same."""
    if doc.render.services is None and doc.render_current is not None:
        return doc.render_current.services
    return doc.render.services


def _kept_keys(exp: BoxExpectation, observed: Mapping[str, EnvLine]) -> AbstractSet[str]:
    """The box's `.env` keys the desired `.env` keeps too (all but those pinned null): every
    render of either file, the box's own or the desired one, carries them through env_file."""
    dropped = {e.key for e in exp.env if e.value is None}
    return observed.keys() - dropped


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


def secret_source_errors(
    exp: BoxExpectation, doc: Observed, stale: Mapping[str, str] | None = None
) -> list[BoxError]:
    """A secret whose box file or key is missing, or a controller_env secret the box was not
    sent (a pyinfra fact's run), cannot be compared or written: an error. `stale`: the
    secrets a replayed snapshot read from another source than the desired one (taken out of
    `doc.secret_sources`, `stale_sources`), each with what it read."""
    errors = []
    used = {secret_of(e) for e in exp.env} - {None}
    for name in sorted(n for n in used if n is not None):
        src = doc.secret_sources.get(name)
        if src is None:
            # Every live run sends the box each secret it reads or stops first, and the box
            # answers for each: an answer without one (a snapshot saved before controller_env
            # secrets were sent, a broken or hostile box, or one that read another source)
            # leaves the secret's .env line uncompared (compare_envfile), which is said, never
            # "in sync".
            other = (stale or {}).get(name)
            why = f": {other}" if other else ""
            errors.append(
                BoxError(
                    Part.SECRET_SOURCE,
                    f"secret {name}",
                    f"not in this observation's secret_sources{why}: its .env line not compared",
                )
            )
            continue
        if src.status != "ok":
            errors.append(
                BoxError(Part.SECRET_SOURCE, f"secret {name}", f"{src.status} ({src.path})")
            )
    return errors


def stale_sources(
    doc: Observed, desired: Mapping[str, SourceSpec], home: str | None = None
) -> dict[str, str]:
    """The secrets of `doc` (a snapshot's) read from another source than `desired` names (a
    path, a key, a variable, or the kind of source changed since it was saved), each with
    what it read and what is desired: its digest is another secret's, which compared as this
    one's would call a changed secret in sync, or a missing one there. A live answer always
    read the desired sources (the payload named them). An answer from before the collector
    recorded its sources tells them only by `path` (a box_file's as given, a controller_env's
    `$VAR on the controller`): there a key changed alone is not seen. `home`: the box's, which
    a box_file's path is expanded under as the collector expands it."""
    out = {}
    for name, seen in doc.secret_sources.items():
        want = desired.get(name)
        if want is None or _same_source(seen, want, home):
            continue
        read = _described(seen.spec) if seen.spec is not None else scrub_text(seen.path or "?")
        out[name] = f"the snapshot read another source ({read}; desired {_described(want)})"
    return out


def envfile_source(doc: Observed, want: SourceSpec, home: str | None) -> SecretSource | None:
    """What a box_file source that is the deployment's own `.env` (`reconcile import` points a
    key no other file holds at its `.env` line) reads, from the answer's `envfile`: the same
    file, read as compose reads it, its secrets hashed as the collector hashes a source's (the
    run's key). So a snapshot replays against it as a live drift reads it. None: another file,
    or a line whose value is not hashed (a key no secret pattern names: the collector's digest
    of it is not known here)."""
    if doc.envfile is None or doc.deploy_dir is None or want.key is None:
        return None
    if under_home(want.path, home) != f"{doc.deploy_dir.rstrip('/')}/.env":
        return None
    line = doc.envfile_by_key().get(want.key)
    if line is None:
        return SecretSource("key-missing", want.path, None, want)
    if isinstance(line.value, SecretValue):
        return SecretSource("ok", want.path, line.value, want)
    return None


def _same_source(seen: SecretSource, want: SourceSpec, home: str | None) -> bool:
    spec = seen.spec
    if spec is None:
        return seen.path == _shown_path(want)
    if want.variable is not None or spec.variable is not None:
        return spec.variable == want.variable
    if spec.key != want.key:
        return False
    expanded = under_home(want.path, home)
    return spec.path == want.path or (expanded is not None and spec.expanded == expanded)


def _shown_path(spec: SourceSpec) -> str | None:
    """The `path` a collector's answer gives this source (collector.py `secret_sources`)."""
    return f"${spec.variable} on the controller" if spec.variable is not None else spec.path


def _described(spec: SourceSpec) -> str:
    if spec.variable is not None:
        return scrub_text(f"${spec.variable} on the controller")
    return scrub_text(f"{spec.path}, key {spec.key}")


def under_home(path: str | None, home: str | None) -> str | None:
    """A desired `~/...` path (desired/types.py `check_home_path`) expanded under the box's
    `home` as the collector's os.path.expanduser expands it (the home's trailing `/` dropped,
    `/` itself giving `/...`): what its answer says for that path. None if either is not
    known."""
    if path is None or home is None or not path.startswith("~/"):
        return None
    return (home.rstrip("/") + path[1:]) or "/"


# Drift actions after which a converge boots the lane they name (plan.py `_collect`).
_BOOTS = frozenset({Action.RECREATE, Action.PULL_RECREATE, Action.START, Action.RESTORE_FILE})


def compare_host(
    exp: BoxExpectation, doc: Observed, drifts: Iterable[Drift] | None = None
) -> Iterator[Drift]:
    """Whether MemAvailable covers each lane boot a converge would make (its gate, converge.py
    `memory_gate`: util x MemTotal + the floor), one lane at a time in the plan's order. A lane
    that would boot is one not running (missing, exited), or one that `drifts` (the box's other
    drifts) recreates; `drifts` None (not known): every running lane too, as if each were
    recreated, but one still booting (health `starting`).
    A converge stops a running lane before it boots it again, so a lane running healthy gives
    back what it holds (its running `--gpu-memory-utilization` x MemTotal: vLLM takes that
    share at boot and keeps it) and a lane left as it runs asks for nothing: a converged box is
    in sync, however little of a unified memory its lanes leave free. Each lane booted before
    another takes its share from what that one finds.
    The incident (lobes.md #5): a lane that cannot boot because memory is short."""
    total, available = doc.meminfo.total_kib, doc.meminfo.available_kib
    if not total or available is None or not exp.lanes:
        return
    if doc.docker.containers is None or (not doc.containers and doc.docker.error is not None):
        # What runs is not known (a box error says why): nothing is known to hold memory, nor
        # to boot.
        return
    running = service_containers(doc)
    recreated = None if drifts is None else _booted_by(drifts)
    floor_kib = exp.mem_floor_gib * GIB_KIB
    taken = 0.0  # KiB the lanes booted before this one take beyond what they gave back
    worst: tuple[float, str, float, float, float] | None = None
    for service, lane in exp.lanes.items():
        group = running.get(service)
        c = group[0] if group else None
        if c is not None and c.status == "running":
            if recreated is not None and service not in recreated:
                continue  # left as it runs: what it holds is already out of MemAvailable
            if recreated is None and c.health == "starting":
                continue  # booting as it was seen: what it still takes, MemAvailable cannot say
        # What a running lane holds, given back by its stop: known only of a healthy one.
        held = _held_share(c) if c is not None and _runs_healthy(c) else 0.0
        util = lane.gpu_memory_utilization
        need_kib = util * total + floor_kib - held * total + taken
        if worst is None or need_kib - available > worst[0]:
            worst = (need_kib - available, service, util, held, taken)
        taken += (util - held) * total
    if worst is None or worst[0] <= 0:
        return
    short, service, util, held, before = worst
    need_kib = available + short
    note = f"booting {service} needs {util:g} x MemTotal + {exp.mem_floor_gib:g} GiB"
    if held:
        note += f"; it runs holding {held:g} x MemTotal, which stopping it frees first"
    if before > 0:
        note += f"; lanes booted before it take {before / GIB_KIB:.1f} GiB of what is free"
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
        note=note,
    )


def _booted_by(drifts: Iterable[Drift]) -> set[str]:
    """The lanes a converge of these drifts (re)boots: each one a lane drift's action boots."""
    return {
        d.subject.removeprefix("lane:")
        for d in drifts
        if d.action in _BOOTS and d.subject.startswith("lane:")
    }


def _runs_healthy(c: Container) -> bool:
    return c.status == "running" and c.health in (None, "healthy")


def _held_share(c: Container) -> float:
    """The share of MemTotal a running lane holds: the `--gpu-memory-utilization` it runs with
    (the last one, as vLLM's argparse reads it); 0 where its command line does not say (a
    secret's digest, no flag, not a number in 0-1): nothing is given back that is not known."""
    said = flags_of((*(c.entrypoint or ()), *(c.cmd or ()))).get("--gpu-memory-utilization")
    if not said or not isinstance(said[-1], str):
        return 0.0
    try:
        share = float(said[-1])
    except ValueError:
        return 0.0
    return share if 0.0 < share <= 1.0 else 0.0
