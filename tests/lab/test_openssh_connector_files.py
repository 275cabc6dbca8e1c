"""pyinfra's files.put/files.get through the @openssh connector against a lab box's real sshd:
the bytes arrive exactly (binary, no final newline), and a second run changes nothing (an
upload whose bytes differed never matched its checksum and was sent again on every run).

Run under the lab lock:
    flock /tmp/lab.lock .venv/bin/pytest tests/lab/test_openssh_connector_files.py
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lab import config
from lab.config import REPO

pytestmark = pytest.mark.lab

PYINFRA = REPO / ".venv" / "bin" / "pyinfra"
BINARY = b"\x89PNG\r\n\x1a\n\x00\xff\xfe" + bytes(range(256)) * 64 + b"no newline at end"
TEXT = b"key=value\nno newline at end"


def test_files_put_and_get_are_byte_exact_and_a_second_run_changes_nothing(
    lab: Any, on_box: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    box = config.box("thor")
    remote = box.home / ".oc-bytes-test"
    local = {"bin": tmp_path / "in.bin", "txt": tmp_path / "in.txt"}
    local["bin"].write_bytes(BINARY)
    local["txt"].write_bytes(TEXT)
    deploy = tmp_path / "deploy.py"
    deploy.write_text(
        "from pyinfra.operations import files\n"
        + "".join(
            f"files.put(name='put {k}', src={str(p)!r}, dest={str(remote / k)!r})\n"
            f"files.get(name='get {k}', src={str(remote / k)!r}, dest={str(tmp_path / k)!r})\n"
            for k, p in local.items()
        ),
        encoding="utf-8",
    )
    on_box("thor", f"rm -rf {remote} && mkdir {remote}")
    try:
        outputs = []
        for _ in range(2):
            done = subprocess.run(
                [str(PYINFRA), "-y", "--limit", "thor", "inventory.py", str(deploy)],
                cwd=REPO, env={**os.environ, "FLEET_INVENTORY": "lab", "PYINFRA_PROGRESS": "off"},
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            text = done.stdout + done.stderr
            assert done.returncode == 0, text[-3000:]
            outputs.append(text)
            on_box_sums = on_box("thor", f"cd {remote} && sha256sum bin txt").stdout.split()
            assert on_box_sums[0::2] == [hashlib.sha256(d).hexdigest() for d in (BINARY, TEXT)]
            assert (tmp_path / "bin").read_bytes() == BINARY
            assert (tmp_path / "txt").read_bytes() == TEXT
        # The first run uploaded and downloaded each file; the second found every file as it
        # should be: no upload, no download.
        assert len(re.findall(r"\[thor\]\s+Success", outputs[0])) == 4, outputs[0][-3000:]
        assert len(re.findall(r"\[thor\]\s+No changes", outputs[1])) == 4, outputs[1][-3000:]
    finally:
        on_box("thor", f"rm -rf {remote}")
