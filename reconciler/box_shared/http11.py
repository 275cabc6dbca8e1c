"""The HTTP/1.1 the box programs and the controller's probes speak: the part of http.client
they use, on the raw socket (stdlib only, Python >= 3.8).

The collector asks the Engine API (a unix socket) and probes the gateway and the lanes with it;
the controller's own keyless probes use the same reader (reconciler/observe/probes.py). On a
box it is part of the collector's text (reconciler/box_program.py).
"""

import sys
import time

try:  # the C module under `socket`, which adds enum conversions and selectors on import
    import _socket as sockets
except ImportError:  # pragma: no cover - an interpreter without it
    import socket as sockets  # type: ignore[no-redef]


class OverLimit(Exception):
    """More was sent than its limit: a child's stream (the child was killed), an HTTP body."""


# The Engine API (a unix socket) and the probes (the gateway on the loopback, the lanes on their
# container addresses) are plain HTTP/1.1 GETs and one POST: this is the part of http.client
# they use, on the raw socket. http.client alone costs each run ~30 ms of CPU to import
# (email's parser comes with it), urllib.request ~40 ms (ssl, hashlib too): more than the
# rest of an observation. It reads answers as http.client does (a 100 Continue skipped, a
# body by Content-Length, chunked transfer-encoding or the connection's end, the first of a
# repeated header), refuses a header value with a bare CR/LF the way it does, and raises
# errors named as http.client and urllib name them, so reports read the same.
_MAXLINE = 65536
_MAXHEADERS = 100
_REDIRECTS = (301, 302, 303, 307, 308)


def _illegal_value(value):
    """http.client's test, `\n(?![ \t])|\r(?![ \t\n])`: a line break not folding the line."""
    for brk, folds in ((b"\n", (b" ", b"\t")), (b"\r", (b" ", b"\t", b"\n"))):
        at = value.find(brk)
        while at >= 0:
            if value[at + 1 : at + 2] not in folds:
                return True
            at = value.find(brk, at + 1)
    return False


def _header_line(text):
    """email.feedparser's headerRE, `[\041-\071\073-\176]*:`: a name of printable ASCII."""
    colon = text.find(":")
    return colon >= 0 and all("!" <= c <= "~" for c in text[:colon])


class HTTPException(Exception):
    pass


class RemoteDisconnected(ConnectionResetError):
    """The server closed the connection before its status line (http.client's name)."""


class IncompleteRead(HTTPException):
    pass


class BadStatusLine(HTTPException):
    def __init__(self, line):
        HTTPException.__init__(self, line or repr(line))


class LineTooLong(HTTPException):
    def __init__(self, what):
        HTTPException.__init__(self, "got more than %d bytes when reading %s" % (_MAXLINE, what))


class UnknownProtocol(HTTPException):
    pass


class URLError(OSError):
    """A request that could not be sent (urllib's name: what the reports have always said)."""

    def __init__(self, reason):
        OSError.__init__(self, reason)
        self.args = (reason,)
        self.reason = reason

    def __str__(self):
        return "<urlopen error %s>" % self.reason


class Connection:
    """One HTTP/1.1 connection; `ask` sends a request and reads its answer whole.

    `budget`: the seconds one request may take from its start to its answer's end (None: no
    bound but each socket operation's timeout). A socket's timeout bounds each read only, and
    a peer dripping a byte a second answered within every one of them for as long as it liked;
    with a budget, each read waits at most what is left of it, then the request fails as
    timed out. The connection's socket must then take `settimeout`."""

    # `until`: a monotonic time no request may go past, whatever its budget (one deadline for
    # a series of requests); `max_body`: a body over this many bytes fails as OverLimit.
    until = None  # type: float | None
    max_body = None  # type: int | None

    def __init__(self, connect, host, budget=None):
        self.connect, self.host, self.budget = connect, host, budget
        self.sock, self.buf, self.deadline = None, b"", None

    def close(self):
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buf = None, b""

    def ask(self, method, path, headers=(), body=None, limit=None, error_limit=None):
        """(status, headers: lower-case name -> first value, body). `limit` (`error_limit`
        for a status outside 2xx): at most this many bytes of the body are read (urllib's
        read(n)); None: the whole body, and a body short of its Content-Length is an
        IncompleteRead. The request is checked whole before anything is sent."""
        lines = ["%s %s HTTP/1.1" % (method, path), "Host: " + self.host]
        lines.append("Accept-Encoding: identity")
        request = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        for name, value in headers:
            value = value.encode("latin-1")
            if _illegal_value(value):
                raise ValueError("Invalid header value %r" % (value,))
            request += name.encode("latin-1") + b": " + value + b"\r\n"
        if body is not None:
            request += b"Content-Length: %d\r\n" % len(body)
        request += b"\r\n" + (body or b"")
        if self.budget is not None:
            self.deadline = time.monotonic() + self.budget
        if self.until is not None:
            self.deadline = min(self.deadline or self.until, self.until)
        cap = self.max_body if limit is None else None
        if cap is not None:
            limit = cap + 1
        if self.sock is None:
            self.sock = self.connect()
        self._time_left()
        self.sock.sendall(request)
        while True:
            status, version = self._status()
            got = self._headers()
            if status != 100:
                break
        if not 200 <= status < 300:
            limit = error_limit
        content = self._body(method, status, version, got, limit)
        if cap is not None and len(content) > cap:
            self.close()
            raise OverLimit("%s answered over %d bytes (stopped)" % (path, cap))
        return status, got, content

    def _time_left(self):
        """The next socket operation bounded by what is left of the request's budget; past
        it, a timeout (as the socket's own timeout says it)."""
        if self.deadline is None:
            return
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self.sock.settimeout(left)  # type: ignore[union-attr]

    def _fill(self):
        self._time_left()
        data = self.sock.recv(65536)  # type: ignore[union-attr]
        self.buf += data
        return bool(data)

    def _line(self, what):
        while True:
            end = self.buf.find(b"\n", 0, _MAXLINE + 1)
            if end >= 0:
                line, self.buf = self.buf[: end + 1], self.buf[end + 1 :]
                return line
            if len(self.buf) > _MAXLINE:
                raise LineTooLong(what)
            if not self._fill():
                line, self.buf = self.buf, b""
                return line

    def _read(self, size):
        if len(self.buf) < size:  # read on in pieces, joined once: a large body reads linearly
            parts, have = [self.buf], len(self.buf)
            self.buf = b""
            while have < size:
                self._time_left()
                data = self.sock.recv(max(65536, min(size - have, 1 << 20)))  # type: ignore[union-attr]
                if not data:
                    break
                parts.append(data)
                have += len(data)
            self.buf = b"".join(parts)
        out, self.buf = self.buf[:size], self.buf[size:]
        return out

    def _status(self):
        line = str(self._line("status line"), "iso-8859-1")
        if not line:
            raise RemoteDisconnected("Remote end closed connection without response")
        parts = line.split(None, 2)
        version, code = (parts + ["", ""])[:2] if len(parts) >= 2 else ("", "")
        if not version.startswith("HTTP/"):
            self.close()
            raise BadStatusLine(line)
        try:
            status = int(code)
        except ValueError:
            raise BadStatusLine(line) from None
        if not 100 <= status <= 999:
            raise BadStatusLine(line)
        if not version.startswith("HTTP/1."):
            self.close()
            raise UnknownProtocol(version)
        return status, version

    def _headers(self):
        """As http.client reads them (every line up to the blank one) and email's parser
        (compat32) gives them back: the first occurrence of a name, its value without the
        leading blanks and the line end, folded lines kept as sent; a line that is no
        header ends the headers (the rest is email's body)."""
        lines = []
        while True:
            line = self._line("header line")
            if line in (b"\r\n", b"\n", b""):
                break
            lines.append(str(line, "iso-8859-1"))
            if len(lines) > _MAXHEADERS:
                raise HTTPException("got more than %d headers" % _MAXHEADERS)
        got = {}  # type: dict
        current = []  # type: list  # [name, [value lines]] of a first occurrence
        for text in lines:
            if text[:1] in (" ", "\t"):
                if current:
                    current[1].append(text)
                continue
            if text.startswith("From "):
                continue  # an mbox envelope line, not a header
            if not _header_line(text):
                break
            name, _, value = text.partition(":")
            if name and name.lower() not in got:
                current = [name.lower(), [value.lstrip(" \t")]]
                got[current[0]] = current[1]
            else:
                current = []
        return {name: "".join(parts).rstrip("\r\n") for name, parts in got.items()}

    def _body(self, method, status, version, got, limit):
        connection = got.get("connection", "").lower()
        if version == "HTTP/1.0":
            closing = not got.get("keep-alive") and "keep-alive" not in connection
        else:
            closing = "close" in connection
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            out = b""
        elif got.get("transfer-encoding", "").lower() == "chunked":
            out = self._chunked(limit)
            closing = closing or limit is not None
        else:
            try:
                length = int(got["content-length"])
            except (KeyError, ValueError):
                length = -1  # none given: the body runs to the connection's end
            if length < 0:
                out, closing = self._to_end(limit), True
            else:
                out = self._read(length if limit is None else min(length, limit))
                if limit is None and len(out) < length:
                    raise IncompleteRead("%d bytes read, %d more expected" % (
                        len(out), length - len(out)))  # fmt: skip
                closing = closing or len(out) < length
        if closing:
            self.close()
        return out

    def _chunked(self, limit):
        parts, total = [], 0
        while limit is None or total < limit:
            line = self._line("chunk size")
            size = line.split(b";", 1)[0]
            try:
                size = int(size, 16)
            except ValueError:
                raise IncompleteRead("%d bytes read" % total) from None
            if size == 0:
                while self._line("trailer line") not in (b"\r\n", b"\n", b""):
                    pass
                break
            part = self._read(size if limit is None else min(size, limit - total))
            if len(part) < min(size, limit - total if limit is not None else size):
                raise IncompleteRead("%d bytes read" % (total + len(part)))
            parts.append(part)
            total += len(part)
            if len(part) == size:
                self._read(2)  # the CRLF after a chunk's data
        return b"".join(parts)

    def _to_end(self, limit):
        parts, have = [self.buf], len(self.buf)
        while limit is None or have < limit:
            self._time_left()
            data = self.sock.recv(65536)  # type: ignore[union-attr]
            if not data:
                break
            parts.append(data)
            have += len(data)
        out = b"".join(parts)
        self.buf = b""
        return out if limit is None else out[:limit]


def unix_connection(path, timeout):
    def connect():
        sock = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(path)
        except BaseException:
            sock.close()
            raise
        return sock

    return Connection(connect, "localhost", timeout)  # each request within the timeout


def tcp_connect(host, port, timeout):
    """socket.create_connection: each address of `host` in turn, the first error raised.
    An ASCII host is passed as bytes: getaddrinfo encodes a str through the idna codec, whose
    import (stringprep, unicodedata) cost every run ~4 ms for hosts that are IP addresses."""
    errors = []
    name = host.encode("ascii") if host.isascii() else host
    for family, kind, proto, _, address in sockets.getaddrinfo(name, port, 0, sockets.SOCK_STREAM):
        sock = sockets.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            errors.append(exc)
    raise errors[0] if errors else OSError("getaddrinfo returns an empty list")


def _split_url(url):
    """(host, port, netloc, path) of an http:// URL, the way http.client reads its host."""
    rest = url[len("http://") :] if url.startswith("http://") else None
    if rest is None:
        raise ValueError("unknown url type: %r" % url)
    netloc, slash, path = rest.partition("/")
    host, port = netloc, 80
    colon, bracket = netloc.rfind(":"), netloc.rfind("]")
    if colon > bracket:
        digits = netloc[colon + 1 :]
        host = netloc[:colon]
        if digits:
            try:
                port = int(digits)
            except ValueError:
                raise ValueError("nonnumeric port: '%s'" % digits) from None
    if host[:1] == "[" and host[-1:] == "]":
        host = host[1:-1]
    return host, port, netloc, slash + path if slash else "/"


def http_ask(url, timeout, method="GET", headers=(), body=None, limit=262144):
    """(status, headers, body) of one request as urllib sends it (Connection: close, its
    User-Agent; at most `limit` bytes of a 2xx body, 65536 of another one, as the probes
    read them); a failure to connect is a URLError, as urllib raised it; a timeout once the
    request has taken `timeout` s in all. None when urllib itself must answer: a redirect to
    follow. Always direct: a proxy the environment names (http_proxy, all_proxy, ...) is never
    used (the keyed probes carry the gateway's and the mesh's keys; see `within`)."""
    host, port, netloc, path = _split_url(url)
    sent = [(name.title(), value) for name, value in headers]
    sent += [("User-Agent", "Python-urllib/%d.%d" % sys.version_info[:2])]
    sent += [("Connection", "close")]

    def connect():
        try:
            return tcp_connect(host, port, timeout)
        except OSError as exc:
            raise URLError(exc) from None

    conn = Connection(connect, netloc, timeout)  # the request as a whole within the timeout
    try:
        status, got, content = conn.ask(method, path, sent, body, limit, 65536)
    finally:
        conn.close()
    if status in _REDIRECTS and ("location" in got or "uri" in got):
        return None
    return status, got, content


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~/")


def quote(text):
    """urllib.parse.quote(text): UTF-8, every byte but the unreserved ones and `/` escaped."""
    return "".join(chr(b) if b in _UNRESERVED else "%%%02X" % b for b in text.encode("utf-8"))
