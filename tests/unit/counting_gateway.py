"""A gateway stand-in for the controller's bounded probes: it answers every request after
`delay` seconds and counts the requests in flight (`peak`: the most at once); `events` lists
each request's path as it came in and as it went out of flight, in that order."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import ClassVar


class CountingGateway(BaseHTTPRequestHandler):
    """Subclass per test (its counts are the class's): set `delay`, reset with `reset()`."""

    delay = 0.1
    lock = threading.Lock()
    open = peak = 0
    events: ClassVar[list[tuple[str, str]]] = []

    @classmethod
    def reset(cls) -> None:
        cls.open = cls.peak = 0
        cls.events = []

    def _answer(self) -> None:
        cls = type(self)
        with cls.lock:
            cls.open += 1
            cls.peak = max(cls.peak, cls.open)
            cls.events.append(("in", self.path))
        try:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(cls.delay)
        finally:
            # Out of flight before the answer is sent: the caller's next request can only
            # come after it (counted after the answer, it raced that next request).
            with cls.lock:
                cls.open -= 1
                cls.events.append(("out", self.path))
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *_: object) -> None:
        pass
