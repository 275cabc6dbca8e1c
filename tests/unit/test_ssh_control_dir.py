"""Issue 10, class 7: the SSH control directory is used only when it is the user's own, a real
directory and mode 0700. Anyone who can write it can put their own socket where ssh looks for
the master connection, and then receives every command and every secret sent on stdin.

Tests run as root, so "another owner" is made with os.chown to nobody."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.observe import transport
from reconciler.observe.transport import Target, control_dir, private_dir, ssh_argv

NOBODY = 65534


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh XDG_RUNTIME_DIR and no remembered verdict from an earlier test. Under /tmp, not
    pytest's tmp_path: that is too long for ssh's sockets (transport.socket_dir_problem)."""
    base = Path(tempfile.mkdtemp(prefix="run", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    private_dir.cache_clear()
    yield base
    private_dir.cache_clear()
    shutil.rmtree(base, ignore_errors=True)


def _sockets(base: Path) -> Path:
    return base / f"fleet-reconciler-ssh-{os.getuid()}"


def _sharing(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith(("ControlMaster=", "ControlPath=", "ControlPersist="))]


TARGET = Target("thor", "10.0.0.11", "lobes", 22, None, None)


def test_a_missing_directory_is_created_0700_and_used(
    runtime: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = os.umask(0)  # whatever the umask, the directory is private
    try:
        path = control_dir()
    finally:
        os.umask(old)
    assert path == _sockets(runtime)
    info = path.lstat()
    assert info.st_mode & 0o777 == 0o700 and info.st_uid == os.getuid()
    socket = transport.control_path(TARGET)  # its name: test_review3_transport.py
    assert socket is not None and socket.parent == path
    assert _sharing(ssh_argv(TARGET, "true")) == [
        "ControlMaster=auto",
        f'ControlPath="{socket}"',  # quoted for ssh's config parser
        "ControlPersist=120",
    ]
    assert capsys.readouterr().err == ""


def _world_readable(path: Path) -> None:
    path.mkdir(mode=0o700)
    path.chmod(0o755)


def _other_owner(path: Path) -> None:
    path.mkdir(mode=0o700)
    os.chown(path, NOBODY, NOBODY)


def _symlink(path: Path) -> None:
    target = path.with_name("elsewhere")
    target.mkdir(mode=0o700)
    path.symlink_to(target)


def _a_file(path: Path) -> None:
    path.write_text("")


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_world_readable, "has mode 0755, not 0700"),
        (_other_owner, f"belongs to uid {NOBODY}"),
        (_symlink, "is a symbolic link"),
        (_a_file, "is not a directory"),
    ],
)
def test_a_directory_that_is_not_private_is_not_used(
    runtime: Path, capsys: pytest.CaptureFixture[str], make: object, reason: str
) -> None:
    path = _sockets(runtime)
    make(path)  # type: ignore[operator]
    before = path.lstat()

    assert control_dir() is None
    argv = ssh_argv(TARGET, "true")
    ssh_argv(TARGET, "true")
    assert _sharing(argv) == ["ControlMaster=no", "ControlPath=none"]
    assert not any(str(path) in a for a in argv)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1  # said once, with the reason
    assert err[0].startswith(f"reconcile: not sharing SSH connections: {path} ")
    assert reason in err[0]
    after = path.lstat()  # and left as it was: not chmod-ed, not replaced
    assert (after.st_mode, after.st_uid, after.st_ino) == (
        before.st_mode,
        before.st_uid,
        before.st_ino,
    )


def test_a_base_where_nothing_can_be_created_shares_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing" / "run"))
    private_dir.cache_clear()
    try:
        assert _sharing(ssh_argv(TARGET, "true")) == ["ControlMaster=no", "ControlPath=none"]
    finally:
        private_dir.cache_clear()
    assert "cannot be created" in capsys.readouterr().err


def test_the_check_is_done_once_per_process(runtime: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []
    real = transport.private_dir_problem
    monkeypatch.setattr(transport, "private_dir_problem", lambda p: calls.append(p) or real(p))
    for _ in range(3):
        ssh_argv(TARGET, "true")
    assert calls == [_sockets(runtime)]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TMPDIR": "/srv/tmp"}, "/srv/tmp"),
        ({"TMPDIR": "relative/tmp", "TMP": "/var/tmp"}, "/var/tmp"),  # a relative one is skipped
        ({"TEMP": "/t1", "TMP": "/t2"}, "/t1"),  # tempfile's order: TMPDIR, TEMP, TMP
        ({}, "/tmp"),
        ({"XDG_RUNTIME_DIR": "/run/user/7", "TMPDIR": "/srv/tmp"}, "/run/user/7"),
    ],
)
def test_the_sockets_go_where_the_runtime_or_temporary_directory_is(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    for name in ("XDG_RUNTIME_DIR", "TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert transport._runtime_base() == expected
