"""Pure parts of the lab (no root, no daemons): .env edits, override edits, docker run argv."""

from __future__ import annotations

import json
import shlex

from lab import envfile
from lab.incidents import _set_service_key, docker_run_argv

ENV = """\
# comment
PRIMARY_MAX_MODEL_LEN=131072                 # the primary now serves its full 128K
# WORKER_IMAGE=   # override the OCI image
VLLM_NIGHTLY_IMAGE=vllm/vllm-openai@sha256:3fb0
PRIMARY_MAX_MODEL_LEN=262144
"""


def test_set_keys_replaces_the_last_active_line_and_keeps_its_comment():
    out = envfile.set_keys(ENV, {"PRIMARY_MAX_MODEL_LEN": "65536"})
    lines = out.splitlines()
    assert lines[1].startswith("PRIMARY_MAX_MODEL_LEN=131072")  # earlier duplicate untouched
    assert lines[4] == "PRIMARY_MAX_MODEL_LEN=65536"
    assert envfile.get(out, "PRIMARY_MAX_MODEL_LEN") == "65536"


def test_set_keys_keeps_inline_comment_and_appends_missing_keys_once():
    text = "A=1   # why\n"
    out = envfile.set_keys(text, {"A": "2", "WORKER_IMAGE": "r@sha256:1"})
    assert out.splitlines()[0] == "A=2   # why"
    assert out.count("# --- fleet lab ---") == 1
    again = envfile.set_keys(out, {"WORKER_IMAGE": "r@sha256:2"})
    assert again.count("# --- fleet lab ---") == 1
    assert envfile.get(again, "WORKER_IMAGE") == "r@sha256:2"
    assert envfile.get(again, "NOPE") is None


OVERRIDE = """\
services:
  gateway:
    build: !reset null
    init: true
  vllm-worker:
    deploy: !reset null
    command: ["old"]
    ulimits:
      memlock: {soft: 65536, hard: 65536}
"""


def test_set_service_key_replaces_an_earlier_value():
    out = _set_service_key(OVERRIDE, "vllm-worker", "command", json.dumps(["vllm", "serve"]))
    assert '["old"]' not in out
    assert '    command: ["vllm", "serve"]' in out
    assert "      memlock: {soft: 65536, hard: 65536}" in out
    assert out.count("  gateway:") == 1


def test_set_service_key_adds_a_service_block():
    out = _set_service_key(OVERRIDE, "vllm-embed", "ports", '!override ["127.0.0.1:8000:8000"]')
    assert out.endswith('  vllm-embed:\n    ports: !override ["127.0.0.1:8000:8000"]\n')


ALIASES = ["model-gear-vllm-worker", "vllm-worker", "0123456789ab"]


def test_docker_run_argv_copies_compose_labels_and_flattens_the_entrypoint():
    inspect = {
        "Name": "/model-gear-vllm-worker",
        "Config": {
            "Labels": {"com.docker.compose.config-hash": "abc", "com.docker.compose.service": "w"},
            "Env": ["A=1", "B=two words"],
            "Entrypoint": ["bash", "/usr/local/bin/mg-logwrap"],
            "Cmd": ["vllm", "serve", "m", '--speculative-config={"a": 1}'],
            "WorkingDir": "/vllm-workspace",
            "ExposedPorts": {"8000/tcp": {}},
            "Healthcheck": {
                "Test": ["CMD", "curl", "-f", "http://localhost:8000/health"],
                "Interval": 2_000_000_000,
                "Retries": 5,
            },
        },
        "HostConfig": {
            "Binds": ["/h/.lobes/logs:/logs/model-gear:rw"],
            "NetworkMode": "lobes_default",
            "RestartPolicy": {"Name": "unless-stopped"},
            "IpcMode": "host",
            "Ulimits": [{"Name": "memlock", "Soft": 65536, "Hard": 65536}],
            "Runtime": "nvidia",
            "Init": None,
            "PortBindings": {"8000/tcp": [{"HostIp": "", "HostPort": "8000"}]},
        },
        "NetworkSettings": {"Networks": {"lobes_default": {"Aliases": ALIASES}}},
    }
    argv = docker_run_argv(inspect, "reg/img@sha256:1")
    joined = shlex.join(argv)
    assert "--label com.docker.compose.config-hash=abc" in joined
    assert argv[argv.index("--network-alias") + 1] == "vllm-worker"
    assert argv.count("--network-alias") == 1
    assert "--runtime nvidia" in joined and "--ipc host" in joined
    assert "--health-cmd 'curl -f http://localhost:8000/health'" in joined
    assert "--health-interval 2s" in joined
    assert "--publish 8000:8000/tcp" in joined
    i = argv.index("reg/img@sha256:1")
    assert argv[i - 2 : i] == ["--entrypoint", "bash"]
    assert argv[i + 1 :] == [
        "/usr/local/bin/mg-logwrap",
        "vllm",
        "serve",
        "m",
        '--speculative-config={"a": 1}',
    ]
