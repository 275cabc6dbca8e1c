"""Issue 10, class 2: no user or host can ever be read by ssh as an option.

Every argv that runs ssh passes the user as the argument of `-l` and the host after `--`, and
refuses a user or host that starts with `-` even when it bypassed the desired-state types.
`ssh -G` (print the configuration, connect to nothing) shows what OpenSSH itself makes of the
argv we build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from reconciler.observe import transport
from reconciler.observe.transport import Target, UnsafeTarget, spawn, ssh_argv

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "-oProxyCommand=touch /tmp/fleet-pwned"  # never run: refused, or -G only


def _target(user: str = "lobes", host: str = "10.0.0.11") -> Target:
    return Target("thor", host, user, 2222, "/keys/id_ed25519", "/keys/known_hosts")


def _ssh_config(argv: list[str]) -> dict[str, str]:
    """What OpenSSH resolves from `argv` (ssh -G parses every option, then prints)."""
    assert argv[0] == "ssh"
    out = subprocess.run(
        ["ssh", "-G", *argv[1:]], capture_output=True, text=True, check=True, timeout=10
    ).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def _user_then_host(argv: list[str], user: str, host: str) -> None:
    assert argv[argv.index("-l") + 1] == user
    assert argv[argv.index("--") + 1] == host
    assert argv.index("-l") < argv.index("--")
    assert not any("@" in a and host in a for a in argv)  # never user@host in one argument


@pytest.mark.parametrize("remote", ["true", "-oProxyCommand=x", "echo -- a"])
def test_transport_argv_gives_user_to_l_and_host_after_double_dash(remote: str) -> None:
    argv = ssh_argv(_target(), remote)
    _user_then_host(argv, "lobes", "10.0.0.11")
    assert argv[-1] == remote
    config = _ssh_config(argv)
    assert (config["user"], config["hostname"], config["port"]) == ("lobes", "10.0.0.11", "2222")
    assert "proxycommand" not in config


@pytest.mark.parametrize(
    ("user", "host"),
    [
        (HOSTILE, "10.0.0.11"),
        ("lobes", HOSTILE),
        ("-l", "10.0.0.11"),
        ("lobes", "-p1"),
        ("", "10.0.0.11"),
        ("lobes", ""),
        ("lo bes", "10.0.0.11"),
        ("lobes", "10.0.0.11\nProxyCommand x"),
    ],
)
def test_transport_refuses_an_option_like_user_or_host(user: str, host: str) -> None:
    with pytest.raises(UnsafeTarget):
        ssh_argv(_target(user, host), "true")


def test_spawn_of_a_hostile_target_is_that_box_s_error_and_runs_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_process(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("ssh was started")

    monkeypatch.setattr(transport.subprocess, "Popen", no_process)
    result = spawn(_target(user=HOSTILE), "true").finish(1)
    assert result.returncode is None
    assert result.error is not None and "refusing ssh user" in result.error


def test_even_past_our_check_ssh_reads_them_as_a_user_and_a_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Defence in depth has two layers: with our own check switched off, ssh still sees the
    hostile value as a (bad) user or host name, never as a ProxyCommand."""
    monkeypatch.setattr(transport, "refuse_unsafe", lambda target: None)
    marker = tmp_path / "pwned"
    hostile = f"-oProxyCommand=touch {marker}"
    for target, what in ((_target(host=hostile), "hostname"), (_target(user=hostile), "username")):
        argv = ssh_argv(target, "true")
        proc = subprocess.run(
            ["ssh", "-G", *argv[1:]], capture_output=True, text=True, check=False, timeout=10
        )
        assert proc.returncode == 255
        assert f"{what} contains invalid characters" in proc.stderr
    assert not list(tmp_path.iterdir())


def test_the_pyinfra_connector_refuses_before_running_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyinfra.api.exceptions import ConnectError

    from reconciler.observe import openssh_connector

    ran: list[str] = []
    monkeypatch.setattr(
        openssh_connector, "run_bounded", lambda argv, **kw: ran.append(" ".join(argv)) or (0, None)
    )
    connector = openssh_connector.OpenSSHConnector.__new__(openssh_connector.OpenSSHConnector)
    connector.host = SimpleNamespace(name="thor", data={"ssh_user": HOSTILE, "ssh_port": 22})  # type: ignore[assignment]
    with pytest.raises(ConnectError, match="refusing ssh user"):
        connector.connect()
    assert ran == []

    connector.host = SimpleNamespace(  # type: ignore[assignment]
        name="thor", data={"ssh_user": "lobes", "ssh_hostname": "10.0.0.11", "ssh_port": 22}
    )
    connector.connect()
    (line,) = ran
    assert " -l lobes " in line and line.endswith(" -- 10.0.0.11 true")


def test_lab_argv_gives_user_to_l_and_host_after_double_dash() -> None:
    sys.path.insert(0, str(ROOT))
    from lab import ssh as lab_ssh
    from lab.config import BOXES

    box = BOXES[0]
    argv = lab_ssh.argv(box, "true")
    _user_then_host(argv, box.user, box.address)
    config = _ssh_config(argv)
    assert (config["user"], config["hostname"]) == (box.user, box.address)
    for bad in ({"user": HOSTILE}, {"address": HOSTILE}):
        with pytest.raises(ValueError, match="refusing"):
            lab_ssh.argv(SimpleNamespace(**{**vars(box), **bad}), "true")  # type: ignore[arg-type]


def test_bench_floor_argv_gives_user_to_l_and_host_after_double_dash() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("drift_bench", ROOT / "bench/drift_bench.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["drift_bench"] = bench  # its dataclasses look their module up
    try:
        spec.loader.exec_module(bench)
    finally:
        del sys.modules["drift_bench"]
    argv = bench.floor_ssh(_target())
    _user_then_host(argv, "lobes", "10.0.0.11")
    assert _ssh_config(argv)["user"] == "lobes"
    with pytest.raises(UnsafeTarget):
        bench.floor_ssh(_target(user=HOSTILE))


@pytest.mark.parametrize("directory", ["/home/me/my fleet", "/srv/100%d", "/srv/a#b", "/srv/x'y"])
def test_a_repository_path_with_spaces_or_percent_reaches_ssh_unchanged(directory: str) -> None:
    """ssh parses `-o` values as config lines (whitespace splits, `%` expands): the key and the
    known_hosts of a repository under such a directory must still be exactly those files."""
    target = Target("thor", "10.0.0.11", "lobes", 22, f"{directory}/key", f"{directory}/kh")
    resolved = _ssh_config(ssh_argv(target, "true"))
    assert resolved["userknownhostsfile"] == f"{directory}/kh"  # one file, tokens not expanded
    # -G prints IdentityFile before its own expansion: `%%` is the literal `%` it will open.
    assert resolved["identityfile"] == f"{directory}/key".replace("%", "%%")


@pytest.mark.parametrize("directory", ['/srv/a"b', "/srv/a\\b", "/srv/${HOME}", "/srv/a\nb"])
def test_a_path_ssh_cannot_be_told_safely_is_refused(directory: str) -> None:
    target = Target("thor", "10.0.0.11", "lobes", 22, f"{directory}/key", None)
    with pytest.raises(UnsafeTarget):
        ssh_argv(target, "true")
