"""Review 3: a master connection opened with the right host-key pin and key must not serve a run
whose own pin or key would refuse the box (ssh authenticates nothing sent through a master).
Without the fix, thor was fully observed through the master after both changes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]


def _keypair(path: Path) -> bytes:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path.read_bytes()


def _in_place(path: Path, data: bytes) -> None:
    """New bytes at the same path, its old mtime put back: only the content says it changed."""
    before = path.stat()
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_master_opened_with_the_right_pin_never_serves_a_changed_pin_or_key(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    files = tmp_path / "ssh"
    files.mkdir()
    key, pin = files / "id_ed25519", files / "known_hosts"
    shutil.copy(REPO / ".lab/ssh/id_ed25519", key)
    key.chmod(0o600)
    shutil.copy(REPO / ".lab/ssh/known_hosts", pin)
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(
        (REPO / "inventory/lab.yaml")
        .read_text()
        .replace(".lab/ssh/id_ed25519", str(key))
        .replace(".lab/ssh/known_hosts", str(pin))
    )
    right_pin, right_key = pin.read_bytes(), key.read_bytes()
    # thor's pin replaced by a host key thor does not have; a key thor does not accept
    _keypair(files / "not_thor")
    wrong = (files / "not_thor.pub").read_text().split()[:2]
    wrong_pin = b"".join(
        f"10.77.0.11 {' '.join(wrong)}\n".encode() if line.startswith(b"10.77.0.11 ") else line
        for line in right_pin.splitlines(keepends=True)
    )
    assert wrong_pin != right_pin
    wrong_key = _keypair(files / "revoked")

    # Its own masters only (short: socket paths must fit sun_path), its own caches.
    runtime = Path(tempfile.mkdtemp(prefix="r3", dir="/tmp"))
    sockets = runtime / f"fleet-reconciler-ssh-{os.getuid()}"
    env = {
        **os.environ,
        "XDG_RUNTIME_DIR": str(runtime),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }

    reconcile = [sys.executable, "-m", "reconciler", "--root", str(REPO), "-i", str(inventory)]

    def drift() -> tuple[int, dict[str, Any]]:
        proc = subprocess.run(
            [*reconcile, "drift", "--format", "json", "--no-history", "thor"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
            cwd=tmp_path,
        )
        (thor,) = json.loads(proc.stdout)["boxes"]
        return proc.returncode, thor

    try:
        code, thor = drift()  # opens thor's master with the right pin and key
        assert thor["observation"] == "full", thor.get("errors")
        opened = sorted(p.name for p in sockets.iterdir())
        assert len(opened) == 1

        _in_place(pin, wrong_pin)
        code, thor = drift()
        assert (code, thor["reachable"]) == (1, False)
        assert thor["errors"] == ["unreachable: Host key verification failed."]

        _in_place(pin, right_pin)
        _in_place(key, wrong_key)
        code, thor = drift()
        assert (code, thor["reachable"]) == (1, False)
        assert "Permission denied (publickey)" in thor["errors"][0]

        _in_place(key, right_key)  # the same settings again: the same master, reused
        code, thor = drift()
        assert thor["observation"] == "full", thor.get("errors")
        assert sorted(p.name for p in sockets.iterdir()) == opened
    finally:
        for socket in sockets.iterdir() if sockets.is_dir() else []:
            subprocess.run(
                ["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "x"],
                capture_output=True,
                check=False,
            )
        shutil.rmtree(runtime, ignore_errors=True)
