"""SSH into each box as its user with the lab key; nothing else gets in."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab


def _ssh(lab, user, address, *extra, command="true"):
    return subprocess.run(
        ["ssh", "-F", "/dev/null", "-o", f"UserKnownHostsFile={lab['ssh']['known_hosts']}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
         *extra, f"{user}@{address}", command],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("box", ["thor", "spark", "orin"])
def test_key_login_as_the_box_user(lab, box):
    b = lab["boxes"][box]
    proc = _ssh(lab, b["user"], b["address"], "-i", lab["ssh"]["key"], "-o", "IdentitiesOnly=yes",
                command="id -un; hostname; hostname -I")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    user, hostname, addrs = proc.stdout.split("\n", 2)
    assert user == b["user"]
    assert hostname == box
    assert b["address"] in addrs.split()


def test_no_password_login_and_no_other_user(lab):
    b = lab["boxes"]["thor"]
    no_key = _ssh(lab, b["user"], b["address"], "-o", "PubkeyAuthentication=no",
                  "-o", "PreferredAuthentications=password,keyboard-interactive")  # fmt: skip
    assert no_key.returncode == 255
    other = _ssh(lab, lab["boxes"]["spark"]["user"], b["address"], "-i", lab["ssh"]["key"],
                 "-o", "IdentitiesOnly=yes")  # fmt: skip
    assert other.returncode == 255
    root = _ssh(lab, "root", b["address"], "-i", lab["ssh"]["key"], "-o", "IdentitiesOnly=yes")
    assert root.returncode == 255


def test_known_hosts_pins_every_box(lab):
    text = Path(lab["ssh"]["known_hosts"]).read_text()
    for b in lab["boxes"].values():
        assert any(line.startswith(b["address"] + " ssh-ed25519 ") for line in text.splitlines())


def test_scrubbed_compose_resolves_the_lobes_chain(lab, on_box):
    for name, box in lab["boxes"].items():
        out = on_box(
            name,
            "cd ~/.lobes && env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=$HOME "
            "docker compose ps --format '{{.Service}}'",
        ).stdout.split()
        assert sorted(out) == sorted(box["services"])


def test_the_tool_reaches_a_box_from_a_repository_path_with_spaces_and_percent(
    lab, tmp_path, monkeypatch
):
    """The key and known_hosts of a checkout under `my fleet/100%d` are the files ssh opens."""
    import shutil

    from reconciler.observe import transport
    from reconciler.observe.transport import Target, ssh_argv

    # A fresh connection: a persisted master would not need to read the key at all.
    monkeypatch.setattr(transport, "control_dir", lambda: None)

    where = tmp_path / "my fleet" / "100%d"
    where.mkdir(parents=True)
    key, known = where / "id_ed25519", where / "known_hosts"
    shutil.copy(lab["ssh"]["key"], key)
    key.chmod(0o600)
    shutil.copy(lab["ssh"]["known_hosts"], known)
    b = lab["boxes"]["thor"]
    target = Target("thor", b["address"], b["user"], 22, str(key), str(known))
    argv = ssh_argv(target, "id -un")
    assert "ControlPath=none" in argv
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == b["user"]
