"""A fake docker engine with containers, for driving the box-side converge (a loaded box
program) through whole converges and rollbacks in a temp home (converge_helpers.deployment).

Containers are keyed by service; a container's config hash is a digest of the deployment's
`.env` and docker-compose.yml as they were when it was created, as compose's would change
with them. `docker compose config --hash` answers for the lanes, the gateway and `extra`;
`docker stop` and `docker start` of an id change its container's state; `docker rm` of an id
removes it (without -f, only a stopped one)."""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

RENDERED = ("vllm-worker", "gateway", "extra")


class Engine:
    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        converge: Any,
        deploy: Path,
        services: tuple[str, ...] = ("vllm-worker", "gateway"),
    ) -> None:
        self.deploy = deploy
        self.c: dict[str, dict[str, Any]] = {}
        self.n = 0
        self.log: list[list[str]] = []
        for service in services:
            self.up(service)
        engine = self

        def run(box: Any, argv: list[str], timeout: int = 120) -> tuple[int, str, str]:
            return engine.run(list(argv))

        monkeypatch.setattr(converge.Box, "run", run)
        monkeypatch.setattr(converge, "gateway_problems", lambda box, deadline=None: [])
        monkeypatch.setattr(converge, "memory_gate", lambda box, service, util: None)

    def render(self, service: str) -> str:
        h = hashlib.sha256(service.encode())
        for name in (".env", "docker-compose.yml"):
            if (self.deploy / name).exists():
                h.update((self.deploy / name).read_bytes())
        return h.hexdigest()[:16]

    def up(self, service: str) -> None:
        self.n += 1
        cid = hashlib.sha256(f"{service}{self.n}".encode()).hexdigest()
        labels = {
            "com.docker.compose.service": service,
            "com.docker.compose.config-hash": self.render(service),
        }
        self.c[service] = {
            "Id": cid,
            "Config": {"Labels": labels},
            "State": {"Status": "running", "Running": True, "Health": {"Status": "healthy"}},
            "RestartCount": 0,
        }

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        self.log.append(argv)
        if argv[:2] == ["docker", "ps"]:
            return 0, "\n".join(c["Id"] for c in self.c.values()), ""
        if argv[:2] == ["docker", "inspect"]:
            ids = set(argv[2:])
            return 0, json.dumps([c for c in self.c.values() if c["Id"] in ids]), ""
        if argv[:4] == ["docker", "compose", "config", "--hash"]:
            return 0, "\n".join(f"{s} {self.render(s)}" for s in RENDERED), ""
        if argv[:3] == ["docker", "compose", "up"]:
            self.up(argv[-1])
        elif argv[:2] in (["docker", "stop"], ["docker", "start"]):
            running = argv[1] == "start"
            for c in self.c.values():
                if c["Id"] == argv[2]:
                    c["State"] = dict(c["State"], Running=running)
                    c["State"]["Status"] = "running" if running else "exited"
        elif argv[:3] == ["docker", "rm", "-f"]:
            self.c = {s: c for s, c in self.c.items() if c["Id"] != argv[3]}
        elif argv[:2] == ["docker", "rm"] and len(argv) == 3:
            # Without -f, docker refuses a running container.
            if any(c["Id"] == argv[2] and c["State"]["Running"] for c in self.c.values()):
                return 1, "", "cannot remove container: container is running"
            self.c = {s: c for s, c in self.c.items() if c["Id"] != argv[2]}
        elif argv[:4] == ["docker", "compose", "rm", "-s"]:
            self.c.pop(argv[-1], None)
        return 0, "", ""


def converge_payload(action: str = "converge", **more: Any) -> dict[str, Any]:
    """A whole payload for `action` on the fake engine: lanes vllm-worker and extra."""
    p: dict[str, Any] = {
        "action": action,
        "holder": "tester",
        "directory": "~/.lobes",
        "project": "lobes",
        "compose_files": ["docker-compose.yml"],
        "lane_specs": [
            {"service": "vllm-worker", "timeout_s": 5, "util": 0.01},
            {"service": "extra", "timeout_s": 5, "util": 0.01},
        ],
        "gateway": {"timeout_s": 1},
        "memory": {"floor_gib": 0, "drop_caches": False},
    }
    if action == "converge":
        p.update(
            {
                "titles": [],
                "fingerprint": {"files": {}, "containers": None},
                "managed_env": {"FOO": "2"},
                "box_secrets": {},
                "env_keys": ["FOO"],
                "restore": [],
                "pulls": [],
                "services": [],
                "removes": [],
                "images": {},
                "verify": {"port": 1, "version": "v", "auth": "keyed", "windows": {}},
                "keep": 10,
            }
        )
    p.update(more)
    return p


def run_main(converge: Any, p: dict[str, Any], out: io.StringIO) -> int:
    """main() on `p`, its events printed into `out`: its exit code."""
    old_in, old_out = sys.stdin, sys.stdout
    sys.stdin, sys.stdout = io.StringIO(json.dumps(p)), out
    try:
        code: int = converge.main()
    finally:
        sys.stdin, sys.stdout = old_in, old_out
    return code


def run_events(converge: Any, p: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """main() on `p`: its exit code and every event it printed."""
    out = io.StringIO()
    code = run_main(converge, p, out)
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


class Killed(BaseException):
    """A SIGKILL: nothing of the program runs after it (no except, no finally of its own)."""


def killed_rollback(converge: Any, monkeypatch: Any, sid: str) -> None:
    """A rollback to `sid` killed at its first file restore, after it said it began."""
    real = converge.restore_snapshot_files

    def killed(*args: Any, **kwargs: Any) -> Any:
        raise Killed

    monkeypatch.setattr(converge, "restore_snapshot_files", killed)
    try:
        run_events(converge, converge_payload("rollback", snapshot=sid))
    except Killed:
        pass
    else:
        raise AssertionError("the rollback was not killed")
    finally:
        monkeypatch.setattr(converge, "restore_snapshot_files", real)


def snapshot_dirs(deploy: Path) -> list[str]:
    root = deploy / ".fleet" / "snapshots"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def meta(deploy: Path, sid: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(
        (deploy / ".fleet" / "snapshots" / sid / "meta.json").read_text()
    )
    return result


EXTRA = "docker-compose.extra.yml"  # the file that defines the lane `extra`
EXTRA_V1 = b"services:\n  extra:\n    image: lobes/extra\n"


class FileEngine(Engine):
    """The harness engine, except that compose knows the lane `extra` only while EXTRA
    exists (as compose renders only the services of its files): `config --hash` leaves it out,
    and `compose rm` / `compose up` of it fail with compose's "no such service"."""

    def rendered(self) -> list[str]:
        return ["vllm-worker", "gateway"] + (["extra"] if (self.deploy / EXTRA).exists() else [])

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        if argv[:4] == ["docker", "compose", "config", "--hash"]:
            self.log.append(argv)
            return 0, "\n".join(f"{s} {self.render(s)}" for s in self.rendered()), ""
        if argv[:2] == ["docker", "compose"] and argv[-1] not in self.rendered():
            self.log.append(argv)
            return 1, "", f"no such service: {argv[-1]}"
        return super().run(argv)
