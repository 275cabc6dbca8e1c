"""What the controller tells a box's collector: where to look and what the desired state pins.

Secret values are never put here for box_file secrets (the collector reads them on the box);
only their source. The run key makes the box-side digests comparable within one run.
"""

from __future__ import annotations

import secrets
from typing import Any

from reconciler.desired.envfile import EnvEntry
from reconciler.desired.models import BoxFileSecret, BoxSpec


def new_run_key() -> str:
    return secrets.token_hex(16)


def collector_payload(box: BoxSpec, env: list[EnvEntry], run_key: str) -> dict[str, Any]:
    managed: dict[str, Any] = {}
    for entry in env:
        managed[entry.key] = (
            entry.value if isinstance(entry.value, str) else {"secret": entry.value.secret}
        )
    box_secrets = {
        name: {"path": src.path, "key": src.key}
        for name, src in box.secrets.items()
        if isinstance(src, BoxFileSecret)
    }
    return {
        "run_key": run_key,
        "directory": box.deployment.directory,
        "project": box.deployment.project,
        "compose_files": list(box.deployment.compose_files),
        "managed_env": managed,
        "box_secrets": box_secrets,
        "secret_patterns": list(box.secret_patterns),
        "gateway_port": box.gateway.port,
        "timeout_s": 20,
        "probe_timeout_s": 3,
    }
