"""The real lobes 0.91.0 gateway in front of the stand-in, both on loopback.

The stand-in exists so the gateway and the reconciler see a vLLM lane; this proves the
gateway does: it reads the lane ready (or not) and proxies chat, streamed or not, to it.
The gateway runs straight from the lobes-cli wheel (pure Python, importable as a zip).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lab import config
from lab.images import vllm_standin
from lab.images.wheels import cached_wheels

STANDIN = Path(vllm_standin.__file__).resolve()
CORTEX = "unsloth/Qwen3.8-27B-NVFP4"


@pytest.fixture(scope="module")
def lobes_wheel() -> Path:
    """The lobes-cli 0.91.0 wheel: $LOBES_WHEEL, else the one the machine set-up fetched.

    Never downloaded here (a test run needs no package index); missing, the test fails and
    says which set-up fetches it."""
    given = os.environ.get("LOBES_WHEEL")
    if given:
        return Path(given)
    try:
        return cached_wheels(config.CACHE_DIR)[0]
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, body: Any = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data)
    if data is not None:
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _wait(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 15
    while True:
        try:
            _get(url)
            return
        except OSError:
            assert proc.poll() is None, f"{proc.args!r} exited {proc.returncode}"
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.1)


@contextmanager
def _spawn(argv: list[str], env: dict[str, str], url: str) -> Iterator[None]:
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(url, proc)
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def fleet(tmp_path: Path, wheel: Path, **lane_env: str) -> Iterator[str]:
    """A cortex stand-in and a gateway pointed at it; yields the gateway's base URL."""
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("STANDIN_", "VLLM_"))}
    lane_port, gw_port = _free_port(), _free_port()
    lane = [sys.executable, str(STANDIN), "serve", CORTEX, f"--served-model-name={CORTEX}",
            "--max-model-len=131072", "--host=127.0.0.1", f"--port={lane_port}"]  # fmt: skip
    lane_vars = {**base_env, "STANDIN_ARGV_FILE": str(tmp_path / "argv.json"), **lane_env}
    gw_env = {
        **base_env,
        "PYTHONPATH": str(wheel),
        "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_PORT": str(gw_port),
        "PRIMARY_URL": f"http://127.0.0.1:{lane_port}",
        "PRIMARY_MAX_MODEL_LEN": "131072",
        "HOME": str(tmp_path),
    }
    gateway = [sys.executable, "-m", "lobes.gateway"]
    gw_url = f"http://127.0.0.1:{gw_port}"
    with (
        _spawn(lane, lane_vars, f"http://127.0.0.1:{lane_port}/standin/argv"),
        _spawn(gateway, gw_env, f"{gw_url}/health"),
    ):
        yield gw_url


def _cortex(gw_url: str) -> dict[str, Any]:
    status, body = _get(f"{gw_url}/capabilities")
    assert status == 200
    return dict(json.loads(body)["cortex"])


def test_gateway_reads_the_standin_ready_and_proxies_chat(
    lobes_wheel: Path, tmp_path: Path
) -> None:
    with fleet(tmp_path, lobes_wheel) as gw:
        status, body = _get(f"{gw}/health")
        assert json.loads(body)["version"] == "0.91.0"
        deadline = time.monotonic() + 12
        while not _cortex(gw).get("ready"):
            assert time.monotonic() < deadline, _cortex(gw)
            time.sleep(0.5)
        assert _cortex(gw)["model"] == CORTEX

        chat = {"model": "cortex", "messages": [{"role": "user", "content": "ping"}]}
        status, body = _get(f"{gw}/v1/chat/completions", chat)
        assert status == 200, body
        reply = json.loads(body)
        assert reply["model"] == CORTEX
        assert reply["choices"][0]["message"]["content"].startswith("[vllm stand-in")

        status, body = _get(f"{gw}/v1/chat/completions", {**chat, "stream": True})
        assert status == 200
        events = [line for line in body.decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert "vllm stand-in" in body.decode()


def test_gateway_sees_a_never_healthy_lane_as_not_ready(lobes_wheel: Path, tmp_path: Path) -> None:
    with fleet(tmp_path, lobes_wheel, STANDIN_FAIL="never-healthy") as gw:
        time.sleep(1.5)  # past the gateway's first readiness probe
        assert _cortex(gw).get("ready") is False
