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
import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.desired.fingerprint import (
    entry_name,
    file_digest,
    fingerprint,
    unchanged,
    write_private,
)
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
        "collector": file_digest(COLLECTOR),
        **fingerprint(root, inputs),
        "targets": {box: t.__dict__ for box, t in targets.items()},
        "payloads": without_key,
        "bases": bases,
    }
    write_private(_entry_path(root, inventory), json.dumps(entry, sort_keys=True).encode())


def _entry_path(root: Path, inventory: Path) -> Path:
    return entry_name("payloads", root, inventory).with_suffix(".json")


def start(root: Path, inventory: Path, boxes: list[str] | None, run_key: str) -> EarlyStart | None:
    """Spawn the collectors from the cached payloads, or None if anything may have changed."""
    try:
        entry = json.loads(_entry_path(root, inventory).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (
        entry.get("version") != CACHE_VERSION
        or entry.get("collector") != file_digest(COLLECTOR)
        or not unchanged(root, entry)
    ):
        return None
    wanted = boxes or list(entry["payloads"])
    if any(box not in entry["payloads"] for box in wanted):
        return None
    running, sent = {}, {}
    for box in wanted:
        payload = {**entry["payloads"][box], "run_key": run_key}
        encoded = base64.b64encode(json.dumps(payload).encode("utf-8")).decode("ascii")
        running[box] = spawn(Target(**entry["targets"][box]), python_command(COLLECTOR, encoded))
        sent[box] = payload
    bases = {box: entry["bases"][box] for box in wanted if box in entry.get("bases", {})}
    # The mesh-side probes need nothing but the URLs: start them too (httpx is imported in
    # that thread, while this one goes on to load the desired state).
    pool = ThreadPoolExecutor(max_workers=1)
    probes = pool.submit(probe_gateways, bases)
    pool.shutdown(wait=False)
    return EarlyStart(running, sent, run_key, bases, probes)
