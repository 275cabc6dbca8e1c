"""The controller's keyless gateway probes, the new-connection check and the gathering of the
boxes' answers run without importing concurrent.futures (and logging under it) or the idna
codec (unicodedata, stringprep): ~15 ms of a repeated drift's CPU for nothing it uses."""

from __future__ import annotations

import socket

from reconciler.observe.transport import create_connection
from tests.unit.conftest import fresh_python


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_probes_and_the_connection_check_import_no_pool_logging_or_idna() -> None:
    port = _closed_port()
    code = (
        "import sys\n"
        "from reconciler.observe.probes import probe_gateways\n"
        "from reconciler.observe.transport import greets\n"
        f"out = probe_gateways({{'thor': 'http://127.0.0.1:{port}'}})\n"
        "assert out['thor']['health']['status'] is None, out\n"
        "assert 'refused' in out['thor']['health']['error'].lower(), out\n"
        f"assert 'refused' in greets('127.0.0.1', {port}, 1.0)\n"
        "print(sorted(m for m in ('concurrent.futures', 'logging', 'encodings.idna')"
        " if m in sys.modules))\n"
    )
    assert fresh_python(code).strip() == "[]"


def test_create_connection_reaches_an_ascii_name_and_an_address() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(2)
        port = server.getsockname()[1]
        for host in ("127.0.0.1", "localhost"):
            with create_connection((host, port), 2.0) as client:
                accepted, _ = server.accept()
                accepted.close()
                assert client.getpeername()[1] == port
