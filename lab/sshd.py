"""One sshd per box, listening only on the box's address inside its namespace.

Keys are lab-generated: a client key the lab (and the reconciler, via inventory/lab.yaml)
logs in with, one host key per box, and a known_hosts pinning each host key to its address,
so clients run with StrictHostKeyChecking=yes and never trust on first use.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from .config import CLIENT_KEY, KNOWN_HOSTS, LOG_DIR, SSH_DIR, Box
from .network import in_netns
from .proc import Identity, log, run, running, spawn, stop_pidfile, wait_for

HOSTKEY_DIR = SSH_DIR / "hostkeys"
SSHD = "/usr/sbin/sshd"


def _keygen(path: Path, comment: str) -> None:
    if not path.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])


def ensure_keys(boxes: tuple[Box, ...]) -> None:
    SSH_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(SSH_DIR, 0o700)
    HOSTKEY_DIR.mkdir(exist_ok=True)
    os.chmod(HOSTKEY_DIR, 0o700)
    _keygen(CLIENT_KEY, "fleet-lab client")
    lines = []
    for b in boxes:
        key = hostkey(b)
        _keygen(key, f"fleet-lab host {b.name}")
        kind, blob = key.with_suffix(".pub").read_text().split()[:2]
        lines.append(f"{b.address} {kind} {blob}\n")
    text = "".join(lines)
    if not KNOWN_HOSTS.exists() or KNOWN_HOSTS.read_text() != text:
        KNOWN_HOSTS.write_text(text)


def hostkey(box: Box) -> Path:
    return HOSTKEY_DIR / f"{box.name}_ed25519"


def config_path(box: Box) -> Path:
    return box.run_dir / "sshd_config"


def render_config(box: Box) -> str:
    return config_text(
        [
            f"# sshd of lab box {box.name} (written by lab/sshd.py)",
            f"# started as: {' '.join(in_netns(box, ['sshd']))}",
        ],
        address=box.address,
        hostkey=hostkey(box),
        pidfile=box.sshd_pidfile,
        user=box.user,
    )


def config_text(head: list[str], *, address: str, hostkey: Path, pidfile: Path, user: str) -> str:
    """One lab sshd's config (the three boxes' and the scale lab's): the deploy user only, by
    key only, on the box's own address."""
    return "\n".join(
        [
            *head,
            f"ListenAddress {address}:22",
            f"HostKey {hostkey}",
            f"PidFile {pidfile}",
            f"AllowUsers {user}",
            "PubkeyAuthentication yes",
            "AuthorizedKeysFile .ssh/authorized_keys",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin no",
            # No PAM in this VM's session stack; the account uses '*' (see users.py).
            "UsePAM no",
            "StrictModes yes",
            "PrintMotd no",
            "X11Forwarding no",
            # pyinfra uploads files over SFTP.
            "Subsystem sftp /usr/lib/openssh/sftp-server",
            # Several sessions at once: the reconciler collects from all boxes in parallel.
            "MaxStartups 50:30:100",
            "MaxSessions 50",
            "",
        ]
    )


def _identity(box: Box) -> Identity:
    """What the pid in the box's sshd pidfile must be to count as its sshd (pids are reused;
    see proc.is_program): sshd with this box's config file on its command line (its process
    title keeps it: "sshd: /usr/sbin/sshd -D -f <config> ... [listener]")."""
    return {"program": SSHD, "argv_has": str(config_path(box))}


def _listening(box: Box) -> bool:
    try:
        with socket.create_connection((box.address, 22), timeout=0.5):
            return True
    except OSError:
        return False


def ensure(box: Box) -> None:
    cfg = config_path(box)
    text = render_config(box)
    changed = not cfg.exists() or cfg.read_text() != text
    if changed:
        cfg.write_text(text)
    if running(box.sshd_pidfile, **_identity(box)) and not changed:
        return
    stop_pidfile(box.sshd_pidfile, **_identity(box))
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
    run(["/usr/sbin/sshd", "-t", "-f", cfg])
    log(f"sshd {box.name} {box.address}:22")
    # -D: stay in the foreground so the pid we hold is sshd's own (nsenter execs, no fork);
    # sshd still writes PidFile, which is what `lab down` uses.
    spawn(
        in_netns(
            box,
            ["/usr/sbin/sshd", "-D", "-f", str(cfg), "-E", str(LOG_DIR / f"sshd-{box.name}.log")],
        ),
        LOG_DIR / f"sshd-{box.name}.out",
    )
    wait_for(
        lambda: _listening(box) and running(box.sshd_pidfile, **_identity(box)),
        timeout=10,
        what=f"sshd on {box.name}",
    )


def stop(box: Box) -> None:
    stop_pidfile(box.sshd_pidfile, **_identity(box))
