"""The controller's keyless gateway probes, the new-connection check and the gathering of the
boxes' answers run without importing concurrent.futures (and logging under it), the idna codec
(unicodedata, stringprep) or http.client (and the email package): ~35 ms of a repeated drift's
CPU for nothing it uses. The probes' HTTP is the collector's reader (box_shared/http11.py); it
must send what http.client sent."""

from __future__ import annotations

import socket

from reconciler.box_shared.http11 import tcp_connect
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
        "print(sorted(m for m in ('concurrent.futures', 'logging', 'encodings.idna',"
        " 'http.client', 'email') if m in sys.modules))\n"
    )
    assert fresh_python(code).strip() == "[]"


def test_tcp_connect_reaches_an_ascii_name_and_an_address() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(2)
        port = server.getsockname()[1]
        for host in ("127.0.0.1", "localhost"):
            client = tcp_connect(host, port, 2.0)
            try:
                accepted, _ = server.accept()
                accepted.close()
                assert client.getpeername()[1] == port
            finally:
                client.close()


def test_a_probe_sends_what_http_client_sent() -> None:
    """Request line and headers, byte for byte, against http.client's for the same GET."""
    import http.client
    import threading

    from reconciler.observe.probes import plain_get

    def first_request(send: object) -> bytes:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            port = server.getsockname()[1]
            got: list[bytes] = []

            def serve() -> None:
                conn, _ = server.accept()
                with conn:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(4096)
                    got.append(data)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

            thread = threading.Thread(target=serve)
            thread.start()
            send(port)  # type: ignore[operator]
            thread.join(5)
            return got[0]

    def by_http_client(port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/v1/models?x=1", headers={"Accept": "*/*", "Connection": "close"})
        conn.getresponse().read()
        conn.close()

    ours = first_request(lambda port: plain_get(f"http://127.0.0.1:{port}/v1/models?x=1"))
    theirs = first_request(by_http_client)
    port_free = [line for line in ours.split(b"\r\n") if not line.startswith(b"Host:")]
    assert port_free == [line for line in theirs.split(b"\r\n") if not line.startswith(b"Host:")]
    assert ours.split(b"\r\n")[1].startswith(b"Host: 127.0.0.1:")
