"""The mesh side of an observation: what a caller on the network gets from each gateway,
without a key. All gateways and paths at once (a hanging gateway costs one timeout). Takes
plain base URLs so a drift run can start it before the desired state is loaded (observe/early.py).

Drift's three keyless GETs per gateway go through the collector's own HTTP/1.1 reader
(`plain_get`), not httpx: they run on every drift, and importing httpx (h11, httpcore, its
models, cookie jar and the `email` and `urllib.request` modules under them) cost 40-60 ms of
CPU here, `http.client` (with `email`) ~20 ms, the reader ~3 ms, and a repeated drift's whole
controller process uses about 250 ms. The audit's requests (keys, POST bodies, phase 2) stay
on httpx (`fetch` below, audit/probes.py).
Both read an answer the same bounded way: at most MAX_BODY bytes, within TOTAL_S, parsed by
`body_json` as a box's answer is.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from reconciler import interrupts
from reconciler.observe.transport import Background, Pool, controller_short, say_controller_short
from reconciler.scrub import exception_text

PATHS = (("health", "/health"), ("capabilities", "/capabilities"), ("models_noauth", "/v1/models"))


def skip_httpx_cli() -> None:
    """Call before the first `import httpx`: the client without httpx's command-line tool.

    httpx's `__init__` imports its CLI whenever click, rich and pygments are installed (they are
    here), which costs a tenth of a drift run's CPU for code no command uses. A None entry in
    sys.modules makes that one import raise ImportError, the case httpx handles by design (its
    `main` then says how to install the CLI); the client API is untouched.
    """
    if "httpx" not in sys.modules and "httpx._main" not in sys.modules:
        sys.modules["httpx._main"] = None  # type: ignore[assignment]  # None: "not importable"


def needs_tls(urls: list[str]) -> bool:
    """httpx's `verify` for a client that will fetch these URLs. With only plain-HTTP URLs
    there is nothing to verify, and building the default SSL context (CA bundle and all)
    would cost a probe run 30-60 ms of CPU; any https URL keeps full verification."""
    return any(url.lower().startswith("https:") for url in urls)


def probe_gateways(
    bases: dict[str, str], timeout: float | None = None
) -> dict[str, dict[str, Any]]:
    """{box: base URL} -> {box: {"base", "health", "capabilities", "models_noauth"}}: every
    box given at once, three sockets and threads each (a fleet's go through `ProbeRun`, a few
    boxes at a time).

    `timeout`: what a box may take (default: the run's, observe/fanout.py), counted from now;
    every probe ends by then, and one still going then (a resolver that hangs) is given up
    (`unanswered`): the probes return by `timeout` + GRACE_S whatever the gateways do."""
    out: dict[str, dict[str, Any]] = {box: {"base": base} for box, base in bases.items()}
    jobs = [(box, probe, base + path) for box, base in bases.items() for probe, path in PATHS]
    if not jobs:
        return out
    budget = probe_budget(timeout)
    deadline = (time.monotonic() + budget, budget)
    # A thread each (not a concurrent.futures pool: it imports logging, ~7 ms of CPU); _get
    # is bounded by its own timeouts and the deadline, and returns its failures.
    running = [
        (box, probe, _begun(url, probe != "models_noauth", deadline)) for box, probe, url in jobs
    ]
    for box, probe, job in running:
        out[box][probe] = waited(job, deadline) if isinstance(job, Background) else job
    return out


def _begun(url: str, keep_body: bool, deadline: Deadline) -> Background | dict[str, Any]:
    """A probe started in its thread, or, when the controller has no thread to give it, the
    probe's failure saying so (the controller's, never the gateway's)."""
    try:
        return Background(_get, url, keep_body, deadline)
    except RuntimeError as exc:
        short = controller_short(exc)
        if short is None:
            raise
        return not_made(short)


# A probe the controller itself could not make (out of open files, threads: its own limits).
NOT_MADE = "the controller could not make the probe"


def not_made(short: str) -> dict[str, Any]:
    return {"status": None, "error": f"{NOT_MADE}: {short}"}


class ProbeRun(Background):
    """`probe` (probe_gateways) over a fleet, at most `size` boxes at a time: each box's three
    GETs at once, with `timeout` from their own start, the boxes in the order given. `size` is
    the collectors' limit (fanout.limit), so the probes' sockets and threads are bounded as the
    ssh clients are (fanout.FDS_PER_BOX counts both), and the boxes' order is the collectors':
    a box's probes run about when its ssh does. All boxes at once, a fleet of 360 took three
    sockets each, ran a controller with 1,024 open files out of them (every ssh then failed with
    EMFILE), and a 1,000-box run took ~4,000 threads.

    A `Background` to gather (observe.py): `result()` is every box's probes."""

    def __init__(
        self,
        probe: Callable[[dict[str, str], float | None], dict[str, dict[str, Any]]],
        bases: dict[str, str],
        timeout: float | None,
        size: int,
    ) -> None:
        self._probe = probe
        self._bases = dict(bases)
        self._budget = probe_budget(timeout)
        self._size = max(1, min(size, len(bases)))
        self._lock = threading.Lock()
        self._out: dict[str, dict[str, Any]] = {}
        self._failed: BaseException | None = None
        self._begun = time.monotonic()
        self._said = False
        super().__init__(self._all)  # the workers start in its thread: this one goes on

    def _all(self) -> dict[str, dict[str, Any]]:
        if len(self._bases) <= self._size:  # every box at once (the 50-box lab): one call
            return self._probe(self._bases, self._budget)
        # Each box ends by its own deadline (probe_gateways): so does this wait.
        Pool(self._bases.items(), self._size, self._one).wait()
        if self._failed is not None:
            raise self._failed
        return self._filled()

    def _one(self, item: tuple[str, str]) -> None:
        box, base = item
        if self._failed is not None:  # the run has failed: no box more is probed
            return
        try:
            found = self._probe({box: base}, self._budget)[box]
        except BaseException as exc:  # as Background: the caller's result() raises it
            with self._lock:
                self._failed = self._failed or exc
            return
        with self._lock:
            self._out[box] = found

    def _filled(self) -> dict[str, dict[str, Any]]:
        """Every box's probes, in the order given: a box not done is `unanswered`."""
        with self._lock:
            done = dict(self._out)
        return {
            box: done.get(box) or {"base": base, **unanswered_gateway(self._budget)}
            for box, base in self._bases.items()
        }

    def bound(self) -> float:
        """When, counted from the start, every box's probes have ended: each box within its
        budget and GRACE_S of its own start, `size` of them at a time."""
        turns = -(-len(self._bases) // self._size)
        return turns * (self._budget + GRACE_S) + GRACE_S

    def result(self, timeout: float | None = None) -> Any:
        """Every box's probes. `timeout` is what the caller gives probes that all began with
        the run (gather's deadline); boxes that waited for their turn began later, each with
        its own budget, and are waited for past it, until `bound`. Never TimeoutError: a box
        not done by then is `unanswered`. Probes the controller could not make (its own limits)
        are said once on stderr: the boxes' entries say which."""
        left = self._begun + self.bound() - time.monotonic()
        # In slices, as gather's wait for the boxes: a swallowed Ctrl-C ends it (interrupts.py).
        if interrupts.wait(self._done, None if timeout is None else max(timeout, left)):
            found: dict[str, dict[str, Any]] = super().result(0)
        else:
            found = self._filled()
        self._say_not_made(found)
        return found

    def _say_not_made(self, found: dict[str, dict[str, Any]]) -> None:
        if self._said:
            return
        self._said = True
        errors = [
            str(p.get("error"))
            for probes in found.values()
            for p in probes.values()
            if isinstance(p, dict) and str(p.get("error") or "").startswith(NOT_MADE)
        ]
        if errors:
            why = errors[0][len(NOT_MADE) + 2 :]
            say_controller_short(f"make {len(errors)} of its gateway probes", why)


# What a probe may take past its box's deadline before it is given up (it is then a daemon
# thread whose answer nobody reads): the socket's own timeouts end it about then.
GRACE_S = 0.5


def probe_budget(timeout: float | None) -> float:
    """The seconds a box's probes have: `timeout`, or the run's (observe/fanout.py)."""
    if timeout is not None:
        return timeout
    from reconciler.observe.fanout import box_timeout

    return box_timeout()


# A box's deadline: (when, as time.monotonic(); the seconds it was given, for what is said).
Deadline = tuple[float, float]


def waited(job: Background, deadline: Deadline) -> Any:
    """A probe's result, waited for until `deadline` (and GRACE_S); `unanswered` after."""
    try:
        return job.result(max(0.0, deadline[0] + GRACE_S - time.monotonic()))
    except TimeoutError:
        return unanswered(deadline[1])


def unanswered(budget: float) -> dict[str, Any]:
    """A probe that gave no answer within its box's time, as a probe's failure reads."""
    return {"status": None, "error": f"no answer within {budget:g} s"}


def unmade_gateway(why: str) -> dict[str, Any]:
    """A gateway whose probes the controller could not make (observe.gather: they failed
    before any answer was kept; `why` names the exception's kind, never its text)."""
    return {probe: not_made(why) for probe, _ in PATHS}


def unanswered_gateway(budget: float) -> dict[str, Any]:
    """A gateway none of whose probes finished in time (observe.gather gave up waiting)."""
    return {probe: unanswered(budget) for probe, _ in PATHS}


CONNECT_S, READ_S = 2.0, 3.0  # a gateway that accepts but never answers costs READ_S per read


def _get(url: str, keep_body: bool, deadline: Deadline | None = None) -> dict[str, Any]:
    started = time.monotonic()
    try:
        status, raw = plain_get(url, deadline)
    except Exception as exc:  # one gateway's odd answer fails that probe, never the others
        short = controller_short(exc)
        if short is not None:  # out of open files (EMFILE): the controller's, not the gateway's
            return not_made(short)
        said = exception_text(exc) if _said_in_full(exc) else failure(exc)
        return {"status": None, "error": said}
    elapsed_ms = int((time.monotonic() - started) * 1000)
    result: dict[str, Any] = {"status": status, "ms": elapsed_ms}
    if keep_body:
        result["body"], why = read_body(raw)
        if why is not None:  # kept for the record (a snapshot): the body is read as absent
            result["body_error"] = why
    return result


class InvalidURL(ValueError):
    """A probe URL that is not one (http.client's name for it, as reports have said)."""


def _said_in_full(exc: BaseException) -> bool:
    """The socket's or HTTP's own errors, whose text says what happened (scrubbed); anything
    else is named by its kind only (`failure`)."""
    if isinstance(exc, OSError | InvalidURL):
        return True
    # The HTTP reader's errors (named as http.client's), and http.client's for an https URL:
    # neither module is imported before a probe has used it.
    for name in (_READER, "http.client"):
        module = sys.modules.get(name)
        if module is not None and isinstance(exc, module.HTTPException):
            return True
    return False


_READER = "reconciler.box_shared.http11"


def plain_get(url: str, deadline: Deadline | None = None) -> tuple[int, bytes]:
    """One GET without credentials, proxies or cookies: the status and at most MAX_BODY + 1
    bytes of the body. Raises what the socket or the HTTP reader raise, InvalidURL, or TooSlow.
    Ends within TOTAL_S, and by its box's `deadline` when there is one.

    Plain http (every lab and mesh gateway) goes through the collector's own HTTP/1.1 reader
    (reconciler/box_shared/http11.py: `Connection`, checked against http.client on the
    same bytes by tests/unit/test_collector_cpu.py): importing http.client (and the email
    package under it) cost each drift run ~20 ms of CPU. https keeps http.client and ssl."""
    from urllib.parse import urlsplit

    from reconciler.box_shared import http11 as reader

    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError for a port that is not a number in range
    except ValueError:
        raise InvalidURL("not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidURL("not an http(s) URL with a host")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(c <= " " or c == "\x7f" for c in path):  # http.client's check, before anything is sent
        raise InvalidURL("a URL with control characters or spaces")
    end = _end(deadline)
    if parts.scheme == "https":
        return _https_get(parts.hostname, port, path, end)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname

    def connect() -> _Deadline:
        sock = reader.tcp_connect(parts.hostname or "", port or 80, _left(end, CONNECT_S))
        sock.settimeout(READ_S)
        return _Deadline(sock, end)

    conn = reader.Connection(connect, host if port in (None, 80) else f"{host}:{port}")
    try:
        headers = [("Accept", "*/*"), ("Connection", "close")]
        status, _, body = conn.ask("GET", path, headers, None, MAX_BODY + 1, MAX_BODY + 1)
        return int(status), bytes(body)
    finally:
        conn.close()


def _end(deadline: Deadline | None) -> Deadline:
    """When a probe starting now must end: within TOTAL_S, or by its box's deadline if that
    comes first (then said as the box's time)."""
    end = time.monotonic() + TOTAL_S
    if deadline is None or end <= deadline[0]:
        return end, TOTAL_S
    return deadline


def _left(end: Deadline, most: float) -> float:
    """A socket operation's timeout: at most `most`, and no later than the probe's end."""
    left = end[0] - time.monotonic()
    if left <= 0:
        raise TooSlow(end[1])
    return min(most, left)


class _Deadline:
    """A gateway's socket that reads on only until the probe's end: a gateway dripping bytes
    stays within every read's timeout, never within this; a read that starts near the end
    waits only what is left."""

    def __init__(self, sock: Any, end: Deadline) -> None:
        self.sock, self.end = sock, end

    def recv(self, size: int) -> bytes:
        left = _left(self.end, READ_S)
        if left >= READ_S:
            return bytes(self.sock.recv(size))
        self.sock.settimeout(left)
        try:
            return bytes(self.sock.recv(size))
        except TimeoutError:  # the probe's end, not the gateway's read timeout
            raise TooSlow(self.end[1]) from None

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()


def _https_get(hostname: str, port: int | None, path: str, end: Deadline) -> tuple[int, bytes]:
    import http.client
    import ssl

    # Full verification (the system's CA bundle, the host name), as httpx's default.
    context = ssl.create_default_context()
    timeout = _left(end, CONNECT_S)
    conn = http.client.HTTPSConnection(hostname, port, timeout=timeout, context=context)
    try:
        conn.connect()
        if conn.sock is not None:
            conn.sock.settimeout(_left(end, READ_S))
        conn.request("GET", path, headers={"Accept": "*/*", "Connection": "close"})
        resp = conn.getresponse()
        chunks, size = [], 0
        while size <= MAX_BODY:
            chunk = resp.read1(64 * 1024)  # what one read brings: a drip is seen between reads
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            left = _left(end, READ_S)  # TooSlow past the end
            if conn.sock is not None:  # None once the response holds the connection
                conn.sock.settimeout(left)
        return resp.status, b"".join(chunks)[: MAX_BODY + 1]
    finally:
        conn.close()


# -- reading a gateway's answer: it is the box's, so bounded like the collector's ----------------
# A gateway's answers are a few KB (/capabilities with a dozen roles). A hostile one may send
# gigabytes, or drip bytes to stay under the read timeout forever: at most this much, this long.
MAX_BODY, TOTAL_S = 256 * 1024, 10.0


class TooSlow(Exception):
    """The answer kept coming past TOTAL_S (or the box's deadline: `seconds`)."""

    def __init__(self, seconds: float | None = None) -> None:
        super().__init__()
        self.seconds = TOTAL_S if seconds is None else seconds


def fetch(
    client: Any,
    method: str,
    url: str,
    json: Any = None,
    deadline: Deadline | None = None,
    timeout: Any = None,
) -> tuple[Any, bytes]:
    """One request through an httpx client (the audit's): the response (headers and status)
    and at most MAX_BODY + 1 bytes of its body. Raises what httpx raises, or TooSlow: the
    body is read until TOTAL_S, or its box's `deadline` if sooner. `timeout`: httpx's
    for this request (the client's when None).

    The body is read as it came (`iter_raw`) and decoded here, bounded: httpx would decode a
    Content-Encoding itself with no limit on what it makes, so a 1 KB gzip answer (or `gzip,
    gzip`) could become gigabytes before MAX_BODY is looked at. Identity is asked for; one
    layer of gzip or deflate is still read; any other encoding is a body not read (b"")."""
    end = _end(deadline)
    headers = {"Accept-Encoding": "identity"}
    extra = {} if timeout is None else {"timeout": timeout}
    with client.stream(method, url, json=json, headers=headers, **extra) as resp:
        decode = _bounded_decoder(resp.headers.get("content-encoding", ""))
        if decode is None:
            return resp, b""
        chunks, size = [], 0
        for raw in resp.iter_raw():
            chunk = decode(raw, MAX_BODY + 1 - size)
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_BODY:
                break
            if time.monotonic() > end[0]:
                raise TooSlow(end[1])
    return resp, b"".join(chunks)[: MAX_BODY + 1]


def _bounded_decoder(encoding: str) -> Callable[[bytes, int], bytes] | None:
    """(data, at most this many bytes out) -> decoded bytes, for a response's Content-Encoding;
    None for one not read (several layers, br, zstd, ...)."""
    kind = encoding.strip().lower()
    if kind in ("", "identity"):
        return lambda data, most: data[:most]
    if kind not in ("gzip", "x-gzip", "deflate"):
        return None
    import zlib

    # 47: a gzip or zlib header, whichever it has (deflate is zlib-wrapped, RFC 9110 8.4.1.2)
    inflate = zlib.decompressobj(47)
    return lambda data, most: inflate.decompress(data, max(most, 1))


def body_json(raw: bytes) -> Any:
    """The body as JSON, read as a box's answer is (document.load_json: within MAX_BODY, UTF-8,
    no NaN, duplicate keys or nesting deeper than document.MAX_DEPTH); None when it is not."""
    return read_body(raw)[0]


def read_body(raw: bytes) -> tuple[Any, str | None]:
    """`body_json`'s value, and why the body is not usable JSON (None: it is, or it is empty);
    the fault's text never quotes the body."""
    # Imported here: a drift run's early start imports this module before it launches the
    # collectors, and the document module is not needed until the answers come back.
    from reconciler.observe.document import Fault, load_json

    parsed = load_json(raw, MAX_BODY) if raw else None
    return (None, parsed.message) if isinstance(parsed, Fault) else (parsed, None)


def failure(exc: BaseException) -> str:
    """A probe's failure other than httpx's own: its kind only (the text could hold anything)."""
    if isinstance(exc, TooSlow):
        return f"the answer took over {exc.seconds:g} s"
    return f"{type(exc).__name__} reading the answer"
