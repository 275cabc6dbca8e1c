"""The box's probes never go through a proxy the box's environment names.

The collector's keyed probes carry the gateway's and the mesh's keys (`Authorization: Bearer
...`). A proxy named in the deploy user's environment (`http_proxy`, `HTTP_PROXY`,
`all_proxy`, ...) would receive them in clear, and its answer would stand in for the
gateway's. Every probe goes direct: the plain path, a redirect followed through urllib, a POST.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.unit.conftest import load_box_program

KEY = "canary-gateway-key-0123456789"
PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


class _Recorder(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, redirect: bool) -> None:
        self.seen: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        self.redirect = redirect
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Recorder

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization")))
        if self.server.redirect and self.path == "/v1/models":  # same origin: urllib follows
            self.send_response(302)
            self.send_header("Location", "/v1/models/")
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

    def log_message(self, *args: Any) -> None:
        pass


def _serving(redirect: bool) -> Iterator[_Recorder]:
    server = _Recorder(redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Recorder]:
    """A recording "proxy" on 127.0.0.1, named by every proxy variable; no bypass list."""
    for name in ("no_proxy", "NO_PROXY", "REQUEST_METHOD"):
        monkeypatch.delenv(name, raising=False)
    for server in _serving(redirect=False):
        for name in PROXY_VARS:
            monkeypatch.setenv(name, server.url)
        yield server


@pytest.fixture(params=[False, True], ids=["direct-answer", "same-origin-redirect"])
def target(request: pytest.FixtureRequest) -> Iterator[_Recorder]:
    yield from _serving(redirect=request.param)


@pytest.fixture(scope="module")
def collector() -> Any:
    return load_box_program(
        "fleet_collector_review2_proxy", "reconciler/observe/remote/collector.py"
    )


def test_a_keyed_probe_goes_to_the_gateway_never_to_the_environments_proxy(
    collector: Any, proxy: _Recorder, target: _Recorder
) -> None:
    got = collector.http_get(target.url + "/v1/models", 5, {"Authorization": "Bearer " + KEY})
    assert proxy.seen == []
    assert got["status"] == 200, got
    assert target.seen[0] == ("GET", "/v1/models", "Bearer " + KEY)
    assert {seen[2] for seen in target.seen} == {"Bearer " + KEY}
    if target.redirect:  # followed within the origin, through urllib, still direct
        assert target.seen[-1][1] == "/v1/models/"


def test_the_audit_post_goes_direct(collector: Any, proxy: _Recorder, target: _Recorder) -> None:
    got = collector.http_post_json(
        target.url + "/v1/chat/completions", {"max_tokens": 1}, 5, {"Authorization": "Bearer x"}
    )
    assert proxy.seen == []
    assert got["status"] == 200, got
    assert [seen[:2] for seen in target.seen] == [("POST", "/v1/chat/completions")]


def test_the_keyed_probes_of_an_audit_go_direct(
    collector: Any, proxy: _Recorder, target: _Recorder
) -> None:
    """`_keyed_get` as the audit calls it, with the gateway's key and then the mesh's."""

    class Run:
        @staticmethod
        def digest(value: str) -> str:
            return "hmac:" + str(len(value))

    url = target.url + "/v1/models"
    for key in (KEY, KEY + "-mesh"):
        got = collector._keyed_get(Run(), url, [("secret:k", key)], 5)
        assert got["status"] == 200, got
    assert proxy.seen == []
    assert {seen[2] for seen in target.seen} == {"Bearer " + KEY, "Bearer " + KEY + "-mesh"}


def test_urllibs_opener_has_no_proxy_whatever_the_environment_says(
    collector: Any, proxy: _Recorder
) -> None:
    import urllib.request

    handlers = collector.within(5).handlers
    proxies = [h.proxies for h in handlers if isinstance(h, urllib.request.ProxyHandler)]
    assert not any(proxies)  # none (an empty ProxyHandler adds no handler), or only empty ones


def test_a_request_set_to_go_through_a_proxy_is_refused_not_sent(
    collector: Any, proxy: _Recorder, target: _Recorder
) -> None:
    """Defence in depth: a request carrying a key is never handed to a proxy, however it was
    made one (a handler added later, a caller's set_proxy)."""
    import urllib.request

    request = urllib.request.Request(target.url + "/v1/models", headers={"Authorization": KEY})
    request.set_proxy(proxy.url[len("http://") :], "http")
    with pytest.raises(OSError, match="proxy"):
        collector.within(5).open(request, timeout=5)
    assert proxy.seen == [] and target.seen == []
