"""A collector's payload travels on stdin, never in a command line.

The payload holds the run's HMAC key and every desired setting, a secret carried inline in one
(`--api-key x`) included. A command line is readable by every user of either machine
(/proc/PID/cmdline, `ps`): ssh's argv on the controller, `sh -c`'s and python3's on the box.
So the command line is the program and `-`, and the payload goes on stdin with the
controller_env secrets, as apply sends its own (reconciler/apply/boxcall.py).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import shlex
import stat
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from reconciler.observe import collectors, transport
from reconciler.observe.transport import Target, ssh_argv
from tests.unit.conftest import load_box_program

RUN_KEY = "f00dfeed" * 4
INLINE = "canary-inline-0123456789abcdef"  # a secret a setting carries inline
SENT = "canary-sent-0123456789abcdef"  # a controller_env secret's value


def _payload(directory: str = "/nonexistent/lobes", port: int = 9) -> dict[str, Any]:
    return {
        "run_key": RUN_KEY,
        "directory": directory,
        "project": "lobes",
        "compose_files": ["docker-compose.yml"],
        "managed_env": {"VLLM_ARGS": "--api-key " + INLINE, "GW": {"secret": "gw"}},
        "box_secrets": {},
        "controller_secrets": {"gw": "FLEET_REVIEW2_GW"},
        "secret_patterns": [],
        "gateway_port": port,
        "timeout_s": 3,
        "probe_timeout_s": 1,
        "knob_argv": {"VLLM_ARGS": ["--api-key", INLINE]},
    }


def _values(node: Any) -> list[str]:
    """Every string in a payload, keys aside: none may reach a command line."""
    if isinstance(node, dict):
        return [v for value in node.values() for v in _values(value)]
    if isinstance(node, list):
        return [v for value in node for v in _values(value)]
    return [node] if isinstance(node, str) and len(node) >= 8 else []


def _readable(words: list[str]) -> str:
    """The words as they are and, for each one that is base64, decoded: what a reader of the
    command line learns from it."""
    seen = list(words)
    for word in words:
        for piece in shlex.split(word) if " " in word else [word]:
            with contextlib.suppress(binascii.Error, ValueError):
                seen.append(base64.b64decode(piece, validate=True).decode("utf-8", "replace"))
    return "\n".join(seen)


def _assert_holds_nothing(words: list[str], payload: dict[str, Any]) -> None:
    text = _readable(words)
    for secret in (RUN_KEY, INLINE, SENT, "/nonexistent/lobes"):
        assert secret not in text
    assert not [v for v in _values(payload) if v in text and v not in ("lobes",)]


def test_the_remote_command_line_holds_nothing_of_the_payload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: dict[str, tuple[str, bytes | None]] = {}
    monkeypatch.setattr(
        collectors,
        "spawn",
        lambda target, cmd, stdin=None: sent.setdefault(target.box, (cmd, stdin)),
    )
    targets = {"thor": Target("thor", "10.77.0.11", "fl-thor", 22, None, None)}
    payload = _payload()
    collectors.start_collectors(targets, {"thor": payload}, {"FLEET_REVIEW2_GW": SENT})
    command, stdin = sent["thor"]
    _assert_holds_nothing(shlex.split(command), payload)
    _assert_holds_nothing(ssh_argv(targets["thor"], command), payload)  # the controller's argv
    assert shlex.split(command)[-1] == "-"
    assert stdin is not None
    assert json.loads(stdin) == {"payload": payload, "sent": {"gw": SENT}}


def _fake_ssh(tmp_path: Path) -> Path:
    """An `ssh` that records its argv (NUL-separated) and runs its last word, the remote
    command, with `sh -c` as sshd does: that word is also the box's `sh -c` argv."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    ssh = bindir / "ssh"
    ssh.write_text(
        "#!/bin/sh\n"
        'printf "%s\\0" "$@" >> "$FAKE_SSH_RECORD"\n'
        "for last; do :; done\n"
        'exec sh -c "$last"\n',
        encoding="utf-8",
    )
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    python3 = bindir / "python3"  # the box's python3: this interpreter
    python3.symlink_to(sys.executable)
    return bindir


def test_a_collector_run_reads_its_payload_and_secrets_from_stdin_and_argv_holds_neither(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real program, launched as the transport launches it (through an `ssh` that runs
    the command here): it answers for the payload it was sent, hashes the controller's
    secret, and no argv on the way (ssh's, the box's `sh -c`) held the key or a value."""
    bindir = _fake_ssh(tmp_path)
    record = tmp_path / "argv"
    home = tmp_path / "home"
    (home / "lobes").mkdir(parents=True)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/local/bin:/usr/bin:/bin")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("FAKE_SSH_RECORD", str(record))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    payload = _payload(directory=str(home / "lobes"))
    targets = {"thor": Target("thor", "127.0.0.1", "fl-thor", 22, None, None)}
    running = collectors.start_collectors(targets, {"thor": payload}, {"FLEET_REVIEW2_GW": SENT})
    result = running["thor"].finish(60)
    assert result.error is None and result.returncode == 0, result.stderr[-2000:]
    doc = json.loads(result.stdout)
    assert doc["deploy_dir"] == str(home / "lobes")  # the payload it was sent
    assert doc["secret_sources"]["gw"]["status"] == "ok"  # and the secret beside it
    argv = record.read_text(encoding="utf-8").split("\0")[:-1]
    assert argv[0] == "-l" and argv[-2] == "127.0.0.1"
    words = argv + shlex.split(argv[-1])  # ssh's argv, and the box's sh -c / python3 argv
    text = _readable(words)
    for secret in (RUN_KEY, INLINE, SENT, str(home / "lobes")):
        assert secret not in text
    assert SENT not in result.stdout and INLINE not in result.stdout


# -- the box's side ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def collector() -> Any:
    return load_box_program(
        "fleet_collector_review2_stdin", "reconciler/observe/remote/collector.py"
    )


def _stream(data: bytes | None) -> Any:
    read, write = os.pipe()
    if data:
        os.write(write, data)
    os.close(write)
    return os.fdopen(read, "rb")


def test_the_box_reads_its_payload_and_the_secrets_from_stdin(collector: Any) -> None:
    payload = _payload()
    with _stream(collectors.collector_stdin(payload, {"gw": SENT})) as stream:
        assert collector.read_input(stream) == (payload, {"gw": SENT})
    unnamed = {k: v for k, v in payload.items() if k != "controller_secrets"}
    with _stream(collectors.collector_stdin(unnamed, {"gw": SENT})) as stream:
        assert collector.read_input(stream) == (unnamed, {})  # taken only when named


@pytest.mark.parametrize(
    "data", [None, b"not json " + INLINE.encode(), b'{"sent": {}}', b'["payload"]'], ids=str
)
def test_no_payload_on_stdin_is_refused_quoting_nothing(collector: Any, data: bytes | None) -> None:
    with _stream(data) as stream, pytest.raises(ValueError, match="no payload") as raised:
        collector.read_input(stream)
    assert INLINE not in str(raised.value)


def test_too_much_on_stdin_is_refused_by_the_controller_before_any_box(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[str] = []
    monkeypatch.setattr(collectors, "spawn", lambda target, *_a: started.append(target.box))
    payload = {**_payload(), "managed_env": {"BIG": "x" * collectors.STDIN_LIMIT_BYTES}}
    targets = {"thor": Target("thor", "10.77.0.11", "fl-thor", 22, None, None)}
    with pytest.raises(ValueError, match="more than"):
        collectors.start_collectors(targets, {"thor": payload}, {"FLEET_REVIEW2_GW": SENT})
    assert started == []


# -- the pyinfra fact: the same program, its payload on the connector's stdin ---------------------
def test_the_pyinfra_fact_sends_its_payload_on_the_connectors_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler.observe import fact, openssh_connector

    example = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fact._inputs.cache_clear()
    data = {"fleet_root": str(example), "fleet_inventory": "lab", "fleet_box": "thor"}
    host = SimpleNamespace(name="thor", data=SimpleNamespace(get=data.get))
    collected = fact.Collected()
    collected.check_preconditions(None, host)  # type: ignore[arg-type]
    command = collected.command()
    fact._inputs.cache_clear()
    assert fact.RUN_KEY not in _readable(shlex.split(command))
    sent = json.loads(command.stdin)  # type: ignore[attr-defined]
    assert sent["payload"]["run_key"] == fact.RUN_KEY and sent["sent"] == {}

    launched: list[tuple[list[str], Any]] = []

    def bounded(argv: list[str], stdin: Any = None, **_: Any) -> tuple[int, Any]:
        launched.append((argv, stdin))
        return 0, SimpleNamespace(combined_lines=[])

    monkeypatch.setattr(openssh_connector, "run_bounded", bounded)
    connector = openssh_connector.OpenSSHConnector.__new__(openssh_connector.OpenSSHConnector)
    connector.state = SimpleNamespace()  # type: ignore[assignment]
    connector.host = SimpleNamespace(  # type: ignore[assignment]
        name="thor", print_prefix="", data={"ssh_hostname": "10.77.0.11", "ssh_user": "fl-thor"}
    )
    ok, _ = connector.run_shell_command(command)  # type: ignore[arg-type]
    assert ok
    ((argv, stdin),) = launched
    assert stdin == command.stdin  # type: ignore[attr-defined]
    assert fact.RUN_KEY not in _readable(argv)


def test_a_large_stdin_never_holds_up_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More than a pipe takes at once (a fleet with a large payload) is written beside: the
    next box's ssh starts without waiting for this one to connect and read."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    ssh = bindir / "ssh"
    ssh.write_text("#!/bin/sh\nsleep 2\nexec cat >/dev/null\n", encoding="utf-8")
    ssh.chmod(0o700)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    import time

    started = time.monotonic()
    running = transport.spawn(Target("b", "127.0.0.1", "u", 22, None, None), "x", b"y" * 300_000)
    assert time.monotonic() - started < 1.5
    assert running.finish(20).returncode == 0
