"""Issue 10, class 2, as reproduced: `ssh_user: "-oProxyCommand=touch ..."` in the inventory
made `pyinfra inventory.py --limit thor fact server.Hostname` run that command on the
controller. Now pyinfra never sees the value: inventory.py exits 1 with the located error.

Runs the real pyinfra CLI on a copy of the repository's inventory and group_vars (the package
itself is linked in, so the copy runs this code)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler import records

ROOT = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).with_name("pyinfra")


def _fleet_copy(tmp_path: Path) -> Path:
    root = tmp_path / "fleet"
    root.mkdir()
    for part in ("inventory", "group_vars"):
        shutil.copytree(ROOT / part, root / part)
    shutil.copy(ROOT / "inventory.py", root / "inventory.py")
    (root / "reconciler").symlink_to(ROOT / "reconciler")
    return root


def _pyinfra(root: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "XDG_RUNTIME_DIR": str(tmp_path / "run"),
    }
    (tmp_path / "run").mkdir(mode=0o700)
    return subprocess.run(
        [str(PYINFRA), "-y", "inventory.py", "--limit", "thor", "fact", "server.Hostname"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_hostile_ssh_user_or_host_never_reaches_ssh(tmp_path: Path) -> None:
    root = _fleet_copy(tmp_path)
    hostile = f"-oProxyCommand=touch {tmp_path / 'pwned'}"
    hosts = root / "inventory" / "hosts.yaml"
    text = hosts.read_text(encoding="utf-8")
    for key, old in (("ssh_hostname", "thor.lan"), ("ssh_user", "lobes")):
        line = f"    {key}: {old}"
        assert line in text
        text = text.replace(line, f'    {key}: "{hostile}"', 1)
    hosts.write_text(text, encoding="utf-8")

    proc = _pyinfra(root, tmp_path)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert (
        f"inventory/hosts.yaml:10:5: boxes.thor.ssh_hostname: {hostile!r} is not a host name"
        in ("\n".join(lines))
    )
    assert (
        f"inventory/hosts.yaml:11:5: boxes.thor.ssh_user: {hostile!r} is not a POSIX user name"
        in ("\n".join(lines))
    )
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("pwned*")), "the ProxyCommand ran"


def test_the_unmodified_copy_loads_so_the_refusal_above_is_the_edit(tmp_path: Path) -> None:
    """Without the edit, the same command gets past the inventory (and fails only to reach
    thor.lan, which does not exist here): exit code and output differ from a refusal."""
    root = _fleet_copy(tmp_path)
    proc = _pyinfra(root, tmp_path)
    assert "inventory/hosts.yaml:" not in proc.stderr
    assert "boxes.thor" not in proc.stderr


def test_pyinfra_host_data_checks_again_whatever_built_the_fleet() -> None:
    """A Fleet built without validation (model_construct) still never hands pyinfra an
    option-like user or host."""
    from reconciler.desired.load import load_fleet
    from reconciler.desired.pyinfra_data import host_data

    fleet = load_fleet(ROOT, "hosts")
    assert host_data(fleet, "thor")["ssh_user"] == "lobes"
    for field in ("ssh_user", "ssh_hostname"):
        thor = fleet.inventory.boxes["thor"].model_copy(update={field: "-oProxyCommand=x"})
        boxes = {**fleet.inventory.boxes, "thor": thor}
        bad = records.replace(fleet, inventory=fleet.inventory.model_copy(update={"boxes": boxes}))
        with pytest.raises(ValueError, match="-oProxyCommand=x"):
            host_data(bad, "thor")
