"""The collector's payload never appears in a command line, on the controller or on the box.

The payload holds the run's HMAC key and every desired setting, a secret carried inline in one
included; /proc/PID/cmdline shows every process's argv to every user of its machine. During a
real `reconcile drift thor` (its run key known to the test, set through the environment, never
an argument) every process's argv is sampled on the controller and, as the deploy user, on the
box; neither the run key, nor a setting's inline `--api-key` value, nor a secret of the lab's
appears in any of them, in clear or base64-encoded. The samplers must also have seen the
collector running, or the test proves nothing.

Run under the lab lock:
  flock /tmp/lab.lock .venv/bin/pytest -p no:cacheprovider tests/lab/test_payload_stdin.py
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from lab import config, ssh

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
RUN_KEY = "5eed" * 8
CANARY = "canary-review2-argv-7f3e9a1c"
MARK = b"_code(zlib.decompress"  # the bootstrap every collector run starts with

# `reconcile ...` with its run key from the environment: nothing of it is in this argv.
DRIVER = (
    "import os, runpy, sys\n"
    "import reconciler.observe.payload as p\n"
    "p.new_run_key = lambda: os.environ['FLEET_REVIEW2_RUN_KEY']\n"
    "sys.argv = ['reconcile'] + sys.argv[1:]\n"
    "runpy.run_module('reconciler', run_name='__main__', alter_sys=True)\n"
)

# Every process's argv, sampled every few ms until stdin closes; then printed (base64).
SAMPLER = """\
import base64, json, os, select, sys
seen = set()
sys.stdout.write("ready\\n"); sys.stdout.flush()
while True:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    seen.add(f.read())
            except OSError:
                pass
    if select.select([sys.stdin], [], [], 0.002)[0] and not os.read(0, 4096):
        break
sys.stdout.write(json.dumps([base64.b64encode(s).decode() for s in seen]) + "\\n")
"""


def desired_state(directory: Path) -> Path:
    """inventory/lab.yaml whose thor sets one more `.env` value, carrying an inline key."""
    yaml = YAML()
    directory.mkdir(parents=True, exist_ok=True)
    inventory = yaml.load((ROOT / "inventory" / "lab.yaml").read_text())
    base = str(inventory["box_overlay"])
    for box in ("thor", "spark", "orin"):
        path = Path(base.replace("{box}", box))
        layer = dict(yaml.load((path if path.is_absolute() else ROOT / path).read_text()) or {})
        if box == "thor":
            layer["env"] = {"FLEET_REVIEW2_ARGS": f"--api-key {CANARY}"}
        with (directory / f"{box}.yaml").open("w") as handle:
            yaml.dump(layer, handle)
    inventory["box_overlay"] = f"{directory}/{{box}}.yaml"
    path = directory / "inventory.yaml"
    with path.open("w") as handle:
        yaml.dump(inventory, handle)
    return path


class Sampler:
    """SAMPLER running through `argv` (here, or on a box over ssh) until `stop`."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        assert ready == b"ready\n", self.proc.stderr.read() if self.proc.stderr else ready

    def stop(self) -> list[bytes]:
        out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err[-2000:]
        return [base64.b64decode(s) for s in json.loads(out.splitlines()[-1])]


def readable(cmdline: bytes) -> str:
    """A process's argv as a reader of /proc learns it: each argument, the words of each one
    a shell would parse (an ssh remote command, `sh -c`), and each base64 word decoded."""
    args = [a.decode("utf-8", "replace") for a in cmdline.split(b"\0")]
    seen = list(args)
    for arg in args:
        words = [arg]
        with contextlib.suppress(ValueError):
            words += shlex.split(arg)
        for word in words:
            with contextlib.suppress(binascii.Error, ValueError):
                seen.append(base64.b64decode(word, validate=True).decode("utf-8", "replace"))
    return "\n".join(seen)


def leaks(cmdlines: list[bytes], needles: list[str]) -> list[str]:
    found = []
    for cmdline in cmdlines:
        text = readable(cmdline)
        found += [f"{n[:6]}... in {cmdline[:60]!r}" for n in needles if n in text]
        if '"run_key"' in text:
            found.append(f"a payload in {cmdline[:60]!r}")
    return found


def test_no_argv_on_either_machine_holds_the_run_key_or_a_setting_during_a_drift(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    inventory = desired_state(tmp_path / "desired")
    secrets = json.loads((config.LAB_DIR / "secrets.json").read_text(encoding="utf-8"))
    needles = [RUN_KEY, CANARY, *secrets.values()]
    box = config.box("thor")
    on_box = Sampler(ssh.argv(box, "python3 -c " + shlex.quote(SAMPLER)))
    here = Sampler([sys.executable, "-c", SAMPLER])
    try:
        drift = subprocess.run(
            [sys.executable, "-c", DRIVER, "-i", str(inventory), "drift", "thor",
             "--format", "json"],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "FLEET_REVIEW2_RUN_KEY": RUN_KEY},
        )  # fmt: skip
    finally:
        box_seen, controller_seen = on_box.stop(), here.stop()
    assert drift.returncode in (0, 2), drift.stderr[-2000:]
    report = json.loads(drift.stdout)
    (thor,) = [b for b in report["boxes"] if b["box"] == "thor"]
    assert thor["observation"] == "full"
    assert CANARY not in drift.stdout  # the setting's inline key is masked in the report too
    # The samplers saw the collector: its ssh here, its python3 on the box.
    assert any(c.startswith(b"ssh\0") and MARK in c for c in controller_seen)
    assert any(c.startswith(b"python3\0-I\0-S\0-c\0") and MARK in c for c in box_seen)
    assert leaks(controller_seen, needles) == []
    assert leaks(box_seen, needles) == []


def test_the_sampler_finds_a_payload_in_an_argv() -> None:
    """The check itself: a payload as the collector's argument once was is found."""
    payload = base64.b64encode(json.dumps({"run_key": RUN_KEY}).encode()).decode()
    cmdline = f"ssh\0--\0host\0python3 -I -S -c 'x' {payload}\0".encode()
    assert leaks([cmdline], [RUN_KEY]) != []
