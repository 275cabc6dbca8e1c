"""The check that a box still takes a new SSH connection (transport.new_connections_refused,
run beside every collector that went through a persisted master) follows the route ssh's own
configuration gives the box. Before, it greeted the inventory's address directly: a box the
user's ~/.ssh/config reaches through a ProxyJump (a bastion) or under another HostName was said
"reachable only through an existing connection: new SSH connections are refused" on every
repeated run (exit 1, an audit warning, a converge refused), though new connections worked.
The route is asked of `ssh -G` (the real OpenSSH) only after the direct greeting failed."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.observe import transport


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


@pytest.fixture
def sshd_like() -> Iterator[int]:
    """A loopback port that greets as an SSH server, as often as it is asked."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.2p1\r\n")
                conn.settimeout(1)
                with contextlib.suppress(OSError):
                    conn.recv(256)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(listener.getsockname()[1])
    stop.set()
    thread.join(2)
    listener.close()


@pytest.fixture
def master_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "master_running", lambda target: True)


def _target(port: int) -> transport.Target:
    return transport.Target("thor", "127.0.0.1", "lobes", port, None, None)


@pytest.mark.usefixtures("master_up")
def test_a_box_behind_a_proxyjump_is_not_said_to_refuse_new_connections(
    tmp_path: Path, closed_port: int
) -> None:
    config = tmp_path / "config"
    config.write_text("Host 127.0.0.1\n  ProxyJump bastion.example\n")
    assert transport.configured_route(_target(closed_port), config) == transport.PROXIED
    assert transport.new_connections_refused(_target(closed_port), config) is None
    config.write_text("Host 127.0.0.1\n  ProxyCommand nc -x proxy %h %p\n")
    assert transport.new_connections_refused(_target(closed_port), config) is None


@pytest.mark.usefixtures("master_up")
def test_a_hostname_from_the_config_is_where_the_box_is_greeted(
    tmp_path: Path, closed_port: int, sshd_like: int
) -> None:
    """The inventory names 127.0.0.9, where nothing listens; the config sends ssh to
    127.0.0.1 (the port stays the command line's `-p`, as ssh takes it)."""
    config = tmp_path / "config"
    config.write_text("Host 127.0.0.9\n  HostName 127.0.0.1\n")
    aliased = transport.Target("thor", "127.0.0.9", "lobes", sshd_like, None, None)
    assert transport.greets("127.0.0.9", sshd_like) is not None  # the address alone refuses
    assert transport.configured_route(aliased, config) == ("127.0.0.1", sshd_like)
    assert transport.new_connections_refused(aliased, config) is None
    # The configured address refusing too: the box is said to refuse, naming that address.
    refusing = transport.Target("thor", "127.0.0.9", "lobes", closed_port, None, None)
    assert transport.new_connections_refused(refusing, config) == (
        f"{transport.MASTER_ONLY} (connect to 127.0.0.1:{closed_port}: Connection refused)"
    )


@pytest.mark.usefixtures("master_up")
def test_a_box_reached_directly_that_refuses_is_still_said_so(
    tmp_path: Path, closed_port: int
) -> None:
    config = tmp_path / "config"
    config.write_text("Host *\n  ServerAliveInterval 30\n")
    assert transport.configured_route(_target(closed_port), config) == ("127.0.0.1", closed_port)
    said = transport.new_connections_refused(_target(closed_port), config)
    assert said == (
        f"{transport.MASTER_ONLY} (connect to 127.0.0.1:{closed_port}: Connection refused)"
    )
