"""The observations an import adopts: a saved snapshot's, or one collector run per box.

A live import needs nothing but the inventory (an operator adopting a mesh has no group_vars
yet): each box gets the collector drift sends, with a payload of discovery rather than of a
desired state: lobes' deployment directory, no managed `.env` keys (so compose renders the
box's own `.env`, the one being adopted), and, as secret sources to digest, the conventional
`.secrets.env` beside it, so a `.env` key can be traced to the file that holds it. The `-f`
chain compose renders with is lobes' base file until the box's `.env` names its chain
(COMPOSE_FILE), and the gateway is probed on lobes' port 8000 until `docker inspect` shows
where it is published: a box whose chain or port differs is observed once more with them.
The secret patterns sent are the adopted policy's and those the repository's group_vars already
list, if it has any (policy.own_patterns): what the fleet named a secret is hashed on the box.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from reconciler.desired.models import InventorySpec
from reconciler.desired.secret_names import effective
from reconciler.desired.types import url_host
from reconciler.drift_inputs import DriftInputs
from reconciler.importer.policy import SECRET_PATTERNS
from reconciler.importer.secrets import SECRET_KEYS
from reconciler.observe.observe import BoxObservation, load_snapshot, observe
from reconciler.observe.payload import new_run_key
from reconciler.observe.transport import Target

DIRECTORY = "~/.lobes"  # where `lobes init --apply` renders
BASE_CHAIN = ["docker-compose.yml"]
GATEWAY_PORT = 8000  # lobes publishes "${VLLM_PORT:-8000}:8000"


def from_snapshot(directory: Path, boxes: list[str]) -> dict[str, BoxObservation]:
    """Raises OSError/ValueError for an unreadable snapshot."""
    _, observations = load_snapshot(directory)
    return {b: observations[b] for b in boxes if b in observations}


def discovery_payload(
    chain: list[str], port: int = GATEWAY_PORT, own: Iterable[str] = ()
) -> dict[str, Any]:
    """`own`: the secret patterns the repository imported in lists (policy.own_patterns): the
    box hashes what they name, as it does for a drift of that repository."""
    return {
        "directory": DIRECTORY,
        "project": "lobes",
        "compose_files": chain,
        "managed_env": {},
        "box_secrets": {
            name: {"path": f"{DIRECTORY}/.secrets.env", "key": key}
            for name, key in SECRET_KEYS.items()
        },
        "controller_secrets": {},
        "secret_patterns": list(effective((*SECRET_PATTERNS, *own))),
        "gateway_port": port,
        "timeout_s": 20,
        "probe_timeout_s": 3,
    }


def _inputs(
    root: Path,
    inv: InventorySpec,
    chains: dict[str, list[str]],
    ports: dict[str, int],
    own: tuple[str, ...] = (),
) -> DriftInputs:
    def path(value: str | None) -> str | None:
        if value is None:
            return None
        p = Path(value).expanduser()
        return str(p if p.is_absolute() else root / p)

    targets = {
        name: Target(name, b.ssh_hostname, b.ssh_user, b.ssh_port, path(b.ssh_key),
                     path(b.ssh_known_hosts_file))
        for name, b in inv.boxes.items()
    }  # fmt: skip
    return DriftInputs(
        inventory_file="(import)",
        boxes=tuple(inv.boxes),
        expectations={},
        payloads={
            name: discovery_payload(
                chains.get(name, BASE_CHAIN), ports.get(name, GATEWAY_PORT), own
            )
            for name in inv.boxes
        },
        targets=targets,
        bases={
            name: f"http://{url_host(b.ssh_hostname)}:{ports.get(name, GATEWAY_PORT)}"
            for name, b in inv.boxes.items()
        },
    )


def _chain(obs: BoxObservation) -> list[str] | None:
    doc = obs.document
    line = doc.envfile_by_key().get("COMPOSE_FILE") if doc is not None else None
    if line is None or not isinstance(line.value, str):
        return None
    return [f for f in line.value.split(":") if f] or None


def _port(obs: BoxObservation) -> int | None:
    """The host port the gateway container publishes lobes' 8000/tcp on."""
    doc = obs.document
    gateway = next((c for c in doc.containers if c.key == "gateway"), None) if doc else None
    bindings = gateway.ports.get("8000/tcp") if gateway is not None else None
    port = bindings[0].host_port if bindings else ""
    # isascii: str.isdigit() also takes `²`, which int() refuses.
    return int(port) if port.isascii() and port.isdigit() and 0 < int(port) < 65536 else None


def live(
    root: Path, inv: InventorySpec, boxes: list[str], own: tuple[str, ...] = ()
) -> dict[str, BoxObservation]:
    """`own`: the repository's own secret patterns (policy.own_patterns)."""
    found = observe(_inputs(root, inv, {}, {}, own), boxes, new_run_key())
    chains = {b: c for b, o in found.items() if (c := _chain(o)) and c != BASE_CHAIN}
    ports = {b: p for b, o in found.items() if (p := _port(o)) and p != GATEWAY_PORT}
    again = sorted(set(chains) | set(ports))
    if again:
        found.update(observe(_inputs(root, inv, chains, ports, own), again, new_run_key()))
    return found
