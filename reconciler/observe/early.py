"""Start the boxes' collectors before the desired state is loaded, when nothing changed.

A drift run's two slow halves are independent: the boxes answering over SSH, and this process
importing pydantic and parsing YAML. The collector payloads are a pure function of the
desired-state files, so the previous run's payloads are cached, keyed by the digest of every
input file, and a run whose inputs are unchanged sends them at once and loads the desired state
while the boxes work. The loaded state is then checked against what was sent; on any mismatch
the early results are discarded and the boxes are asked again. Stdlib only, on purpose.

The cache holds no secret (payloads name secret sources, never values) and lives in the
controller user's cache directory.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.observe.probes import probe_gateways
from reconciler.observe.transport import Running, Target, python_command, spawn

COLLECTOR = Path(__file__).parent / "remote" / "collector.py"
CACHE_VERSION = 2


@dataclass
class EarlyStart:
    """Collectors and gateway probes already running, and exactly what they were sent."""

    running: dict[str, Running]
    payloads: dict[str, dict[str, Any]]
    run_key: str
    bases: dict[str, str]
    probes: Future[dict[str, dict[str, Any]]] | None = None

    def cancel(self) -> None:
        for handle in self.running.values():
            handle.cancel()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fleet-reconciler"


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _entry_path(root: Path, inventory: Path) -> Path:
    name = hashlib.sha256(f"{root.resolve()}\0{inventory.resolve()}".encode()).hexdigest()[:24]
    return cache_dir() / f"payloads-{name}.json"


def _inputs_listing(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "group_vars").glob("*.y*ml"))


def store(
    root: Path,
    inventory: Path,
    inputs: list[Path],
    targets: dict[str, Target],
    payloads: dict[str, dict[str, Any]],
    bases: dict[str, str],
) -> None:
    """Remember what this run sent, keyed by the content of every file that decided it."""
    without_key = {
        box: {k: v for k, v in payload.items() if k != "run_key"}
        for box, payload in payloads.items()
    }
    entry = {
        "version": CACHE_VERSION,
        "collector": _digest(COLLECTOR),
        "listing": _inputs_listing(root),
        "inputs": {str(p): _digest(p) for p in inputs},
        "targets": {box: t.__dict__ for box, t in targets.items()},
        "payloads": without_key,
        "bases": bases,
    }
    path = _entry_path(root, inventory)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entry, sort_keys=True), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # a cache that cannot be written only costs time


def start(root: Path, inventory: Path, boxes: list[str] | None, run_key: str) -> EarlyStart | None:
    """Spawn the collectors from the cached payloads, or None if anything may have changed."""
    try:
        entry = json.loads(_entry_path(root, inventory).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (
        entry.get("version") != CACHE_VERSION
        or entry.get("collector") != _digest(COLLECTOR)
        or entry.get("listing") != _inputs_listing(root)
        or any(_digest(Path(p)) != d for p, d in entry.get("inputs", {}).items())
    ):
        return None
    wanted = boxes or list(entry["payloads"])
    if any(box not in entry["payloads"] for box in wanted):
        return None
    script = COLLECTOR.read_text(encoding="utf-8")
    running, sent = {}, {}
    for box in wanted:
        payload = {**entry["payloads"][box], "run_key": run_key}
        encoded = base64.b64encode(json.dumps(payload).encode("utf-8")).decode("ascii")
        running[box] = spawn(Target(**entry["targets"][box]), python_command(script, encoded))
        sent[box] = payload
    bases = {box: entry["bases"][box] for box in wanted if box in entry.get("bases", {})}
    # The mesh-side probes need nothing but the URLs: start them too (httpx is imported in
    # that thread, while this one goes on to load the desired state).
    pool = ThreadPoolExecutor(max_workers=1)
    probes = pool.submit(probe_gateways, bases)
    pool.shutdown(wait=False)
    return EarlyStart(running, sent, run_key, bases, probes)
