"""`state`, `image`, `argv`, `env`, `port`: each compose service of the box against
what compose renders from the desired `.env` (scrubbed) and against `docker inspect`."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping

from reconciler.compare.argv import desired_split, diff_argv
from reconciler.compare.context import GATEWAY, BoxExpectation
from reconciler.compare.drift import Action, Drift
from reconciler.compare.rules import Rule, rule
from reconciler.compare.values import changed_keys, same, value
from reconciler.desired.refs import is_digest_ref
from reconciler.observe.document import Container, EnvValue, Image, Mount, Observed, Service

# Remembered per reference (bounded: a box chooses its references): a fleet runs a handful of
# images, and the reference grammar's regex was ~15 ms of comparing 1,000 boxes' containers.
_pinned = functools.lru_cache(maxsize=1024)(is_digest_ref)


def _action(r: Rule, service: str) -> Action:
    if service == GATEWAY and r.action in (Action.RECREATE, Action.PULL_RECREATE, Action.START):
        return Action.RECREATE_GATEWAY
    return r.action


def _subject(service: str) -> str:
    return "gateway" if service == GATEWAY else f"lane:{service}"


# Docker's states (State.Status) of a container that runs no process and that starting it (not
# recreating it) serves again: never started, exited, dead. Not `paused` (frozen, its processes
# there: `docker unpause`), `restarting` (its policy starts it) or `removing`.
STOPPED = frozenset({"created", "exited", "dead"})
_DOCKER_HUB = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})


# Remembered per reference (bounded: a box chooses its references), as _pinned is.
@functools.lru_cache(maxsize=1024)
def normal_ref(ref: str) -> str:
    """An image reference as the registry resolves it, so that two spellings of one image are
    equal: the tag dropped when a digest pins it (the digest decides), Docker Hub's implied
    domain and `library/` spelled out (`x`, `docker.io/x`, `index.docker.io/library/x` are
    one). RepoDigests name `repo@sha256:…`, in Docker Hub's short form and never with a tag."""
    name, at, digest = ref.partition("@")
    colon = name.rfind(":")
    if at and colon > name.rfind("/"):  # a tag (a registry's port comes before a slash)
        name = name[:colon]
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        domain, path = first.lower(), rest
    else:
        domain, path = "docker.io", name
    if domain in _DOCKER_HUB:
        domain = "docker.io"
        if "/" not in path:
            path = "library/" + path
    return f"{domain}/{path}{at}{digest}"


def service_containers(doc: Observed) -> dict[str, list[Container]]:
    """Each service's containers (a container compose did not make: under its own name), the
    one compared as the service's first: the one named as the render's `container_name`, else
    compose's numbered replica (`<project>-<service>-<n>`, lowest n), else the first by name.
    The others (a `--scale` replica, a copy made by hand) are reported on their own.
    compare_containers and the contract's lane windows (gateway.py) read the same one.

    Never a `docker compose run` container (Container.oneoff): it keeps its service's label,
    yet it runs what the operator gave `run` (bash, a benchmark), and a converge never takes
    it for the service (converge.py `containers`). Taken as the service's, the only one left
    behind made a missing lane look present (or its argv all wrong), and one of a service the
    desired state does not know was planned for a removal the box then skipped, failing the
    verification on every apply. compare_containers reports each on its own (`_oneoff`)."""
    groups: dict[str, list[Container]] = {}
    for found in doc.containers:
        if not found.oneoff:
            groups.setdefault(found.key, []).append(found)
    rendered = doc.render.services or {}
    for service, group in groups.items():
        if len(group) > 1:
            spec = rendered.get(service)
            named = spec.container_name if spec is not None else None
            group.sort(key=lambda c: _rank(c.name, service, named))
    return groups


def _rank(name: str, service: str, named: str | None) -> tuple[int, int, str]:
    if named is not None and name == named:
        return (0, 0, name)
    for sep in "-_":  # compose v2 `project-service-1`, v1 `project_service_1`
        mark = f"{sep}{service}{sep}"
        at = name.rfind(mark)
        number = name[at + len(mark) :] if at > 0 else ""
        if number.isascii() and number.isdigit() and len(number) <= 6:
            return (1, int(number), name)
    return (2, 0, name)


def compare_containers(
    exp: BoxExpectation, doc: Observed, files_as_desired: bool = True
) -> Iterator[Drift]:
    """Each desired service's container against the render. `files_as_desired`: the box's
    `.env` and compose files are the desired ones (no `envfile` or `compose-file` entry), so
    a pending recreate's note may offer the recreate (`_pending_recreate`)."""
    if doc.docker.containers is None:
        return  # reported as a box error by the caller
    if not doc.docker.containers and doc.docker.error is not None:
        # dockerd down as a live collector answers it (docker's fallback lists no container,
        # and says why): no container is known to be missing; the box error says why.
        return
    rendered = doc.render.services or {}
    images = doc.docker.images
    by_service = service_containers(doc)
    wanted = [*exp.lanes, GATEWAY]
    for service in wanted:
        group = by_service.get(service)
        if not group:
            r = rule("state.missing")
            yield Drift(
                exp.name,
                r.kind,
                _subject(service),
                "container",
                "running",
                None,
                _action(r, service),
                note="no container for this service",
            )
            continue
        c = group[0]
        yield from _state(exp, service, c)
        fields = [*_image(exp, service, c, images), *_ports(exp, service, c)]
        # A desired service the render lacks is one compose-file entry (composefiles.py).
        spec = rendered.get(service)
        if spec is not None:
            fields += _argv(exp, service, spec, c)
            fields += _env(exp, service, spec, c, images)
            fields += _runtime(exp, service, spec, c)
            fields += _restart(exp, service, spec, c)
            fields += _mounts(exp, service, spec, c)
        yield from fields
        # A field compared above already says the container is not what the files make (each
        # entry with what a converge does about it): the config hash would only say so again.
        if all(d.path == "restart" for d in fields):  # `docker update`: the hash keeps
            yield from _pending_recreate(exp, service, c, doc, files_as_desired)
        for extra in group[1:]:
            # Its ports too, as the duplicate's own (recreating the service would not unpublish
            # them): what a person decides about it decides about them.
            yield from _ports(exp, service, extra, rule("state.duplicate").action)
            yield _extra(exp, service, extra, "state.duplicate", f"not {c.name}: {_DUPLICATE}")
    for service, group in sorted(by_service.items()):
        if service not in wanted:
            for c in group:
                yield from _ports(exp, service, c)
                yield _extra(exp, service, c, "state.stray", _STRAY)
    for c in doc.containers:
        if c.oneoff:
            yield from _oneoff(exp, c)


_STRAY = "a container of the project the desired state does not know"
_DUPLICATE = "another container of this service (a `docker compose run` copy or a scaled replica)"


def _oneoff(exp: BoxExpectation, c: Container) -> Iterator[Drift]:
    """A `docker compose run` container, of a desired service or not: report-only, with what it
    publishes. Never removed by a converge (converge.py `containers` skips it, so a `remove`
    of its service would be skipped and the verification fail), nor recreated: it is the
    operator's, running or left behind, and a person removes it."""
    action = rule("state.duplicate").action
    yield from _ports(exp, c.key, c, action)
    how = "docker rm -f" if c.status in ("running", "restarting", "paused") else "docker rm"
    note = (
        "a `docker compose run` container (label com.docker.compose.oneoff=True), never the "
        f"service's own; a converge leaves it: once done with it, remove it by hand "
        f"(`{how} {c.name}`)"
    )
    yield _extra(exp, c.key, c, "state.duplicate", note)


def _extra(exp: BoxExpectation, service: str, c: Container, name: str, note: str) -> Drift:
    """A container that should not run: of a service the desired state does not know, or a
    second one of a desired service."""
    r = rule(name)
    return Drift(
        exp.name, r.kind, _subject(service), "container", None, c.status, r.action,
        source=c.name, note=note,
    )  # fmt: skip


def _state(exp: BoxExpectation, service: str, c: Container) -> Iterator[Drift]:
    r = rule("state.status")
    status, health = c.status, c.health
    if status == "running" and health in (None, "healthy"):
        return
    if status == "running" and health == "starting":
        yield _booting(exp, service, c)
        return
    if status == "paused":
        yield _paused(exp, service, c)
        return
    observed = status if status != "running" else f"running ({health})"
    action = Action.START if status in STOPPED else _action(r, service)
    if status in ("exited", "dead") and service == GATEWAY:
        action = Action.RECREATE_GATEWAY
    note = None
    if status == "exited":
        note = f"exit code {c.exit_code}"
    elif status == "restarting" or c.restart_count > 0:
        note = f"restarted {c.restart_count} times"
    yield Drift(
        exp.name,
        r.kind,
        _subject(service),
        "status",
        "running (healthy)",
        observed,
        action,
        source=c.name,
        note=note,
    )


def _paused(exp: BoxExpectation, service: str, c: Container) -> Drift:
    """A container someone paused (`docker pause`: its processes frozen, its model still in
    memory). Report-only: `docker unpause` resumes it as it was in a moment, where a recreate
    would load its model again; a pause is a person's act, and a person ends it."""
    note = (
        f"paused (`docker pause`): `docker unpause {c.name}` resumes it as it was, without the "
        "recreate that would load its model again"
    )
    return _status_said(exp, service, c, "paused", note)


def _booting(exp: BoxExpectation, service: str, c: Container) -> Drift:
    """A container whose health check has not passed yet (`starting`): a lane loading its
    model (a start period of up to ~780 s), the gateway waiting for its lanes. Report-only: a
    recreate would start the load over, and every drift run during a boot would plan one.
    One that never passes is marked unhealthy by docker (its start period over, its retries
    failed), and that is recreated."""
    restarts = f"restarted {c.restart_count} times; " if c.restart_count > 0 else ""
    note = (
        f"{restarts}booting: its health check has not passed yet; not recreated (that would "
        "start it over); one that never passes turns unhealthy, and that is recreated"
    )
    return _status_said(exp, service, c, "running (starting)", note)


def _status_said(
    exp: BoxExpectation, service: str, c: Container, observed: str, note: str
) -> Drift:
    """A status entry left to a person (report-only): what a recreate would undo is theirs."""
    return Drift(
        exp.name,
        rule("state.status").kind,
        _subject(service),
        "status",
        "running (healthy)",
        observed,
        Action.REPORT,
        source=c.name,
        note=note,
    )


def _image(
    exp: BoxExpectation, service: str, c: Container, images: Mapping[str, Image]
) -> Iterator[Drift]:
    want = exp.gateway_image if service == GATEWAY else exp.lanes[service].image
    ref = c.image_ref or ""
    image = images.get(c.image_id or "")
    digests = image.repo_digests if image else ()
    if not _pinned(ref):
        r = rule("image.pinned")
        yield Drift(
            exp.name,
            r.kind,
            _subject(service),
            "reference",
            want,
            ref,
            _action(r, service),
            source=c.name,
            note="the container was created from a tag, not a digest",
        )
    # Compared as the registry resolves them: `repo:tag@sha256:…` and `docker.io/x@…` are
    # the RepoDigests' `repo@sha256:…` and `x@…` (normal_ref).
    want_ref = normal_ref(want)
    normal = [normal_ref(d) for d in digests]
    if want_ref in normal:
        return
    want_repo = want_ref.split("@", 1)[0]
    same_repo = [d for d, n in zip(digests, normal, strict=True) if n.split("@", 1)[0] == want_repo]
    candidates: list[str | None] = [*same_repo] or [*digests] or [ref or c.image_id]
    observed = candidates[0]
    if observed == want or (observed and normal_ref(observed) == want_ref):
        return
    r = rule("image.digest")
    yield Drift(
        exp.name,
        r.kind,
        _subject(service),
        "digest",
        want,
        observed,
        _action(r, service),
        source=c.name,
    )


def _argv(exp: BoxExpectation, service: str, spec: Service, c: Container) -> Iterator[Drift]:
    """The command line that runs (entrypoint + command) against the render's (compare/argv.py):
    flags by name, positionals as a sequence, a different entrypoint/command cut on its own."""
    want_entry, want_cmd = desired_split(spec.entrypoint, spec.command, c.entrypoint, c.cmd)
    diffs = diff_argv(want_entry, want_cmd, c.entrypoint or (), c.cmd or ())
    for d in diffs:
        r = rule("container.argv-split" if d.split_only else "container.argv")
        yield Drift(
            exp.name,
            r.kind,
            _subject(service),
            d.path,
            d.desired,
            d.observed,
            _action(r, service),
            source=c.name,
            note=d.note,
        )


def _runtime(exp: BoxExpectation, service: str, spec: Service, c: Container) -> Iterator[Drift]:
    """The OCI runtime (`runtime: nvidia` of a GPU compose file) against the render's. A render
    that names none leaves it to the engine's default: nothing to compare. A container whose
    runtime was not collected (an older snapshot) is not compared either."""
    want, got = spec.runtime, c.runtime
    if want is None or got is None or want == got:
        return
    r = rule("container.runtime")
    yield Drift(
        exp.name,
        r.kind,
        _subject(service),
        "runtime",
        want,
        got,
        _action(r, service),
        source=c.name,
        note="created from another compose chain (a GPU file dropped?)",
    )


def _restart(exp: BoxExpectation, service: str, spec: Service, c: Container) -> Iterator[Drift]:
    """The restart policy the render names against the container's. A lane whose policy was
    changed to `no` by hand does not come back after the box reboots, and nothing else tells:
    its config hash is unchanged, so `docker compose up` leaves it as it is. A render naming
    none, or a container whose policy was not collected (an older snapshot), is not compared."""
    want, got = spec.restart, c.restart_policy
    if want is None or got is None or want == got:
        return
    r = rule("container.restart")
    # The command is offered only for a policy docker takes (the render's text is the box's).
    fix = (
        f"`docker update --restart {want} {c.name}` puts it back without a recreate"
        if _docker_takes(want)
        else "not a policy docker takes"
    )
    yield Drift(
        exp.name,
        r.kind,
        _subject(service),
        "restart",
        want,
        got,
        _action(r, service),
        source=c.name,
        note=f"changed after it was created ({fix})",
    )


def _mounts(exp: BoxExpectation, service: str, spec: Service, c: Container) -> Iterator[Drift]:
    """What the render mounts against what the container mounts, by the path inside it: a
    bind's host path, a volume's name, read-only or not. `${HF_CACHE:-${HOME}/.cache/...}`
    renders with the deploy user's HOME; a lane `docker compose up`-ed under sudo or cron
    mounts another directory, and nothing else in its inspect says so. A volume the render
    leaves anonymous, and one the container has that the render does not name but is
    anonymous (an image's VOLUME), are not compared by name. Not recorded on either side (a
    snapshot of an earlier collector): not compared."""
    if spec.volumes is None or c.mounts is None:
        return
    want = {m.target: m for m in spec.volumes}
    got = {m.target: m for m in c.mounts if m.target in want or not m.anonymous}
    r = rule("container.mounts")
    for target in sorted(want.keys() | got.keys()):
        w, g = want.get(target), got.get(target)
        if w is not None and g is not None and _same_mount(w, g):
            continue
        note = None
        if g is None:
            note = "missing from the running container"
        elif w is None:
            note = "not in the render: mounted in the running container"
        yield Drift(
            exp.name,
            r.kind,
            _subject(service),
            f"mounts[{target}]",
            _mount_text(w),
            _mount_text(g),
            _action(r, service),
            source=c.name,
            note=note,
        )


# The path of a pending recreate's entry (a history diff leaves these out where compose could not
# give its hashes: history/diff.py).
PENDING_RECREATE = "config-hash"


def _pending_recreate(
    exp: BoxExpectation, service: str, c: Container, doc: Observed, files_as_desired: bool
) -> Iterator[Drift]:
    """compose's config hash of the service, from the files on the box as they are, against
    the one the container was created with (its `com.docker.compose.config-hash` label).
    `docker compose up` recreates a container whose label differs, whoever runs it next and
    for whatever change: the lane's model loads again. The fields compared above are what
    lobes' lanes are known to drift in; this is everything else compose puts in a container
    (labels, health check, devices, resources, shm_size, ...).

    Report-only: the difference is in no field a converge could show before it acts, so a
    person chooses when the model may reload. A converge never recreates for a hash alone,
    and its verification never fails on one: on a compose whose hashing this tool has not
    been checked against (tests/lab/test_config_hash.py checks the one it runs), a hash that
    does not match `up`'s would otherwise roll back every converge. Where the box's `.env` or
    a compose file is not the desired one, the hash is of files a converge replaces: said so.
    Not compared when either hash was not recorded (an older snapshot, a render that failed)."""
    hashes = doc.config_hashes
    if hashes is None or hashes.services is None or c.config_hash is None:
        return
    want = hashes.services.get(service)
    if want is None or want == c.config_hash:
        return
    r = rule("container.config-hash")
    note = (
        "the next `docker compose up` recreates it (its model loads again): it was not "
        "created from the compose files and .env now on the box, and differs from them in a "
        "setting no other entry compares"
    )
    if files_as_desired:
        note += f"; recreate it when a reload suits: `docker compose up -d {service}` there"
    else:
        note += "; those files are not the desired ones yet: a converge replaces them first"
    yield Drift(
        exp.name,
        r.kind,
        _subject(service),
        PENDING_RECREATE,
        want,
        c.config_hash,
        r.action,
        source=c.name,
        note=note,
    )


def _same_mount(want: Mount, got: Mount) -> bool:
    if (want.type, want.read_only) != (got.type, got.read_only):
        return False
    return want.source is None if want.type == "tmpfs" else want.source in (None, got.source)


def _mount_text(m: Mount | None) -> str | None:
    """`bind /home/u/.cache/huggingface`, `volume lobes_hf (read-only)`, `tmpfs`."""
    if m is None:
        return None
    text = m.type if m.source is None else f"{m.type} {m.source}"
    return f"{text} (read-only)" if m.read_only else text


def _docker_takes(policy: str) -> bool:
    """A policy `docker update --restart` takes: no, always, unless-stopped, on-failure[:N]."""
    if policy in ("no", "always", "unless-stopped", "on-failure"):
        return True
    count = policy.removeprefix("on-failure:")
    return count != policy and count.isascii() and count.isdigit() and len(count) <= 9


def _env(
    exp: BoxExpectation,
    service: str,
    spec: Service,
    c: Container,
    images: Mapping[str, Image],
) -> Iterator[Drift]:
    r = rule("container.env")
    image = images.get(c.image_id or "")
    # Docker starts from the image's ENV and lays the service's environment over it.
    expected: dict[str, EnvValue] = {**(image.env if image else {}), **spec.environment}
    subject, action = _subject(service), _action(r, service)
    for key, (w, g) in changed_keys(expected, c.env).items():  # in key order
        if same(w, g):
            continue
        yield Drift(exp.name, r.kind, subject, key, value(w), value(g), action, source=c.name)


def _ports(
    exp: BoxExpectation, service: str, c: Container, action: Action | None = None
) -> Iterator[Drift]:
    """Published ports against policy, not against the render: a hand edit that publishes
    elsewhere renders the same as it runs, yet differs from what the desired state allows.
    The gateway publishes exactly `gateway.bind:gateway.port`; a lane publishes nothing."""
    r = rule("container.ports")
    want: dict[str, list[str]] = {}
    if service == GATEWAY and not c.oneoff:  # a one-off of the gateway publishes nothing either
        want["8000/tcp"] = [f"{_ip(exp.gateway.bind)}:{exp.gateway.port}"]
    got: dict[str, list[str]] = {}
    for key, bindings in c.ports.items():
        for b in bindings:
            got.setdefault(key, []).append(f"{_ip(b.host_ip)}:{b.host_port}")
    for key in sorted(set(want) | set(got)):
        w, g = sorted(want.get(key, [])), sorted(got.get(key, []))
        if w == g:
            continue
        note = "lanes are reached only through the gateway" if service != GATEWAY else None
        if c.oneoff:
            note = "published by a `docker compose run` container (--service-ports, -p)"
        yield Drift(
            exp.name,
            r.kind,
            _subject(service),
            key,
            ", ".join(w) or None,
            ", ".join(g) or None,
            action or _action(r, service),
            source=c.name,
            note=note,
        )


def _ip(host_ip: str) -> str:
    return "0.0.0.0" if host_ip in ("", "0.0.0.0", "::") else host_ip
