"""The vLLM stand-in as a process: argv contract, HTTP surface, auth, fail modes.

Each test starts `lab/images/vllm_standin.py` on a free loopback port in a subprocess, the
way a lane image runs it, and talks to it over HTTP.
"""

from __future__ import annotations

import json
import os
import shlex
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

STANDIN = Path(__file__).resolve().parents[2] / "lab" / "images" / "vllm_standin.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    drop = ("STANDIN_", "VLLM_", "MG_LOG_NAME")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["STANDIN_ARGV_FILE"] = str(tmp_path / "argv.json")
    env["STANDIN_BUILD_INFO"] = str(tmp_path / "no-build-info.json")
    env.update(extra)
    return env


class Lane:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, key: str | None = None) -> tuple[int, bytes]:
        return self.request("GET", path, None, key)

    def request(
        self, method: str, path: str, body: Any = None, key: str | None = None
    ) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("content-type", "application/json")
        if key is not None:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()


@contextmanager
def running(tmp_path: Path, *serve_args: str, **env: str) -> Iterator[Lane]:
    port = _free_port()
    argv = [sys.executable, str(STANDIN), "serve", *serve_args, "--host", "127.0.0.1"]
    argv += ["--port", str(port)]
    proc = subprocess.Popen(argv, env=_env(tmp_path, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip
    lane = Lane(proc, port)
    deadline = time.monotonic() + 10
    while True:  # the port answers as soon as the process binds, ready or not
        try:
            if lane.get("/standin/argv")[0] == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise AssertionError(f"stand-in did not come up (rc={proc.poll()}):\n{out}")
        time.sleep(0.05)
    try:
        yield lane
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        finally:
            if proc.poll() is None:
                proc.kill()
            if proc.stdout:
                proc.stdout.close()


def _run_to_exit(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(STANDIN), *args], env=_env(tmp_path, **env),
                          capture_output=True, text=True, timeout=20)  # fmt: skip


def _wait_health(lane: Lane, want: int, within: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < within:
        if lane.get("/health")[0] == want:
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"/health never returned {want} within {within}s")


# --- argv ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        # a compose list item that rendered empty: one "" argv element
        (["--enforce-eager", ""], "unrecognized arguments: "),
        # an unquoted JSON value in a compose command string: the shell lexer split it
        (
            shlex.split('--speculative-config={"method": "mtp", "num_speculative_tokens": 2}'),
            "argument --speculative-config: Invalid JSON",
        ),
        # a split whose first token happens to be valid JSON on its own
        (["--hf-overrides={}", "extra-token"], "unrecognized arguments: extra-token"),
    ],
)
def test_bad_argv_exits_2_like_argparse(tmp_path: Path, extra: list[str], needle: str) -> None:
    done = _run_to_exit(tmp_path, "serve", "org/model", "--port", "1", *extra)
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr
    assert "vllm" in done.stderr.splitlines()[-1]


def test_truncated_json_value_is_an_argparse_error(tmp_path: Path) -> None:
    done = _run_to_exit(tmp_path, "serve", "m", '--hf-overrides={"rope": ')
    assert done.returncode == 2
    assert "argument --hf-overrides" in done.stderr


def test_boolean_flags_take_no_value(tmp_path: Path) -> None:
    done = _run_to_exit(tmp_path, "serve", "m", "--enforce-eager=true")
    assert done.returncode == 2
    assert "ignored explicit argument" in done.stderr


def test_good_argv_gets_past_parsing(tmp_path: Path) -> None:
    # STANDIN_FAIL=exit exits 1 right after a successful parse: 1, not 2, proves the parse.
    done = _run_to_exit(
        tmp_path, "serve", "org/m", "--enforce-eager", "--no-enable-prefix-caching",
        "--async-scheduling", "--no-async-scheduling", "--enable-chunked-prefill",
        "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}',
        "--kv_cache_dtype=fp8", "-tp", "1", "--max-num-batched-tokens", "16k",
        STANDIN_FAIL="exit",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "EngineCore failed to start" in done.stderr


def test_version_flag(tmp_path: Path) -> None:
    info = tmp_path / "build.json"
    info.write_text(json.dumps({"version": "9.9.9+standin.x", "flavor": "x"}))
    done = _run_to_exit(tmp_path, "--version", STANDIN_BUILD_INFO=str(info))
    assert done.returncode == 0
    assert done.stdout.strip() == "9.9.9+standin.x"


# --- HTTP ------------------------------------------------------------------------------------


def test_models_reports_max_model_len_and_served_names(tmp_path: Path) -> None:
    with running(tmp_path, "org/Model-7B", "--served-model-name", "alias-a", "alias-b",
                 "--max-model-len=12345") as lane:  # fmt: skip
        status, body = lane.get("/v1/models")
        assert status == 200
        models = json.loads(body)
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == ["alias-a", "alias-b"]
        assert {m["max_model_len"] for m in models["data"]} == {12345}
        assert {m["root"] for m in models["data"]} == {"org/Model-7B"}
        assert {m["owned_by"] for m in models["data"]} == {"vllm"}


def test_max_model_len_separate_value_and_suffix(tmp_path: Path) -> None:
    with running(tmp_path, "m", "--max-model-len", "32k") as lane:
        data = json.loads(lane.get("/v1/models")[1])["data"]
        assert [(m["id"], m["max_model_len"]) for m in data] == [("m", 32000)]


def test_health_is_empty_200_and_version_metrics_answer(tmp_path: Path) -> None:
    info = tmp_path / "build.json"
    info.write_text(json.dumps({"version": "1.2.3+standin.t", "flavor": "t"}))
    with running(tmp_path, "m", STANDIN_BUILD_INFO=str(info)) as lane:
        assert lane.get("/health") == (200, b"")
        assert json.loads(lane.get("/version")[1]) == {"version": "1.2.3+standin.t"}
        status, metrics = lane.get("/metrics")
        assert status == 200
        assert b'vllm:num_requests_running{model_name="m"} 0' in metrics
        assert b"# TYPE vllm:prompt_tokens_total counter" in metrics


def test_api_key_flag_gates_v1_only(tmp_path: Path) -> None:
    with running(tmp_path, "m", "--api-key", "sekret") as lane:
        assert lane.get("/v1/models")[0] == 401
        assert json.loads(lane.get("/v1/models", key="wrong")[1]) == {"error": "Unauthorized"}
        assert lane.get("/v1/models", key="sekret")[0] == 200
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        assert lane.request("POST", "/v1/chat/completions", chat)[0] == 401
        assert lane.request("POST", "/v1/chat/completions", chat, key="sekret")[0] == 200
        assert lane.get("/health")[0] == 200
        assert lane.get("/metrics")[0] == 200


def test_vllm_api_key_env_and_cli_precedence(tmp_path: Path) -> None:
    with running(tmp_path, "m", VLLM_API_KEY="from-env") as lane:
        assert lane.get("/v1/models")[0] == 401
        assert lane.get("/v1/models", key="from-env")[0] == 200
    with running(tmp_path, "m", "--api-key=from-cli", VLLM_API_KEY="from-env") as lane:
        assert lane.get("/v1/models", key="from-env")[0] == 401
        assert lane.get("/v1/models", key="from-cli")[0] == 200
    with running(tmp_path, "m") as lane:
        assert lane.get("/v1/models")[0] == 200


def test_chat_is_deterministic_and_window_is_enforced(tmp_path: Path) -> None:
    with running(tmp_path, "org/m", "--served-model-name=chat", "--max-model-len=64") as lane:
        short = {"model": "chat", "messages": [{"role": "user", "content": "hello there"}]}
        status, first = lane.request("POST", "/v1/chat/completions", short)
        assert status == 200
        reply = json.loads(first)
        assert reply["object"] == "chat.completion"
        assert reply["model"] == "chat"
        assert reply["choices"][0]["message"]["role"] == "assistant"
        assert reply["choices"][0]["message"]["content"]
        assert reply["usage"]["prompt_tokens"] > 0
        again = json.loads(lane.request("POST", "/v1/chat/completions", short)[1])
        assert again["choices"] == reply["choices"]

        long = {"model": "chat", "messages": [{"role": "user", "content": "x" * 1000}]}
        status, body = lane.request("POST", "/v1/chat/completions", long)
        assert status == 400
        assert "maximum context length is 64" in json.loads(body)["error"]["message"]

        greedy = {**short, "max_tokens": 1000}
        assert lane.request("POST", "/v1/chat/completions", greedy)[0] == 400
        unknown = {**short, "model": "org/m"}  # the path is not a served name
        assert lane.request("POST", "/v1/chat/completions", unknown)[0] == 404

        status, body = lane.request("POST", "/v1/completions", {"model": "chat", "prompt": "a"})
        assert status == 200
        assert json.loads(body)["object"] == "text_completion"
        metrics = lane.get("/metrics")[1]
        assert b'vllm:request_success_total{model_name="chat"} 3' in metrics


def test_embeddings_and_rerank_for_pooling_lanes(tmp_path: Path) -> None:
    with running(tmp_path, "Qwen/Qwen3-Embedding-0.6B", "--runner=pooling") as lane:
        status, body = lane.request("POST", "/v1/embeddings", {"input": ["a", "b"]})
        assert status == 200
        data = json.loads(body)["data"]
        assert [d["index"] for d in data] == [0, 1]
        assert data[0]["embedding"] != data[1]["embedding"]
        ask = {"query": "q", "documents": ["x", "y", "z"], "top_n": 2}
        status, body = lane.request("POST", "/v1/rerank", ask)
        assert status == 200
        results = json.loads(body)["results"]
        assert len(results) == 2
        assert results[0]["relevance_score"] >= results[1]["relevance_score"]
        assert json.loads(lane.request("POST", "/v1/rerank", ask)[1])["results"] == results


def test_start_delay_holds_health(tmp_path: Path) -> None:
    with running(tmp_path, "m", STANDIN_START_DELAY_S="1.5") as lane:
        assert lane.get("/health") == (503, b"")
        assert lane.get("/v1/models")[0] == 503
        waited = _wait_health(lane, 200, within=6)
        assert waited > 0.8  # the process was already up ~0.1-0.5 s when polling began


def test_never_healthy(tmp_path: Path) -> None:
    with running(tmp_path, "m", STANDIN_FAIL="never-healthy") as lane:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert lane.get("/health")[0] == 503
            time.sleep(0.1)
        assert lane.proc.poll() is None


def test_per_lane_knobs_win_over_shared_ones(tmp_path: Path) -> None:
    # One .env feeds every lane: the plain knob fails them all, the lane's own one wins.
    shared = {"STANDIN_FAIL": "never-healthy", "STANDIN_FAIL_WORKER": ""}
    with running(tmp_path, "m", MG_LOG_NAME="worker", **shared) as lane:
        assert lane.get("/health")[0] == 200
    with running(tmp_path, "m", MG_LOG_NAME="embed", **shared) as lane:
        assert lane.get("/health")[0] == 503
    delayed = {"STANDIN_START_DELAY_S_PRIMARY": "30"}
    with running(tmp_path, "m", MG_LOG_NAME="primary", **delayed) as lane:
        assert lane.get("/health")[0] == 503


def test_failure_baked_into_the_build(tmp_path: Path) -> None:
    info = tmp_path / "build.json"
    info.write_text(json.dumps({"version": "x", "fail": "never-healthy"}))
    with running(tmp_path, "m", STANDIN_BUILD_INFO=str(info)) as lane:
        time.sleep(0.3)
        assert lane.get("/health")[0] == 503
    with running(tmp_path, "m", STANDIN_BUILD_INFO=str(info), STANDIN_FAIL="") as lane:
        assert lane.get("/health")[0] == 200


def test_fail_exit_mode(tmp_path: Path) -> None:
    done = _run_to_exit(tmp_path, "serve", "m", "--port", str(_free_port()), STANDIN_FAIL="exit")
    assert done.returncode == 1


def test_exit_after_ready(tmp_path: Path) -> None:
    with running(tmp_path, "m", STANDIN_FAIL="exit-after=0.5") as lane:
        assert lane.proc.wait(timeout=5) == 1


def test_argv_is_recorded_verbatim(tmp_path: Path) -> None:
    spec = '{"method": "mtp", "num_speculative_tokens": 2}'
    args = ["org/m", f"--speculative-config={spec}", "--hf-overrides={}", "--max-model-len=99"]
    with running(tmp_path, *args) as lane:
        recorded = json.loads(lane.get("/standin/argv")[1])
        on_disk = json.loads((tmp_path / "argv.json").read_text())
    expected = ["serve", *args, "--host", "127.0.0.1"]
    assert recorded["argv"][: len(expected)] == expected
    assert on_disk["argv"] == recorded["argv"]
    assert recorded["max_model_len"] == 99


def test_argv_recorded_even_when_parsing_fails(tmp_path: Path) -> None:
    done = _run_to_exit(tmp_path, "serve", "m", "", "--bogus")
    assert done.returncode == 2
    assert json.loads((tmp_path / "argv.json").read_text())["argv"] == ["serve", "m", "", "--bogus"]


def test_sigterm_during_boot_is_prompt(tmp_path: Path) -> None:
    with running(tmp_path, "m", STANDIN_START_DELAY_S="120") as lane:
        started = time.monotonic()
        lane.proc.send_signal(signal.SIGTERM)
        assert lane.proc.wait(timeout=5) == 0
        assert time.monotonic() - started < 2
