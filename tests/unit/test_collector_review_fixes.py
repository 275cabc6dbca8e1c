"""The collector's review fixes: secrets inside one argv word, the run's patterns in error
texts, an unlistable deployment directory, a login profile's background job, and one
deadline and a byte limit for the Engine API (reproducers of /tmp/review_collector)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.values import parse_argv
from reconciler.observe.document import SecretValue
from tests.unit.test_secret_boundaries import _collector

KEY = "sk-live-9f8e7d6c5b4a"


def _run(patterns: list[str] | None = None, key: str = "k" * 64, **extra: Any) -> Any:
    payload = {"directory": "/nonexistent", "secret_patterns": patterns or [], "run_key": key}
    payload.update(extra)
    return _collector().Run(payload)


@pytest.mark.parametrize(
    ("entrypoint", "command"),
    [
        (["/bin/sh", "-c"], [f"exec vllm serve m --api-key {KEY} --port 8000"]),
        (["/bin/sh", "-c"], [f"exec vllm serve m --api-key={KEY}"]),
        (["/bin/sh", "-c"], [f"exec vllm serve m --hf-token={KEY}"]),
        (None, ["sh", "-c", f"curl -H 'Authorization: Bearer {KEY}' http://x"]),
        (None, ["sh", "-c", f"curl -H 'authorization: Basic {KEY}' http://x"]),
        (None, ["sh", "-c", f'curl -H "Authorization: {KEY}" http://x']),
        (None, ["sh", "-c", f"export HF_TOKEN={KEY}; exec vllm"]),
    ],
)
def test_a_secret_inside_one_word_is_hashed(
    entrypoint: list[str] | None, command: list[str]
) -> None:
    run = _run()
    masked = run.mask_command(entrypoint, command)
    assert KEY not in repr(masked)
    assert '{"secret": "hmac:' in repr(masked)
    # equal commands stay equal under one key; another key reads changed
    assert run.mask_command(entrypoint, command) == masked
    assert _run(key="j" * 64).mask_command(entrypoint, command) != masked


def test_a_payload_named_flag_inside_a_word_is_hashed_and_others_are_kept() -> None:
    run = _run(["*_CRED"])
    word = f"exec app --db-cred {KEY} --port 8000 --model-name m"
    out = run.mask_words(word)
    assert KEY not in out
    assert out.endswith("--port 8000 --model-name m")
    assert run.mask_words("exec app --port 8000") == "exec app --port 8000"


def test_render_and_container_commands_compare_equal_through_parse_argv() -> None:
    # the render's command and the container's are masked alike: parse_argv reads them equal
    run = _run()
    argv = ["vllm", "serve", f"--api-key={KEY}", "sh -c 'x --api-key " + KEY + "'"]
    a, b = run.mask_argv(list(argv)), run.mask_argv(list(argv))
    assert parse_argv(a) == parse_argv(b)
    assert isinstance(parse_argv(a)[1]["--api-key"][0], SecretValue)
    other = run.mask_argv([*argv[:3], "sh -c 'x --api-key other-key-123'"])
    assert parse_argv(other) != parse_argv(a)


def test_env_and_login_values_carrying_a_secret_flag_are_hashed(tmp_path: Path) -> None:
    run = _run()
    env = {"VLLM_ARGS": f"--api-key {KEY} --port 8000", "PLAIN": "a --port 8000"}
    shown = run.mask_env_map(env)
    assert KEY not in repr(shown)
    assert shown["PLAIN"] == "a --port 8000"
    assert run.mask_env_list([f"VLLM_ARGS=--hf-token={KEY}"]) != {"VLLM_ARGS": f"--hf-token={KEY}"}
    assert KEY not in repr(run.mask_env_list([f"VLLM_ARGS=--hf-token={KEY}"]))
    (tmp_path / ".bash_profile").write_text(f'export VLLM_ARGS="--api-key {KEY}"\n')
    home = os.environ.get("HOME")
    os.environ["HOME"] = str(tmp_path)
    try:
        login = _run(timeout_s=10)
        result, _ = _collector().login_shell(login)
    finally:
        os.environ["HOME"] = home or ""
    assert "VLLM_ARGS" in result["exports"]
    assert KEY not in repr(result)


def test_error_text_is_scrubbed_with_the_run_patterns() -> None:
    collector = _collector()
    run = _run(["*_CRED"])
    line = "error: DB_CRED=hunter22x and --db-cred hunter33y"
    out = collector._last_line(line, run)
    assert "hunter22x" not in out and "hunter33y" not in out
    assert "hunter22x" in collector.scrub_text(line)  # the floor alone does not know *_CRED


def test_an_unlistable_deployment_directory_is_named_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    collector = _collector()
    deploy = tmp_path / "lobes"
    deploy.mkdir()
    (deploy / ".env").write_text("A=1\n")
    real = collector.os.listdir

    def refused(path: Any = ".") -> Any:
        if str(path) == str(deploy):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(collector.os, "listdir", refused)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    payload = {
        "run_key": "k" * 64, "directory": str(deploy), "project": "lobes",
        "compose_files": ["docker-compose.yml"], "managed_env": {}, "box_secrets": {},
        "controller_secrets": {}, "secret_patterns": [], "gateway_port": 1,
        "timeout_s": 5, "probe_timeout_s": 1,
    }  # fmt: skip
    doc = collector.collect(payload)
    assert "." in doc["file_errors"]
    assert "ermission" in doc["file_errors"]["."]


def test_a_login_profile_background_job_does_not_hold_the_answer(tmp_path: Path) -> None:
    (tmp_path / ".bash_profile").write_text("export WHO=me\nsleep 30 &\n")
    home = os.environ.get("HOME")
    os.environ["HOME"] = str(tmp_path)
    try:
        started = time.monotonic()
        result, _ = _collector().login_shell(_run(timeout_s=4))
        took = time.monotonic() - started
    finally:
        os.environ["HOME"] = home or ""
    assert took < 2.5
    assert result.get("exports", {}).get("WHO", {}).get("value") == "me"


def _engine(path: str, answer: Any) -> None:
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(5)

    def serve() -> None:
        conn, _ = srv.accept()
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
            req, buf = buf.split(b"\r\n\r\n", 1)
            try:
                answer(conn, req.split(b" ")[1].decode())
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()


def test_engine_inspect_has_one_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sock = str(tmp_path / "e.sock")

    def answer(conn: socket.socket, path: str) -> None:
        if path.startswith("/containers/json"):
            body = json.dumps([{"Id": f"c{i:02d}"} for i in range(8)]).encode()
        else:
            time.sleep(0.6)  # each within the per-request budget
            body = json.dumps({"Id": path, "Name": "/x", "Config": {}}).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    _engine(sock, answer)
    monkeypatch.setenv("DOCKER_HOST", "unix://" + sock)
    collector = _collector()
    started = time.monotonic()
    with pytest.raises(OSError):
        collector.engine_inspect(_run(project="lobes", timeout_s=2))
    assert time.monotonic() - started < 3


def test_an_engine_body_over_the_limit_is_refused(tmp_path: Path) -> None:
    sock = str(tmp_path / "b.sock")
    size = 3 * 1024 * 1024

    def answer(conn: socket.socket, path: str) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        conn.sendall(b"[" + b" " * (size - 2) + b"]")

    _engine(sock, answer)
    collector = _collector()
    conn = collector.unix_connection(sock, 10)
    conn.max_body = 1024 * 1024
    with pytest.raises(collector.OverLimit):
        conn.ask("GET", "/containers/json")
    conn.close()
