"""Review 5 of the collector: a hung dockerd (its socket takes connections, never answers).

Each step waited its whole timeout on it, one after the other: the Engine API, then the docker
CLI on the same engine, then the audit's `docker ps --filter network=host`, then its running
containers through the Engine and the CLI again. With the controller's 20 s a step, the audit
passed the controller's 60 s for the box and lost the whole box; a drift took 40 s. Now the
engine is asked once a run: a timeout is said as a hung engine (no CLI after it), and the
audit takes `containers`' answer or error. Here with a socket that accepts and never answers,
reached the way the docker CLI reaches it too (the current context of ~/.docker).
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import load_box_program

collector = load_box_program(
    "box_collector_review5_engine", "reconciler/observe/remote/collector.py"
)
TIMEOUT = 1.5


def _serve(path: str, answer: Any) -> socket.socket:
    """A unix socket server at `path`; each connection is given to `answer(conn)` in a thread."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server


def _context(home: Path, sock: str) -> None:
    """~/.docker naming `sock` as the current context's engine (the CLI's way to it too)."""
    meta = home / ".docker" / "contexts" / "meta" / hashlib.sha256(b"lab").hexdigest()
    meta.mkdir(parents=True)
    (home / ".docker" / "config.json").write_text(json.dumps({"currentContext": "lab"}))
    endpoint = {"docker": {"Host": "unix://" + sock, "SkipTLSVerify": False}}
    (meta / "meta.json").write_text(json.dumps({"Name": "lab", "Endpoints": endpoint}))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    (tmp_path / ".bash_profile").write_text("")
    (tmp_path / "lobes").mkdir()
    (tmp_path / "lobes" / "compose.yml").write_text("services:\n  g:\n    image: busybox\n")
    return tmp_path


@pytest.fixture
def hung(home: Path) -> Iterator[str]:
    """An engine socket that takes every connection and never answers."""
    held: list[socket.socket] = []
    sock = str(home / "hung.sock")
    server = _serve(sock, held.append)
    _context(home, sock)
    yield sock
    server.close()
    for conn in held:
        conn.close()


def _payload(**extra: Any) -> dict[str, Any]:
    return {
        "run_key": "k" * 32, "directory": "~/lobes", "project": "lobes",
        "compose_files": ["compose.yml"], "managed_env": {}, "box_secrets": {},
        "controller_secrets": {}, "secret_patterns": [], "gateway_port": 1,
        "timeout_s": TIMEOUT, "probe_timeout_s": 0.5,
    } | extra  # fmt: skip


AUDIT = {"env_keys": ["GATEWAY_API_KEY"], "api_key_secret": None, "mesh_key_secret": None}


def test_a_hung_engine_is_said_after_one_timeout_without_the_cli(hung: str) -> None:
    started = time.monotonic()
    found = collector.containers(collector.Run(_payload()))
    took = time.monotonic() - started
    assert took < TIMEOUT * 1.6, took  # the CLI after it doubled it
    assert "did not answer within 1.5 s" in found["error"] and "hung" in found["error"]


def test_the_audit_of_a_hung_engine_costs_one_timeout(hung: str) -> None:
    started = time.monotonic()
    doc = collector.collect(_payload(audit=AUDIT), {})
    took = time.monotonic() - started
    assert took < TIMEOUT * 1.6, took  # three timeouts over, one after the other
    said = doc["docker"]["error"]
    assert "did not answer" in said
    assert doc["audit"]["host_network"] == {"error": said}
    assert doc["audit"]["running"] == {"error": said}


def test_the_audit_takes_the_host_network_from_the_containers_found(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listed = [
        {
            "Id": "a1",
            "Name": "/lobes-gateway-1",
            "Config": {},
            "HostConfig": {"NetworkMode": "host"},
        },
        {"Id": "b2", "Name": "/lobes-vllm-1", "Config": {}, "HostConfig": {"NetworkMode": "lobes"}},
    ]
    asked: list[str] = []

    def answer(conn: socket.socket) -> None:
        data = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                path = head.split(b" ")[1].decode()
                asked.append(path)
                if path.startswith("/containers/json"):
                    body: Any = [{"Id": c["Id"]} for c in listed]
                else:
                    body = next(c for c in listed if c["Id"] in path)
                raw = json.dumps(body).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(raw) + raw)

    sock = str(home / "engine.sock")
    server = _serve(sock, answer)
    _context(home, sock)
    ran: list[list[str]] = []
    real = collector.Run.run

    def counted(self: Any, argv: list[str], *args: Any, **kw: Any) -> Any:
        ran.append(argv)
        return real(self, argv, *args, **kw)

    monkeypatch.setattr(collector.Run, "run", counted)
    try:
        doc = collector.collect(_payload(audit=AUDIT), {})
    finally:
        server.close()
    assert doc["audit"]["host_network"] == {"containers": ["lobes-gateway-1"]}
    assert not [argv for argv in ran if argv[:2] == ["docker", "ps"]]
    assert sum(1 for path in asked if "label" in path) == 1  # the project's, listed once


def test_the_audit_asks_for_itself_when_the_listing_failed_but_the_engine_answers(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A project container gone between the list and its inspect (a `compose run --rm` copy
    that ended) fails the project's listing, not the engine: every running container is
    still listed for the exposure check (a stray `docker run -p 0.0.0.0:18001`)."""
    stray = {"name": "stray-vllm", "ports": {"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "1"}]}}
    monkeypatch.setattr(collector, "_engine_running", lambda run: [stray])
    run = collector.Run(_payload())
    listed = collector.audit_running(run, {"error": "Error: No such object: b2"})
    assert [c["name"] for c in listed["containers"]] == ["stray-vllm"]
    run.engine_down = "docker engine not reachable: refused"
    assert collector.audit_running(run, {"error": run.engine_down}) == {"error": run.engine_down}
    assert collector.audit_host_network(run, {"error": run.engine_down}) == {
        "error": run.engine_down
    }
