"""The audit's probes read a gateway's body within MAX_BODY also when it comes compressed.

Anything listening on a gateway's or a published lane's port answers the audit. httpx decodes a
Content-Encoding itself, with no limit on what it makes: a 64 KB gzip answer is 64 MiB once
decoded (and `gzip, gzip` much more), all of it before MAX_BODY was looked at. observe.probes
.fetch asks for identity, reads the body as it came and decodes one layer of gzip or deflate
itself, bounded; it reads no other encoding. A real HTTP server on the loopback answers here.
"""

from __future__ import annotations

import gzip
import json
import threading
import tracemalloc
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from reconciler.observe.probes import MAX_BODY, fetch

ANSWER = json.dumps({"status": "ok", "version": "0.92.0"}).encode()
ZEROS = 64 * 1024 * 1024  # what the bomb makes once decoded


def _bomb() -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip stream
    block = b"0" * (1024 * 1024)
    return b"".join(packer.compress(block) for _ in range(ZEROS // len(block))) + packer.flush()


BODIES: dict[str, tuple[str, bytes]] = {
    "/identity": ("", ANSWER),
    "/gzip": ("gzip", gzip.compress(ANSWER)),
    "/deflate": ("deflate", zlib.compress(ANSWER)),
    "/bomb": ("gzip", _bomb()),
    "/gzip-gzip": ("gzip, gzip", gzip.compress(gzip.compress(ANSWER))),
    "/br": ("br", b"\x8b\x02\x80" + ANSWER),
}
ASKED: list[str] = []


class _Gateway(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ASKED.append(self.headers.get("Accept-Encoding", ""))
        encoding, body = BODIES[self.path]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def fetched(base: str, path: str) -> tuple[int, bytes, int]:
    """(status, body, the most memory Python held meanwhile)."""
    ASKED.clear()
    with httpx.Client(trust_env=False) as client:
        tracemalloc.start()
        try:
            resp, body = fetch(client, "GET", base + path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert ASKED == ["identity"]  # and an honest server sends it so
    return resp.status_code, body, peak


@pytest.mark.parametrize("path", ["/identity", "/gzip", "/deflate"])
def test_a_plain_or_once_compressed_answer_is_read_whole(base: str, path: str) -> None:
    status, body, _ = fetched(base, path)
    assert (status, body) == (200, ANSWER)


def test_a_compressed_answer_is_decoded_no_further_than_max_body(base: str) -> None:
    status, body, peak = fetched(base, "/bomb")
    assert status == 200
    assert body == b"0" * (MAX_BODY + 1)  # one byte past the limit: the caller refuses it
    assert peak < 8 * 1024 * 1024  # not the 64 MiB it makes decoded


@pytest.mark.parametrize("path", ["/gzip-gzip", "/br"])
def test_an_encoding_not_read_is_no_body(base: str, path: str) -> None:
    status, body, peak = fetched(base, path)
    assert (status, body) == (200, b"")
    assert peak < 8 * 1024 * 1024
