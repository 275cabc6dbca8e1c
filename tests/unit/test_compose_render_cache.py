"""The box's compose render cache (collector.compose_cached) serves a render only to the same
command line: the same files and .env, and the same project name and `-f` chain.

The importer's discovery run renders lobes' own chain; a drift of the lab renders that chain
plus the lab's override. Both see the same project directory, so a key of the directory alone
served the discovery's render (no override) to the drift, and the override's settings went
missing from what it compared (found in CI: LOBES_BOOT_DELAY_S and two more on spark, orin).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import load_box_program

collector = load_box_program("box_collector_cache", "reconciler/observe/remote/collector.py")


def run_with(deploy: Path, home: Path, compose_files: list[str], project: str = "lobes") -> Any:
    return collector.Run(
        {"run_key": "k" * 32, "secret_patterns": [], "directory": str(deploy), "home": str(home),
         "project": project, "compose_files": compose_files, "managed_env": {}, "box_secrets": {}}
    )  # fmt: skip


@pytest.fixture
def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[list[str]]]:
    """A deployment with a base file and an override, a private cache, and a stand-in for
    `docker compose` that answers with the -f chain it was given (and records each call)."""
    d = tmp_path / "lobes"
    d.mkdir()
    (d / ".env").write_text("A=1\n", encoding="utf-8")
    (d / "docker-compose.yml").write_text("services: {}\n", encoding="utf-8")
    (d / "docker-compose.override.yml").write_text("services: {}\n", encoding="utf-8")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setattr(collector, "_cache_dir", lambda: str(cache))
    calls: list[list[str]] = []

    def fake_run(self: Any, argv: list[str], env: Any = None, **_: Any) -> tuple[int, str, str]:
        calls.append(argv)
        chain = [Path(argv[i + 1]).name for i, a in enumerate(argv) if a == "-f"]
        project = argv[argv.index("-p") + 1]
        return 0, f'{{"name": "{project}", "chain": {chain!r}}}'.replace("'", '"'), ""

    monkeypatch.setattr(collector.Run, "run", fake_run)
    return d, calls


def test_a_render_of_another_f_chain_is_not_served(deploy: tuple[Path, list[list[str]]]) -> None:
    d, calls = deploy
    args = ["config", "--format", "json"]
    env = {"PATH": "/usr/bin"}
    base = run_with(d, d.parent, ["docker-compose.yml"])
    with_override = run_with(d, d.parent, ["docker-compose.yml", "docker-compose.override.yml"])
    first = collector.compose_cached(base, str(d), env, args)
    second = collector.compose_cached(with_override, str(d), env, args)
    assert '"chain": ["docker-compose.yml"]' in first[1]
    assert '"chain": ["docker-compose.yml", "docker-compose.override.yml"]' in second[1]
    assert len(calls) == 2  # the second command line rendered for itself


def test_the_same_command_line_is_served_from_the_cache(
    deploy: tuple[Path, list[list[str]]],
) -> None:
    d, calls = deploy
    args = ["config", "--format", "json"]
    run = run_with(d, d.parent, ["docker-compose.yml", "docker-compose.override.yml"])
    first = collector.compose_cached(run, str(d), {"PATH": "/usr/bin"}, args)
    again = collector.compose_cached(run, str(d), {"PATH": "/usr/bin"}, args)
    other_project = collector.compose_cached(
        run_with(d, d.parent, ["docker-compose.yml", "docker-compose.override.yml"], "other"),
        str(d),
        {"PATH": "/usr/bin"},
        args,
    )
    assert first == again and len(calls) == 2  # served once from the cache, not the project
    assert '"name": "other"' in other_project[1]
