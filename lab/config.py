"""Where the lab lives and what its three boxes are: one place for every name and path.

Box addresses and users come from `inventory/lab.yaml` (the same file the reconciler reads to
reach the boxes), so the lab and its clients cannot disagree about where thor is. Everything
else here is lab-internal layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[1]
LAB_DIR = REPO / ".lab"  # gitignored: keys, facts, rendered pristine deployments, logs
SSH_DIR = LAB_DIR / "ssh"
CLIENT_KEY = SSH_DIR / "id_ed25519"
KNOWN_HOSTS = SSH_DIR / "known_hosts"
FACTS_FILE = LAB_DIR / "lab.json"
IMAGES_FILE = LAB_DIR / "images.yaml"
SECRETS_FILE = LAB_DIR / "secrets.json"
PRISTINE_DIR = LAB_DIR / "pristine"  # the deployment each box must have after `lab up`
LOG_DIR = LAB_DIR / "logs"

# Engine data-roots and the registry's blobs are large and want a plain ext4 path outside the
# repo (overlay2 on the repo's filesystem works, but a `git clean -x` must not eat them).
STATE_ROOT = Path("/var/lib/fleet-lab")
# Sockets, pidfiles and exec-roots: short paths, because containerd's socket paths live under
# the exec-root and unix socket paths are limited to 108 bytes.
RUN_ROOT = Path("/run/fleet-lab")
# What survives `lab down` (only `lab down --purge` removes it): the debootstrap rootfs and
# whatever else the image builder caches. Everything else the lab creates is removed.
CACHE_DIR = Path("/var/cache/fleet-lab")

BRIDGE = "flab0"
BRIDGE_ADDR = "10.77.0.1"
BRIDGE_CIDR = "10.77.0.0/24"
REGISTRY = f"{BRIDGE_ADDR}:5000"
GATEWAY_PORT = 8000

# Tools installed by .ci/setup-machine.sh (machine prerequisites, not lab state).
LOBES_BIN = Path("/opt/fleet-lab/lobes-venv/bin/lobes")
LOBES_VERSION = "0.91.0"
DOCKER = "/usr/local/bin/docker" if Path("/usr/local/bin/docker").exists() else "/usr/bin/docker"
SCRUBBED_PATH = "/usr/local/bin:/usr/bin:/bin"

_SHAPES = {"thor": "thor-worker", "spark": "spark-lobe", "orin": "orin-lobe"}
# The roles each shape hosts locally; readiness waits for each to read ready in /capabilities.
_LOCAL_ROLES = {
    "thor": ("worker", "embedder", "reranker"),
    "spark": ("cortex", "embedder", "reranker"),
    "orin": ("senses", "embedder", "reranker"),
}
# Per-box bridge subnets for the box's own dockerd: distinct so a packet capture or an
# `ip route` inside a netns says which engine it belongs to.
_SUBNET_INDEX = {"thor": 11, "spark": 12, "orin": 13}


@dataclass(frozen=True)
class Box:
    name: str
    address: str
    user: str
    shape: str
    local_roles: tuple[str, ...]
    subnet_index: int

    @property
    def netns(self) -> str:
        return f"flab-{self.name}"

    @property
    def home(self) -> Path:
        return Path("/home") / self.user

    @property
    def lobes_dir(self) -> Path:
        return self.home / ".lobes"

    @property
    def run_dir(self) -> Path:
        return RUN_ROOT / self.name

    @property
    def docker_socket(self) -> Path:
        return self.run_dir / "docker.sock"

    @property
    def docker_host(self) -> str:
        return f"unix://{self.docker_socket}"

    @property
    def dockerd_pidfile(self) -> Path:
        return self.run_dir / "dockerd.pid"

    @property
    def sshd_pidfile(self) -> Path:
        return self.run_dir / "sshd.pid"

    @property
    def exec_root(self) -> Path:
        return self.run_dir / "exec"

    @property
    def data_root(self) -> Path:
        return STATE_ROOT / self.name / "docker"

    @property
    def state_dir(self) -> Path:
        return STATE_ROOT / self.name

    @property
    def docker_group(self) -> str:
        # The user's own primary group owns the socket: nobody else is in it.
        return self.user

    @property
    def veth_host(self) -> str:
        return f"flv-{self.name}"

    @property
    def veth_box(self) -> str:
        return "eth0"

    @property
    def bip(self) -> str:
        return f"172.31.{self.subnet_index}.1/24"

    @property
    def address_pool(self) -> str:
        return f"base=172.30.{self.subnet_index}.0/24,size=27"

    @property
    def gateway_origin(self) -> str:
        return f"http://{self.address}:{GATEWAY_PORT}"

    @property
    def docker_cli(self) -> list[str]:
        """The docker CLI prefix for root on the host to talk to this box's engine."""
        return [DOCKER, "-H", self.docker_host]


@dataclass(frozen=True)
class Builder:
    """The host-namespace dockerd that builds lab images and pushes them to the registry.

    Separate from the boxes so no box engine carries build cache, intermediate images or
    tags that a real box would never have; it runs in the host netns so the image builder
    sees the same network as on a developer machine (the install mirrors, the registry).
    """

    name: str = "builder"

    @property
    def run_dir(self) -> Path:
        return RUN_ROOT / self.name

    @property
    def docker_socket(self) -> Path:
        return self.run_dir / "docker.sock"

    @property
    def docker_host(self) -> str:
        return f"unix://{self.docker_socket}"

    @property
    def dockerd_pidfile(self) -> Path:
        return self.run_dir / "dockerd.pid"

    @property
    def exec_root(self) -> Path:
        return self.run_dir / "exec"

    @property
    def data_root(self) -> Path:
        return STATE_ROOT / self.name / "docker"

    @property
    def state_dir(self) -> Path:
        return STATE_ROOT / self.name

    @property
    def docker_cli(self) -> list[str]:
        return [DOCKER, "-H", self.docker_host]


BUILDER = Builder()


def _load_boxes() -> tuple[Box, ...]:
    inv = YAML(typ="safe").load((REPO / "inventory" / "lab.yaml").read_text())
    boxes = []
    for name, spec in inv["boxes"].items():
        boxes.append(
            Box(
                name=name,
                address=spec["ssh_hostname"],
                user=spec["ssh_user"],
                shape=_SHAPES[name],
                local_roles=_LOCAL_ROLES[name],
                subnet_index=_SUBNET_INDEX[name],
            )
        )
    return tuple(boxes)


BOXES: tuple[Box, ...] = _load_boxes()
BOX_BY_NAME = {b.name: b for b in BOXES}


def box(name: str) -> Box:
    try:
        return BOX_BY_NAME[name]
    except KeyError:
        raise SystemExit(f"unknown box {name!r}; lab boxes: {', '.join(BOX_BY_NAME)}") from None
