"""The audit's rules: evidence -> findings with a severity -> one verdict per box and for the
mesh. Pure functions of the evidence rows; every message names where its facts were seen.

Severity: `fail` when who-can-call-what differs from the desired state now (a keyed box that
answers anyone, a lane reachable around the gateway, a mesh whose open member forwards into a
keyed one); `warn` when it holds now but rests on something that flips it on the next ordinary
action (a key only the login shell provides, a `.env` that declares the other posture, a key
reused where each box should have its own). A box that cannot be audited gets `fail` and makes
the run exit 1.

Codes (stable, in the JSON report):
  audit.unobserved            the box (or its gateway) could not be observed; a box whose
                              gateway alone answered nothing is still judged on what it
                              publishes (publish.*)
  posture.keyed-but-open      desired keyed; /v1/* answers without a key
  posture.open-but-keyed      desired open; every caller without a key gets 401 (seed #209)
  posture.mixed               the probes disagree (loopback vs mesh side, or models vs chat)
  gateway.mesh-side-unreachable  the loopback answers, the mesh side cannot reach the gateway
                              (never for a desired loopback bind: no one outside the box can)
  key.from-login-shell        the running key came from a login-shell export, not .env
  key.stale                   the running key is not what .env declares and no shell explains it
  envfile.other-posture       .env declares the other posture: a scrubbed recreate flips it
  key.not-desired             the running key is not the desired secret's value
  envfile.key-not-desired     .env holds another key than the desired secret
  key.right-key-refused       the desired key does not open /v1/models
  key.unproven                keyed access could not be tried with the desired key, or was
                              tried and got no answer (refused, timed out), or the box's
                              answer has no keyed probe (its audit section failed)
  secret.unreadable           a desired secret is unknown on the box: its file or key is missing,
                              or a controller secret was not sent (digest unknown)
  key.is-mesh-key             the inbound key is the mesh key
  key.reused                  the inbound key is the same as another box's (each has its own)
  key.not-shared              the desired state shares one key; the boxes carry different ones
  shell.secret-export         the login shell exports a secret compose interpolates
  publish.lane                a lane publishes a host port (reachable around the gateway)
  publish.host-network        a lane runs on the host network
  publish.gateway             the gateway is published elsewhere than the desired bind:port,
                              another gateway container publishes a port, a published gateway
                              port answers without a key, or a desired loopback gateway
                              answers the mesh side (or runs on the host network)
  publish.stray               a running container outside the compose project publishes a
                              host port or runs on the host network (reachable around the
                              gateway; asked without a key at the box's own address only):
                              fail when it answers GET /v1/models without a key (2xx), declared
                              or not, or is undeclared with an LLM server's image and no answer;
                              else a warning, none when audit.expected_containers declares it
  mesh.member                 mesh membership differs from the desired state
  mesh.member-loopback        desired a mesh member with a loopback gateway.bind: no other
                              member can reach it
  mesh.key-not-desired        a member's running mesh key is not the desired secret's value
                              (fail on a keyed box: the mesh key is a data-plane bearer)
  mesh.weakest-link           an open member and a keyed member in one mesh
  mesh.keys-differ            members run with different mesh keys
  mesh.incomplete             a member could not be audited
  mesh.not-in-run             desired members this run did not audit (a subset of the boxes)

Findings that rest on `.env`'s key lines (key.from-login-shell, key.stale,
envfile.other-posture, envfile.key-not-desired) are not made when `.env` could not be read or
the audit section failed: its lines are unknown, not absent.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

from reconciler.audit import phrases
from reconciler.audit.evidence import (
    API_KEYS,
    AUDITED_KEYS,
    Binding,
    BoxEvidence,
    Published,
    Side,
    every_interface,
    is_loopback,
)
from reconciler.audit.mesh import MeshEvidence, every_as_one


class Severity(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


RANK = {Severity.OK: 0, Severity.WARN: 1, Severity.FAIL: 2}


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    message: str


@dataclass(frozen=True)
class Verdict:
    subject: str  # a box name, or "mesh"
    verdict: Severity
    audited: bool
    findings: tuple[Finding, ...]
    reasons: tuple[str, ...]  # what was proven: the grounds of an ok, the context of the rest


def worst(findings: tuple[Finding, ...]) -> Severity:
    return max((f.severity for f in findings), key=RANK.__getitem__, default=Severity.OK)


def _verdict(subject: str, audited: bool, findings: list[Finding], reasons: list[str]) -> Verdict:
    ordered = tuple(sorted(findings, key=lambda f: (-RANK[f.severity], f.code, f.message)))
    return Verdict(subject, worst(ordered), audited, ordered, tuple(reasons))


# -- one box -------------------------------------------------------------------------------------
def box_verdict(row: BoxEvidence, others: list[BoxEvidence]) -> Verdict:
    if not row.audited:
        findings = [Finding("audit.unobserved", Severity.FAIL, e) for e in row.errors]
        if row.collected:
            # The box answered, its gateway did not: who can call the gateway is unknown, but
            # what the box publishes was seen (and asked by the controller): a lane anyone
            # can call around a silent gateway is still one.
            findings += _published(row)
            reason = (
                f"desired {row.intent.auth}, live unknown: the box answered, its gateway did "
                "not; judged on what the box publishes only"
            )
            return _verdict(row.box, False, findings, [reason])
        if not row.partial:
            return _verdict(row.box, False, findings, [])
        # Seen from the mesh side only: its posture is still proven (or disproven) there.
        if row.posture != "unknown":
            findings += _posture(row)
        reason = (
            f"seen from the mesh side only: desired {row.intent.auth}, live {row.posture} "
            f"(mesh side {_codes(row.mesh_side)})"
        )
        return _verdict(row.box, False, findings, [reason])
    findings = [
        *_posture(row),
        *_key_origin(row),
        *_right_key(row),
        *_key_reuse(row, others),
        *_shell(row),
        *_published(row),
        *_mesh_member(row),
    ]
    findings += [Finding("audit.unobserved", Severity.WARN, e) for e in row.errors]
    return _verdict(row.box, True, findings, _box_reasons(row))


def _codes(side: Side | None) -> str:
    if side is None:
        return "not probed"
    return f"GET /v1/models {phrases.status(side.models)}, POST chat {phrases.status(side.chat)}"


def _posture(row: BoxEvidence) -> Iterator[Finding]:
    live, want = row.posture, row.intent.auth
    where = f"loopback {_codes(row.loopback)}; mesh side {_codes(row.mesh_side)}"
    if live == "mixed":
        yield Finding(
            "posture.mixed",
            Severity.FAIL,
            f"the gated routes answer differently without a key ({where})",
        )
    elif live != want:
        code, why = (
            ("posture.keyed-but-open", "answers callers without a key")
            if want == "keyed"
            else ("posture.open-but-keyed", "refuses every caller without a key")
        )
        yield Finding(code, Severity.FAIL, f"desired {want}, but the gateway {why} ({where})")
    side, loopback = row.mesh_side, row.loopback
    answers_inside = loopback is not None and loopback.models.status is not None
    # A gateway bound to the loopback as desired answers no one outside the box: the
    # controller not reaching it is the desired state, not a finding.
    expected = is_loopback(row.intent.bind)
    if side is not None and answers_inside and side.models.status is None and not expected:
        yield Finding(
            "gateway.mesh-side-unreachable",
            Severity.WARN,
            f"the gateway answers on the loopback but not from the mesh side "
            f"({side.models.error or 'no answer'})",
        )


def _key_origin(row: BoxEvidence) -> Iterator[Finding]:
    declared = row.declared
    mismatch = row.posture != row.intent.auth
    for name in AUDITED_KEYS:
        carried = row.carried.get(name)
        if carried is None or carried.origin not in ("shell", "unexplained"):
            continue
        # An inbound key that decides the posture fails when the posture is wrong; the rest
        # (a mesh key, a key the posture does not depend on) is a warning.
        severity = Severity.FAIL if mismatch and name in API_KEYS else Severity.WARN
        line = phrases.env_line(row.envfile.get(name))
        if carried.origin == "shell":
            yield Finding(
                "key.from-login-shell",
                severity,
                f"the gateway runs with {name} {phrases.carried(carried)}, while .env has it "
                f"{line}: a recreate from cron, CI or a converge (scrubbed) starts it otherwise",
            )
        else:
            shown = "empty" if carried.digest is None else f"set ({phrases.digest(carried.digest)})"
            # A login shell whose trace failed may be where it came from: not said as known.
            shell = " (the login shell was not traced: it may give it)" if row.shell_unread else ""
            yield Finding(
                "key.stale",
                severity,
                f"the gateway runs with {name} {shown}, but .env has it {line}: it was started "
                f"before .env changed, or with another environment{shell}; recreate it "
                "(scrubbed)",
            )
    if row.envfile_unread is not None:
        return  # .env's lines are unknown: what it declares cannot be said
    declares = "keyed" if declared is not None and declared.state == "set" else "open"
    if declares != row.intent.auth:
        yield Finding(
            "envfile.other-posture",
            Severity.WARN,
            f".env declares the gateway {declares} ({declared.name if declared else API_KEYS[0]} "
            f"{phrases.env_line(declared)}), desired {row.intent.auth}: the next scrubbed "
            "recreate makes it so",
        )


def _right_key(row: BoxEvidence) -> Iterator[Finding]:
    want = row.intent
    if want.auth != "keyed":
        return
    inbound = row.inbound
    if want.api_key is not None:
        if inbound is not None and inbound.digest is not None and inbound.digest != want.api_key:
            yield Finding(
                "key.not-desired",
                Severity.FAIL,
                f"the gateway's key ({phrases.digest(inbound.digest)}) is not the desired "
                f"{want.api_key_secret} ({phrases.digest(want.api_key)})",
            )
        declared = row.declared
        if declared is not None and declared.state == "set" and declared.digest != want.api_key:
            yield Finding(
                "envfile.key-not-desired",
                Severity.WARN,
                f".env {declared.name} {phrases.env_line(declared)} is not the desired "
                f"{want.api_key_secret} ({phrases.digest(want.api_key)})",
            )
    elif want.api_key_status not in (None, "ok"):
        yield Finding(
            "secret.unreadable",
            Severity.WARN,
            f"the desired {want.api_key_secret} cannot be read on the box "
            f"({want.api_key_status}: {want.api_key_where}): the right key is unknown",
        )
    keyed = row.keyed
    if row.posture != "keyed":
        return
    if keyed is None:
        # No keyed probe in the box's answer (its audit section failed): the key that
        # opens this gateway is not proven, whatever else holds.
        why = row.envfile_unread or "the box's answer has no keyed probe"
        yield Finding("key.unproven", Severity.WARN, f"keyed access was not tried: {why}")
    elif keyed.status is None and keyed.key_from is not None:
        # Sent, and no answer came back (refused, timed out): tried, not proven.
        yield Finding(
            "key.unproven",
            Severity.WARN,
            f"keyed access was tried, with no answer: GET /v1/models on the box with the key "
            f"from {keyed.key_from} ({phrases.digest(keyed.digest)}): "
            f"{keyed.note or 'no answer'}",
        )
    elif keyed.status is None:
        yield Finding(
            "key.unproven",
            Severity.WARN,
            f"keyed access was not tried: {keyed.note or 'no key'}",
        )
    elif keyed.status != 200:
        yield Finding(
            "key.right-key-refused",
            Severity.FAIL,
            f"GET /v1/models with the key from {keyed.key_from} ({phrases.digest(keyed.digest)}) "
            f"got {keyed.status}: callers holding it are refused",
        )
    elif keyed.key_from and not keyed.key_from.startswith("secret:"):
        yield Finding(
            "key.unproven",
            Severity.WARN,
            f"keyed access works with the key from {keyed.key_from}, not the desired source",
        )


def _key_reuse(row: BoxEvidence, others: list[BoxEvidence]) -> Iterator[Finding]:
    inbound = row.inbound
    if inbound is None or inbound.digest is None:
        return
    mesh = row.carried.get("LOBES_MESH_KEY")
    if mesh is not None and mesh.digest == inbound.digest:
        yield Finding(
            "key.is-mesh-key",
            Severity.FAIL,
            f"the inbound {inbound.name} is the mesh key ({phrases.digest(inbound.digest)}): "
            "every API client holds the key members sign with",
        )
    same = [
        o.box
        for o in others
        if o.audited
        and o.inbound is not None
        and o.inbound.digest == inbound.digest
        and not _one_variable(row, o)
    ]
    if same:
        yield Finding(
            "key.reused",
            Severity.WARN,
            f"the inbound key ({phrases.digest(inbound.digest)}) is {phrases.same_as(same)}; "
            f"the desired {row.intent.api_key_secret or 'key'} is one per box",
        )
    differ = [
        o.box
        for o in others
        if o.audited
        and _one_variable(row, o)
        and o.inbound is not None
        and o.inbound.digest != inbound.digest
    ]
    if differ:
        yield Finding(
            "key.not-shared",
            Severity.WARN,
            f"the desired {row.intent.api_key_secret} ({row.intent.api_key_where}) is one value "
            f"for every box naming it, but {', '.join(differ)} carry another",
        )


def _one_variable(row: BoxEvidence, other: BoxEvidence) -> bool:
    """Both boxes take their API key from the same controller variable: one value by design
    (a per-box variable, as inventory/lab-controller.yaml names, is one key per box)."""
    return (
        row.intent.api_key_shared
        and other.intent.api_key_shared
        and row.intent.api_key_secret == other.intent.api_key_secret
        and row.intent.api_key_where == other.intent.api_key_where
    )


def _shell(row: BoxEvidence) -> Iterator[Finding]:
    for export in row.shell:
        value = f"set ({phrases.digest(export.digest)})" if export.digest else "empty"
        yield Finding(
            "shell.secret-export",
            Severity.WARN,
            f"the login shell exports {export.name} {value} at "
            f"{export.source or 'an unknown line'}: compose takes it ahead of .env",
        )


def _published(row: BoxEvidence) -> Iterator[Finding]:
    pub = row.published
    if pub is None:
        return
    for b in pub.lanes:
        yield Finding(
            "publish.lane",
            Severity.WARN if b.loopback else Severity.FAIL,
            f"{b.container} publishes {b.address}->{b.container_port} on the host: callers "
            f"reach the lane without the gateway's key{_asked(pub, b)}",
        )
    for name in pub.host_network:
        if name != row.gateway_container:
            yield Finding(
                "publish.host-network",
                Severity.FAIL,
                f"{name} runs on the host network: every port it opens is on the box",
            )
    for b in pub.stray:
        yield from _stray(pub, b)
    for name in pub.stray_host_network:
        if name in pub.declared:
            continue  # expected (audit.expected_containers): listed, no finding
        llm = name in pub.llm_like
        yield Finding(
            "publish.stray",
            Severity.FAIL if llm else Severity.WARN,
            f"{name}, outside the compose project, runs on the host network: every port it "
            "opens is on the box, around the gateway (its ports are unknown: not probed)"
            + (
                "; its image is an LLM server's"
                if llm
                else f"; if intended, declare it under audit.expected_containers "
                f"(name: {name}) in group_vars"
            ),
        )
    yield from _gateway_published(row, pub)


def _stray(pub: Published, b: Binding) -> Iterator[Finding]:
    """A port published by a container outside the project. Declared (audit.expected_containers,
    this port included): no finding, unless it answers GET /v1/models without a key (2xx), an
    open LLM API, which fails whatever is declared. Undeclared: fails when it answers so, or
    when its image is an LLM server's and no answer says otherwise; else a warning."""
    where = (
        f"{b.container} ({b.service or 'no image'}), outside the compose project, publishes "
        f"{b.address}->{b.container_port} on the host"
    )
    if _answers_as_llm_api(pub, b):
        declared = (
            f"; declared under audit.expected_containers ({b.expected_by}), but an LLM API "
            "anyone can call is never expected"
            if b.expected_by
            else ""
        )
        yield Finding(
            "publish.stray",
            Severity.FAIL,
            f"{where}: it answers as an LLM API without a key, around the gateway"
            f"{_asked(pub, b)}{declared}",
        )
        return
    if b.expected_by is not None:
        return  # expected: listed as such in the report
    probe = pub.probe_of(b)
    unanswered = probe is None or probe.status is None
    if b.container in pub.llm_like and unanswered and not b.loopback:
        yield Finding(
            "publish.stray",
            Severity.FAIL,
            f"{where}: its image is an LLM server's, reachable around the gateway{_asked(pub, b)}",
        )
        return
    if b.container in pub.declared:
        hint = (
            f"{b.container} is declared under audit.expected_containers "
            f"({pub.declared[b.container]}) without port {b.host_port}: add it to that "
            "entry's ports if intended"
        )
    else:
        hint = (
            f"if intended, declare it under audit.expected_containers (name: {b.container}, "
            f"ports: [{b.host_port}]) in group_vars"
        )
    yield Finding(
        "publish.stray",
        Severity.WARN,
        f"{where}: callers reach it around the gateway{_asked(pub, b)}; {hint}",
    )


def _answers_as_llm_api(pub: Published, b: Binding) -> bool:
    """The controller's GET /v1/models without a key got a 2xx: an OpenAI-style API, open."""
    probe = pub.probe_of(b)
    return probe is not None and probe.status is not None and 200 <= probe.status < 300


def _asked(pub: Published, b: Binding) -> str:
    """What the controller got from `b` without a key, or why it did not ask."""
    probe = pub.probe_of(b)
    if probe is not None:
        return f"; GET {probe.url} without a key: {probe.status or probe.error}"
    if b.loopback:
        return ""
    if not every_interface(b.host_ip):
        return (
            f"; not requested: {b.host_ip} is not the box's inventory address (judged from "
            "the published address alone)"
        )
    return "; not probed"


def _answers_without_key(pub: Published, b: Binding) -> bool:
    probe = pub.probe_of(b)
    return probe is not None and probe.status is not None and probe.status != 401


def _answered(side: Side | None) -> bool:
    """Did any request from that side get an answer (401 included: it reached the gateway)?"""
    if side is None:
        return False
    return any(p.status is not None for p in (side.health, side.capabilities, *side.gated))


def _gateway_published(row: BoxEvidence, pub: Published) -> Iterator[Finding]:
    bind = row.intent.bind
    want = f"{bind}:{row.intent.port}"
    loopback_wanted = is_loopback(bind)
    mesh_seen = f"mesh side {_codes(row.mesh_side)}"
    answered = _answered(row.mesh_side)
    bindings = [b for b in pub.gateway if b.container_port.startswith("8000")]
    mine = [b for b in bindings if b.container == row.gateway_container]
    # Another container of the gateway service (a `docker compose run` copy, a replica): each
    # of its ports is one more door, asked without a key like the lanes.
    for b in bindings:
        if b.container == row.gateway_container:
            continue
        opened = _answers_without_key(pub, b)
        yield Finding(
            "publish.gateway",
            Severity.FAIL if opened or _wider(bind, b) else Severity.WARN,
            f"another gateway container, {b.container}, publishes {b.address} (the gateway is "
            f"{row.gateway_container or 'not running'}, desired {want})"
            f"{' and answers without a key' if opened else ''}{_asked(pub, b)}",
        )
    if row.gateway_container is not None and row.gateway_container in pub.host_network:
        # Docker publishes nothing for it: it listens on the box's own addresses (GATEWAY_HOST).
        wider = loopback_wanted or not every_interface(bind)
        seen = "it answers the mesh side" if answered else "the mesh side got no answer"
        yield Finding(
            "publish.gateway",
            Severity.FAIL if wider else Severity.WARN,
            f"the gateway runs on the host network, not published on {want}: it listens on "
            f"the box's own addresses ({seen}: {mesh_seen})",
        )
        return
    addresses = sorted({b.address for b in mine})
    published = sorted({every_as_one(b) for b in mine})
    extra_open = [b for b in mine if every_as_one(b) != want and _answers_without_key(pub, b)]
    if not addresses:
        if answered:
            # Something answers the controller where the gateway should be: never "unreachable".
            yield Finding(
                "publish.gateway",
                Severity.FAIL if loopback_wanted else Severity.WARN,
                f"the gateway publishes no port (desired {want}), yet the mesh side gets "
                f"answers ({mesh_seen})",
            )
        else:
            yield Finding(
                "publish.gateway",
                Severity.WARN,
                f"the gateway publishes no port (desired {want}): mesh members cannot reach it",
            )
    elif published != [want]:
        # Reached from the mesh side while the box alone should reach it (published on another
        # loopback address, say, yet answering): wider than desired whatever the bindings say.
        reached = loopback_wanted and answered
        wider = any(_wider(bind, b) for b in mine) or bool(extra_open) or reached
        asked = "".join(_asked(pub, b) for b in mine if every_as_one(b) != want)
        yield Finding(
            "publish.gateway",
            Severity.FAIL if wider else Severity.WARN,
            f"the gateway is published on {', '.join(addresses)}, desired {want}"
            f"{'; answers without a key there' if extra_open else ''}"
            f"{f'; it answers the mesh side ({mesh_seen})' if reached else ''}{asked}",
        )
    elif loopback_wanted and answered:
        yield Finding(
            "publish.gateway",
            Severity.FAIL,
            f"desired {want} (the box only), yet the gateway answers the mesh side ({mesh_seen})",
        )


def _wider(bind: str, b: Binding) -> bool:
    """Does `b` reach callers the desired bind does not? Any address but the loopback when the
    loopback is desired (every interface, ::, another IP, one that does not parse: all may
    reach past the box); every interface when one other address is desired."""
    if is_loopback(bind):
        return not b.loopback
    return not every_interface(bind) and every_interface(b.host_ip)


def _mesh_member(row: BoxEvidence) -> Iterator[Finding]:
    want = row.intent
    if want.mesh and is_loopback(want.bind):
        # The desired state contradicts itself (the loader does not refuse it): members reach
        # each other's gateways, and a loopback bind is reachable from this box only.
        yield Finding(
            "mesh.member-loopback",
            Severity.WARN,
            f"desired a mesh member, but gateway.bind is {want.bind}: no other member can "
            "reach its gateway, so the roles it hosts fail through the mesh",
        )
    if want.mesh and not row.mesh_on:
        yield Finding(
            "mesh.member",
            Severity.WARN,
            "desired a mesh member, but the gateway runs without a mesh key or name",
        )
    elif not want.mesh and row.mesh_on:
        yield Finding(
            "mesh.member",
            Severity.FAIL,
            "not desired in the mesh, but the gateway runs with a mesh key: it proxies for, "
            "and accepts callers bearing, the mesh key",
        )
    mesh = row.carried.get("LOBES_MESH_KEY")
    if want.mesh and want.mesh_key is not None and mesh is not None and mesh.digest is not None:
        if mesh.digest != want.mesh_key:
            # lobes accepts the mesh key as a data-plane bearer: on a keyed box, whoever holds
            # this other key calls it, as key.not-desired's holder would.
            yield Finding(
                "mesh.key-not-desired",
                Severity.FAIL if want.auth == "keyed" else Severity.WARN,
                f"the gateway's mesh key ({phrases.digest(mesh.digest)}) is not the desired "
                f"{want.mesh_key_secret} ({phrases.digest(want.mesh_key)})",
            )
    elif want.mesh and want.mesh_key is None and want.mesh_key_status not in (None, "ok"):
        yield Finding(
            "secret.unreadable",
            Severity.WARN,
            f"the desired {want.mesh_key_secret} cannot be read on the box "
            f"({want.mesh_key_status})",
        )


def _box_reasons(row: BoxEvidence) -> list[str]:
    """What the evidence proves, finding or not: the first lines a reader checks."""
    out = [
        f"desired {row.intent.auth}, live {row.posture} (loopback {_codes(row.loopback)}; "
        f"mesh side {_codes(row.mesh_side)})"
    ]
    # On an open gateway a keyed request proves nothing: every request gets through.
    if row.posture == "keyed" and row.keyed is not None and row.keyed.status is not None:
        out.append(
            f"with the key from {row.keyed.key_from} ({phrases.digest(row.keyed.digest)}): "
            f"GET /v1/models {row.keyed.status}"
        )
    mesh = row.mesh_keyed
    if row.posture == "keyed" and mesh is not None and mesh.status == 200:
        # lobes accepts the mesh key as a data-plane bearer: whoever holds it calls this box.
        out.append(
            f"with the mesh key ({phrases.digest(mesh.digest)}): GET /v1/models 200, as on "
            "every member"
        )
    inbound = row.inbound
    if inbound is not None:
        out.append(f"the gateway's {inbound.name}: {phrases.carried(inbound)}")
    expected = _expected(row.published) if row.published is not None else []
    if expected:
        out.append(f"expected (audit.expected_containers): {', '.join(expected)}")
    if row.published is not None and row.published.running is not None:
        # Containers outside the project were not (all) seen: none published is not proven.
        out.append(f"other running containers: {row.published.running}")
    return out


def _expected(pub: Published) -> list[str]:
    """The containers outside the project that the desired state declares, and where."""
    out: dict[str, list[str]] = {}
    for b in pub.stray:
        if b.expected_by is not None:
            out.setdefault(b.container, []).append(b.address)
    for name in pub.stray_host_network:
        if name in pub.declared:
            out.setdefault(name, []).append("host network")
    return [f"{name} ({', '.join(where)})" for name, where in out.items()]


# -- the mesh ------------------------------------------------------------------------------------
def mesh_verdict(mesh: MeshEvidence) -> Verdict:
    findings: list[Finding] = []
    reasons = [
        f"desired members: {', '.join(mesh.members) or 'none'}; "
        f"live members: {', '.join(mesh.live_members) or 'none'}"
    ]
    # A mixed member answers some gated route without a key: it forwards that caller into the
    # keyed members as an open one does, so it is on the open side of the weakest link.
    open_, keyed = _marked(mesh, mesh.open_members), mesh.with_posture("keyed")
    if open_ or keyed:
        reasons.append(f"open: {', '.join(open_) or 'none'}; keyed: {', '.join(keyed) or 'none'}")
    if open_ and keyed:
        findings.append(_weakest_link(mesh, open_, keyed))
    elif open_ and not keyed:
        reasons.append("every live member is open: anyone who reaches a member calls every role")
    findings += _mesh_keys(mesh)
    for box in mesh.unaudited:
        if box in mesh.members:
            findings.append(
                Finding(
                    "mesh.incomplete",
                    Severity.FAIL,
                    f"{box} could not be audited: its posture is unknown, and the mesh is "
                    "only as closed as its weakest member",
                )
            )
    if mesh.not_in_run:
        findings.append(_not_in_run(mesh.not_in_run))
    return _verdict("mesh", not mesh.unaudited, findings, reasons)


def _marked(mesh: MeshEvidence, boxes: list[str]) -> list[str]:
    return [f"{b} (mixed)" if mesh.postures.get(b) == "mixed" else b for b in boxes]


def _not_in_run(boxes: tuple[str, ...]) -> Finding:
    # A subset run sees part of the mesh: a member it did not audit may be the open one.
    return Finding(
        "mesh.not-in-run",
        Severity.WARN,
        f"desired members not audited in this run: {', '.join(boxes)}; the mesh is only as "
        "closed as its weakest member (audit every member to judge it)",
    )


def _weakest_link(mesh: MeshEvidence, open_: list[str], keyed: list[str]) -> Finding:
    head = (
        f"{', '.join(open_)} open while {', '.join(keyed)} keyed: an open member forwards "
        "unauthenticated callers into keyed ones with the mesh key"
    )
    proven = [p for p in mesh.proofs if p.proven]
    if proven:
        p = proven[0]
        proof = (
            f"proven: POST {p.url} model={p.role} without a key -> {p.status}, "
            f"X-Lobes-Mesh-Member: {p.mesh_member}, X-Lobes-Proxied-By: {p.proxied_by}"
        )
    elif mesh.proofs:
        p = mesh.proofs[0]
        answer = p.status if p.status is not None else p.error
        proof = (
            f"not proven live: POST {p.url} model={p.role} without a key -> {answer}"
            f"{f' ({p.error})' if p.error and p.status is not None else ''}"
        )
    else:
        proof = "not proven live: no desired contract proxies a keyed member's role through it"
    return Finding("mesh.weakest-link", Severity.FAIL, f"{head}; {proof}")


def _mesh_keys(mesh: MeshEvidence) -> Iterator[Finding]:
    groups: dict[str, list[str]] = {}
    for box, key in mesh.mesh_keys.items():
        groups.setdefault(phrases.digest(key), []).append(box)
    if len(groups) > 1:
        shown = "; ".join(f"{', '.join(boxes)}: {d}" for d, boxes in sorted(groups.items()))
        yield Finding(
            "mesh.keys-differ",
            Severity.FAIL,
            f"members run with different mesh keys ({shown}): they cannot verify each other",
        )
