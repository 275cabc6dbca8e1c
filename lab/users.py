"""Each box's Unix user: own home, own login files, own docker context, own SSH key entry.

Why a docker *context* (and not a mount namespace that bind-mounts the box socket onto
/var/run/docker.sock): the context lives in ~/.docker/config.json, which every docker and
compose invocation reads as long as HOME is set, so it survives `env -i PATH=… HOME=…`,
non-interactive SSH commands, pyinfra's shell and cron alike, with no per-session setup and
no privileged helper. A mount namespace would have to be entered by sshd for every session
(and by anything else that runs as the user), which is exactly the kind of hidden plumbing
that makes a lab differ from a real box.

Isolation comes from the socket itself: the box's dockerd creates it as root:<user> 0660 and
its run directory is root:<user> 0750, so fl-thor cannot even reach spark's socket path.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import shutil
import signal
from pathlib import Path

from .config import CLIENT_KEY, Box
from .proc import log, run

# The pristine login files. No "return unless interactive" guard at the top (Debian's skel
# has one): operators on these boxes put exports in ~/.bashrc and expect `bash -lc` to see
# them, which is precisely how a shell-exported key reaches compose (seed incident #209).
BASHRC = """\
# ~/.bashrc of {user} on lab box {box} (written by the fleet lab; `lab up` restores it)
# Login shells read this through ~/.profile; anything exported here reaches
# `docker compose` when it is run from a login shell.
export PATH="$HOME/.local/bin:$PATH"
alias ll='ls -l'
"""

PROFILE = """\
# ~/.profile of {user} on lab box {box} (written by the fleet lab)
if [ -n "$BASH_VERSION" ] && [ -f "$HOME/.bashrc" ]; then
    . "$HOME/.bashrc"
fi
"""


def context_name(box: Box) -> str:
    return f"flab-{box.name}"


def user_exists(box: Box) -> bool:
    try:
        pwd.getpwnam(box.user)
    except KeyError:
        return False
    return True


def uid_gid(box: Box) -> tuple[int, int]:
    pw = pwd.getpwnam(box.user)
    return pw.pw_uid, pw.pw_gid


def ensure_user(box: Box) -> None:
    if not user_exists(box):
        log(f"user {box.user} ({box.home})")
        run(
            [
                "useradd",
                "--create-home",
                "--home-dir",
                box.home,
                "--shell",
                "/bin/bash",
                "--user-group",
                "--comment",
                f"fleet lab box {box.name}",
                box.user,
            ]
        )
    # '*' rather than useradd's '!': with UsePAM no, sshd refuses a '!'-locked account even
    # for key auth; '*' still matches no password, so password login stays impossible.
    shadow = run(["getent", "shadow", box.user]).stdout.split(":")
    if len(shadow) > 1 and shadow[1] != "*":
        run(["usermod", "--password", "*", box.user])
    os.chmod(box.home, 0o750)  # separate homes: fl-spark cannot read fl-thor's ~/.lobes


def _write(path: Path, text: str, uid: int, gid: int, mode: int) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    os.chown(path, uid, gid)
    os.chmod(path, mode)


def _mkdir(path: Path, uid: int, gid: int, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, gid)
    os.chmod(path, mode)


def login_files(box: Box) -> dict[str, str]:
    """The pristine ~/.bashrc and ~/.profile (relative name -> content)."""
    fmt = {"user": box.user, "box": box.name}
    return {".bashrc": BASHRC.format(**fmt), ".profile": PROFILE.format(**fmt)}


def ensure_home(box: Box) -> None:
    """Login files, authorized_keys and the docker context; rewritten only when they differ."""
    uid, gid = uid_gid(box)
    for name, text in login_files(box).items():
        _write(box.home / name, text, uid, gid, 0o644)

    ssh_dir = box.home / ".ssh"
    _mkdir(ssh_dir, uid, gid, 0o700)
    pub = CLIENT_KEY.with_suffix(".pub").read_text()
    _write(ssh_dir / "authorized_keys", pub, uid, gid, 0o600)

    # A docker context written as files (what `docker context create` + `use` would write):
    # the metadata directory is named by the sha256 of the context name.
    name = context_name(box)
    docker_dir = box.home / ".docker"
    _mkdir(docker_dir, uid, gid, 0o700)
    meta_dir = docker_dir / "contexts" / "meta" / hashlib.sha256(name.encode()).hexdigest()
    for d in (docker_dir / "contexts", docker_dir / "contexts" / "meta", meta_dir):
        _mkdir(d, uid, gid, 0o700)
    meta = {
        "Name": name,
        "Metadata": {"Description": f"fleet lab box {box.name}: this box's own dockerd"},
        "Endpoints": {"docker": {"Host": box.docker_host, "SkipTLSVerify": False}},
    }
    _write(meta_dir / "meta.json", json.dumps(meta), uid, gid, 0o600)
    config_path = docker_dir / "config.json"
    config: dict[str, object] = {}
    if config_path.exists():
        try:
            config = json.loads(config_path.read_text())
        except json.JSONDecodeError:
            config = {}
    config["currentContext"] = name
    _write(config_path, json.dumps(config, indent=1) + "\n", uid, gid, 0o600)


def ensure_run_dir(box: Box) -> None:
    """root:<user> 0750: the box user can reach its socket, no other lab user can."""
    box.run_dir.mkdir(parents=True, exist_ok=True)
    os.chown(box.run_dir, 0, grp.getgrnam(box.docker_group).gr_gid)
    os.chmod(box.run_dir, 0o750)


def remove_user(box: Box) -> None:
    remove_account(box.user, box.home)


def remove_account(user: str, home: Path) -> None:
    """A lab user (a box's or a scale box's): its SSH sessions ended, the account, its home
    and its group removed."""
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        uid = None
    if uid is not None:
        log(f"remove user {user}")
        kill_processes_of(uid)
        # Root-owned files (container logs, caches) live in the home; userdel -r handles them.
        run(["userdel", "--remove", user], check=False)
    if home.exists():
        shutil.rmtree(home, ignore_errors=True)
    try:
        grp.getgrnam(user)
    except KeyError:
        pass
    else:
        run(["groupdel", user], check=False)


def kill_processes_of(uid: int) -> None:
    """Sessions left behind by SSH (sshd's children outlive the listener) block userdel."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == uid:
                os.kill(int(entry.name), signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
