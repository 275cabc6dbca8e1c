"""A redirect never carries a probe's key to another origin.

urllib sends a request's headers on to wherever a redirect points. The audit's keyed probe
(`Authorization: Bearer <the gateway's or the mesh's key>`) went through urllib whenever the
gateway answered with a redirect, so an answer naming another host or port received the key in
clear. Here two real servers on the loopback: the gateway, which redirects, and another origin,
which records every request it gets. A redirect within the gateway's own origin is still
followed, as the converger's check follows it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.unit.conftest import load_box_program

collector = load_box_program("box_collector_redirects", "reconciler/observe/remote/collector.py")

KEY = "hunter2-gateway-key-0123"


class _Recorder(BaseHTTPRequestHandler):
    """Redirects /away to `server.elsewhere`, /here to /landed; answers anything else 200 and
    records each request's path and Authorization header on its server."""

    def _answer(self) -> None:
        server: Any = self.server
        server.seen.append((self.path, self.headers.get("Authorization")))
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.path in ("/away", "/here"):
            target = server.elsewhere if self.path == "/away" else "/landed"
            self.send_response(307)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b'{"data": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def _server(elsewhere: str = "") -> Any:
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.seen, server.elsewhere = [], elsewhere
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def servers() -> Iterator[tuple[Any, Any]]:
    other = _server()
    gateway = _server(f"http://127.0.0.1:{other.server_address[1]}/stolen")
    yield gateway, other
    for server in (gateway, other):
        server.shutdown()
        server.server_close()


def _url(server: Any, path: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


def test_a_keyed_get_redirected_to_another_origin_sends_it_nothing(servers):
    gateway, other = servers
    result = collector.http_get(_url(gateway, "/away"), 3, {"Authorization": f"Bearer {KEY}"})
    assert result["status"] == 307  # the redirect is the probe's answer
    assert other.seen == []  # the key never left for the other origin


def test_a_keyed_post_redirected_to_another_origin_sends_it_nothing(servers):
    gateway, other = servers
    headers = {"Authorization": f"Bearer {KEY}"}
    result = collector.http_post_json(_url(gateway, "/away"), {"q": 1}, 3, headers)
    assert result["status"] == 307
    assert other.seen == []


def test_a_redirect_within_the_origin_is_followed_with_its_key(servers):
    gateway, other = servers
    result = collector.http_get(_url(gateway, "/here"), 3, {"Authorization": f"Bearer {KEY}"})
    assert result["status"] == 200 and result["body"] == {"data": []}
    # (the raw reader asks first and hands a redirect to urllib, which asks again)
    assert gateway.seen[-1] == ("/landed", f"Bearer {KEY}")
    assert {path for path, _ in gateway.seen} == {"/here", "/landed"}
    assert other.seen == []


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://127.0.0.1/x", ("http", "127.0.0.1", 80)),
        ("http://127.0.0.1:80/y", ("http", "127.0.0.1", 80)),
        ("https://Gateway.local/", ("https", "gateway.local", 443)),
        ("http://u:p@127.0.0.1:8000/", ("http", "127.0.0.1", 8000)),
        ("http://127.0.0.1:x/", ("http", "127.0.0.1:x", None)),
    ],
)
def test_an_origin_is_scheme_host_and_port(url, origin):
    assert collector._origin(url) == origin
