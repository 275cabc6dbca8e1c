"""A dockerd per box, inside the box's network namespace, plus the host-side image builder.

Every engine has its own data-root, exec-root (and with it its own containerd, runc state
and shims), socket, pidfile and bridge subnet, so a container started on thor does not exist
for spark's engine at all. The engines share only the kernel and the host filesystem: bind
mounts such as ~/.lobes resolve on the host, as they do on a real box.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from .config import BRIDGE_ADDR, DOCKER, LOG_DIR, REGISTRY, Box, Builder
from .dns import SERVER as DNS_SERVER
from .network import in_netns
from .proc import Identity, LabError, log, run, running, spawn, stop_pidfile, wait_for

DOCKERD = "/usr/sbin/dockerd"


def _identity(engine: Box | Builder) -> Identity:
    """What the pid in the engine's pidfile must be to count as its dockerd (pids are reused;
    see proc.is_program): dockerd, started with that very --pidfile."""
    return {"program": DOCKERD, "argv_has": str(engine.dockerd_pidfile)}


def _daemon_json(engine: Box | Builder) -> str:
    # Each engine its own identity key: by default every dockerd on a machine reads
    # /etc/docker/key.json and they would all report the same engine ID.
    return json.dumps({"deprecated-key-path": str(engine.state_dir / "key.json")}) + "\n"


def _daemon_config(engine: Box | Builder) -> Path:
    # An explicit config file: dockerd would otherwise read /etc/docker/daemon.json, which
    # belongs to whoever runs a host engine on this machine, not to the lab.
    path = engine.run_dir / "daemon.json"
    text = _daemon_json(engine)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def _common_args(engine: Box | Builder) -> list[str]:
    return [
        DOCKERD,
        "--config-file",
        str(_daemon_config(engine)),
        "--data-root",
        str(engine.data_root),
        "--exec-root",
        str(engine.exec_root),
        "--pidfile",
        str(engine.dockerd_pidfile),
        "--host",
        engine.docker_host,
        "--insecure-registry",
        REGISTRY,
        "--storage-driver",
        "overlay2",
    ]


def box_argv(box: Box) -> list[str]:
    return in_netns(
        box,
        [
            *_common_args(box),
            "--group",
            box.docker_group,
            "--bip",
            box.bip,
            "--default-address-pool",
            box.address_pool,
            # orin's GPU chain says `runtime: nvidia`; a GPU-less lab maps the name to runc so
            # the override stays honest (the runtime name is still what compose renders).
            "--add-runtime",
            "nvidia=runc",
            # Containers resolve through the engine's embedded DNS, which forwards what it
            # does not know; the lab resolver answers at once (see dns.py).
            "--dns",
            DNS_SERVER,
        ],
    )


def builder_argv(builder: Builder) -> list[str]:
    # Host namespace, no bridge and no iptables: builds run with --network host if they need
    # the network, and this engine must not touch the host's FORWARD chain or NAT tables.
    return [
        *_common_args(builder),
        "--group",
        "root",
        "--bridge",
        "none",
        "--iptables=false",
    ]


def responds(engine: Box | Builder) -> bool:
    if not engine.docker_socket.exists():
        return False
    proc = subprocess.run(
        [DOCKER, "-H", engine.docker_host, "version", "--format", "{{.Server.Version}}"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return proc.returncode == 0


def _argv_file(engine: Box | Builder) -> Path:
    return engine.run_dir / "dockerd.argv"


def start(engine: Box | Builder) -> bool:
    """Start the engine unless it already runs with these flags. True if (re)started now.

    A changed flag set restarts the engine; its containers come back by their restart policy.
    """
    engine.run_dir.mkdir(parents=True, exist_ok=True)
    argv = box_argv(engine) if isinstance(engine, Box) else builder_argv(engine)
    want = "\0".join(argv) + "\0" + _daemon_json(engine)
    argv_file = _argv_file(engine)
    same = argv_file.exists() and argv_file.read_text() == want
    if same and running(engine.dockerd_pidfile, **_identity(engine)) and responds(engine):
        return False
    stop_pidfile(engine.dockerd_pidfile, timeout=60, **_identity(engine))
    engine.data_root.mkdir(parents=True, exist_ok=True)
    engine.docker_socket.unlink(missing_ok=True)
    argv_file.write_text(want)
    log(f"dockerd {engine.name} ({engine.docker_socket})")
    spawn(argv, LOG_DIR / f"dockerd-{engine.name}.log")
    return True


def wait_ready(engine: Box | Builder, timeout: float = 60) -> None:
    try:
        wait_for(
            lambda: responds(engine), timeout=timeout, interval=0.2, what=f"dockerd {engine.name}"
        )
    except LabError:
        tail = (LOG_DIR / f"dockerd-{engine.name}.log").read_text()[-2000:]
        raise LabError(f"dockerd {engine.name} did not come up:\n{tail}") from None


def container_ids(engine: Box | Builder) -> list[str]:
    proc = run([DOCKER, "-H", engine.docker_host, "ps", "-aq"], check=False)
    return proc.stdout.split()


def stop(engine: Box | Builder) -> None:
    """Remove every container (fast: no per-container stop timeout), then stop dockerd."""
    if running(engine.dockerd_pidfile, **_identity(engine)) and responds(engine):
        ids = container_ids(engine)
        if ids:
            run([DOCKER, "-H", engine.docker_host, "rm", "-f", *ids], check=False, timeout=120)
    if stop_pidfile(engine.dockerd_pidfile, timeout=30, **_identity(engine)):
        log(f"stopped dockerd {engine.name}")
    engine.docker_socket.unlink(missing_ok=True)


def remove_state(engine: Box | Builder) -> None:
    """Unmount whatever the engine left mounted under its roots, then delete them."""
    roots = [engine.exec_root, engine.data_root]
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mountpoint = line.split()[4]
        if any(mountpoint.startswith(str(r) + "/") or mountpoint == str(r) for r in roots):
            mounts.append(mountpoint)
    for mp in sorted(mounts, key=len, reverse=True):
        run(["umount", "-l", mp], check=False)
    for r in roots:
        shutil.rmtree(r, ignore_errors=True)
    shutil.rmtree(engine.state_dir, ignore_errors=True)


def info(engine: Box | Builder) -> dict[str, object]:
    out = run([DOCKER, "-H", engine.docker_host, "info", "--format", "{{json .}}"]).stdout
    return json.loads(out)


def registry_reachable_from(box: Box) -> bool:
    """The box engine's view: can something in the namespace reach the registry?"""
    return (
        run(
            in_netns(
                box,
                [
                    "curl",
                    "--noproxy",
                    "*",  # the lab's own registry: never through a proxy
                    "-fsS",
                    "-o",
                    "/dev/null",
                    "--max-time",
                    "3",
                    f"http://{BRIDGE_ADDR}:5000/v2/",
                ],
            ),
            check=False,
        ).returncode
        == 0
    )
