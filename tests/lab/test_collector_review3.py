"""The collector's review-3 fixes on a real box (thor): its python3, its docker compose, its
/proc, over SSH as a drift runs it.

- A render follows every file compose reads: a lane's `env_file:` of another name and an
  `extends:` file in a subdirectory, edited after a render was cached, are rendered anew (the
  cache served the old render: drift said "in sync" for a change the next `up` applies), and
  an unchanged project is still served from the cache. The desired `.env` reaches compose from
  the collector's memory (/proc/PID/fd), never a file: the managed value is in the render. A
  scratch project in the box user's home, rendered only (`config`): no container is made and the
  deployment is not touched.
- A drift while a converge holds the box's lock says so, as an error of the box; once the lock
  is released (its record left, as a killed converge leaves it) it does not.

Run under the lab lock:
  flock /tmp/lab.lock .venv/bin/pytest -p no:cacheprovider tests/lab/test_collector_review3.py
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import config, ssh
from reconciler.observe.collectors import collector_command

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
BOX = "thor"
SCRATCH = "r3-collector-scratch"  # in the box user's home, removed after
FILES = {
    "docker-compose.yml": (
        "services:\n"
        "  lane:\n"
        "    image: busybox\n"
        "    env_file: [lane.env]\n"
        '    command: [serve, "${WINDOW:-1}"]\n'
        "  inc:\n"
        "    extends: {file: common/base.yml, service: base}\n"
    ),
    ".env": "WINDOW=1\n",
    "lane.env": "MODEL_LEN=131072\n",
    "common/base.yml": "services:\n  base:\n    image: alpine:3.19\n",
}
# What a lab box takes for a render served from its cache, and what a `docker compose config`
# costs it (~0.1-0.5 s of CPU): the collector's own count (timings_ms.cpu, children included).
SERVED_CPU_MS = 150


def box_run(command: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return ssh.run(config.box(BOX), command, input=stdin, timeout=120)


def put(name: str, text: str) -> None:
    path = f"~/{SCRATCH}/{name}"
    box_run(f"mkdir -p $(dirname {path}) && cat > {path}", stdin=text)


@pytest.fixture
def scratch(lab: Any) -> Iterator[None]:
    box_run(f"rm -rf ~/{SCRATCH}")
    for name, text in FILES.items():
        put(name, text)
    try:
        yield
    finally:
        box_run(f"rm -rf ~/{SCRATCH}")


def collect(directory: str, managed_env: dict[str, Any] | None = None) -> dict[str, Any]:
    """The collector's answer from the box, its payload on stdin as a drift sends it."""
    payload = {
        "run_key": "5eed" * 8, "directory": directory, "project": "r3scratch",
        "compose_files": ["docker-compose.yml"], "managed_env": managed_env or {},
        "box_secrets": {}, "secret_patterns": [], "gateway_port": 9, "timeout_s": 30,
        "probe_timeout_s": 1,
    }  # fmt: skip
    stdin = json.dumps({"payload": payload, "sent": {}})
    return dict(json.loads(box_run(collector_command(), stdin=stdin).stdout))


def services(answer: dict[str, Any]) -> dict[str, Any]:
    assert "services" in answer["render"], answer["render"]
    return dict(answer["render"]["services"])


def test_a_render_follows_the_files_compose_reads_on_a_real_box(scratch: None) -> None:
    directory = f"~/{SCRATCH}"
    first = collect(directory, {"WINDOW": "7"})
    lane, inc = services(first)["lane"], services(first)["inc"]
    assert lane["command"] == ["serve", "7"]  # the desired .env, read from the collector's memory
    assert lane["environment"] == {"MODEL_LEN": "131072"} and inc["image"] == "alpine:3.19"
    again = collect(directory, {"WINDOW": "7"})
    assert services(again) == services(first)
    assert again["timings_ms"]["cpu"] < SERVED_CPU_MS, again["timings_ms"]  # served
    put("lane.env", "MODEL_LEN=262144\n")
    put("common/base.yml", "services:\n  base:\n    image: alpine:3.20\n")
    edited = collect(directory, {"WINDOW": "7"})
    assert services(edited)["lane"]["environment"] == {"MODEL_LEN": "262144"}
    assert services(edited)["inc"]["image"] == "alpine:3.20"
    # no desired .env was left on the box's disk by any of these runs
    left = box_run("ls -d /tmp/fleet-collect-* 2>/dev/null || true").stdout.split()
    owned = box_run("id -u").stdout.strip()
    for path in left:
        out = box_run(f"stat -c %u {shlex.quote(path)} 2>/dev/null || true").stdout.strip()
        assert out != owned, f"{path} left behind"


LOCK = "~/.lobes/.fleet/lock"
RECORD = {"holder": "review3@lab", "pid": 4242, "host": "lab", "since": "2025-01-02T03:04:05Z"}


def drift_errors() -> list[str]:
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/reconcile"), "--root", str(ROOT), "-i", "lab", "drift", BOX,
         "--format", "json"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    doc = json.loads(proc.stdout)
    [box] = [b for b in doc["boxes"] if b["box"] == BOX]
    return [str(e) for e in box["errors"]]


@pytest.fixture
def holder(lab: Any) -> Iterator[subprocess.Popen[str]]:
    """`flock` holding thor's converge lock as a converge holds it (exclusive, its record
    written), until the fixture ends; the lock file is left empty, as a converge leaves it."""
    existed = box_run(f"test -e {LOCK} && echo yes || true").stdout.strip() == "yes"
    box_run(f"mkdir -p -m 700 ~/.lobes/.fleet && umask 077 && cat > {LOCK}", json.dumps(RECORD))
    proc = subprocess.Popen(
        ssh.argv(config.box(BOX), f"exec flock -x {LOCK} sh -c 'echo held; exec cat'"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        if proc.poll() is None:
            proc.communicate(timeout=30)  # stdin closed: cat ends, flock lets go
        box_run(f": > {LOCK}" if existed else f"rm -f {LOCK}")


def test_a_drift_during_a_converge_says_so(holder: subprocess.Popen[str]) -> None:
    errors = drift_errors()
    found = [e for e in errors if e.startswith("converge: ")]
    assert len(found) == 1, errors
    assert "a converge of this box was running while it was observed" in found[0]
    assert "pid 4242, by review3@lab, since 2025-01-02T03:04:05Z" in found[0]
    holder.communicate(timeout=30)  # released; its record stays, as a killed converge's would
    assert not [e for e in drift_errors() if e.startswith("converge: ")]
