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

import errno
import grp
import hashlib
import json
import os
import pwd
import shutil
import signal
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path, PurePath

from .config import CLIENT_KEY, Box
from .proc import LabError, log, run

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


# -- files in a home the box user owns ------------------------------------------------------------
# `lab up` runs as root and writes into directories the box user owns (~, ~/.ssh, ~/.docker,
# ~/.lobes). Whatever stands at a name there may be the user's symlink (a lab test puts one in
# ~/.lobes on purpose), a hard link to another file, a FIFO: root must never write, chown or
# chmod through it. So everything below goes through directory fds opened with O_NOFOLLOW, a
# file is changed in place only when it is a plain file of one link (opened with O_NOFOLLOW,
# checked on the fd), and anything else at its name is replaced by a new file (made with
# O_EXCL beside it, renamed over the name: rename replaces a link, it never follows one).
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO would otherwise wait for a writer; O_NOCTTY: a tty stays ours.
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
# What opening a name with O_NOFOLLOW says when no plain file is there: a symlink (ELOOP), a
# directory (EISDIR), a socket (ENXIO), a running executable (ETXTBSY, for writing).
_NOT_A_FILE = (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ETXTBSY)


def _own(fd: int, uid: int, gid: int, mode: int) -> bool:
    """uid:gid and `mode` on what `fd` holds; True when anything had to change."""
    st = os.fstat(fd)
    changed = False
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.fchown(fd, uid, gid)
        changed = True
    if stat.S_IMODE(st.st_mode) != mode:  # after the chown, which clears set-id bits
        os.fchmod(fd, mode)
        changed = True
    return changed


def _open_subdir(parent: int, name: str, uid: int, gid: int, mode: int | None, where: Path) -> int:
    """An fd of directory `name` in `parent`, made (uid:gid, `mode` or 0700) when missing. A
    symlink or a non-directory at that name is removed and a directory made instead, never
    followed. An existing directory gets uid:gid and `mode` only when `mode` is given."""
    for _ in range(5):  # the user may be changing the name meanwhile: a few tries, then fail
        made = False
        with suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
            made = True
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            os.unlink(name, dir_fd=parent)  # removes the link itself, not what it points at
            continue
        if made or mode is not None:
            try:
                _own(fd, uid, gid, 0o700 if mode is None else mode)
            except BaseException:
                os.close(fd)
                raise
        return fd
    raise LabError(f"{where / name}: a directory belongs there and it keeps being replaced")


@contextmanager
def subdir(
    parent: int, name: str, uid: int, gid: int, mode: int | None = None, *, where: Path
) -> Iterator[int]:
    """`_open_subdir` as a context manager (the fd is closed on exit); `where`: the parent's
    path, for messages."""
    fd = _open_subdir(parent, name, uid, gid, mode, where)
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def home_dir(
    home: Path, rel: str | PurePath, uid: int, gid: int, mode: int | None = None
) -> Iterator[int]:
    """An fd of the directory home/rel, every missing level made (uid:gid, 0700; the last one
    `mode` when given); a symlink on the way is replaced by a directory, never followed.

    `home` itself must be a directory (a user cannot swap their home: /home is root's)."""
    parts = PurePath(rel).parts
    if PurePath(rel).is_absolute() or ".." in parts:
        raise ValueError(f"{rel}: not a path inside the home")
    fd = os.open(home, _DIR_FLAGS)
    try:
        for i, name in enumerate(parts):
            level_mode = mode if i == len(parts) - 1 else None
            nxt = _open_subdir(fd, name, uid, gid, level_mode, home.joinpath(*parts[:i]))
            os.close(fd)
            fd = nxt
        if not parts and mode is not None:
            _own(fd, uid, gid, mode)
        yield fd
    finally:
        os.close(fd)


def read_at(dir_fd: int, name: str) -> bytes | None:
    """The content of `name` in `dir_fd` when it is a plain file; None when it is absent or
    anything else (a symlink is not followed)."""
    try:
        fd = os.open(name, os.O_RDONLY | _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in _NOT_A_FILE:
            return None
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return handle.read()


def plain_files(dir_fd: int) -> list[str]:
    """Names of the plain files in `dir_fd` (no symlinks, no directories), sorted."""
    with os.scandir(dir_fd) as entries:
        return sorted(e.name for e in entries if e.is_file(follow_symlinks=False))


def write_at(dir_fd: int, name: str, content: bytes, uid: int, gid: int, mode: int) -> bool:
    """Make `name` in `dir_fd` a plain file holding `content`, uid:gid, `mode`, never through a
    link. True when anything had to change."""
    try:
        fd: int | None = os.open(name, os.O_RDWR | _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        fd = None
    except OSError as e:
        if e.errno not in _NOT_A_FILE:
            raise
        fd = None
    if fd is not None:
        with os.fdopen(fd, "r+b") as handle:
            st = os.fstat(fd)
            # In place (the inode a running container bind-mounts keeps its new content) only
            # for a plain file no other name shares: a hard link's other name may be anyone's.
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                changed = handle.read() != content
                if changed:
                    handle.seek(0)
                    handle.truncate()
                    handle.write(content)
                    handle.flush()
                return _own(fd, uid, gid, mode) or changed
    _replace_at(dir_fd, name, content, uid, gid, mode)
    return True


def _replace_at(dir_fd: int, name: str, content: bytes, uid: int, gid: int, mode: int) -> None:
    tmp = f".{name}.lab-{os.urandom(6).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            _own(fd, uid, gid, mode)
        with suppress(FileNotFoundError):
            if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                shutil.rmtree(name, dir_fd=dir_fd)  # a directory where the file belongs
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def write_file(home: Path, rel: str, content: bytes, uid: int, gid: int, mode: int) -> bool:
    """home/rel made a plain file (see write_at), missing directories on the way made 0700
    uid:gid; nothing on the way is followed. True when anything had to change."""
    path = PurePath(rel)
    with home_dir(home, path.parent, uid, gid) as d:
        return write_at(d, path.name, content, uid, gid, mode)


def login_files(box: Box) -> dict[str, str]:
    """The pristine ~/.bashrc and ~/.profile (relative name -> content)."""
    fmt = {"user": box.user, "box": box.name}
    return {".bashrc": BASHRC.format(**fmt), ".profile": PROFILE.format(**fmt)}


def ensure_home(box: Box) -> None:
    """Login files, authorized_keys and the docker context; rewritten only when they differ.
    Nothing the user put in the way (a symlink, a hard link) is followed: see write_at."""
    uid, gid = uid_gid(box)
    for name, text in login_files(box).items():
        write_file(box.home, name, text.encode(), uid, gid, 0o644)

    with home_dir(box.home, ".ssh", uid, gid, 0o700) as ssh_dir:
        pub = CLIENT_KEY.with_suffix(".pub").read_bytes()
        write_at(ssh_dir, "authorized_keys", pub, uid, gid, 0o600)

    # A docker context written as files (what `docker context create` + `use` would write):
    # the metadata directory is named by the sha256 of the context name.
    name = context_name(box)
    meta_rel = PurePath(".docker", "contexts", "meta", hashlib.sha256(name.encode()).hexdigest())
    for level in reversed([meta_rel, *meta_rel.parents[:-1]]):
        with home_dir(box.home, level, uid, gid, 0o700):
            pass
    meta = {
        "Name": name,
        "Metadata": {"Description": f"fleet lab box {box.name}: this box's own dockerd"},
        "Endpoints": {"docker": {"Host": box.docker_host, "SkipTLSVerify": False}},
    }
    with home_dir(box.home, meta_rel, uid, gid) as meta_dir:
        write_at(meta_dir, "meta.json", json.dumps(meta).encode(), uid, gid, 0o600)
    with home_dir(box.home, ".docker", uid, gid) as docker_dir:
        # Read without following a link too: a config.json linked to a file only root may
        # read would otherwise be copied into the user's own.
        config: dict[str, object] = {}
        raw = read_at(docker_dir, "config.json")
        if raw is not None:
            try:
                loaded = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                loaded = {}
            config = loaded if isinstance(loaded, dict) else {}
        config["currentContext"] = name
        text = json.dumps(config, indent=1) + "\n"
        write_at(docker_dir, "config.json", text.encode(), uid, gid, 0o600)


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
