"""The @openssh connector's file transfer is byte-exact both ways (pyinfra's files.put/get).

Every box is `@openssh` (inventory.py), so `files.put`/`files.template` upload through
OpenSSHConnector.put_file: a byte more or less (an appended newline) and the file's checksum
never matches, so it is uploaded again on every run; a binary file must not fail. Only the
network is faked: `ssh` on PATH runs the remote command line with a local `sh`, so the real
ssh_argv, run_bounded, pyinfra's command wrapping (sudo) and the box's cat/base64 all run.
"""

from __future__ import annotations

import io
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, all_argument_meta
from pyinfra.api.config import Config

from reconciler.observe import openssh_connector

# No final newline, CR LF, NUL, bytes that are not UTF-8: what a PNG starts with, and more.
BINARY = b"\x89PNG\r\n\x1a\n\x00\xff\xfe" + bytes(range(256)) + b"no newline at end"
CASES = [
    b"no newline at end",
    b"two newlines\n\n",
    b"",
    BINARY,
    BINARY * 3000,  # ~800 KiB: more than a pipe holds, in both directions
]


def pyinfra_arguments(**given: Any) -> dict[str, Any]:
    """The connector arguments pyinfra's FileUploadCommand/FileDownloadCommand pass: every one,
    at its default (`_stdin=None` included), and those an operation gives."""
    defaults = {key: all_argument_meta[key].default(Config()) for key in CONNECTOR_ARGUMENT_KEYS}
    return {**defaults, **given}


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A connector whose `ssh` runs the remote command locally; `ran` lists the commands."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    ran = tmp_path / "ran"
    (bindir / "ssh").write_text(
        '#!/bin/sh\neval "last=\\${$#}"\nprintf "%s\\n" "$last" >> ' + f"'{ran}'\n"
        'exec sh -c "$last"\n',
        encoding="utf-8",
    )
    # sudo's options dropped, the rest run as is: what reaches the file is what sudo passed on.
    (bindir / "sudo").write_text(
        '#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n', encoding="utf-8"
    )
    for program in bindir.iterdir():
        program.chmod(0o700)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    # A short private dir: a control socket path under pytest's tmp_path is too long for ssh.
    runtime = Path(tempfile.mkdtemp(prefix="oc-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    connector = openssh_connector.OpenSSHConnector.__new__(openssh_connector.OpenSSHConnector)
    connector.state = SimpleNamespace()  # type: ignore[assignment]
    connector.host = SimpleNamespace(  # type: ignore[assignment]
        name="thor",
        print_prefix="[thor] ",
        connector_data={},
        data={"ssh_hostname": "10.77.0.11", "ssh_user": "fl-thor"},
    )
    remote = tmp_path / "remote"
    remote.mkdir()
    yield {"connector": connector, "remote": remote, "ran": ran}
    shutil.rmtree(runtime)


@pytest.mark.parametrize("data", CASES, ids=["no-newline", "newlines", "empty", "png", "large"])
def test_put_file_writes_exactly_the_bytes_given(box: dict[str, Any], data: bytes) -> None:
    dest = box["remote"] / "f"
    assert box["connector"].put_file(io.BytesIO(data), str(dest), **pyinfra_arguments()) is True
    assert dest.read_bytes() == data
    assert data[:8] not in box["ran"].read_bytes() or not data  # on stdin, not the command line


@pytest.mark.parametrize("data", CASES, ids=["no-newline", "newlines", "empty", "png", "large"])
def test_get_file_reads_exactly_the_bytes_on_the_box(box: dict[str, Any], data: bytes) -> None:
    src = box["remote"] / "f"
    src.write_bytes(data)
    into = io.BytesIO()
    assert box["connector"].get_file(str(src), into, **pyinfra_arguments()) is True
    assert into.getvalue() == data


def test_filenames_text_io_and_sudo_round_trip(
    box: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    connector = box["connector"]
    said: list[str] = []  # pyinfra's echo (the CLI sets it; a no-op otherwise)
    monkeypatch.setattr(
        openssh_connector, "echo", lambda line, **_: said.append(line), raising=False
    )
    local = tmp_path / "local.png"
    local.write_bytes(BINARY)
    dest = box["remote"] / "name with 'quote'"
    # A local file name, as files.put gives it; sudo wraps the command and stdin passes through.
    assert (
        connector.put_file(
            str(local), str(dest), print_output=True, **pyinfra_arguments(_sudo=True)
        )
        is True
    )
    assert dest.read_bytes() == BINARY
    assert "sudo" in box["ran"].read_text(encoding="utf-8", errors="replace")
    back = tmp_path / "back.png"
    assert (
        connector.get_file(str(dest), str(back), print_output=True, **pyinfra_arguments(_sudo=True))
        is True
    )
    assert back.read_bytes() == BINARY
    assert said == [f"[thor] file uploaded: {dest}", f"[thor] file downloaded: {dest}"]
    # A text file object goes as its UTF-8, as pyinfra's own put_file sends it.
    text = "é\nno newline"
    assert connector.put_file(io.StringIO(text), str(dest)) is True
    assert dest.read_bytes() == text.encode()


def test_a_failure_or_an_answer_that_is_not_the_file_raises(box: dict[str, Any]) -> None:
    connector = box["connector"]
    with pytest.raises(OSError, match="missing"):
        connector.get_file(str(box["remote"] / "missing"), io.BytesIO())
    with pytest.raises(OSError, match="nodir"):
        connector.put_file(io.BytesIO(b"x"), str(box["remote"] / "nodir" / "f"))
    # A login script that writes on stdout: its words are never taken for the file's bytes.
    (box["remote"] / "f").write_bytes(b"content")
    profile = 'echo "Welcome to thor!"; '
    ssh = Path(box["ran"]).parent / "bin" / "ssh"
    ssh.write_text(
        ssh.read_text(encoding="utf-8").replace('exec sh -c "$last"', profile + 'sh -c "$last"'),
        encoding="utf-8",
    )
    into = io.BytesIO()
    with pytest.raises(OSError, match="not base64"):
        connector.get_file(str(box["remote"] / "f"), into)
    assert into.getvalue() == b""
