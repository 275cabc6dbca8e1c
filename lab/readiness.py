"""What "ready" means for the lab, probed from where a client stands.

A box is ready when every service its shape renders has a running container that Docker
reports healthy, its gateway answers `/health` with the lobes version on the box address
(from the host, across the bridge: the published port really works), and `/capabilities`
shows every role the lab hosts as ready: its own roles served locally, the others proxied
through the mesh (spark's worker comes from thor). The last one is the mesh converging.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from .config import BOXES, DOCKER, LOBES_VERSION, Box
from .proc import LabError, run

PROJECT = "lobes"  # compose project name of ~/.lobes (lobes never passes -p)


@dataclass(frozen=True)
class Lane:
    service: str
    container: str
    state: str
    health: str
    image: str


@dataclass
class BoxHealth:
    box: str
    lanes: list[Lane] = field(default_factory=list)
    gateway_version: str | None = None
    roles: dict[str, dict[str, object]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return not self.problems


def lanes(box: Box) -> list[Lane]:
    cli = [DOCKER, "-H", box.docker_host]
    ids = run(
        [*cli, "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}"],
        check=False,
    ).stdout.split()
    if not ids:
        return []
    out = run([*cli, "inspect", *ids], check=False).stdout
    result = []
    for c in json.loads(out or "[]"):
        state = c.get("State", {})
        result.append(
            Lane(
                service=c["Config"]["Labels"].get("com.docker.compose.service", "?"),
                container=c["Name"].lstrip("/"),
                state=state.get("Status", "?"),
                health=(state.get("Health") or {}).get("Status", "none"),
                image=c["Config"].get("Image", ""),
            )
        )
    return sorted(result, key=lambda lane: lane.service)


def lab_roles() -> set[str]:
    return {role for b in BOXES for role in b.local_roles}


def check(
    box: Box, services: list[str] | None = None, client: httpx.Client | None = None
) -> BoxHealth:
    """One probe of one box, no waiting."""
    h = BoxHealth(box=box.name)
    h.lanes = lanes(box)
    by_service = {lane.service: lane for lane in h.lanes}
    for svc in services or sorted(by_service):
        lane = by_service.get(svc)
        if lane is None:
            h.problems.append(f"{svc}: no container")
        elif lane.state != "running" or lane.health != "healthy":
            h.problems.append(f"{svc}: {lane.state}/{lane.health}")
    # trust_env=False: a gateway is a lab address; http_proxy/ALL_PROXY must not send it away.
    own = client or httpx.Client(timeout=3, trust_env=False)
    try:
        try:
            r = own.get(f"{box.gateway_origin}/health")
            h.gateway_version = r.json().get("version") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            h.gateway_version = None
        if h.gateway_version != LOBES_VERSION:
            h.problems.append(f"gateway /health version {h.gateway_version!r}")
            return h
        try:
            caps = own.get(f"{box.gateway_origin}/capabilities").json()
        except (httpx.HTTPError, ValueError) as e:
            h.problems.append(f"/capabilities: {e}")
            return h
        h.roles = {k: v for k, v in caps.items() if isinstance(v, dict)}
        for role in sorted(lab_roles()):
            info = h.roles.get(role, {})
            local = role in box.local_roles
            if not info.get("ready"):
                h.problems.append(f"role {role} not ready ({'local' if local else 'mesh'})")
            elif local == bool(info.get("proxied")):
                h.problems.append(f"role {role} proxied={info.get('proxied')} (local={local})")
    finally:
        if client is None:
            own.close()
    return h


def check_all(services: dict[str, list[str]] | None = None) -> dict[str, BoxHealth]:
    with ThreadPoolExecutor(len(BOXES)) as pool:
        futs = {b.name: pool.submit(check, b, (services or {}).get(b.name)) for b in BOXES}
        return {name: f.result() for name, f in futs.items()}


def wait_all(services: dict[str, list[str]], timeout: float = 150) -> dict[str, BoxHealth]:
    deadline = time.monotonic() + timeout
    while True:
        report = check_all(services)
        if all(h.ready for h in report.values()):
            return report
        if time.monotonic() > deadline:
            problems = "; ".join(
                f"{n}: {', '.join(h.problems)}" for n, h in report.items() if h.problems
            )
            raise LabError(f"lab not ready after {timeout:.0f}s: {problems}")
        time.sleep(0.5)
