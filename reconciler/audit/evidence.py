"""One evidence row per box, built from its observation: pure, typed, no I/O.

Everything an audit verdict rests on is here, each fact with where it was seen: the desired
posture, what `.env` declares (line state and digest), what the running gateway carries and
where that came from, the login shell's exports, the probes without credentials from the box
itself (loopback) and from the controller (the mesh side), the keyed probe, and what is
published on the host. Secrets only ever appear as `SecretValue` digests (keyed per run on the
box); two equal digests in one run mean the same value.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Literal

from reconciler.compare.drift import SecretValue
from reconciler.desired import roles
from reconciler.desired.models import BoxFileSecret, BoxSpec, ControllerEnvSecret
from reconciler.observe.observe import BoxObservation

API_KEYS = ("GATEWAY_API_KEY", "CULTURE_VLLM_API_KEY")  # lobes: the first non-blank wins
MESH_KEY = "LOBES_MESH_KEY"
AUDITED_KEYS = (*API_KEYS, MESH_KEY)

Posture = Literal["keyed", "open", "mixed", "unknown"]
LineState = Literal["set", "empty", "commented-out", "absent", "no-file"]
# Where the value the running gateway carries came from.
Origin = Literal["env", "shell", "env+shell", "none", "unexplained"]


@dataclass(frozen=True)
class Intent:
    """The desired state's answer to "who may call this gateway"."""

    auth: Literal["keyed", "open"]
    api_key_secret: str | None
    api_key_where: str | None  # "~/.lobes/.secrets.env GATEWAY_API_KEY" / "$FLEET_KEY"
    api_key: SecretValue | None  # the desired key's digest, read from its source on the box
    api_key_status: str | None  # ok | file-missing | key-missing | controller-env | None
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

    @property
    def address(self) -> str:
        return f"{self.host_ip or '0.0.0.0'}:{self.host_port}"


@dataclass(frozen=True)
class LaneProbe:
    container: str
    url: str
    status: int | None
    error: str | None


@dataclass(frozen=True)
class Published:
    gateway: tuple[Binding, ...]
    lanes: tuple[Binding, ...]
    host_network: tuple[str, ...]  # containers on the host network
    lane_probes: tuple[LaneProbe, ...] = ()


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

    @property
    def inbound(self) -> Carried | None:
        """The key the gateway enforces: GATEWAY_API_KEY if non-blank, else the fallback."""
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
def intent(box: BoxSpec, collected: dict[str, Any] | None) -> Intent:
    sources = (collected or {}).get("secret_sources") or {}

    def desired(secret: str | None) -> tuple[SecretValue | None, str | None, str | None]:
        if secret is None:
            return None, None, None
        src = box.secrets.get(secret)
        if isinstance(src, ControllerEnvSecret):
            return None, "controller-env", f"${src.variable} on the controller"
        where = f"{src.path} {src.key}" if isinstance(src, BoxFileSecret) else None
        seen = sources.get(secret) or {}
        digest = SecretValue(seen["digest"]) if seen.get("digest") else None
        return digest, seen.get("status"), where

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
        api_key_shared=isinstance(box.secrets.get(api_secret or ""), ControllerEnvSecret),
        mesh=box.mesh.enabled,
        mesh_key_secret=mesh_secret,
        mesh_key=mesh_digest,
        mesh_key_status=mesh_status,
        bind=box.gateway.bind,
        port=box.gateway.port,
    )


def box_evidence(box: BoxSpec, obs: BoxObservation) -> BoxEvidence:
    doc = obs.collected
    want = intent(box, doc)
    if doc is None:
        return BoxEvidence(box.name, False, (obs.error or "not observed",), want)
    audit = doc.get("audit")
    if not isinstance(audit, dict):
        reason = "the collector ran without its audit section (an older snapshot?)"
        return BoxEvidence(box.name, False, (reason,), want)
    errors = _errors(doc, audit)
    containers = ((doc.get("docker") or {}).get("containers")) or []
    gateway = next((c for c in containers if c.get("service") == roles.GATEWAY_SERVICE), None)
    envfile = _envfile(audit.get("envfile_keys") or {})
    shell = _shell(box, doc)
    carried = _carried(gateway, envfile, {s.name: s for s in shell}) if gateway else {}
    controller = obs.controller or {}
    loopback = _side(doc.get("gateway") or {}, (audit.get("probes") or {}).get("chat_noauth"))
    mesh_side = _side(controller, (controller.get("audit") or {}).get("chat_noauth"))
    probes = audit.get("probes") or {}
    ev = BoxEvidence(
        box=box.name,
        audited=True,
        errors=tuple(errors),
        intent=want,
        envfile=envfile,
        gateway_container=gateway.get("name") if gateway else None,
        gateway_status=gateway.get("status") if gateway else None,
        carried=carried,
        shell=shell,
        loopback=loopback,
        mesh_side=mesh_side,
        keyed=_keyed(probes.get("models_key")),
        mesh_keyed=_keyed(probes.get("models_mesh_key")),
        published=_published(containers, audit, controller),
        mesh_name=_plain((gateway or {}).get("env", {}).get("LOBES_MESH_NAME")),
        mesh_detect=_mesh_detect(controller),
        proxied=_proxied(controller, doc),
        proofs=_proofs(controller),
    )
    if ev.posture == "unknown":
        # Neither side got an answer to a gated route: who can call it cannot be said.
        return BoxEvidence(
            **{**ev.__dict__, "audited": False, "errors": (*ev.errors, _no_answer(ev))}
        )
    return ev


def _errors(doc: dict[str, Any], audit: dict[str, Any]) -> list[str]:
    errors = []
    if not doc.get("deploy_dir_exists"):
        errors.append(f"deployment directory {doc.get('deploy_dir')} does not exist")
    for part in ("docker", "login_shell", "variables"):
        section = doc.get(part)
        if isinstance(section, dict) and section.get("error"):
            errors.append(f"{part}: {section['error']}")
    if isinstance(audit.get("error"), str):
        errors.append(f"audit: {audit['error']}")
    return errors


def _no_answer(ev: BoxEvidence) -> str:
    parts = []
    for name, side in (("loopback", ev.loopback), ("mesh side", ev.mesh_side)):
        probe = side.models if side else None
        parts.append(f"{name}: {(probe.error if probe else None) or 'no answer'}")
    return "the gateway answered no gated request (" + "; ".join(parts) + ")"


def _secret(raw: Any) -> SecretValue | None:
    if isinstance(raw, dict) and isinstance(raw.get("secret"), str):
        return SecretValue(raw["secret"])
    return None


def _plain(raw: Any) -> str | None:
    return raw if isinstance(raw, str) and raw else None


def _envfile(raw: dict[str, Any]) -> dict[str, EnvLine]:
    out = {}
    for name in AUDITED_KEYS:
        entry = raw.get(name) or {"state": "absent"}
        digest = entry.get("digest")
        out[name] = EnvLine(
            name,
            entry.get("state", "absent"),
            entry.get("line"),
            SecretValue(digest) if isinstance(digest, str) else None,
        )
    return out


def _shell(box: BoxSpec, doc: dict[str, Any]) -> tuple[ShellExport, ...]:
    """Login-shell exports of secret names that compose interpolates: each one decides what
    `docker compose up` from an operator's shell runs with, ahead of `.env` (incident #209)."""
    exports = ((doc.get("login_shell") or {}).get("exports")) or {}
    interpolated = set((doc.get("variables") or {}).get("names") or [])
    out = []
    for name, export in sorted(exports.items()):
        secret = any(fnmatch.fnmatchcase(name, p) for p in box.secret_patterns)
        if secret and (name in interpolated or name in AUDITED_KEYS):
            out.append(ShellExport(name, export.get("source"), _secret(export.get("value"))))
    return tuple(out)


def _carried(
    gateway: dict[str, Any], envfile: dict[str, EnvLine], shell: dict[str, ShellExport]
) -> dict[str, Carried]:
    env = gateway.get("env") or {}
    out = {}
    for name in AUDITED_KEYS:
        digest = _secret(env.get(name))
        line = envfile.get(name) or EnvLine(name, "absent")
        declared = line.digest if line.state == "set" else None
        export = shell.get(name)
        by_env = digest == declared
        by_shell = export is not None and export.digest == digest
        origin: Origin
        where: str | None = None
        if by_env and digest is None:
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


def _side(probes: dict[str, Any], chat: dict[str, Any] | None) -> Side:
    return Side(
        health=_probe(probes.get("health")),
        capabilities=_probe(probes.get("capabilities")),
        models=_probe(probes.get("models_noauth")),
        chat=_probe(chat),
    )


def _probe(raw: Any) -> Probe:
    if not isinstance(raw, dict):
        return Probe(None, "not probed")
    return Probe(raw.get("status"), raw.get("error") or raw.get("error_type"), raw.get("model"))


def _keyed(raw: Any) -> KeyedProbe | None:
    if not isinstance(raw, dict):
        return None
    return KeyedProbe(
        status=raw.get("status"),
        key_from=raw.get("key_from"),
        digest=SecretValue(raw["key"]) if isinstance(raw.get("key"), str) else None,
        note=raw.get("skipped") or raw.get("error") or raw.get("error_type"),
    )


def _bindings(container: dict[str, Any]) -> list[Binding]:
    out = []
    for port, binds in sorted((container.get("ports") or {}).items()):
        for bind in binds or []:
            out.append(
                Binding(
                    container=container.get("name") or "?",
                    service=container.get("service"),
                    host_ip=bind.get("HostIp") or "",
                    host_port=str(bind.get("HostPort") or ""),
                    container_port=port,
                )
            )
    return out


def _published(
    containers: list[dict[str, Any]], audit: dict[str, Any], controller: dict[str, Any]
) -> Published:
    gateway: list[Binding] = []
    lanes: list[Binding] = []
    for c in containers:
        if c.get("status") != "running":
            continue  # a stopped container publishes nothing
        (gateway if c.get("service") == roles.GATEWAY_SERVICE else lanes).extend(_bindings(c))
    host_net = tuple((audit.get("host_network") or {}).get("containers") or ())
    lane_probes = tuple(
        LaneProbe(p.get("container", "?"), p.get("url", ""), p.get("status"), p.get("error"))
        for p in (controller.get("audit") or {}).get("lane_ports") or []
    )
    return Published(tuple(gateway), tuple(lanes), host_net, lane_probes)


def _mesh_detect(controller: dict[str, Any]) -> bool | None:
    probe = (controller.get("audit") or {}).get("mesh_detect") or {}
    if probe.get("status") == 200 and isinstance(probe.get("body"), dict):
        return bool(probe["body"].get("mesh"))
    if probe.get("status") == 404:
        return False  # lobes answers every /mesh/* with 404 when the mesh is off
    return None


def _proxied(controller: dict[str, Any], doc: dict[str, Any]) -> dict[str, str]:
    """role -> member, from /capabilities (mesh side first, else the loopback's)."""
    for probe in (controller.get("capabilities"), (doc.get("gateway") or {}).get("capabilities")):
        body = (probe or {}).get("body")
        if isinstance(body, dict):
            return {
                role: str(entry["member"])
                for role, entry in sorted(body.items())
                if isinstance(entry, dict) and entry.get("proxied") and entry.get("member")
            }
    return {}


def _proofs(controller: dict[str, Any]) -> tuple[Proof, ...]:
    out = []
    for p in (controller.get("audit") or {}).get("weakest_link") or []:
        headers = p.get("headers") or {}
        out.append(
            Proof(
                via=p.get("via", "?"),
                role=p.get("role", "?"),
                host=p.get("host", "?"),
                url=p.get("url", ""),
                status=p.get("status"),
                mesh_member=headers.get("X-Lobes-Mesh-Member"),
                proxied_by=headers.get("X-Lobes-Proxied-By"),
                error=p.get("error") or p.get("error_type"),
            )
        )
    return tuple(out)


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
