"""A gateway that drips its answer a byte at a time fails the collector's probe at the probe's
timeout, not when it stops dripping.

Each socket read has the timeout, so a peer sending one byte within each read's timeout kept a
probe (and with it the whole observation, which waits for its slowest part) alive as long as it
liked. Here a real server on the loopback answers with its status line, headers or body dripped
a byte every DRIP_S, for DRIP_FOR_S at most; every path a probe takes must give up at its
timeout: the raw HTTP/1.1 reader (GET and POST), the Engine's unix socket, urllib's (a redirect
to follow) and a redirect that hands the probe over to urllib. (No probe goes through a proxy:
tests/unit/test_collector_review2_proxy.py.)
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.conftest import load_box_program

collector = load_box_program("box_collector_drip", "reconciler/observe/remote/collector.py")

TIMEOUT_S = 0.5  # the probe's timeout
DRIP_S = 0.05  # a byte this often: well within each read's timeout
DRIP_FOR_S = 6.0  # how long the server goes on dripping (the old reader waited all of it)
BOUND_S = TIMEOUT_S + 0.5  # a probe's end, at the latest
LATE_TIMEOUT_S = 1.0  # a probe whose redirect comes late ...
LATE_S = 0.8  # ... this late: most of its timeout is gone before urllib takes over
LATE_BOUND_S = LATE_TIMEOUT_S + 0.4  # one timeout for the whole probe (two took 1.8 s)
ANSWERS = {
    "status": (b"", b"HTTP/1.1 200 OK"),  # nothing at once, the status line dripped
    "headers": (b"HTTP/1.1 200 OK\r\n", b"X-Drip: " + b"a" * 1000),
    "body": (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", b"{" * 1000),
    "chunked": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3e8\r\n", b"x" * 1000),
    "to-close": (b"HTTP/1.0 200 OK\r\n\r\n", b"x" * 1000),
}


class Dripping:
    """A server (TCP on 127.0.0.1, or a unix socket): each connection's request read, then
    `first` sent at once and `drip` a byte every DRIP_S. A request for /redirect is answered
    at once with a redirect to /drip, one for /late-redirect (a GET or a POST) after LATE_S."""

    def __init__(self, first: bytes, drip: bytes, unix: str | None = None) -> None:
        self.first, self.drip, self.stop = first, drip, threading.Event()
        family = socket.AF_UNIX if unix else socket.AF_INET
        self.server = socket.socket(family, socket.SOCK_STREAM)
        self.server.bind(unix or ("127.0.0.1", 0))
        self.server.listen(8)
        self.port = 0 if unix else self.server.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            late = head.split(b"\r\n")[0].split(b" ")[1:2] == [b"/late-redirect"]
            if late:
                head, _, body = head.partition(b"\r\n\r\n")
                sizes = [h for h in head.lower().split(b"\r\n") if h.startswith(b"content-length")]
                want = int(sizes[0].split(b":")[1]) if sizes else 0
                while len(body) < want:  # a POST's body read (closed unread, it would reset)
                    body += conn.recv(65536)
                time.sleep(LATE_S)
            if head.startswith(b"GET /redirect") or late:
                where = f"http://127.0.0.1:{self.port}/drip".encode()
                conn.sendall(
                    b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % where
                )
                return
            conn.sendall(self.first)
            ends = time.monotonic() + DRIP_FOR_S
            for byte in self.drip:
                if self.stop.is_set() or time.monotonic() > ends:
                    return
                conn.sendall(bytes([byte]))
                time.sleep(DRIP_S)

    def close(self) -> None:
        self.stop.set()
        self.server.close()


@pytest.fixture(params=sorted(ANSWERS))
def each_shape(request: pytest.FixtureRequest) -> Iterator[Dripping]:
    """A gateway dripping each part of its answer in turn."""
    server = Dripping(*ANSWERS[request.param])
    yield server
    server.close()


@pytest.fixture
def gateway() -> Iterator[Dripping]:
    """A gateway dripping its answer's body."""
    server = Dripping(*ANSWERS["body"])
    yield server
    server.close()


def timed(fn, *args):  # type: ignore[no-untyped-def]
    started = time.monotonic()
    result = fn(*args)
    return result, time.monotonic() - started


def test_a_dripped_get_times_out_at_the_probes_timeout(each_shape: Dripping) -> None:
    url = f"http://127.0.0.1:{each_shape.port}/health"
    answer, took = timed(collector.http_get, url, TIMEOUT_S)
    assert took < BOUND_S
    assert answer["status"] is None and answer["error"] == "TimeoutError: timed out"


def test_a_dripped_post_times_out_at_the_probes_timeout(gateway: Dripping) -> None:
    url = f"http://127.0.0.1:{gateway.port}/v1/chat/completions"
    answer, took = timed(collector.http_post_json, url, {"max_tokens": 1}, TIMEOUT_S)
    assert took < BOUND_S
    assert answer["status"] is None and answer["error"] == "TimeoutError: timed out"


def test_urllibs_get_and_post_time_out_at_the_probes_timeout(gateway: Dripping) -> None:
    url = f"http://127.0.0.1:{gateway.port}/drip"
    answer, took = timed(collector._urllib_get, url, TIMEOUT_S, None, time.monotonic())
    assert took < BOUND_S
    assert answer["status"] is None and "timed out" in answer["error"]
    with pytest.raises(OSError, match="timed out"):
        timed(collector._urllib_post, url, b"{}", {"Content-Type": "application/json"}, TIMEOUT_S)


def test_a_redirect_to_a_dripping_answer_times_out_too(gateway: Dripping) -> None:
    url = f"http://127.0.0.1:{gateway.port}/redirect"  # the raw reader hands it to urllib
    answer, took = timed(collector.http_get, url, TIMEOUT_S)
    assert took < BOUND_S  # one timeout for the probe, however many requests it makes
    assert answer["status"] is None and "timed out" in answer["error"]


def test_a_late_redirect_leaves_urllib_only_what_is_left_of_the_timeout(
    gateway: Dripping,
) -> None:
    """The raw reader spent most of the timeout on the redirect; urllib, following it, had a
    whole timeout of its own: the probe took up to twice its timeout. Now one deadline."""
    url = f"http://127.0.0.1:{gateway.port}/late-redirect"
    answer, took = timed(collector.http_get, url, LATE_TIMEOUT_S)
    assert LATE_S < took < LATE_BOUND_S
    assert answer["status"] is None and "timed out" in answer["error"]
    posted, took = timed(collector.http_post_json, url, {"max_tokens": 1}, LATE_TIMEOUT_S)
    assert LATE_S < took < LATE_BOUND_S
    assert posted["status"] is None and "timed out" in posted["error"]


def test_the_engine_over_its_unix_socket_times_out_too(tmp_path: Path) -> None:
    path = str(tmp_path / "docker.sock")
    first, drip = ANSWERS["body"]
    server = Dripping(first, drip, unix=path)
    conn = collector.unix_connection(path, TIMEOUT_S)
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            collector.engine_get(conn, "/containers/json?all=1")
        assert time.monotonic() - started < BOUND_S
    finally:
        conn.close()
        server.close()


def test_an_answer_that_comes_in_time_is_read_whole() -> None:
    # The budget is the request's, not each read's: a slow but finished answer is kept.
    server = Dripping(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n", b"[1] ")
    try:
        answer, took = timed(collector.http_get, f"http://127.0.0.1:{server.port}/", TIMEOUT_S)
    finally:
        server.close()
    assert answer["status"] == 200 and answer["body"] == [1]
    assert 3 * DRIP_S <= took < BOUND_S
