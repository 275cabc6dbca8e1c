"""Review 3 of the SSH transport: a shared master connection must never serve a run whose own
settings would have refused the box.

1. ssh's %C names a master by local host, host, port and user only, and ssh never
   authenticates a command sent through a master: a known_hosts re-pinned to refuse the box's
   host key, or a key the box no longer accepts, went unnoticed while a master lived. The
   master's name now covers every setting that decides trust or identity, files by content.
2. The sockets' directory was checked (ours, 0700, not a link), but not what is above it: in
   a directory others may write (no sticky bit), the checked directory can be renamed away
   after the once-a-process check and another put in its place.

Tests run as root, so "another owner" is made with os.chown to nobody.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reconciler.observe import transport
from reconciler.observe.transport import Target, control_dir, control_path, private_dir, ssh_argv

NOBODY = 65534


@pytest.fixture
def base(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short directory under /tmp (pytest's tmp_path is too long for ssh's sockets), the
    runtime directory by default, and no remembered verdict or file digest."""
    made = Path(tempfile.mkdtemp(prefix="r3", dir="/tmp"))
    for name in ("XDG_RUNTIME_DIR", "TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(made))
    private_dir.cache_clear()
    getattr(transport, "_IDENTITIES", {}).clear()
    yield made
    private_dir.cache_clear()
    shutil.rmtree(made, ignore_errors=True)


def _keypair(path: Path) -> None:
    """A real ed25519 key pair, as ssh-keygen writes it (`path` and `path`.pub)."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fleet", "-f", str(path)],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def files(base: Path) -> dict[str, Path]:
    """The operator's key and a known_hosts pinning thor's host key, and spare copies."""
    keys = base / "keys"
    keys.mkdir()
    for name in ("id", "other_id", "host", "other_host"):
        _keypair(keys / name)
    pin = keys / "known_hosts"
    pin.write_text("10.0.0.11 " + " ".join((keys / "host.pub").read_text().split()[:2]) + "\n")
    return {"dir": keys, "key": keys / "id", "known_hosts": pin}


def _target(files: dict[str, Path], **changes: object) -> Target:
    target = Target("thor", "10.0.0.11", "lobes", 22, str(files["key"]), str(files["known_hosts"]))
    return target._replace(**changes)


def _replace_in_place(path: Path, data: bytes) -> None:
    """`path` given new bytes of its old size and its old mtime (an editor's or a script's
    re-pin): only its content and ctime say it changed."""
    before = path.stat()
    assert len(data) == before.st_size
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _repin(files: dict[str, Path]) -> Target:
    """thor's pin replaced, at the same path, by another host key: ssh must refuse thor."""
    other = " ".join((files["dir"] / "other_host.pub").read_text().split()[:2])
    _replace_in_place(files["known_hosts"], f"10.0.0.11 {other}\n".encode())
    return _target(files)


def _rekey(files: dict[str, Path]) -> Target:
    """The key replaced, at the same path, by one the box does not accept (a revoked key)."""
    _replace_in_place(files["key"], (files["dir"] / "other_id").read_bytes())
    return _target(files)


def _certified(files: dict[str, Path]) -> Target:
    """A certificate beside the key (ssh offers KEY-cert.pub on its own): another identity."""
    shutil.copy(files["dir"] / "id.pub", f"{files['key']}-cert.pub")
    return _target(files)


def _other_key_path(files: dict[str, Path]) -> Target:
    return _target(files, key_file=str(files["dir"] / "other_id"))


def _other_pin_path(files: dict[str, Path]) -> Target:
    copy = files["dir"] / "known_hosts.copy"
    shutil.copy(files["known_hosts"], copy)  # the same pins: still another file ssh reads
    return _target(files, known_hosts=str(copy))


CHANGES: dict[str, Callable[[dict[str, Path]], Target]] = {
    "host": lambda f: _target(f, hostname="10.0.0.12"),
    "port": lambda f: _target(f, port=2222),
    "user": lambda f: _target(f, user="root"),
    "no key file": lambda f: _target(f, key_file=None),
    "key path": _other_key_path,
    "key content": _rekey,
    "key certificate": _certified,
    "no known_hosts": lambda f: _target(f, known_hosts=None),
    "known_hosts path": _other_pin_path,
    "known_hosts content": _repin,
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_master_is_never_shared_across_a_change_of_trust_or_identity(
    files: dict[str, Path], change: str
) -> None:
    before = control_path(_target(files))
    assert before is not None
    after = CHANGES[change](files)
    path = control_path(after)
    assert path is not None and path != before
    assert _control_path_option(ssh_argv(after, "true")) == str(path)


def test_unchanged_settings_keep_their_master(files: dict[str, Path]) -> None:
    """What a repeated drift relies on: the same settings, the same socket, in every process
    (a fresh interpreter computes the same name), and it is the one ssh is told."""
    target = _target(files)
    path = control_path(target)
    assert path is not None and path.parent == control_dir()
    assert control_path(target) == path
    # the box's name is not the connection's; ssh lower-cases the host name it connects to
    assert control_path(target._replace(box="other")) == path
    named = control_path(target._replace(hostname="Thor.LAN"))
    assert named == control_path(target._replace(hostname="thor.lan")) != path
    assert _control_path_option(ssh_argv(target, "true")) == str(path)
    # a socket path always fits sun_path with ssh's temporary suffix (socket_dir_problem)
    assert len(path.name) == 40 and int(path.name, 16) >= 0
    fresh = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from reconciler.observe.transport import Target, control_path; "
            "print(control_path(Target(*sys.argv[1:4], int(sys.argv[4]), *sys.argv[5:])))",
            *map(str, target),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert fresh.stdout.strip() == str(path)


def test_a_looser_host_key_policy_is_another_master(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _target(files)
    strict = control_path(target)
    real = transport.trust_options
    loose = [
        o.replace("StrictHostKeyChecking=yes", "StrictHostKeyChecking=accept-new")
        for o in real(target)
    ]
    monkeypatch.setattr(transport, "trust_options", lambda t: loose)
    assert control_path(target) != strict


def test_a_fifo_in_a_key_s_place_does_not_hang_the_run(files: dict[str, Path]) -> None:
    files["key"].unlink()
    os.mkfifo(files["key"])  # no writer: a blocking open would wait forever
    assert control_path(_target(files)) is not None


def _control_path_option(argv: list[str]) -> str:
    (value,) = [a.removeprefix("ControlPath=") for a in argv if a.startswith("ControlPath=")]
    assert value.startswith('"') and value.endswith('"')  # quoted for ssh's config parser
    return value[1:-1].replace("%%", "%")


# -- 2. the directories above the sockets' one -----------------------------------------------
def _others_may_write(path: Path) -> None:
    path.mkdir()
    path.chmod(0o777)


def _another_user_s(path: Path) -> None:
    path.mkdir(mode=0o755)
    os.chown(path, NOBODY, NOBODY)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_others_may_write, "which others may write (mode 0777, no sticky bit)"),
        (_another_user_s, f"which belongs to uid {NOBODY}"),
    ],
)
def test_sockets_under_a_directory_others_can_change_are_not_shared(
    base: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], None],
    reason: str,
) -> None:
    runtime = base / "shared"
    make(runtime)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert control_dir() is None
    argv = ssh_argv(Target("thor", "10.0.0.11", "lobes", 22, None, None), "true")
    assert "ControlPath=none" in argv
    (said,) = capsys.readouterr().err.splitlines()
    assert said.startswith("reconcile: not sharing SSH connections: ")
    assert f"is under {runtime}, {reason}" in said


def test_a_sticky_directory_others_may_write_is_fine(
    base: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime = base / "tmp"
    runtime.mkdir()
    runtime.chmod(0o1777)  # as /tmp: only an entry's owner may rename it
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert control_dir() == runtime / f"fleet-reconciler-ssh-{os.getuid()}"
    assert capsys.readouterr().err == ""


def test_a_runtime_directory_behind_a_link_is_used_by_its_real_path(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked once, used all run long: a link could be re-pointed in between, its real path
    cannot (its owner and every directory above it are checked)."""
    real = base / "real"
    real.mkdir(mode=0o700)
    (base / "link").symlink_to(real)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base / "link"))
    sockets = control_dir()
    assert sockets == real / f"fleet-reconciler-ssh-{os.getuid()}"
    path = control_path(Target("thor", "10.0.0.11", "lobes", 22, None, None))
    assert path is not None and path.parent == sockets


def test_a_key_shared_by_many_boxes_is_read_once_and_a_change_is_still_seen(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Digests are remembered under the file's stamps; here every file counts as settled (a
    real one must be a few seconds old: a younger one is read every time)."""
    monkeypatch.setattr(transport, "_RACY_NS", -(10**30))
    reads: list[str] = []
    real = transport._read_identity
    monkeypatch.setattr(transport, "_read_identity", lambda p: reads.append(p) or real(p))
    first = [control_path(_target(files, box=f"b{i}", hostname=f"10.0.1.{i}")) for i in range(50)]
    assert len(set(first)) == 50
    assert reads.count(str(files["known_hosts"])) == 1 and reads.count(str(files["key"])) == 1
    with files["known_hosts"].open("a") as pin:  # another host key pinned beside it
        pin.write(
            "10.0.0.11 " + " ".join((files["dir"] / "other_host.pub").read_text().split()[:2])
        )
    assert control_path(_target(files, box="b0", hostname="10.0.1.0")) != first[0]


def test_the_same_files_through_a_symlinked_directory_name_the_same_master(
    files: dict[str, Path],
) -> None:
    """`reconcile --root current` (a `current -> release` link) and pyinfra's inventory.py
    (which resolves its own path) name the key and pin by different paths: one master all
    the same, not a second one per box."""
    linked = files["dir"].parent / "current"
    linked.symlink_to(files["dir"], target_is_directory=True)
    through_link = _target(
        files, key_file=str(linked / "id"), known_hosts=str(linked / "known_hosts")
    )
    assert transport.connection_name(through_link) == transport.connection_name(_target(files))
