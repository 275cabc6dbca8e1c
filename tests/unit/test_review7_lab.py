"""Review 7 of the lab harness: what `lab up`/`lab reset`/`lab down` do as root (these tests run
as root, as the lab does), on temp paths.

- root never writes, chowns or chmods through a link the box user put in their home (users,
  deployments, scale): `nobody` stands in for the box user, a temp directory for the home;
- `lab down` takes the scale lab down first (a real sshd on loopback stands in for a scale box's,
  every three-box step and every host-wide command is a stub);
- the lab's daemons get no proxy settings;
- the stand-in tests read lobes' wheel from the machine set-up's cache and fail, naming the
  set-up, when it is missing (never download, never skip);
- .lab/secrets.json is never left readable by others.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lab import deployments, labfacts, lifecycle, proc, scale, sshd, users

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def nobody() -> tuple[int, int]:
    pw = pwd.getpwnam("nobody")
    return pw.pw_uid, pw.pw_gid


def _victim(where: Path, name: str, text: str = "root's own\n") -> Path:
    """A root-owned file (0640) outside the home: nothing the lab does may change it."""
    where.mkdir(mode=0o700, exist_ok=True)
    path = where / name
    path.write_text(text)
    os.chmod(path, 0o640)
    return path


def _victim_dir(where: Path, name: str) -> Path:
    path = where / name
    path.mkdir(mode=0o750)
    os.chmod(path, 0o750)
    (path / "keep").write_text("root's own\n")
    return path


def _untouched(path: Path, text: str = "root's own\n", mode: int = 0o640) -> None:
    st = path.lstat()
    assert (path.read_text(), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (text, 0, 0, mode)


def _plain(path: Path, content: bytes, uid: int, mode: int) -> None:
    st = path.lstat()
    assert stat.S_ISREG(st.st_mode), f"{path} is not a plain file"
    assert (path.read_bytes(), st.st_uid, stat.S_IMODE(st.st_mode), st.st_nlink) == (
        content,
        uid,
        mode,
        1,
    )


def _home(tmp_path: Path, owner: tuple[int, int]) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, *owner)
    os.chmod(home, 0o750)
    return home


def _link(target: Path, link: Path, owner: tuple[int, int]) -> None:
    """What the box user can do in their own home: a symlink to anything."""
    link.symlink_to(target)
    os.lchown(link, *owner)


@pytest.fixture
def client_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    key = tmp_path / "ssh" / "id_ed25519"
    key.parent.mkdir()
    pub = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeFakeFakeFakeFakeFakeFakeFakeFakeFakeFake lab\n"
    key.with_suffix(".pub").write_bytes(pub)
    monkeypatch.setattr(users, "CLIENT_KEY", key)
    monkeypatch.setattr(scale, "CLIENT_KEY", key)
    return pub


# -- 1. no link in a box home is followed ----------------------------------------------------------
def test_ensure_home_replaces_the_users_links_and_never_writes_through_them(
    tmp_path: Path, nobody: tuple[int, int], client_key: bytes
) -> None:
    home = _home(tmp_path, nobody)
    outside = tmp_path / "outside"
    bashrc, profile = _victim(outside, "bashrc"), _victim(outside, "profile")
    secret = _victim(outside, "docker-config", json.dumps({"auths": {"r": {"auth": "c2VjcmV0"}}}))
    ssh_target = _victim_dir(outside, "ssh")
    _link(bashrc, home / ".bashrc", nobody)
    os.link(profile, home / ".profile")  # a hard link (fs.protected_hardlinks aside)
    _link(ssh_target, home / ".ssh", nobody)
    (home / ".docker").mkdir()
    os.chown(home / ".docker", *nobody)
    _link(secret, home / ".docker" / "config.json", nobody)
    box = SimpleNamespace(name="thor", user="nobody", home=home, docker_host="unix:///x.sock")

    users.ensure_home(box)  # type: ignore[arg-type]

    for victim in (bashrc, profile):
        _untouched(victim)
    _untouched(secret, json.dumps({"auths": {"r": {"auth": "c2VjcmV0"}}}))
    assert sorted(p.name for p in ssh_target.iterdir()) == ["keep"]
    st = ssh_target.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o750)
    uid = nobody[0]
    login = users.login_files(box)  # type: ignore[arg-type]
    _plain(home / ".bashrc", login[".bashrc"].encode(), uid, 0o644)
    _plain(home / ".profile", login[".profile"].encode(), uid, 0o644)
    assert not (home / ".ssh").is_symlink() and (home / ".ssh").is_dir()
    _plain(home / ".ssh" / "authorized_keys", client_key, uid, 0o600)
    # Replaced, not read through: nothing of root's file reached the user's config.
    config = home / ".docker" / "config.json"
    _plain(config, config.read_bytes(), uid, 0o600)
    assert json.loads(config.read_text()) == {"currentContext": "flab-thor"}


@pytest.fixture
def lobes_home(
    tmp_path: Path, nobody: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> SimpleNamespace:
    home = _home(tmp_path, nobody)
    monkeypatch.setattr(deployments, "overlay", SimpleNamespace(write=lambda *a: None))
    files = {
        ".lobes/.env": (b"GATEWAY_IMAGE=lab\n", 0o600),
        ".lobes/docker-compose.yml": (b"services: {}\n", 0o644),
        f".lobes/{deployments.OVERRIDE}": (b"services: {}\n", 0o644),
        ".bashrc": (b"# rc\n", 0o644),
    }
    monkeypatch.setattr(deployments, "pristine_files", lambda box, images, secrets: files)
    box = SimpleNamespace(name="thor", user="nobody", home=home, lobes_dir=home / ".lobes")
    return SimpleNamespace(box=box, files=files, outside=tmp_path / "outside")


def test_restore_replaces_links_in_lobes_and_never_writes_or_chowns_through_them(
    lobes_home: SimpleNamespace, nobody: tuple[int, int]
) -> None:
    box, outside = lobes_home.box, lobes_home.outside
    env, compose = _victim(outside, "env"), _victim(outside, "compose")
    mesh_target = _victim_dir(outside, "mesh")
    box.lobes_dir.mkdir()
    os.chown(box.lobes_dir, *nobody)
    # What tests/lab/test_converge_review3.py does on purpose: ~/.lobes/.env a symlink.
    _link(env, box.lobes_dir / ".env", nobody)
    os.link(compose, box.lobes_dir / "docker-compose.yml")
    _link(mesh_target, box.lobes_dir / "mesh", nobody)
    (box.lobes_dir / "stray.yml").write_text("x: 1\n")

    changed = deployments.restore(box, {}, {})

    _untouched(env)
    _untouched(compose)
    st = mesh_target.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o750)
    for rel, (content, mode) in lobes_home.files.items():
        _plain(box.home / rel, content, nobody[0], mode)
    mesh = (box.lobes_dir / "mesh").lstat()
    assert stat.S_ISDIR(mesh.st_mode) and mesh.st_uid == deployments.GATEWAY_UID
    assert not (box.lobes_dir / "stray.yml").exists()
    assert set(changed) == {*lobes_home.files, "-.lobes/stray.yml"}
    # A second reset finds the pristine files and changes nothing.
    assert deployments.restore(box, {}, {}) == []


def test_restore_replaces_a_linked_lobes_directory_and_leaves_its_target_alone(
    lobes_home: SimpleNamespace, nobody: tuple[int, int]
) -> None:
    box = lobes_home.box
    target = _victim_dir(lobes_home.outside.parent, "elsewhere")
    _link(target, box.lobes_dir, nobody)

    deployments.restore(box, {}, {})

    # Not one file written into, or removed from, the directory the link led to.
    assert sorted(p.name for p in target.iterdir()) == ["keep"]
    assert (target / "keep").read_text() == "root's own\n"
    assert not box.lobes_dir.is_symlink() and box.lobes_dir.is_dir()
    _plain(box.lobes_dir / ".env", b"GATEWAY_IMAGE=lab\n", nobody[0], 0o600)


def test_scale_home_replaces_links_and_never_writes_or_chowns_through_them(
    tmp_path: Path, nobody: tuple[int, int], client_key: bytes
) -> None:
    home = _home(tmp_path, nobody)
    outside = tmp_path / "outside"
    bashrc, config = _victim(outside, "bashrc"), _victim(outside, "config")
    mesh_target = _victim_dir(outside, "mesh")
    _link(bashrc, home / ".bashrc", nobody)
    (home / ".docker").mkdir()
    os.chown(home / ".docker", *nobody)
    _link(config, home / ".docker" / "config.json", nobody)
    (home / "scale-thor").mkdir()
    _link(mesh_target, home / "scale-thor" / "mesh", nobody)
    box = SimpleNamespace(
        name="thor",
        kind="thor",
        user="nobody",
        home=home,
        project="scale-thor",
        lobes_dir=home / "scale-thor",
        engine=SimpleNamespace(docker_host="unix:///x.sock"),
    )
    files = {"scale-thor/.env": (b"A=1\n", 0o600), ".bashrc": (b"# rc\n", 0o644)}

    scale._home(box, files)  # type: ignore[arg-type]

    _untouched(bashrc)
    _untouched(config)
    st = mesh_target.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o750)
    _plain(home / ".bashrc", b"# rc\n", nobody[0], 0o644)
    _plain(home / "scale-thor" / ".env", b"A=1\n", nobody[0], 0o600)
    _plain(home / ".ssh" / "authorized_keys", client_key, nobody[0], 0o600)
    config_bytes = json.dumps({"currentContext": "flab-scale-thor"}).encode()
    _plain(home / ".docker" / "config.json", config_bytes, nobody[0], 0o600)
    mesh = (home / "scale-thor" / "mesh").lstat()
    assert stat.S_ISDIR(mesh.st_mode) and mesh.st_uid == deployments.GATEWAY_UID


# -- 2. `lab down` takes the scale lab down first --------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def stubbed_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """lifecycle._down with every three-box step a no-op and every path in tmp_path; scale's
    host-wide commands (ip, docker, userdel) recorded, not run."""
    noop = SimpleNamespace(
        stop=lambda *a: None,
        remove_state=lambda *a: None,
        remove_box=lambda *a: None,
        remove_user=lambda *a: None,
        remove_bridge=lambda *a: None,
    )
    for name in ("engines", "sshd", "registry", "dns", "network", "users"):
        monkeypatch.setattr(lifecycle, name, noop)
    monkeypatch.setattr(lifecycle, "BOXES", ())
    monkeypatch.setattr(lifecycle, "BUILDER", SimpleNamespace(run_dir=tmp_path / "builder"))
    monkeypatch.setattr(lifecycle, "imageset", SimpleNamespace(FINGERPRINT_FILE=tmp_path / "fp"))
    monkeypatch.setattr(lifecycle, "overlay", SimpleNamespace(OVERLAY_DIR=tmp_path / "overlay"))
    lab_dir = tmp_path / "lab"
    paths = {
        "RUN_ROOT": tmp_path / "run",
        "STATE_ROOT": tmp_path / "state",
        "LAB_DIR": lab_dir,
        "FACTS_FILE": lab_dir / "lab.json",
        "IMAGES_FILE": lab_dir / "images.yaml",
        "SECRETS_FILE": lab_dir / "secrets.json",
        "SSH_DIR": lab_dir / "ssh",
        "PRISTINE_DIR": lab_dir / "pristine",
        "LOG_DIR": lab_dir / "logs",
        "CACHE_DIR": tmp_path / "cache",
    }
    for name, path in paths.items():
        monkeypatch.setattr(lifecycle, name, path)
    monkeypatch.setattr(scale, "SCALE_RUN", tmp_path / "run" / "scale")
    monkeypatch.setattr(scale, "SCALE_DIR", lab_dir / "scale")
    monkeypatch.setattr(scale, "STATE", lab_dir / "scale" / "state.json")
    commands: list[list[str]] = []
    removed: list[str] = []

    def record(argv: list[Any], **kw: Any) -> subprocess.CompletedProcess[str]:
        commands.append([str(a) for a in argv])
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(scale, "run", record)
    monkeypatch.setattr(scale, "ok", lambda argv, **kw: False)
    monkeypatch.setattr(
        scale, "users", SimpleNamespace(remove_account=lambda u, h: removed.append(u))
    )
    real_rmtree = shutil.rmtree

    def rmtree_in_tmp(path: Any, *a: Any, **kw: Any) -> None:
        assert Path(path).is_relative_to(tmp_path), f"rmtree outside the test: {path}"
        real_rmtree(path, *a, **kw)

    monkeypatch.setattr(shutil, "rmtree", rmtree_in_tmp)
    return SimpleNamespace(commands=commands, removed=removed, tmp=tmp_path)


@pytest.fixture
def scale_sshd(stubbed_down: SimpleNamespace) -> Iterator[subprocess.Popen[bytes]]:
    """A real sshd started as the scale lab starts box `thor`'s (its config in the box's run
    dir, its pidfile there), on a loopback port instead of 10.77.0.100."""
    box = scale.boxes(1)[0]
    box.run_dir.mkdir(parents=True)
    key = stubbed_down.tmp / "hostkey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
    cfg = box.run_dir / "sshd_config"
    text = sshd.config_text(
        ["# test"], address="127.0.0.1", hostkey=key, pidfile=box.sshd_pidfile, user="nobody"
    )
    cfg.write_text(text.replace("127.0.0.1:22", f"127.0.0.1:{_free_port()}"))
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    daemon = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-f", cfg, "-E", stubbed_down.tmp / "sshd.log"],
        start_new_session=True,
    )
    try:
        identity = scale._sshd_identity(box)
        deadline = time.monotonic() + 10
        while not proc.running(box.sshd_pidfile, **identity):
            assert daemon.poll() is None and time.monotonic() < deadline, "sshd did not start"
            time.sleep(0.05)
        scale.SCALE_DIR.mkdir(parents=True)
        scale.STATE.write_text(json.dumps({"boxes": 1}) + "\n")
        yield daemon
    finally:
        if daemon.poll() is None:
            daemon.kill()
        daemon.wait(10)


def test_lab_down_takes_the_scale_lab_down_first(
    stubbed_down: SimpleNamespace, scale_sshd: subprocess.Popen[bytes]
) -> None:
    lifecycle._down(False)

    # Stopped by its pidfile before RUN_ROOT went, not left running with nothing to stop it.
    assert scale_sshd.wait(5) is not None
    assert stubbed_down.removed == ["fs-thor"]
    assert not scale.STATE.exists() and not scale.SCALE_RUN.exists()


def test_lab_down_without_a_scale_lab_leaves_scale_alone(stubbed_down: SimpleNamespace) -> None:
    lifecycle._down(False)  # no scale state: no sweep of 150 names

    assert stubbed_down.commands == [] and stubbed_down.removed == []


# -- 3. the daemons get no proxy settings ----------------------------------------------------------
def test_spawned_daemons_get_no_proxy_variable_in_any_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxies = ("HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "NO_PROXY", "Ftp_Proxy")
    for name in proxies:
        monkeypatch.setenv(name, "http://proxy.invalid:3128")
    monkeypatch.setenv("FLEET_LAB_KEPT", "yes")
    log = tmp_path / "env.log"

    proc.spawn(["/usr/bin/env"], log).wait(10)

    seen = dict(line.split("=", 1) for line in log.read_text().splitlines() if "=" in line)
    assert seen.get("FLEET_LAB_KEPT") == "yes"  # the rest of the environment is passed on
    assert [name for name in seen if name.lower().endswith("_proxy")] == []


# -- 4. the stand-in tests need the set-up's wheel, never an index -------------------------------
def test_standin_tests_fail_naming_the_setup_when_the_wheel_is_missing(tmp_path: Path) -> None:
    # pytest in a child, the lab's cache moved to an empty directory and pip given no index:
    # an old fixture downloading at test time fails and skips; a fixed one fails, naming the
    # set-up that fetches the wheel.
    child = (
        "import sys, pytest\nfrom pathlib import Path\nimport lab.config\n"
        "lab.config.CACHE_DIR = Path(sys.argv[1])\nsys.exit(pytest.main(sys.argv[2:]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LOBES_WHEEL" and not k.startswith("PIP_")}
    (tmp_path / "links").mkdir()
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}
    env["PIP_FIND_LINKS"] = str(tmp_path / "links")
    tests = [
        "tests/unit/test_standin_template.py::test_template_has_the_vllm_lanes",
        "tests/unit/test_standin_gateway.py::test_gateway_sees_a_never_healthy_lane_as_not_ready",
    ]
    args = [str(tmp_path / "cache"), "-p", "no:cacheprovider", "-q", "-rA", *tests]
    done = subprocess.run(
        [sys.executable, "-c", child, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert "skipped" not in said.lower(), said
    assert said.count("run `bash scripts/setup.sh`") >= 2, said
    assert str(tmp_path / "cache" / "wheels" / "lobes_cli-0.91.0-py3-none-any.whl") in said


# -- 5. .lab/secrets.json is never readable by others ---------------------------------------------
@pytest.fixture
def secrets_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "lab" / "secrets.json"
    monkeypatch.setattr(labfacts, "SECRETS_FILE", path)
    old = os.umask(0o022)
    try:
        yield path
    finally:
        os.umask(old)


def test_secrets_are_0600_from_the_first_byte_even_when_interrupted(
    secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(self: Path, mode: int, **kw: Any) -> None:
        raise KeyboardInterrupt  # the moment after the write, before any chmod

    with monkeypatch.context() as m:
        m.setattr(Path, "chmod", interrupted)
        m.setattr(os, "chmod", interrupted)
        with contextlib.suppress(KeyboardInterrupt):
            labfacts.lab_secrets()
    assert secrets_file.exists()
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    assert [p.name for p in secrets_file.parent.iterdir()] == ["secrets.json"]  # no temp left


def test_a_secrets_file_left_wider_is_narrowed_on_load(secrets_file: Path) -> None:
    first = labfacts.lab_secrets()
    os.chmod(secrets_file, 0o644)  # what an interrupted older lab left

    again = labfacts.lab_secrets()

    assert again == first  # loaded, not regenerated
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
