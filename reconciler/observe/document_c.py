"""A large replay's snapshot file, read by msgspec straight into the typed document.

`document.py` reads a box's answer in two passes: JSON into dicts and lists, then a Python
walk that checks every field and builds the document. At 1,000 boxes that walk and the dicts
it walks were over half of a replay (BENCHMARKS.md, issue 12). Here msgspec (C) decodes the
bulky sections, the containers, images and compose renders with their environments and
command lines, and the `.env` lines, straight from the bytes into typed values, checking the
same types, ranges and lengths as it goes; the small sections (probes, files, meminfo, the
login shell, ...) are decoded as plain JSON and go through document.py's own readers.

It gives exactly what document.py gives, or nothing:
- every object read here is declared with every key collector version 1 writes
  (`forbid_unknown_fields`), so it cannot hold more keys than document.py allows either;
- each field's type, range, length and pattern is document.py's (Meta constraints); what
  msgspec cannot express (a name's printable characters, the order document.py gives an
  environment) is checked or rebuilt below, in bulk;
- anything else, a fault, an unexpected key, a newer collector, a file that is not this
  tool's, is refused (None), and the caller reads the file as always, so every fault and
  its message stay document.py's. tests/unit/test_document_c.py holds the two readers to
  the same result on real captures and on thousands of damaged copies.

Only files the snapshot's index vouches for come here (no key repeated; see
observe.snapshot_observation), and only in a large replay (fast_json.LARGE): msgspec's import
and these decoders cost a few milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import compress, repeat
from operator import is_not
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from reconciler.observe.document import (
    _MAX_INT,
    MAX_ITEMS,
    MAX_TEXT,
    SNAPSHOT_DEPTH,
    Container,
    Docker,
    EnvLine,
    EnvValue,
    Image,
    Mount,
    Observed,
    Render,
    SecretValue,
    Service,
    _audit,
    _Bad,
    _config_hashes,
    _converge,
    _envfile_desired,
    _file_errors,
    _file_fact,
    _gateway,
    _int,
    _knobs_desired,
    _lane_probe,
    _list,
    _login_shell,
    _mapping,
    _meminfo,
    _names,
    _opt_name,
    _or,
    _port_entry,
    _ports,
    _printable,
    _Reader,
    _secret_source,
    _variables,
    nested_deeper,
)

# document.py's field checks, as msgspec constraints.
Text = Annotated[str, Meta(max_length=MAX_TEXT)]  # `_text` (msgspec refuses lone surrogates)
Count = Annotated[int, Meta(ge=0, le=_MAX_INT)]  # `_int`
LineNumber = Annotated[int, Meta(ge=1, le=_MAX_INT)]  # `_int(..., lo=1)`
ExitCode = Annotated[int, Meta(ge=-(2**31), le=2**31)]
Digest = Annotated[str, Meta(pattern=r"^hmac:[0-9a-f]{64}\Z")]  # `_digest`
Sha256 = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}\Z")]  # `_opt_sha256`
HexId = Annotated[str, Meta(pattern=r"^[0-9a-f]{1,64}\Z")]  # `_container_id`


class _Secret(Struct, forbid_unknown_fields=True, gc=False):
    """`{"secret": "hmac:<64 hex>"}` and nothing else (`_secret`)."""

    secret: Digest


Value = Text | _Secret
Env = Annotated[dict[Text, Value], Meta(max_length=MAX_ITEMS)]
Argv = Annotated[tuple[Value, ...], Meta(max_length=MAX_ITEMS)]
Texts = Annotated[tuple[Text, ...], Meta(max_length=MAX_ITEMS)]


class _Mount(Struct, forbid_unknown_fields=True, gc=False):
    """document._mount's fields: a container's mount, a service's volume."""

    type: Text
    target: Text
    source: Text | None = None
    read_only: bool | None = None


Mounts = Annotated[tuple[_Mount, ...], Meta(max_length=MAX_ITEMS)]


class _Container(Struct, forbid_unknown_fields=True, gc=False):
    name: Text
    id: HexId | None = None
    service: Text | None = None
    image_ref: Text | None = None
    image_id: Text | None = None
    cmd: Argv | None = None
    env: Env | None = None
    status: Text | None = None
    health: Text | None = None
    restart_count: Count | None = None
    exit_code: ExitCode | None = None
    ports: Any = None  # a few bindings: document.py's `_ports`
    ips: Any = None  # `_names`
    entrypoint: Argv | None = None
    config_hash: Text | None = None
    config_files: Text | None = None
    started_at: Text | None = None
    runtime: Text | None = None
    restart_policy: Text | None = None
    mounts: Mounts | None = None
    oneoff: bool | None = None


class _Image(Struct, forbid_unknown_fields=True, gc=False):
    repo_digests: Texts | None = None
    repo_tags: Texts | None = None
    env: Env | None = None


class _Docker(Struct, forbid_unknown_fields=True, gc=False):
    # UNSET, not None: an absent list is "not observed", a null one is a fault.
    containers: Annotated[list[_Container], Meta(max_length=MAX_ITEMS)] | UnsetType = UNSET
    images: Annotated[dict[Text, _Image], Meta(max_length=MAX_ITEMS)] | None = None
    error: Text | None = None


class _Service(Struct, forbid_unknown_fields=True, gc=False):
    image: Text | None = None
    command: Argv | None = None
    environment: Env | None = None
    ports: Any = None  # each entry kept as canonical JSON: document.py's `_port_entry`
    entrypoint: Argv | None = None
    profiles: Texts | None = None
    container_name: Text | None = None
    runtime: Text | None = None
    restart: Text | None = None
    volumes: Mounts | None = None


class _Render(Struct, forbid_unknown_fields=True, gc=False):
    services: Annotated[dict[Text, _Service], Meta(max_length=MAX_ITEMS)] | UnsetType = UNSET
    error: Text | None = None
    basis: Sha256 | None = None


class _EnvLine(Struct, forbid_unknown_fields=True, gc=False):
    key: Text
    value: Value
    line: LineNumber


_NULL = msgspec.Raw(b"null")


class _Collected(Struct, forbid_unknown_fields=True, gc=False):
    """The collector's document, version 1 (absent: a snapshot's, version 1 as documented)."""

    collector: Literal[1] = 1
    user: Text | None = None
    home: Text | None = None
    deploy_dir: Text | None = None
    deploy_dir_exists: bool | None = None
    time: Text | None = None
    envfile: Annotated[list[_EnvLine], Meta(max_length=MAX_ITEMS)] | None = None
    docker: _Docker | None = None
    # compose's renders, as their text: a box whose login shell changes nothing renders the
    # same text twice, read once (`_renders`).
    render: msgspec.Raw = _NULL
    render_login: msgspec.Raw = _NULL
    render_current: msgspec.Raw = _NULL
    render_login_current: msgspec.Raw = _NULL
    # The small sections, as plain JSON for document.py's readers.
    meminfo: Any = None
    files: Any = None
    secret_sources: Any = None
    gateway: Any = None
    lanes: Any = None
    variables: Any = None
    login_shell: Any = None
    current_env_keys: Any = None
    audit: Any = None
    timings_ms: Any = None
    file_errors: Any = None
    envfile_desired: Any = None
    knobs_desired: Any = None
    converge: Any = None
    config_hashes: Any = None


class _SnapshotFile(Struct, forbid_unknown_fields=True, gc=False):
    """A box's snapshot file as save_snapshot writes it for an observed box."""

    collected: _Collected
    box: Any = None
    controller: dict[str, Any] | None = None
    elapsed_s: Any = None
    error: Any = None
    connection: Any = None


class TypedSnapshot(Struct, gc=False):
    """A snapshot file's box: the typed document, and the rest of the file as JSON values
    (observe.snapshot_observation reads those as it does for any file)."""

    document: Observed
    controller: dict[str, Any] | None
    error: Any
    elapsed_s: Any
    connection: Any


class _Decoders:
    """Made on first use: building a decoder walks its types (a few milliseconds)."""

    file: msgspec.json.Decoder[_SnapshotFile] | None = None
    render: msgspec.json.Decoder[_Render | None] | None = None


def ready() -> None:
    """Make the decoders now: before a replay forks its workers, which then share them."""
    if _Decoders.file is None:
        _Decoders.file = msgspec.json.Decoder(_SnapshotFile)
        _Decoders.render = msgspec.json.Decoder(_Render | None)


def read_snapshot_file(data: bytes) -> TypedSnapshot | None:
    """A snapshot file's bytes -> its box's typed document, exactly as document.py reads it,
    and the file's other fields; None for anything it does not read exactly so (the caller
    then reads the file as always)."""
    ready()
    assert _Decoders.file is not None
    try:
        raw = _Decoders.file.decode(data)
        _shallow((raw.box, raw.controller, raw.elapsed_s, raw.error, raw.connection), 1)
        document = _observed(raw.collected)
    except (msgspec.MsgspecError, _Bad, RecursionError, ValueError):
        return None  # _Refused is a ValueError
    return TypedSnapshot(document, raw.controller, raw.error, raw.elapsed_s, raw.connection)


# -- the document, as document._observed builds it for a snapshot (complete=False) -----------------
_SNAPSHOT = _Reader(complete=False)


# What msgspec reads typed nests a few levels at most; what it keeps as plain JSON (`Any`)
# may nest as deep as the text does. load_json refuses a file nested deeper than
# SNAPSHOT_DEPTH: so is such a file refused here (the caller then reads it for that fault).
# Each `Any` field, by the objects and lists around it in the file:
_IN_COLLECTED = 2  # {"collected": {"files": ...}}
_IN_ITEM = 5  # {"collected": {"docker": {"containers": [{"ports": ...}]}}}, a service's ports


def _shallow(values: tuple[Any, ...], around: int) -> None:
    if nested_deeper(values, SNAPSHOT_DEPTH - around):
        raise _Refused


def _observed(doc: _Collected) -> Observed:
    r = _SNAPSHOT
    _shallow(
        (
            doc.meminfo,
            doc.files,
            doc.secret_sources,
            doc.gateway,
            doc.lanes,
            doc.variables,
            doc.login_shell,
            doc.current_env_keys,
            doc.audit,
            doc.timings_ms,
            doc.file_errors,
            doc.envfile_desired,
            doc.knobs_desired,
            doc.converge,
            doc.config_hashes,
        ),
        _IN_COLLECTED,
    )
    read = _renders()
    render = read(doc.render)
    return Observed(
        collector=doc.collector,
        user=doc.user,
        home=doc.home,
        deploy_dir=doc.deploy_dir,
        deploy_dir_exists=bool(doc.deploy_dir_exists),
        time=doc.time,
        meminfo=_meminfo(r, doc.meminfo),
        files=_mapping(_or(doc.files, {}), "files", _file_fact),
        envfile=None if doc.envfile is None else _envfile(doc.envfile),
        secret_sources=_mapping(_or(doc.secret_sources, {}), "secret_sources", _secret_source),
        docker=_docker(doc.docker),
        gateway=_gateway(r, doc.gateway, "gateway"),
        lanes=_mapping(_or(doc.lanes, {}), "lanes", _lane_probe),
        lanes_observed=doc.lanes is not None,
        render=render if render is not None else Render(None),
        render_login=read(doc.render_login),
        render_current=read(doc.render_current),
        render_login_current=read(doc.render_login_current),
        variables=_variables(r, doc.variables, "variables"),
        login_shell=_login_shell(r, doc.login_shell, "login_shell"),
        current_env_keys=_names(_or(doc.current_env_keys, []), "current_env_keys"),
        audit=None if doc.audit is None else _audit(r, doc.audit, "audit"),
        timings_ms=_mapping(_or(doc.timings_ms, {}), "timings_ms", _int),
        file_errors=_file_errors(doc.file_errors),
        envfile_desired=_envfile_desired(doc.envfile_desired),
        knobs_desired=_knobs_desired(doc.knobs_desired),
        converge=_converge(doc.converge),
        config_hashes=_config_hashes(doc.config_hashes),
    )


class _Refused(ValueError):
    """A value document.py refuses that msgspec's constraints let through (a name that is
    not printable): the file goes to document.py, which says where."""


def _names_ok(names: Any) -> None:
    # document._name: printable text. Lengths and valid Unicode are msgspec's checks already.
    if not _printable("".join(names)):
        raise _Refused


def _docker(docker: _Docker | None) -> Docker:
    if docker is None:
        return Docker(None)
    if docker.containers is UNSET:
        return Docker(None, error=docker.error)
    images = docker.images
    if images:
        _names_ok(images)
    containers = docker.containers
    # Every container's few bindings and addresses in one depth check (one call a box, not
    # one a container: most hold none).
    _shallow(tuple(v for c in containers for v in (c.ports, c.ips) if v is not None), _IN_ITEM)
    return Docker(
        tuple(map(_container, containers)),
        {name: _image(image) for name, image in images.items()} if images else {},
        docker.error,
    )


def _container(c: _Container) -> Container:
    _names_ok((c.name, c.service or "", c.status or "", c.health or ""))
    return Container(
        name=c.name,
        id=c.id if c.id is not None else "",
        service=c.service,
        image_ref=c.image_ref,
        image_id=c.image_id,
        cmd=_argv(c.cmd),
        env=_env(c.env),
        status=c.status,
        health=c.health,
        restart_count=c.restart_count if c.restart_count is not None else 0,
        exit_code=c.exit_code,
        ports=_ports(c.ports, "ports") if c.ports is not None else {},
        ips=_names(_or(c.ips, []), "ips"),
        entrypoint=_argv(c.entrypoint),
        config_hash=c.config_hash,
        config_files=c.config_files,
        started_at=c.started_at,
        runtime=c.runtime,
        restart_policy=c.restart_policy,
        mounts=_mounts(c.mounts),
        oneoff=c.oneoff is True,
    )


def _mounts(mounts: tuple[_Mount, ...] | None) -> tuple[Mount, ...] | None:
    """document._opt_mounts' result (its `type` a name: printable)."""
    if mounts is None:
        return None
    if mounts:
        _names_ok(tuple(m.type for m in mounts))
    return tuple(Mount(m.type, m.source, m.target, m.read_only is True) for m in mounts)


def _image(image: _Image) -> Image:
    return Image(
        repo_digests=image.repo_digests or (),
        repo_tags=image.repo_tags or (),
        env=_env(image.env),
    )


def _renders() -> Callable[[msgspec.Raw], Render | None]:
    """A reader of one document's renders: the same text gives the same Render (documents
    are never changed, so one object serves both fields), read once."""
    seen: list[tuple[msgspec.Raw, Render | None]] = []

    def read(text: msgspec.Raw) -> Render | None:
        for known, render in seen:
            if known == text:
                return render
        assert _Decoders.render is not None
        decoded = _Decoders.render.decode(text)
        render = None if decoded is None else _render(decoded)
        seen.append((text, render))
        return render

    return read


def _render(render: _Render) -> Render:
    if render.services is UNSET:
        return Render(None, render.error, render.basis)
    services = render.services
    _names_ok(services)
    return Render(
        {name: _service(service) for name, service in services.items()},
        render.error,
        render.basis,
    )


def _service(s: _Service) -> Service:
    if s.profiles:
        _names_ok(s.profiles)
    ports = _list(_or(s.ports, []), "ports")
    if ports:
        _shallow((ports,), _IN_ITEM)
    return Service(
        image=s.image,
        command=_argv(s.command),
        environment=_env(s.environment),
        ports=tuple(_port_entry(p, "ports") for p in ports),
        entrypoint=_argv(s.entrypoint),
        profiles=s.profiles or (),
        container_name=_opt_name(s.container_name, "container_name"),
        runtime=s.runtime,
        restart=s.restart,
        volumes=_mounts(s.volumes),
    )


def _env(env: dict[str, Any] | None) -> dict[str, EnvValue]:
    """document._env's result: the text entries in their order, then the hashed secrets in
    theirs (its bulk path, the only one that takes a whole environment without a fault). The
    decoded dict is this document's own: changed in place."""
    if not env:
        return {}
    _names_ok(env)
    # The secrets' keys, found by C loops (a few among ~100 entries), each moved to the end.
    for key in list(compress(env, map(is_not, map(type, env.values()), repeat(str)))):
        env[key] = SecretValue(env.pop(key).secret)
    return env


def _argv(argv: tuple[Any, ...] | None) -> tuple[EnvValue, ...] | None:
    if argv is None:
        return None
    if list(map(type, argv)).count(str) == len(argv):
        return argv  # every token is text: the tuple msgspec made
    return tuple(map(_value, argv))


def _value(raw: str | _Secret) -> EnvValue:
    return raw if isinstance(raw, str) else SecretValue(raw.secret)


def _envfile(lines: list[_EnvLine]) -> tuple[EnvLine, ...]:
    _names_ok([line.key for line in lines])
    return tuple(EnvLine(line.key, _value(line.value), line.line) for line in lines)
