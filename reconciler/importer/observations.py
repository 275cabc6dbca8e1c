"""The observations an import adopts: a saved snapshot's, or one collector run per box.

A live import sends each box the collector drift sends, with two differences in its payload:
no managed `.env` keys (so compose renders the box's own `.env`, the one being adopted) and,
as secret sources to digest, the conventional `.secrets.env` beside it, so a `.env` key can be
traced to the file that holds it. The connections (and the `-f` chain to render) come from
the repository's inventory and group_vars (`--root`, `-i`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from reconciler.desired.fleet import Fleet
from reconciler.drift_inputs import drift_inputs
from reconciler.importer.secrets import SECRET_KEYS
from reconciler.observe.observe import BoxObservation, load_snapshot, observe
from reconciler.observe.payload import new_run_key


def from_snapshot(directory: Path, boxes: list[str]) -> dict[str, BoxObservation]:
    """Raises OSError/ValueError for an unreadable snapshot."""
    _, observations = load_snapshot(directory)
    return {b: observations[b] for b in boxes if b in observations}


def discovery_payload(payload: dict[str, Any]) -> dict[str, Any]:
    directory = str(payload.get("directory") or "~/.lobes").rstrip("/")
    sources = {
        name: {"path": f"{directory}/.secrets.env", "key": key} for name, key in SECRET_KEYS.items()
    }
    return {**payload, "managed_env": {}, "controller_secrets": {}, "box_secrets": sources}


def live(fleet: Fleet, boxes: list[str]) -> dict[str, BoxObservation]:
    inputs = drift_inputs(fleet)
    payloads = {b: discovery_payload(p) for b, p in inputs.payloads.items()}
    return observe(dataclasses.replace(inputs, payloads=payloads), boxes, new_run_key())
