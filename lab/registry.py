"""Debian's docker-registry on the host bridge: the only place lab images come from.

Plain HTTP on 10.77.0.1:5000 (every lab engine lists it as an insecure registry); storage in
/var/lib/fleet-lab/registry so `lab down` can delete it with everything else.
"""

from __future__ import annotations

import shutil

import httpx

from .config import BRIDGE_ADDR, LOG_DIR, REGISTRY, RUN_ROOT, STATE_ROOT
from .proc import Identity, LabError, log, running, spawn, stop_pidfile, wait_for

BINARY = "/usr/bin/docker-registry"
PIDFILE = RUN_ROOT / "registry.pid"
CONFIG = RUN_ROOT / "registry.yml"
STORAGE = STATE_ROOT / "registry"
URL = f"http://{REGISTRY}"  # requests to it ignore *_proxy (trust_env=False): lab-only address
# What the pid in PIDFILE must be to count as ours (pids are reused; see proc.is_program).
_IDENTITY: Identity = {"program": BINARY, "argv_has": str(CONFIG)}

_CONFIG_TEXT = f"""\
# docker-registry of the fleet lab (written by lab/registry.py)
version: 0.1
log:
  level: warn
  fields:
    service: fleet-lab-registry
storage:
  filesystem:
    rootdirectory: {STORAGE}
  delete:
    enabled: true
http:
  addr: {BRIDGE_ADDR}:5000
"""


def healthy() -> bool:
    try:
        return httpx.get(f"{URL}/v2/", timeout=1.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def ensure() -> None:
    RUN_ROOT.mkdir(parents=True, exist_ok=True)
    changed = not CONFIG.exists() or CONFIG.read_text() != _CONFIG_TEXT
    if changed:
        CONFIG.write_text(_CONFIG_TEXT)
    if running(PIDFILE, **_IDENTITY) and not changed and healthy():
        return
    stop_pidfile(PIDFILE, **_IDENTITY)
    STORAGE.mkdir(parents=True, exist_ok=True)
    log(f"registry {REGISTRY}")
    proc = spawn([BINARY, "serve", str(CONFIG)], LOG_DIR / "registry.log")
    # The registry does not write a pidfile of its own; we record the pid we started.
    PIDFILE.write_text(f"{proc.pid}\n")
    try:
        wait_for(healthy, timeout=15, what="the registry")
    except LabError:
        tail = (LOG_DIR / "registry.log").read_text()[-2000:]
        raise LabError(f"registry did not come up:\n{tail}") from None


def has_manifest(ref: str) -> bool:
    """True when `<registry>/<repo>@sha256:…` resolves in the registry (HEAD on the manifest)."""
    if not ref.startswith(REGISTRY + "/") or "@" not in ref:
        return False
    repo, digest = ref[len(REGISTRY) + 1 :].split("@", 1)
    accept = ", ".join(
        [
            "application/vnd.docker.distribution.manifest.v2+json",
            "application/vnd.docker.distribution.manifest.list.v2+json",
            "application/vnd.oci.image.manifest.v1+json",
            "application/vnd.oci.image.index.v1+json",
        ]
    )
    try:
        r = httpx.head(
            f"{URL}/v2/{repo}/manifests/{digest}",
            headers={"Accept": accept},
            timeout=3,
            trust_env=False,
        )
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def stop() -> None:
    if stop_pidfile(PIDFILE, **_IDENTITY):
        log("stopped registry")


def remove_state() -> None:
    shutil.rmtree(STORAGE, ignore_errors=True)
    CONFIG.unlink(missing_ok=True)
