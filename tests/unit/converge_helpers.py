"""What the box-side converge's unit tests share: a deployment in a temp home posing as the
deploy user's, docker faked, and the payload fields every action carries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

COMPOSE = "services:\n  gateway:\n    image: lobes/gateway\n"


def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str) -> Path:
    """A home with ~/.lobes holding `.env` (0600) and docker-compose.yml, made $HOME."""
    home = tmp_path / "home"
    deploy = home / ".lobes"
    deploy.mkdir(parents=True)
    (deploy / ".env").write_text(env)
    (deploy / ".env").chmod(0o600)
    (deploy / "docker-compose.yml").write_text(COMPOSE)
    (deploy / "docker-compose.yml").chmod(0o644)
    monkeypatch.setenv("HOME", str(home))
    return home


def fake_docker(monkeypatch: pytest.MonkeyPatch, converge: Any) -> list[list[str]]:
    """Every command `converge` (a loaded box program) runs, recorded: none really runs, each
    answers as an engine with no containers would."""
    ran: list[list[str]] = []

    def run(self: Any, argv: list[str], timeout: int = 120) -> tuple[int, str, str]:
        ran.append(list(argv))
        return 0, "", ""

    monkeypatch.setattr(converge.Box, "run", run)
    return ran


def base_payload(action: str, holder: str) -> dict[str, Any]:
    """The fields every converge payload carries, whatever its action."""
    return {
        "action": action,
        "holder": holder,
        "directory": "~/.lobes",
        "project": "lobes",
        "compose_files": ["docker-compose.yml"],
        "lane_specs": [{"service": "vllm-worker", "timeout_s": 900, "util": 0.45}],
        "gateway": {"timeout_s": 120},
        "memory": {"floor_gib": 4.0, "drop_caches": True},
    }
