"""The controller-side probe client: lean to import, verifying TLS whenever there is TLS."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reconciler.observe import probes
from reconciler.observe.probes import needs_tls


@pytest.mark.parametrize(
    ("urls", "verify"),
    [
        (["http://10.77.0.11:8000", "http://spark.lan:8000"], False),
        (["http://thor.lan:8000", "https://spark.lan:8443"], True),
        (["HTTPS://orin.lan"], True),
        ([], False),
    ],
)
def test_tls_is_verified_whenever_any_url_is_https(urls: list[str], verify: bool) -> None:
    assert needs_tls(urls) is verify


def test_httpx_without_its_cli_still_has_its_client() -> None:
    code = (
        "import sys\n"
        "from reconciler.observe.probes import skip_httpx_cli\n"
        "skip_httpx_cli()\n"
        "import httpx\n"
        "assert httpx.Client and httpx.Timeout and httpx.HTTPError\n"
        "print(sorted(m for m in ('click', 'rich', 'pygments') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"  # none of the CLI's dependencies came along


# -- drift's mesh-side GETs (http.client), against a real HTTP server on loopback --------------

CANARY = "Bearer sk-canary-0123456789abcdefABCDEF"


class _Gateway(BaseHTTPRequestHandler):
    """Answers GET with the server's `answer`: (status, body chunks, chunked?, delay between)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        status, chunks, chunked, pause = self.server.answer  # type: ignore[attr-defined]
        self.server.seen.append((self.path, dict(self.headers)))  # type: ignore[attr-defined]
        self.send_response(status)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(sum(len(c) for c in chunks)))
        self.end_headers()
        for chunk in chunks:
            if pause:
                threading.Event().wait(pause)
            if chunked:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            else:
                self.wfile.write(chunk)
            self.wfile.flush()
        if chunked:
            self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    server.answer = (200, [b"{}"], False, 0.0)  # type: ignore[attr-defined]
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server: ThreadingHTTPServer, path: str) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}{path}"


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize(
    ("body", "kept"),
    [
        pytest.param([b'{"cortex": ', b'{"ready": true}}'], {"cortex": {"ready": True}}, id="real"),
        pytest.param([b'{"pad": "' + b"x" * (300 * 1024) + b'"}'], None, id="oversized"),
        pytest.param([b'{"mesh": NaN}'], None, id="NaN"),
        pytest.param([b"[" * 100_000 + b"]" * 100_000], None, id="nested past the parser"),
        pytest.param([b'{"a": 1, "a": 2}'], None, id="a key twice"),
        pytest.param([b"\xff\xfe not utf-8"], None, id="not UTF-8"),
    ],
)
def test_a_gateways_answer_to_drift_is_read_bounded(gateway, chunked, body, kept) -> None:
    gateway.answer = (200, body, chunked, 0.0)
    got = probes._get(_url(gateway, "/capabilities"), keep_body=True)
    assert got["status"] == 200 and got["body"] == kept
    path, headers = gateway.seen[-1]
    assert path == "/capabilities"
    assert not {"Authorization", "Cookie", "X-Api-Key"} & set(headers)  # keyless, always


def test_drift_probes_every_path_of_every_gateway_at_once(gateway) -> None:
    gateway.answer = (401, [b'{"error": "no key"}'], False, 0.0)
    got = probes.probe_gateways({"thor": _url(gateway, ""), "spark": _url(gateway, "")})
    assert sorted(got) == ["spark", "thor"]
    for box in got:
        assert {k: v["status"] for k, v in got[box].items() if k != "base"} == {
            "health": 401,
            "capabilities": 401,
            "models_noauth": 401,
        }
        assert got[box]["health"]["body"] == {"error": "no key"}
        assert "body" not in got[box]["models_noauth"]  # only its status is compared
    assert sorted(p for p, _ in gateway.seen) == sorted(
        ["/health", "/capabilities", "/v1/models"] * 2
    )


def test_a_dripping_gateway_fails_that_probe_within_the_deadline(gateway, monkeypatch) -> None:
    monkeypatch.setattr(probes, "TOTAL_S", 0.3)
    gateway.answer = (200, [b"{"] + [b" "] * 20, True, 0.05)  # a byte every 50 ms, for 1 s
    got = probes._get(_url(gateway, "/health"), keep_body=True)
    assert got["status"] is None and "took over" in got["error"]


def test_a_gateway_that_is_not_there_is_that_probes_error() -> None:
    import socket

    with socket.socket() as sock:  # a port just freed: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    got = probes._get(f"http://127.0.0.1:{port}/health", keep_body=True)
    assert got == {"status": None, "error": "ConnectionRefusedError: connection refused"}


@pytest.mark.parametrize(
    "url",
    [
        "ftp://thor:8000/health",
        "http://thor:99999/health",
        "http:///health",
        f"http://thor:8000/{CANARY}\r\nX: y",
    ],
)
def test_a_url_that_is_not_one_is_refused_without_echoing_it(url: str) -> None:
    got = probes._get(url, keep_body=True)
    assert got["status"] is None
    assert CANARY not in got["error"] and "sk-canary" not in got["error"]
