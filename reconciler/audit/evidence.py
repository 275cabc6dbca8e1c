"""One evidence row per box, built from its typed observation: pure, no I/O.

A box's answer was parsed once (reconciler/observe/document.py) into a typed document or a
`Fault` of that box; the rows are built from that document only. A box whose answer was refused,
or lacks what an audit needs, is a row that is not audited, with its typed fault: every other
box and the mesh are judged as usual.

Everything an audit verdict rests on is here, each fact with where it was seen: the desired
posture, what `.env` declares (line state and digest), what the running gateway carries and
where that came from, the login shell's exports, the probes without credentials from the box
itself (loopback) and from the controller (the mesh side), the keyed probe, and what is
published on the host. Secrets only ever appear as `SecretValue` digests (keyed per run on the
box); two equal digests in one run mean the same value.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from reconciler.compare.containers import service_containers
from reconciler.desired import roles
from reconciler.desired.models import (
    BoxFileSecret,
    BoxSpec,
    ControllerEnvSecret,
    ExpectedContainer,
)
from reconciler.desired.types import url_host
from reconciler.observe import document as seen
from reconciler.observe.document import (
    AuditSection,
    CapabilitiesProbe,
    Container,
    ControllerAudit,
    EnvValue,
    Fault,
    FaultKind,
    MeshDetectProbe,
    Observed,
    ProofProbe,
    SecretValue,
)
from reconciler.observe.observe import BoxObservation
from reconciler.scrub import scrub_text

API_KEYS = ("GATEWAY_API_KEY", "CULTURE_VLLM_API_KEY")  # lobes: the first non-blank wins
MESH_KEY = "LOBES_MESH_KEY"
AUDITED_KEYS = (*API_KEYS, MESH_KEY)

Posture = Literal["keyed", "open", "mixed", "unknown"]
# unknown: `.env` could not be read, or the audit section failed (BoxEvidence.envfile_unread)
LineState = Literal["set", "empty", "commented-out", "absent", "no-file", "unknown"]
# Where the value the running gateway carries came from (unknown: `.env` was not read).
Origin = Literal["env", "shell", "env+shell", "none", "unexplained", "unknown"]
NO_AUDIT = ControllerAudit()  # no audit probes from the controller (an unprobed box)
# The fault's path when the box answered but its gateway answered no gated request from either
# side (kind not-observed: the posture was not observed; SSH, the collector and the rest were).
GATEWAY_PART = "gateway"
# A container in one of these states runs no process: nothing of it listens, on the host
# network or anywhere. A paused or restarting one still counts: it listens again without
# anyone recreating it (`docker unpause`, its restart policy).
STOPPED = frozenset({"created", "exited", "dead", "removing"})


@dataclass(frozen=True)
class Intent:
    """The desired state's answer to "who may call this gateway"."""

    auth: Literal["keyed", "open"]
    api_key_secret: str | None
    api_key_where: str | None  # "~/.lobes/.secrets.env GATEWAY_API_KEY" / "$FLEET_KEY"
    api_key: SecretValue | None  # the desired key's digest, read from its source on the box
    api_key_status: str | None  # ok, file-missing, file-unreadable, key-missing, not-sent
    api_key_shared: bool  # one value for every box naming the secret (a controller variable)
    mesh: bool
    mesh_key_secret: str | None
    mesh_key: SecretValue | None
    mesh_key_status: str | None
    bind: str
    port: int


@dataclass(frozen=True)
class EnvLine:
    """One key's state in the deployed `.env`, as compose would read it."""

    name: str
    state: LineState
    line: int | None = None
    digest: SecretValue | None = None  # also for a commented-out value: "is it the shell's?"


@dataclass(frozen=True)
class Carried:
    """What the running gateway container carries for one variable, and from where."""

    name: str
    digest: SecretValue | None  # None: empty or absent in the container
    origin: Origin
    where: str | None = None  # ".env:1193", "~/.bashrc:7"


@dataclass(frozen=True)
class ShellExport:
    name: str
    source: str | None  # "~/.bashrc:7" (the collector traces the login shell)
    digest: SecretValue | None  # None: exported empty


@dataclass(frozen=True)
class Probe:
    status: int | None
    error: str | None = None  # transport failure, or the gateway's error type (invalid_api_key)
    model: str | None = None


@dataclass(frozen=True)
class Side:
    """The four unauthenticated requests from one place."""

    health: Probe
    capabilities: Probe
    models: Probe
    chat: Probe

    @property
    def gated(self) -> tuple[Probe, Probe]:
        return (self.models, self.chat)


@dataclass(frozen=True)
class KeyedProbe:
    """`GET /v1/models` with a key, sent on the box (the key never leaves it)."""

    status: int | None
    key_from: str | None  # "secret:gateway_api_key" or ".env:GATEWAY_API_KEY"
    digest: SecretValue | None
    note: str | None = None  # why it was not sent, or how it failed


@dataclass(frozen=True)
class Binding:
    container: str
    service: str | None
    host_ip: str  # "" = every interface
    host_port: str
    container_port: str
    # A stray's port that a desired `audit.expected_containers` entry declares: that entry's
    # name (or pattern). None: not declared (or not a stray).
    expected_by: str | None = None

    @property
    def address(self) -> str:
        return f"{url_host(self.host_ip or '0.0.0.0')}:{self.host_port}"

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host_ip)


def _ip(host_ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host_ip or "0.0.0.0")  # "" is Docker's every interface
    except ValueError:
        return None


def is_loopback(host_ip: str) -> bool:
    """A host address only the box itself reaches (127.0.0.0/8, ::1)."""
    ip = _ip(host_ip)
    return ip is not None and ip.is_loopback


def every_interface(host_ip: str) -> bool:
    """Docker's "", 0.0.0.0 or "::": published on every interface of the box."""
    ip = _ip(host_ip)
    return ip is not None and ip.is_unspecified


@dataclass(frozen=True)
class LaneProbe:
    container: str
    url: str
    status: int | None
    error: str | None


@dataclass(frozen=True)
class Published:
    gateway: tuple[Binding, ...]  # every gateway-service container's (copies included)
    lanes: tuple[Binding, ...]
    host_network: tuple[str, ...]  # the project's containers on the host network, not stopped
    # GET /v1/models without a key from the controller, at the box's own inventory address
    # only: on each published lane, gateway and stray port it could ask (audit phase 2)
    lane_probes: tuple[LaneProbe, ...] = ()
    # Running containers outside the compose project (any `docker run`): their published
    # ports, and those on the host network; `running` None: they were not listed (why).
    stray: tuple[Binding, ...] = ()
    stray_host_network: tuple[str, ...] = ()
    running: str | None = None
    # Stray containers a desired `audit.expected_containers` entry names (container -> that
    # entry's name or pattern), whatever its ports; a declared host-network one is expected.
    declared: Mapping[str, str] = field(default_factory=dict)
    # Stray containers whose image looks like an LLM server (vLLM and its kin, or one of the
    # box's own desired images): one that cannot be asked is never taken as harmless.
    llm_like: frozenset[str] = frozenset()
    # The compose service of each of `host_network` (the HTML matrix's lane column)
    host_network_services: Mapping[str, str] = field(default_factory=dict)

    def probe_of(self, b: Binding) -> LaneProbe | None:
        """The controller's request to `b` (one per container and host port), if one was sent."""
        for p in self.lane_probes:
            if p.container == b.container and port_of(p.url) == b.host_port:
                return p
        return None


def port_of(url: str) -> str:
    """The port of a probe's `http://host:port/v1/models`."""
    authority = url.partition("://")[2].partition("/")[0]
    return authority.rpartition(":")[2]


@dataclass(frozen=True)
class Proof:
    """One unauthenticated request sent through an open member for a keyed member's role."""

    via: str
    role: str
    host: str
    url: str
    status: int | None
    mesh_member: str | None
    proxied_by: str | None
    error: str | None

    @property
    def proven(self) -> bool:
        # lobes stamps X-Lobes-Mesh-Member on local answers too: only a 200 that names the
        # keyed member AND carries X-Lobes-Proxied-By crossed the mesh.
        return self.status == 200 and self.mesh_member == self.host and bool(self.proxied_by)


@dataclass(frozen=True)
class BoxEvidence:
    box: str
    audited: bool
    errors: tuple[str, ...]
    intent: Intent
    envfile: dict[str, EnvLine] = field(default_factory=dict)
    gateway_container: str | None = None
    gateway_status: str | None = None
    carried: dict[str, Carried] = field(default_factory=dict)
    shell: tuple[ShellExport, ...] = ()
    loopback: Side | None = None
    mesh_side: Side | None = None
    keyed: KeyedProbe | None = None
    mesh_keyed: KeyedProbe | None = None
    published: Published | None = None
    mesh_name: str | None = None  # LOBES_MESH_NAME the gateway runs with
    mesh_detect: bool | None = None  # GET /mesh/detect from the mesh side
    proxied: dict[str, str] = field(default_factory=dict)  # role -> member, /capabilities
    proofs: tuple[Proof, ...] = ()
    fault: Fault | None = None  # why the box is not audited (typed; also errors[0])
    # Why `.env`'s key lines are unknown (its lines then read "unknown"); None: they were read.
    envfile_unread: str | None = None
    # Why the login shell's exports are unknown (its trace failed: a profile that exec'd
    # another shell, a timeout); None: traced. Shown as such, never as "no exports".
    shell_unread: str | None = None
    # Not audited, but its gateway answered the controller: `mesh_side` (and the posture it
    # shows), `mesh_detect`, `proxied` and `proofs` are the mesh side's; nothing else was seen.
    partial: bool = False

    @property
    def collected(self) -> bool:
        """The box's own answer was read: every field is its evidence, audited or not (a box
        whose gateway answered no gated request is not audited, yet what it publishes is
        known). False for a box seen from the mesh side only, or not at all."""
        return self.published is not None

    @property
    def inbound(self) -> Carried | None:
        """The key the gateway enforces, as lobes resolves it (`_gateway_api_key`):
        GATEWAY_API_KEY if non-blank, else CULTURE_VLLM_API_KEY. A blank value has no digest:
        the collector sends "" for an empty or whitespace-only secret, and a digest is never
        a blank value, so "has a digest" is lobes' "non-blank"."""
        for name in API_KEYS:
            carried = self.carried.get(name)
            if carried is not None and carried.digest is not None:
                return carried
        return self.carried.get(API_KEYS[0])

    @property
    def declared(self) -> EnvLine | None:
        """The inbound key `.env` declares, with lobes' fallback order."""
        for name in API_KEYS:
            line = self.envfile.get(name)
            if line is not None and line.state == "set":
                return line
        return self.envfile.get(API_KEYS[0])

    @property
    def posture(self) -> Posture:
        return live_posture(self.loopback, self.mesh_side)

    @property
    def mesh_on(self) -> bool:
        if self.partial:  # only the mesh side's word: GET /mesh/detect
            return bool(self.mesh_detect)
        mesh = self.carried.get(MESH_KEY)
        return bool(mesh and mesh.digest is not None and self.mesh_name)


# -- posture ----------------------------------------------------------------------------------
def probe_posture(probe: Probe) -> Posture:
    """401 is the gate; any other answer (200, or a 404/503 from past the gate) is no gate."""
    if probe.status is None:
        return "unknown"
    return "keyed" if probe.status == 401 else "open"


def live_posture(*sides: Side | None) -> Posture:
    seen = {probe_posture(p) for s in sides if s is not None for p in s.gated} - {"unknown"}
    if not seen:
        return "unknown"
    return seen.pop() if len(seen) == 1 else "mixed"


# -- building ---------------------------------------------------------------------------------
# Everything below reads the box's typed document (reconciler/observe/document.py), parsed once
# when the answer arrived: a field of the wrong type never gets here, it made the box's fault.
def shared_variables(specs: Iterable[BoxSpec]) -> frozenset[str]:
    """The controller variables that hold more than one box's API key: one value by design
    (a variable per box, as inventory/lab-controller.yaml names, is one key per box)."""
    count: Counter[str] = Counter()
    for spec in specs:
        src = spec.secrets.get(spec.gateway.api_key.secret) if spec.gateway.api_key else None
        if isinstance(src, ControllerEnvSecret):
            count[src.variable] += 1
    return frozenset(variable for variable, boxes in count.items() if boxes > 1)


def intent(box: BoxSpec, doc: Observed | None, shared: frozenset[str] | None = None) -> Intent:
    """`shared`: shared_variables() of the fleet (None: any controller variable counts as
    shared, for a caller that does not know the other boxes)."""
    sources = doc.secret_sources if doc is not None else {}

    def desired(secret: str | None) -> tuple[SecretValue | None, str | None, str | None]:
        if secret is None:
            return None, None, None
        src = box.secrets.get(secret)
        seen = sources.get(secret)
        if isinstance(src, ControllerEnvSecret):
            # The controller sent its value to the box for this run, where it was hashed like
            # a box file's (observe/controller_secrets.py). An observation saved before that
            # was done has no digest: the right key is unknown, and says why.
            variable = f"${src.variable} on the controller"
            if seen is None:
                return None, "not-sent", variable
            return seen.digest, seen.status, variable
        where = f"{src.path} {src.key}" if isinstance(src, BoxFileSecret) else None
        return (seen.digest, seen.status, where) if seen is not None else (None, None, where)

    api_secret = box.gateway.api_key.secret if box.gateway.api_key else None
    mesh_secret = box.mesh.key.secret if box.mesh.enabled and box.mesh.key else None
    api_digest, api_status, api_where = desired(api_secret)
    mesh_digest, mesh_status, _ = desired(mesh_secret)
    return Intent(
        auth=box.gateway.auth,
        api_key_secret=api_secret,
        api_key_where=api_where,
        api_key=api_digest,
        api_key_status=api_status,
        api_key_shared=_shared(box.secrets.get(api_secret or ""), shared),
        mesh=box.mesh.enabled,
        mesh_key_secret=mesh_secret,
        mesh_key=mesh_digest,
        mesh_key_status=mesh_status,
        bind=box.gateway.bind,
        port=box.gateway.port,
    )


def _shared(src: Any, shared: frozenset[str] | None) -> bool:
    if not isinstance(src, ControllerEnvSecret):
        return False
    return shared is None or src.variable in shared


def box_evidence(
    box: BoxSpec, obs: BoxObservation, shared: frozenset[str] | None = None
) -> BoxEvidence:
    doc = obs.document
    want = intent(box, doc, shared)
    if doc is None:
        why = obs.failure or Fault(FaultKind.NOT_OBSERVED, "not observed")
        return seen_from_mesh_side(box.name, want, obs.probes, why)
    fault = _lacking(box, doc)
    if fault is not None:
        return seen_from_mesh_side(box.name, want, obs.probes, fault)
    audit = doc.audit
    assert audit is not None  # _lacking said so
    controller = obs.probes
    gateway = gateway_container(doc)
    unread = _envfile_unread(doc, audit)
    envfile = _envfile(audit, unread)
    shell = _shell(box, doc)
    carried = _carried(gateway.env, envfile, {s.name: s for s in shell}) if gateway else {}
    on_box = controller.audit or NO_AUDIT
    ev = BoxEvidence(
        box=box.name,
        audited=True,
        # A box reached only through an existing SSH connection (observe.BoxObservation):
        # what was proven holds until that connection ends; the next one is refused.
        errors=((f"ssh: {obs.connection}",) if obs.connection else ()) + _errors(doc, audit),
        intent=want,
        envfile=envfile,
        envfile_unread=unread,
        gateway_container=gateway.name if gateway else None,
        gateway_status=gateway.status if gateway else None,
        carried=carried,
        shell=shell,
        shell_unread=scrub_text(doc.login_shell.error) if doc.login_shell.error else None,
        loopback=_side(
            doc.gateway.health,
            doc.gateway.capabilities,
            doc.gateway.models_noauth,
            audit.chat_noauth,
        ),
        mesh_side=_side(
            controller.health,
            controller.capabilities,
            controller.models_noauth,
            on_box.chat_noauth,
        ),
        keyed=_keyed(audit.models_key),
        mesh_keyed=_keyed(audit.models_mesh_key),
        published=_published(doc, audit, on_box, box),
        mesh_name=_plain(gateway.env.get("LOBES_MESH_NAME") if gateway else None),
        mesh_detect=_mesh_detect(on_box.mesh_detect),
        proxied=_proxied(controller.capabilities, doc.gateway.capabilities),
        proofs=tuple(_proof(p) for p in on_box.weakest_link),
    )
    if ev.posture == "unknown":
        # Neither side got an answer to a gated route: who can call the gateway cannot be
        # said. The box itself answered, so this is no "unreachable": its evidence stays
        # (`collected`), and what it publishes is judged (a lane anyone can call is still one).
        fault = Fault(FaultKind.NOT_OBSERVED, _no_answer(ev), GATEWAY_PART)
        return replace(ev, audited=False, fault=fault, errors=(fault.message, *ev.errors))
    return ev


def unaudited(name: str, want: Intent, fault: Fault) -> BoxEvidence:
    """A box the audit cannot judge, and the typed reason (shown as its first error)."""
    return BoxEvidence(name, False, (fault.message,), want, fault=fault)


def seen_from_mesh_side(
    name: str, want: Intent, probes: seen.ControllerProbes, fault: Fault
) -> BoxEvidence:
    """A box that could not be observed (SSH failed), whose gateway still answered the
    controller: not audited, but keyed or open as a caller on the mesh finds it (a 401 from
    `GET /v1/models` without a key is keyed, whatever the box's own state)."""
    on_box = probes.audit or NO_AUDIT
    side = _side(probes.health, probes.capabilities, probes.models_noauth, on_box.chat_noauth)
    if all(p.status is None for p in (side.health, side.capabilities, *side.gated)):
        return unaudited(name, want, fault)
    return BoxEvidence(
        name,
        False,
        (fault.message,),
        want,
        mesh_side=side,
        mesh_detect=_mesh_detect(on_box.mesh_detect),
        proxied=_proxied(probes.capabilities),
        # The controller's proofs through this gateway need no SSH: they hold as sent.
        proofs=tuple(_proof(p) for p in on_box.weakest_link),
        fault=fault,
        partial=True,
    )


def _lacking(box: BoxSpec, doc: Observed) -> Fault | None:
    """What the audit needs that a well-typed answer may still lack: its own section, the
    containers and the gateway probes (a live answer always has them; a snapshot cut down for
    another command may not), and hashed values wherever a secret's value belongs."""
    if doc.audit is None:
        return Fault(
            FaultKind.NOT_OBSERVED,
            "the collector ran without its audit section (an older or a drift snapshot?)",
            "audit",
        )
    if doc.docker.containers is None:
        if doc.docker.error is None:
            what = "missing (and no error says why)"
            return Fault(FaultKind.MALFORMED, what, "docker.containers")
        # The engine could not be read: no container seen is no container running. Judged as
        # seen, the box carried no key, published nothing and was no live mesh member, and the
        # mesh verdict was ok while this member's gateway said it was in the mesh.
        what = f"the containers could not be read ({scrub_text(doc.docker.error, limit=200)})"
        return Fault(FaultKind.NOT_OBSERVED, what, "docker")
    probes = doc.gateway
    if probes.error is None and probes.models_noauth is None:
        return Fault(
            FaultKind.MALFORMED, "missing (and no error says why)", "gateway.models_noauth"
        )
    for i, c in enumerate(doc.containers):
        for name in AUDITED_KEYS:
            if _in_clear(c.env.get(name)):
                return _clear(f"docker.containers[{i}].env.{name}")
    for name, export in doc.login_shell.exports.items():
        if _in_clear(export.value) and _is_secret(box, name):
            shown = f".{name}" if name.isidentifier() else "[?]"
            return _clear(f"login_shell.exports{shown}.value")
    return None


def _in_clear(value: EnvValue | None) -> bool:
    # The collector hashes every secret-named value and sends "" for an empty (or
    # whitespace-only: lobes' no key) one: any other text there is a value it should never
    # have sent (a broken or hostile box).
    return isinstance(value, str) and value.strip() != ""


def _clear(path: str) -> Fault:
    what = "a secret's value in clear text (expected a hashed secret)"
    return Fault(FaultKind.MALFORMED, what, path)


def _is_secret(box: BoxSpec, name: str) -> bool:
    return name in AUDITED_KEYS or any(fnmatch.fnmatchcase(name, p) for p in box.secret_patterns)


def _errors(doc: Observed, audit: AuditSection) -> tuple[str, ...]:
    """What the box said it could not observe: warnings on an audited box (its own words)."""
    errors = []
    if not doc.deploy_dir_exists:
        errors.append(f"deployment directory {doc.deploy_dir} does not exist")
    for part, error in (
        ("docker", doc.docker.error),
        ("login_shell", doc.login_shell.error),
        ("variables", doc.variables.error),
        ("audit", audit.error),
    ):
        if error:
            errors.append(f"{part}: {error}")
    # What is published beside the gateway is unknown (or known only in part): never "none".
    if audit.host_network is not None and audit.host_network.error:
        errors.append(f"host network: {audit.host_network.error}")
    if audit.running is not None and audit.running.error:
        errors.append(f"running containers: {audit.running.error}")
    unread = doc.file_errors.get(".env")
    if unread and not audit.error:  # a collector that says so in its audit section says it once
        errors.append(f"file .env: {unread}")
    return tuple(errors)


def _no_answer(ev: BoxEvidence) -> str:
    parts = []
    for name, side in (("loopback", ev.loopback), ("mesh side", ev.mesh_side)):
        probe = side.models if side else None
        parts.append(f"{name}: {(probe.error if probe else None) or 'no answer'}")
    return "no gated request got an answer (" + "; ".join(parts) + "), though the box answered"


def _plain(value: EnvValue | None) -> str | None:
    return value if isinstance(value, str) and value else None


def _envfile_unread(doc: Observed, audit: AuditSection) -> str | None:
    """Why `.env`'s key lines are unknown, or None. A failed audit section never read them (its
    `envfile_keys` is empty), and a `.env` the collector could not read (over its size limit,
    not UTF-8, not a file) reads as "no-file": either way "absent" or "no .env" would be a
    claim the box never made, and the findings resting on it would be false."""
    if audit.error:
        return audit.error
    unread = doc.file_errors.get(".env")
    return f"file .env: {unread}" if unread else None


def _envfile(audit: AuditSection, unread: str | None) -> dict[str, EnvLine]:
    if unread is not None:
        return {name: EnvLine(name, "unknown") for name in AUDITED_KEYS}
    out = {}
    for name in AUDITED_KEYS:
        seen = audit.envfile_keys.get(name)
        if seen is None:
            out[name] = EnvLine(name, "absent")
        else:
            out[name] = EnvLine(name, seen.state, seen.line, seen.digest)
    return out


def _shell(box: BoxSpec, doc: Observed) -> tuple[ShellExport, ...]:
    """Login-shell exports of secret names that compose interpolates: each one decides what
    `docker compose up` from an operator's shell runs with, ahead of `.env` (incident #209)."""
    interpolated = doc.variables.names
    out = []
    for name, export in sorted(doc.login_shell.exports.items()):
        secret = any(fnmatch.fnmatchcase(name, p) for p in box.secret_patterns)
        if secret and (name in interpolated or name in AUDITED_KEYS):
            digest = export.value if isinstance(export.value, SecretValue) else None
            # the box's text (a login file's line): scrubbed as any free text from a box
            source = scrub_text(export.source) if export.source else None
            out.append(ShellExport(name, source, digest))
    return tuple(out)


def _carried(
    env: Mapping[str, EnvValue], envfile: dict[str, EnvLine], shell: dict[str, ShellExport]
) -> dict[str, Carried]:
    out = {}
    for name in AUDITED_KEYS:
        value = env.get(name)
        digest = value if isinstance(value, SecretValue) else None
        line = envfile.get(name) or EnvLine(name, "absent")
        declared = line.digest if line.state == "set" else None
        export = shell.get(name)
        by_env = digest == declared
        by_shell = export is not None and export.digest == digest
        origin: Origin
        where: str | None = None
        if line.state == "unknown":
            # .env was not read: whether it gives this value cannot be said, so neither can
            # the origin (a shell exporting the same value is named, as a lead).
            origin = "unknown"
            where = export.source if by_shell and export and digest is not None else None
        elif by_env and digest is None:
            origin = "none"  # nothing anywhere (a shell exporting it empty changes nothing)
        elif by_env:
            # Compose reads the shell before .env; when both say the same, both are named.
            origin = "env+shell" if by_shell else "env"
            where = f".env:{line.line}"
        elif by_shell and export is not None:
            origin, where = "shell", export.source or "login shell"
        else:
            # Neither .env nor the login shell gives this value: the gateway was started
            # before .env changed (stale), or by hand with another environment.
            origin = "unexplained"
        out[name] = Carried(name, digest, origin, where)
    return out


def _side(
    health: seen.Probe | None,
    capabilities: seen.Probe | None,
    models: seen.Probe | None,
    chat: seen.Probe | None,
) -> Side:
    return Side(_probe(health), _probe(capabilities), _probe(models), _probe(chat))


def _probe(probe: seen.Probe | None) -> Probe:
    if probe is None:
        return Probe(None, "not probed")
    return Probe(probe.status, probe.failure, probe.model)


def _keyed(probe: seen.KeyedProbe | None) -> KeyedProbe | None:
    if probe is None:
        return None
    return KeyedProbe(
        status=probe.status,
        key_from=probe.key_from,
        digest=probe.key,
        note=probe.skipped or probe.failure,
    )


def gateway_container(doc: Observed) -> Container | None:
    """The gateway, picked as drift picks a service's container (compare/containers.py): the
    render's `container_name`, else lobes' fixed name, else compose's replica; never a
    `docker compose run` copy only because its name sorts first."""
    group = service_containers(doc).get(roles.GATEWAY_SERVICE) or []
    rendered = (doc.render.services or {}).get(roles.GATEWAY_SERVICE)
    named = rendered.container_name if rendered and rendered.container_name else None
    wanted = named or roles.container_name(roles.GATEWAY_SERVICE)
    return next((c for c in group if c.name == wanted), group[0] if group else None)


def _published(
    doc: Observed, audit: AuditSection, on_box: ControllerAudit, box: BoxSpec
) -> Published:
    gateway: list[Binding] = []
    lanes: list[Binding] = []
    for c in doc.containers:
        if c.status != "running":
            continue  # a stopped container publishes nothing
        found = [
            Binding(c.name, c.service, b.host_ip, b.host_port, port)
            for port, binds in sorted(c.ports.items())
            for b in binds
        ]
        (gateway if c.service == roles.GATEWAY_SERVICE else lanes).extend(found)
    # The collector lists the project's host-network containers stopped ones included (and a
    # snapshot keeps such a list): only one that runs opens a port on the box.
    status = {c.name: c.status for c in doc.containers}
    listed = audit.host_network.containers if audit.host_network else None
    host_net = tuple(n for n in listed or () if status.get(n) not in STOPPED)
    lane_probes = tuple(LaneProbe(p.container, p.url, p.status, p.error) for p in on_box.lane_ports)
    stray: list[Binding] = []
    stray_host: list[str] = []
    declared: dict[str, str] = {}
    llm_like: set[str] = set()
    expected = box.audit.expected_containers
    own_images = _repositories(box)
    running = audit.running
    why = None
    if running is None:
        why = "not listed in this observation (a snapshot from an older collector)"
    elif running.containers is None:
        why = f"not listed: {running.error or 'no answer'}"
    else:
        ours = {c.name for c in doc.containers}
        for r in running.containers:
            if r.name in ours:
                continue  # the project's own: judged above (lanes, the gateway and its copies)
            if r.host_network:
                stray_host.append(r.name)
            named = [e for e in expected if fnmatch.fnmatchcase(r.name, e.name)]
            if named:
                declared[r.name] = named[0].name
            if r.image and _llm_image(r.image, own_images):
                llm_like.add(r.name)
            label = r.project and f"{r.project}/{r.service or '?'}"
            stray += [
                Binding(
                    r.name,
                    label or r.image,
                    b.host_ip,
                    b.host_port,
                    port,
                    expected_by=_declaring(named, b.host_port),
                )
                for port, binds in sorted(r.ports.items())
                for b in binds
            ]
        if running.error:
            why = running.error  # listed, but cut: what is past the cut is unknown
    return Published(
        tuple(gateway),
        tuple(lanes),
        host_net,
        lane_probes,
        stray=tuple(stray),
        stray_host_network=tuple(sorted(stray_host)),
        running=why,
        declared=declared,
        llm_like=frozenset(llm_like),
        host_network_services={
            c.name: c.service for c in doc.containers if c.service and c.name in host_net
        },
    )


def _declaring(named: list[ExpectedContainer], host_port: str) -> str | None:
    """The first entry naming the container that allows `host_port` (no `ports`: any)."""
    for e in named:
        if e.ports is None or (host_port.isdigit() and int(host_port) in e.ports):
            return e.name
    return None


# Image names of servers that answer an OpenAI-style API (GET /v1/models): vLLM and its kin.
LLM_IMAGE_MARKERS = (
    "vllm",
    "sglang",
    "text-generation-inference",
    "ollama",
    "llama.cpp",
    "llama-cpp",
    "llama-server",
    "tensorrt-llm",
    "tensorrt_llm",
    "lmdeploy",
    "localai",
)


def _repository(image: str) -> str:
    """`host:5000/vllm/vllm-openai:tag@sha256:...` -> `host:5000/vllm/vllm-openai`."""
    name = image.partition("@")[0]
    head, _, last = name.rpartition("/")
    last = last.partition(":")[0]
    return f"{head}/{last}" if head else last


def _repositories(box: BoxSpec) -> frozenset[str]:
    """The repositories of the box's own desired images (its lanes' and the gateway's)."""
    refs = [box.image_ref(lane.image) for lane in box.lanes.values()]
    refs.append(box.image_ref(box.gateway.image))
    return frozenset(_repository(r) for r in refs)


def _llm_image(image: str, own: frozenset[str]) -> bool:
    lowered = image.lower()
    return any(m in lowered for m in LLM_IMAGE_MARKERS) or _repository(image) in own


def _mesh_detect(probe: MeshDetectProbe | None) -> bool | None:
    if probe is None:
        return None
    if probe.status == 200:
        return probe.mesh
    if probe.status == 404:
        return False  # lobes answers every /mesh/* with 404 when the mesh is off
    return None


def _proxied(*probes: CapabilitiesProbe | None) -> dict[str, str]:
    """role -> member, from /capabilities (mesh side first, else the loopback's)."""
    for probe in probes:
        if probe is not None and probe.roles is not None:
            return {
                role: entry.member
                for role, entry in sorted(probe.roles.items())
                if entry.proxied and entry.member
            }
    return {}


def _proof(p: ProofProbe) -> Proof:
    return Proof(
        via=p.via,
        role=p.role,
        host=p.host,
        url=p.url,
        status=p.status,
        mesh_member=p.headers.get("X-Lobes-Mesh-Member"),
        proxied_by=p.headers.get("X-Lobes-Proxied-By"),
        error=p.failure,
    )


# -- key use across boxes ------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyUse:
    """One running key against the desired state and the other boxes (digests only)."""

    digest: SecretValue | None
    matches_desired: bool | None  # None: no desired value known (source unreadable, or open)
    same_as: tuple[str, ...]  # other audited boxes whose gateway carries the same value


def key_use(row: BoxEvidence, rows: list[BoxEvidence]) -> dict[str, KeyUse]:
    """`inbound` and `mesh`: is each the desired value, and which other boxes share it."""
    others = [r for r in rows if r.audited and r.box != row.box]

    def use(mine: SecretValue | None, desired: SecretValue | None, theirs: Any) -> KeyUse:
        same = tuple(o.box for o in others if mine is not None and theirs(o) == mine)
        matches = None if desired is None or mine is None else mine == desired
        return KeyUse(mine, matches, same)

    def inbound(r: BoxEvidence) -> SecretValue | None:
        return r.inbound.digest if r.inbound else None

    def mesh(r: BoxEvidence) -> SecretValue | None:
        c = r.carried.get(MESH_KEY)
        return c.digest if c else None

    return {
        "inbound": use(inbound(row), row.intent.api_key, inbound),
        "mesh": use(mesh(row), row.intent.mesh_key, mesh),
    }
