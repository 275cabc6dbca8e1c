"""The lab's wire: a host bridge and one network namespace per box, joined by a veth pair.

Boxes get NO default route: the only things a box (and any container in it) can reach are
its bridge neighbours on 10.77.0.0/24 (the registry, the other boxes). That is the
"no traffic outside loopback and the lab's own addresses" rule, enforced by routing rather
than by hoping nothing dials out.
"""

from __future__ import annotations

from pathlib import Path

from .config import BOXES, BRIDGE, BRIDGE_ADDR, RUN_ROOT, Box
from .proc import log, ok, run

# A host dockerd (ours or anyone's) loads br_netfilter and sets the FORWARD policy to DROP;
# bridged frames between two lab namespaces then traverse FORWARD and die there. This rule
# lets frames that enter and leave the lab bridge through, and nothing else.
_FORWARD_RULE = ["FORWARD", "-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT"]


def _link_exists(name: str, netns: str | None = None) -> bool:
    prefix = ["ip", "-n", netns] if netns else ["ip"]
    return ok([*prefix, "link", "show", "dev", name])


def netns_exists(box: Box) -> bool:
    return Path("/run/netns", box.netns).exists()


def uts_file(box: Box) -> Path:
    return RUN_ROOT / "uts" / box.name


def _uts_mounted(box: Box) -> bool:
    target = str(uts_file(box))
    return any(
        line.split()[4] == target for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )


def ensure_uts(box: Box) -> None:
    """A UTS namespace per box, so `hostname` in an SSH session (and dockerd's Name) says thor."""
    if _uts_mounted(box):
        return
    f = uts_file(box)
    f.parent.mkdir(parents=True, exist_ok=True)
    f.touch()
    run(["unshare", f"--uts={f}", "hostname", box.name])


def remove_uts(box: Box) -> None:
    f = uts_file(box)
    if _uts_mounted(box):
        run(["umount", f], check=False)
    f.unlink(missing_ok=True)


def ensure_bridge() -> None:
    if not _link_exists(BRIDGE):
        log(f"bridge {BRIDGE} {BRIDGE_ADDR}/24")
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    addrs = run(["ip", "-o", "-4", "addr", "show", "dev", BRIDGE]).stdout
    if f" {BRIDGE_ADDR}/24 " not in addrs:
        run(["ip", "addr", "add", f"{BRIDGE_ADDR}/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])
    if not ok(["iptables", "-C", *_FORWARD_RULE]):
        run(["iptables", "-I", *_FORWARD_RULE])


def ensure_box(box: Box) -> None:
    """Namespace, veth into the bridge, the box's fixed address, loopback up."""
    if not netns_exists(box):
        log(f"netns {box.netns} {box.address}")
        run(["ip", "netns", "add", box.netns])
    ns = ["ip", "-n", box.netns]
    if not _link_exists(box.veth_box, box.netns):
        if _link_exists(box.veth_host):  # half-built pair from an interrupted run
            run(["ip", "link", "del", box.veth_host])
        peer = f"flp-{box.name}"
        run(["ip", "link", "add", box.veth_host, "type", "veth", "peer", "name", peer])
        run(["ip", "link", "set", peer, "netns", box.netns])
        run([*ns, "link", "set", peer, "name", box.veth_box])
    run(["ip", "link", "set", box.veth_host, "master", BRIDGE, "up"])
    addrs = run([*ns, "-o", "-4", "addr", "show", "dev", box.veth_box]).stdout
    if f" {box.address}/24 " not in addrs:
        run([*ns, "addr", "add", f"{box.address}/24", "dev", box.veth_box])
    run([*ns, "link", "set", box.veth_box, "up"])
    run([*ns, "link", "set", "lo", "up"])
    ensure_uts(box)


def ensure_all() -> None:
    ensure_bridge()
    for b in BOXES:
        ensure_box(b)


def remove_box(box: Box) -> None:
    # Deleting the namespace destroys the veth end inside it, and with it the pair.
    if netns_exists(box):
        run(["ip", "netns", "del", box.netns], check=False)
    if _link_exists(box.veth_host):
        run(["ip", "link", "del", box.veth_host], check=False)
    remove_uts(box)


def remove_bridge() -> None:
    while ok(["iptables", "-C", *_FORWARD_RULE]):
        run(["iptables", "-D", *_FORWARD_RULE], check=False)
    if _link_exists(BRIDGE):
        run(["ip", "link", "del", BRIDGE], check=False)


def in_netns(box: Box, argv: list[str]) -> list[str]:
    """Wrap argv to run inside the box's network (and hostname) namespace; same mounts, users.

    nsenter execs the program itself (no fork for these namespaces), so the pid a caller
    holds is the daemon's own.
    """
    return ["nsenter", f"--net=/run/netns/{box.netns}", f"--uts={uts_file(box)}", "--", *argv]
