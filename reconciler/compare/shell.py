"""`shell-leak`: variables the deploy user's login shell exports that compose would use.

Compose interpolates `${VAR}` from the process environment before `.env`, so any `docker
compose up` from an interactive login shell silently takes the shell's value (incident #209:
`~/.bashrc:6` armed GATEWAY_API_KEY while `.env` had it commented out). A leak is any export
of a variable the compose files interpolate, of a name the login-shell policy forbids, or of a
variable compose or docker reads itself (COMPOSE_*, DOCKER_HOST, …: a floor, always); it
says which services and fields the shell would change, and whether a running container
already carries the shell's value instead of `.env`'s.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Iterator, Mapping

from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import Drift
from reconciler.compare.inline import conceal_clear, fits, hashed_inline
from reconciler.compare.rules import rule
from reconciler.compare.values import Flags, parse_argv
from reconciler.observe.document import Container, EnvLine, EnvValue, Observed, Service
from reconciler.scrub import scrub_text


def compare_shell(
    exp: BoxExpectation, doc: Observed, envfile: Mapping[str, EnvLine] | None = None
) -> Iterator[Drift]:
    """`envfile`: doc.envfile_by_key(), if the caller has it already."""
    exports = doc.login_shell.exports
    if not exports:
        return
    interpolated = doc.variables.names
    forbidden = exp.forbidden_exports
    envfile = doc.envfile_by_key() if envfile is None else envfile
    scrubbed = doc.render.services or {}
    login_render = (doc.render_login.services if doc.render_login else None) or {}
    containers = doc.containers
    flags: dict[str, tuple[Flags, Flags]] = {}  # each service's two command lines, parsed once
    r = rule("shell.export")
    for name, export in sorted(exports.items()):
        is_forbidden = _forbidden(name, forbidden)
        is_control = control_variable(name)
        if name not in interpolated and not is_forbidden and not is_control:
            continue
        fields = _changed_fields(name, export.value, scrubbed, login_render, flags)
        carriers = _carriers(name, export.value, envfile.get(name), containers)
        parts = []
        if fields:
            parts.append("would change " + ", ".join(fields))
        elif name in interpolated:
            parts.append("compose interpolates it")
        if carriers:
            parts.append("running " + ", ".join(carriers) + " carry the shell's value")
        if is_forbidden:
            parts.append("forbidden by login_shell policy")
        if is_control:
            parts.append("compose or docker reads it itself (project, files, engine)")
        env_line = envfile.get(name)
        yield Drift(
            exp.name,
            r.kind,
            "shell",
            name,
            # A line of a snapshot saved before the box hashed inline secrets may hold one in
            # clear (`--api-key x`): never in a drift.
            conceal_clear(env_line.value) if env_line else None,
            export.value,
            r.action,
            # the box's text (a login file's line): scrubbed as any free text from a box
            source=scrub_text(export.source) if export.source else "login shell",
            note="; ".join(parts),
        )


# What compose and the docker CLI read from their own environment, whatever the compose files
# say: the project, its files and profiles (COMPOSE_*), the engine and the CLI's configuration.
# A floor no policy can lower (as the secret-name floor): exported by a login shell, they send
# a hand-run `docker compose` to another project, other files or another engine.
CONTROL_PREFIX = "COMPOSE_"
CONTROL_NAMES = frozenset(
    {
        "DOCKER_HOST",
        "DOCKER_CONTEXT",
        "DOCKER_CONFIG",
        "DOCKER_TLS_VERIFY",
        "DOCKER_CERT_PATH",
        "DOCKER_DEFAULT_PLATFORM",
    }
)


def control_variable(name: str) -> bool:
    """A variable compose or docker reads itself (CONTROL_PREFIX, CONTROL_NAMES)."""
    return name.startswith(CONTROL_PREFIX) or name in CONTROL_NAMES


# Of those, the ones that send compose elsewhere, or make it remove containers, when `.env` sets
# them (compose reads `.env` for its own options too): another project, other files or
# profiles, another engine. A desired `env:` pin of one is refused (desired/checks.py); a
# tuning knob (COMPOSE_PARALLEL_LIMIT, COMPOSE_HTTP_TIMEOUT, COMPOSE_ANSI, ...) moves nothing
# and may be pinned. A login shell exporting any of the floor above is still reported.
REDIRECTING = CONTROL_NAMES | {
    "COMPOSE_PROJECT_NAME",
    "COMPOSE_FILE",
    "COMPOSE_PROFILES",
    "COMPOSE_PATH_SEPARATOR",
    "COMPOSE_ENV_FILES",
    "COMPOSE_REMOVE_ORPHANS",  # `up` would remove containers a rollback may need (strays)
    "COMPOSE_IGNORE_ORPHANS",
}


def redirecting_variable(name: str) -> bool:
    """A variable that, set in `.env`, moves compose off the deployment (REDIRECTING)."""
    return name in REDIRECTING


# Remembered per name and policy (bounded: a box chooses its exports): a fleet's login shells
# export the same few names under one policy, and every pattern is an fnmatch call.
@functools.lru_cache(maxsize=1024)
def _forbidden(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _changed_fields(
    name: str,
    shell_value: EnvValue,
    scrubbed: Mapping[str, Service],
    login: Mapping[str, Service],
    parsed: dict[str, tuple[Flags, Flags]],
) -> list[str]:
    """Fields whose render differs under the login shell *because of this variable*: its own
    environment entry, or a command flag / image / port whose login-shell value contains it.
    `parsed`: the services' flags already parsed for this box's other exports."""
    out = []
    needle = shell_value if isinstance(shell_value, str) and len(shell_value) >= 2 else None
    for service in sorted(set(scrubbed) & set(login)):
        a, b = scrubbed[service], login[service]
        if a.environment.get(name) != b.environment.get(name):
            out.append(f"{service}.environment.{name}")
        if needle is None:
            continue
        if service not in parsed:
            parsed[service] = parse_argv(a.command)[1], parse_argv(b.command)[1]
        flags_a, flags_b = parsed[service]
        for flag in sorted(set(flags_a) | set(flags_b)):
            after = flags_b.get(flag)
            if flags_a.get(flag) != after and needle in str(after):
                out.append(f"{service}.command {flag}")
        if a.image != b.image and needle in (b.image or ""):
            out.append(f"{service}.image")
        if a.ports != b.ports and any(needle in port for port in b.ports):
            out.append(f"{service}.ports")
    return out


def _carriers(
    name: str, shell_value: EnvValue, env_line: EnvLine | None, containers: tuple[Container, ...]
) -> list[str]:
    env_value = env_line.value if env_line else ""
    if shell_value in (env_value, ""):
        return []
    if isinstance(env_value, str) and hashed_inline(shell_value) and not hashed_inline(env_value):
        # A line of a snapshot saved before the box hashed inline secrets holds one in clear,
        # the export hashed: where they read alike outside it, the shell's value cannot be
        # told from `.env`'s, and a container carrying it proves nothing.
        assert isinstance(shell_value, str)
        if fits(shell_value, env_value):
            return []
    return [c.name for c in containers if c.env.get(name) == shell_value]
