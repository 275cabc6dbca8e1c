"""`.lab/lab.json`: the facts other code and the tests read instead of importing lab internals.

Format (version 1; paths absolute):
{
  "version": 1,
  "registry": "10.77.0.1:5000", "registry_pidfile": "...",
  "bridge": {"name": "flab0", "address": "10.77.0.1", "cidr": "10.77.0.0/24"},
  "ssh": {"key": ".../.lab/ssh/id_ed25519", "known_hosts": ".../.lab/ssh/known_hosts"},
  "images": {"vllm_nightly": "10.77.0.1:5000/vllm/vllm-openai@sha256:...", ...},
  "builder": {"docker_host": "unix:///run/fleet-lab/builder/docker.sock", "pidfile": "..."},
  "mesh": {"key": "...", "heartbeat_s": 5},
  "boxes": {
    "thor": {
      "address": "10.77.0.11", "user": "fl-thor", "home": "/home/fl-thor",
      "lobes_dir": "/home/fl-thor/.lobes", "profile": "thor", "shape": "thor-worker",
      "netns": "flab-thor", "docker_socket": "/run/fleet-lab/thor/docker.sock",
      "docker_host": "unix:///run/fleet-lab/thor/docker.sock", "docker_context": "flab-thor",
      "data_root": "/var/lib/fleet-lab/thor/docker",
      "pidfiles": {"dockerd": "...", "sshd": "..."},
      "gateway_url": "http://10.77.0.11:8000", "gateway_api_key": null,
      "roles": ["worker", "embedder", "reranker"],
      "services": ["gateway", "vllm-embed", ...], "compose_files": ["docker-compose.yml", ...]
    }, ...
  },
  "timings": {"last_up_s": 12.3, "last_up_kind": "warm"}
}
"""

from __future__ import annotations

import json
import os
import secrets as _secrets
import stat
from pathlib import Path
from typing import Any

from . import registry, users
from .config import (
    BOXES,
    BRIDGE,
    BRIDGE_ADDR,
    BRIDGE_CIDR,
    BUILDER,
    CLIENT_KEY,
    FACTS_FILE,
    KNOWN_HOSTS,
    REGISTRY,
    SECRETS_FILE,
)
from .deployments import HEARTBEAT_S, OVERRIDE, manifest


def _write_private(path: Path, text: str) -> None:
    """`path` holding `text`, readable by its owner only from the first byte on: made 0600 under
    a temporary name (O_EXCL) and renamed into place, so no interruption leaves it wider."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.urandom(6).hex()}")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def lab_secrets() -> dict[str, str]:
    """Generated once per lab (until `lab down`), so a warm `lab up` leaves .env untouched."""
    values: dict[str, str] = {}
    if SECRETS_FILE.exists():
        # A file left wider than 0600 (by an older lab, or by hand) is narrowed on every load.
        if stat.S_IMODE(SECRETS_FILE.stat().st_mode) & ~0o600:
            os.chmod(SECRETS_FILE, 0o600)
        values = json.loads(SECRETS_FILE.read_text())
    # Each box has its own inbound gateway key in ~/.lobes/.secrets.env (the operator's), the
    # mesh one shared key, and an HF token placeholder; spark is the one that arms its key.
    wanted = ["mesh_key", "hf_token", *(f"{b.name}_gateway_key" for b in BOXES)]
    missing = [name for name in wanted if name not in values]
    if not missing:
        return values
    for name in missing:
        values[name] = _secrets.token_urlsafe(24)
    _write_private(SECRETS_FILE, json.dumps(values, indent=1) + "\n")
    return values


def build(
    images: dict[str, str], secrets: dict[str, str], timings: dict[str, Any]
) -> dict[str, Any]:
    boxes = {}
    for b in BOXES:
        m = manifest(b)
        boxes[b.name] = {
            "address": b.address,
            "user": b.user,
            "home": str(b.home),
            "lobes_dir": str(b.lobes_dir),
            "profile": b.name,
            "shape": b.shape,
            "netns": b.netns,
            "docker_socket": str(b.docker_socket),
            "docker_host": b.docker_host,
            "docker_context": users.context_name(b),
            "data_root": str(b.data_root),
            "pidfiles": {"dockerd": str(b.dockerd_pidfile), "sshd": str(b.sshd_pidfile)},
            "gateway_url": b.gateway_origin,
            "gateway_api_key": secrets["spark_gateway_key"] if b.name == "spark" else None,
            "roles": list(b.local_roles),
            "services": m["services"],
            "compose_files": [*m["base_chain"], OVERRIDE],
        }
    return {
        "version": 1,
        "registry": REGISTRY,
        "registry_pidfile": str(registry.PIDFILE),
        "bridge": {"name": BRIDGE, "address": BRIDGE_ADDR, "cidr": BRIDGE_CIDR},
        "ssh": {"key": str(CLIENT_KEY), "known_hosts": str(KNOWN_HOSTS)},
        "images": images,
        "builder": {"docker_host": BUILDER.docker_host, "pidfile": str(BUILDER.dockerd_pidfile)},
        "mesh": {"key": secrets["mesh_key"], "heartbeat_s": int(HEARTBEAT_S)},
        "boxes": boxes,
        "timings": timings,
    }


def write(facts: dict[str, Any]) -> None:
    _write_private(FACTS_FILE, json.dumps(facts, indent=1) + "\n")  # it carries the lab's keys


def load() -> dict[str, Any]:
    return json.loads(FACTS_FILE.read_text())
