"""The mesh as a whole: who is a member, who is open, who is keyed, and which unauthenticated
request would prove that an open member lets anyone into a keyed one. Pure.

A lobes member with no inbound key forwards any caller's request for a role another member
hosts, signed with the mesh key (contracts §3.5, observed in §4.5): the keyed member accepts
the mesh key as a bearer, so its own key is bypassed. The mesh is as open as its weakest member.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from reconciler.audit.evidence import Binding, BoxEvidence, Posture, Proof, every_interface
from reconciler.audit.probes import LanePort, ProofAttempt
from reconciler.compare.drift import SecretValue
from reconciler.desired.models import BoxSpec
from reconciler.desired.types import url_host

# A member that answers any gated route without a key (open, or mixed: some routes open)
# forwards that caller into the keyed members: for the weakest link it is open.
ANSWERS_WITHOUT_KEY: frozenset[Posture] = frozenset({"open", "mixed"})


@dataclass(frozen=True)
class MeshEvidence:
    members: tuple[str, ...]  # the mesh on in the desired state
    live_members: tuple[str, ...]  # gateways running with a mesh key and a mesh name
    postures: dict[str, Posture]  # every audited box
    mesh_keys: dict[str, SecretValue | None]  # the key each live member's gateway carries
    proofs: tuple[Proof, ...]
    unaudited: tuple[str, ...]
    hosts: dict[str, str]  # role -> the member whose contract serves it
    # Desired members this run did not audit (a subset run): the mesh is not judged whole.
    not_in_run: tuple[str, ...] = ()

    def with_posture(self, posture: Posture) -> list[str]:
        return [b for b in self.live_members if self.postures.get(b) == posture]

    @property
    def open_members(self) -> list[str]:
        """Live members that answer a gated route without a key (open or mixed)."""
        return [b for b in self.live_members if self.postures.get(b) in ANSWERS_WITHOUT_KEY]


def role_hosts(specs: dict[str, BoxSpec]) -> dict[str, str]:
    return {
        str(role): name
        for name, spec in specs.items()
        for role, contract in spec.contract.items()
        if contract.context is not None
    }


def mesh_evidence(specs: dict[str, BoxSpec], rows: list[BoxEvidence]) -> MeshEvidence:
    """`specs`: the whole fleet, not only the boxes in `rows`: the mesh is every desired
    member, and one the run did not audit is named (`not_in_run`), never left out unseen."""
    audited = [r for r in rows if r.audited]
    # A box seen from the mesh side only (evidence.seen_from_mesh_side) still has a posture
    # and a /mesh/detect answer; its mesh key is unknown, so it is not compared.
    seen = [r for r in rows if r.audited or r.partial]
    live = tuple(r.box for r in seen if r.mesh_on)
    members = tuple(name for name, spec in specs.items() if spec.mesh.enabled)
    in_run = {r.box for r in rows}
    return MeshEvidence(
        members=members,
        live_members=live,
        postures={r.box: r.posture for r in seen},
        mesh_keys={
            r.box: (r.carried["LOBES_MESH_KEY"].digest if "LOBES_MESH_KEY" in r.carried else None)
            for r in audited
            if r.box in live
        },
        proofs=tuple(p for r in rows for p in r.proofs),
        unaudited=tuple(r.box for r in rows if not r.audited),
        hosts=role_hosts(specs),
        not_in_run=tuple(name for name in members if name not in in_run),
    )


def proof_attempts(
    specs: dict[str, BoxSpec], rows: list[BoxEvidence], bases: dict[str, str]
) -> list[ProofAttempt]:
    """One request per (open member, keyed member) pair: through the open one (or a mixed one:
    some gated route answers without a key), for the first role (by name) its desired
    contract proxies to the keyed one, with no credentials."""
    by_box = {r.box: r for r in rows if r.audited or r.partial}  # the requests need no SSH
    attempts = []
    for via, row in by_box.items():
        if row.posture not in ANSWERS_WITHOUT_KEY or not row.mesh_on:
            continue
        tried: set[str] = set()
        for role, contract in sorted(specs[via].contract.items()):
            host = contract.proxied_to
            target = by_box.get(host or "")
            if host is None or host in tried or target is None:
                continue
            if target.posture == "keyed" and target.mesh_on:
                tried.add(host)
                attempts.append(ProofAttempt(via, bases[via], str(role), host))
    return attempts


def lane_port_targets(rows: list[BoxEvidence], addresses: dict[str, str]) -> list[LanePort]:
    """Published ports the controller asks for /v1/models without a key: every lane's, every
    stray container's, and every gateway port but the one the mesh side already probed (the
    gateway's own at the desired bind:port). Only ever at the box's own inventory address
    (`addresses[box]`): a binding on any other address is judged from the box's word alone,
    never requested (a box chooses that address: it could name any host the controller
    reaches, 169.254.169.254 or another box)."""
    out = []
    for row in rows:
        pub = row.published
        if pub is None:
            continue
        want = f"{row.intent.bind}:{row.intent.port}"
        gateway = [
            b
            for b in pub.gateway
            if not (b.container == row.gateway_container and every_as_one(b) == want)
        ]
        sent: set[tuple[str, str]] = set()
        for b in (*pub.lanes, *gateway, *pub.stray):
            # Not asked: a loopback binding (the controller cannot reach it), no port yet, a
            # range (no one port to ask), or an address other than the box's own.
            if b.loopback or not b.host_port.isdigit() or not at_box(b, addresses[row.box]):
                continue
            if (b.container, b.host_port) in sent:
                continue  # a dual-stack publish (0.0.0.0 and ::) is one port to ask
            sent.add((b.container, b.host_port))
            url = f"http://{url_host(addresses[row.box])}:{b.host_port}/v1/models"
            out.append(LanePort(row.box, b.container, url))
    return out


def at_box(b: Binding, address: str) -> bool:
    """Is `b` reachable at the box's inventory address: every interface, or that very IP."""
    if every_interface(b.host_ip):
        return True
    try:
        return ipaddress.ip_address(b.host_ip) == ipaddress.ip_address(address)
    except ValueError:
        return False  # an inventory host name: only an every-interface binding is asked


def every_as_one(b: Binding) -> str:
    """Docker spells every interface "", 0.0.0.0 or :: (a dual-stack publish shows two): one."""
    return f"0.0.0.0:{b.host_port}" if every_interface(b.host_ip) else b.address


def lane_bindings(row: BoxEvidence) -> tuple[Binding, ...]:
    return row.published.lanes if row.published else ()
