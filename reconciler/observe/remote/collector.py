"""The box-side collector: ONE run per box per command gathers everything a drift needs.

This file is shipped over SSH and run by the box's python3 (stdlib only, Python >= 3.8), as
one text with the code it shares with the converge written in (reconciler/box_program.py). It
prints one JSON document on stdout.

Secrets never leave the box in clear: every value of a secret-named variable (in .env, the
secret files, the controller_env secrets the controller sends on stdin, compose's render,
containers' environments, the login shell) is replaced here by an HMAC-SHA256 keyed with the
run's key, so equal values give equal digests within one run and nothing can be recovered
from a report; so is a secret that any other value of those carries inline (`--api-key x`,
`Bearer x`, `HF_TOKEN=x` inside a command or a `.env` value). The work runs in threads: the
run takes about as long as its slowest part (usually `docker compose config`), not the sum.
"""

import _thread
import os
import resource
import sys
import time

try:  # json's own C scanner and encoder: the json package imports re (and enum with it)
    import _json as _cjson
except ImportError:  # pragma: no cover - an interpreter without it: json itself, below
    _cjson = None  # type: ignore[assignment]
try:  # the C module under `socket`, which adds enum conversions and selectors on import
    import _socket as sockets
except ImportError:  # pragma: no cover - an interpreter without it
    import socket as sockets  # type: ignore[no-redef]
try:  # CPython's builtin SHA-256: hashlib's OpenSSL one costs ~5 ms to import and each HMAC
    from _sha2 import sha256  # ~0.4 ms to set up (OpenSSL 3 fetches the algorithm each time)
except ImportError:  # Python < 3.12
    try:
        from _sha256 import sha256
    except ImportError:  # pragma: no cover - a build without the builtin hashes
        from hashlib import sha256

# Shared with the other box program. On a box each of these statements is its module's own
# text (reconciler/box_program.py packs it in): the program still runs alone, stdlib only.
from reconciler.box_shared.dotenv import (
    _SPACE,
    SCRUBBED_PATH,
    _dotenv_expand,
    _dotenv_lines,
    _dotenv_read,
    _line_end,
    _removal,
    _secret_file_values,
)
from reconciler.box_shared.http11 import (
    HTTPException,
    OverLimit,
    URLError,
    http_ask,
    quote,
    unix_connection,
)
from reconciler.box_shared.secret_floor import FLOOR

# What is imported at the top is what EVERY run needs: a repeated drift runs this program on
# each box, and a module imported here costs every run its import time (http.client and
# urllib pulled in email, ssl and hashlib: ~40 ms of a ~90 ms run). The rest is imported
# where it is used, on the paths that need it (a compose render that misses the cache, an
# HTTP redirect, the audit's stdin).

TRACE_SEP = "\x1f"


# -- threads -------------------------------------------------------------------------------------
class Thread:
    """fn(*args) started now in a thread of its own, as threading.Thread(daemon=True) ran it:
    importing threading (functools, collections) cost every run ~5 ms. `join` waits for it."""

    def __init__(self, fn, *args):
        self.done = _thread.allocate_lock()
        self.done.acquire()
        _thread.start_new_thread(self._run, (fn, args))

    def _run(self, fn, args):
        try:
            fn(*args)
        finally:
            self.done.release()

    def join(self):
        with self.done:
            pass


# -- JSON ----------------------------------------------------------------------------------------
# json.loads and json.dumps through the C scanner and encoder the json package itself uses
# (_json), set up as json sets them up: importing the package costs every run ~5 ms (re, enum).
# Anything the fast reader does not take as it is (an error, a BOM, a document that is not
# UTF-8) goes to json.loads itself, so it reads, or fails with the message, as before.
_WS = " \t\n\r"
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Decoding:
    """The attributes json's C scanner reads from a JSONDecoder, as json.loads sets them."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


_SCAN = _cjson.make_scanner(_Decoding()) if _cjson is not None else None  # type: ignore[arg-type]


def json_loads(text):
    try:
        if _SCAN is None:
            raise ValueError("no C scanner")
        doc = text
        if isinstance(doc, (bytes, bytearray)):
            if (
                doc[:3] == b"\xef\xbb\xbf"
                or b"\x00" in doc[:4]
                or doc[:2] in (b"\xff\xfe", b"\xfe\xff")
            ):
                raise ValueError("not plain UTF-8")
            doc = bytes(doc).decode("utf-8", "surrogatepass")
        start = len(doc) - len(doc.lstrip(_WS))
        value, end = _SCAN(doc, start)
        if doc[end:].strip(_WS):
            raise ValueError("extra data")
        return value
    except (StopIteration, ValueError):
        import json

        return json.loads(text)


def json_dumps(value, sort_keys=False, separators=(", ", ": ")):
    """json.dumps(value, sort_keys=..., separators=...) (ensure_ascii, allow_nan, no indent)."""
    if _cjson is not None:
        try:
            encoder = _cjson.make_encoder(
                {}, _not_serializable, _cjson.encode_basestring_ascii, None,
                separators[1], separators[0], sort_keys, False, True,
            )  # fmt: skip
        except TypeError:  # another signature: json itself knows it
            encoder = None
        if encoder is not None:
            return "".join(encoder(value, 0))
    import json

    return json.dumps(value, sort_keys=sort_keys, separators=separators)


def _not_serializable(value):
    raise TypeError("Object of type %s is not JSON serializable" % value.__class__.__name__)


# -- secrets: the floor and the scrubber ----------------------------------------------------------
# Hashed whatever the payload says (an old or crafted payload cannot switch hashing off): the
# floor (FLOOR, reconciler/box_shared/secret_floor.py), and the same scrubbing as
# reconciler/scrub.py (tests/unit/test_secret_boundaries.py keeps the copies in step).
MIN_RUN_KEY = 32  # the controller's run keys are 32 hex; a shorter one could be guessed
_KNOWN = set()  # type: set  # every secret value this run hashed: masked in any error text
_CREDENTIAL = (
    r"(?i:\bbearer\b|\b(?:proxy-)?authorization\b|\bx-api-key\b|--api-key\b|\bset-cookie\b"
    r"|\bcookie\s*[:=])|\bBasic\s+[A-Za-z0-9+/=]{8,}"
)
_BREAK = r"[\r\n]|\\r|\\n"
# `NAME=value` first, then `NAME: value` (so `error: HF_TOKEN=x` reaches the HF_TOKEN), the
# name possibly a quoted mapping key; each a name and its separator, then the value (`_VALUE`).
# A name that holds no secret is passed over up to its separator only: its value is read too.
_ASSIGNMENTS = (
    r"\b([A-Za-z_][A-Za-z0-9_]*)([\"']?\s*=\s*)",
    r"\b([A-Z_][A-Z0-9_]*)([\"']?\s*:\s*)",
    # A quoted mapping key of any case given quoted text (`{"api_key": "x"}`): `mask_assignments`
    r"[\"']([A-Za-z_][A-Za-z0-9_]*)([\"']\s*:\s*)(?=[\"'])",
)
_VALUE = r"\"[^\"]*\"|'[^']*'|[^\s,;)}]+"
# The last words of a flag that names a credential (`--token`, `--hf-token`, `--key`,
# `--client-secret`), and vLLM's flags that only read like one (`--allow-credentials`, a switch):
# the same as reconciler/scrub.py's CREDENTIAL_WORDS and PLAIN_FLAGS (`credential_flag`).
CREDENTIAL_WORDS = ("token", "secret", "password", "passwd", "credentials", "credential", "key")
PLAIN_FLAGS = frozenset(
    ("--allow-credentials", "--no-allow-credentials", "--max-prompt-adapter-token")
)
# A flag whose last word names a credential (`--hf-token x`, `--password=x`, `'--token', 'x'`
# in a printed list), and a URL's password (`http://user:pw@host`).
_FLAG_NAME = r"(?<![\w-])(--?(?:[A-Za-z0-9]+[-_])*(?i:" + "|".join(CREDENTIAL_WORDS) + "))"
_SECRET_FLAG = _FLAG_NAME + r"(=|\s+)(\"[^\"]*\"|'[^']*'|\S+)"
_ANY_FLAG = r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)(=|\s+)(\"[^\"]*\"|'[^']*'|\S+)"
_SECRET_ITEM = _FLAG_NAME + r"([\"']\s*,\s*)([\"'])(.*?)\3"
_USERINFO = r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://[^\s/?#:]*):[^\s/?#]+@"
_STATE_WORDS = frozenset(("set", "empty", "absent", "unset", "missing", "commented", "***"))
# url-safe/hex runs, and standard base64 (with + and /) that mixes cases, so paths stay.
_RUN = (
    r"(?<![A-Za-z0-9+/])(?=\S*[A-Z])(?=\S*[a-z])[A-Za-z0-9+/]{30,}={0,2}"
    r"|[A-Za-z0-9_\-]{24,}"
)
_DIGEST_PREFIX = r"(?:sha256|sha512|hmac):$"


def _any_of(patterns):
    """One matcher for shell-style patterns: a collector asks about every variable of every
    container and render (thousands of names), fnmatch one pattern at a time cost ~20 ms.
    Patterns made of literal characters and `*` (the floor and every pattern seen so far) are
    matched by their literal pieces, as fnmatch would: compiling them into one regular
    expression cost each run ~2 ms. Any other pattern (`?`, `[...]`) goes through fnmatch's
    own translation."""
    globs = [p for p in patterns if not any(c in p for c in "?[")]
    if len(globs) < len(patterns):
        import fnmatch
        import re

        regex = re.compile("|".join(fnmatch.translate(p) for p in patterns))
        return regex.match
    exact, prefixes, suffixes, inner, general = set(), [], [], [], []
    for pattern in dict.fromkeys(globs):
        parts = pattern.split("*")
        if len(parts) == 1:
            exact.add(pattern)
        elif len(parts) == 2 and not parts[1]:
            prefixes.append(parts[0])  # `X*` (and `*` itself: every name starts with "")
        elif len(parts) == 2 and not parts[0]:
            suffixes.append(parts[1])  # `*X`
        elif len(parts) == 3 and not parts[0] and not parts[2]:
            inner.append(parts[1])  # `*X*`
        else:
            general.append(tuple(parts))
    starts, ends = tuple(prefixes), tuple(suffixes)

    def match(name):
        return (
            name in exact
            or name.startswith(starts)
            or name.endswith(ends)
            or any(piece in name for piece in inner)
            or (bool(general) and _glob_any(general, name))
        )

    return match


def _glob_any(pieces, name):
    for parts in pieces:
        first, last = parts[0], parts[-1]
        if len(name) < len(first) + len(last):
            continue
        if not name.startswith(first) or not name.endswith(last):
            continue
        at, end = len(first), len(name) - len(last)
        for middle in parts[1:-1]:  # each in turn, leftmost first: `*` takes what lies between
            found = name.find(middle, at, end)
            if found < 0:
                break
            at = found + len(middle)
        else:
            return True
    return False


_FLOOR = _any_of(FLOOR)


def floor_secret(name):
    return bool(_FLOOR(name.upper()))


def credential_flag(flag):
    """Whether this long flag's last word names a credential (`--token`, `--hf_token`,
    `--client-secret`): words of ASCII letters and digits joined by `-` or `_`, none of
    PLAIN_FLAGS. The same code as reconciler/scrub.py's `credential_flag`."""
    if flag[:2] != "--":
        return False
    words = flag[2:].replace("_", "-").split("-")
    return (
        words[-1].lower() in CREDENTIAL_WORDS
        and all(w and w.isascii() and w.isalnum() for w in words)
        and flag not in PLAIN_FLAGS
    )


def _cut_masked(text, bound, known):
    """`text` cut to `bound` characters, the known values masked first (in the text up to
    `bound` plus the longest of them, so one starting before the cut is masked whole), and
    never the start of a word that went on past the cut (as reconciler/scrub.py's `_cut_masked`)."""
    window = text[: bound + min(max([len(v) for v in known] or [0]), bound)]
    out = window
    for value in known:  # longest first
        out = out.replace(value, "***")
    if len(out) > bound:
        out, following = out[:bound], out[bound]
    else:
        following = text[len(window) : len(window) + 1]
    if following and not following.isspace() and out[-1:] and not out[-1].isspace():
        kept = out.rsplit(None, 1)
        out = (kept[0] if len(kept) == 2 else "") + " \u2026"
    return out


def scrub_text(text, secrets=(), is_secret=None):
    """One short printable line without a known secret value, a header or a key-shaped run.
    `is_secret`: the run's judgement of a name (the payload's patterns over the floor); the
    floor alone without one."""
    import re  # only an error's text comes here

    def judged(name):
        return floor_secret(name) or (is_secret is not None and is_secret(name))

    known = [
        value
        for value in sorted(set(_KNOWN) | set(secrets), key=len, reverse=True)
        if isinstance(value, str) and len(value) >= 4
    ]
    out = _cut_masked(str(text), 2400, known)
    cut = re.search(_CREDENTIAL, out)
    if cut:
        out = out[: cut.start()].rstrip() + " [redacted]"
    cut = re.search(_BREAK, out)
    if cut:
        rest = out[cut.end() :]
        out = out[: cut.start()].rstrip() + (" [redacted]" if rest.strip() else "")

    def assignments(pattern, text):
        pieces = []  # type: list
        done = at = 0
        found = pattern.search(text)
        while found is not None:
            at = found.end()  # after the separator: a value not masked is read on
            taken = value_of.match(text, at) if judged(found.group(1)) else None
            value = taken.group(0) if taken else ""
            if (
                taken
                and value not in _STATE_WORDS
                and (":" not in found.group(2) or len(value) >= 4)
            ):
                pieces += (text[done:at], "***")
                done = at = taken.end()
            found = pattern.search(text, at)
        return "".join(pieces) + text[done:] if pieces else text

    def run(match):
        token = match.group(0)
        if re.search(_DIGEST_PREFIX, out[max(0, match.start() - 8) : match.start()]):
            return token
        mixed = any(c.isalpha() for c in token) and any(c.isdigit() for c in token)
        return "***" if mixed else token

    def flag(match):
        groups = match.groups()
        if len(groups) == 4:  # a printed list's next item: `'--token', 'x'`
            name, sep, quote, value = groups
            sep, end = sep + quote, quote
        else:
            (name, sep, value), end = groups, ""
        if value in _STATE_WORDS or value.startswith("-"):
            return match.group(0)
        return name + sep + "***" + end

    value_of = re.compile(_VALUE)
    for pattern in _ASSIGNMENTS:
        out = assignments(re.compile(pattern), out)
    out = re.sub(_SECRET_FLAG, flag, out)
    if is_secret is not None and "-" in out:  # a flag the payload's patterns name (`--db-cred`)

        def named_flag(match):
            name = match.group(1).lstrip("-").replace("-", "_").upper()
            return flag(match) if is_secret(name) else match.group(0)

        out = re.sub(_ANY_FLAG, named_flag, out)
    out = re.sub(_SECRET_ITEM, flag, out)
    out = re.sub(_USERINFO, r"\1:***@", out)
    out = re.sub(_RUN, run, out)
    out = " ".join("".join(c if c.isprintable() else "?" for c in out).split())
    return out if len(out) <= 300 else out[:299] + "\u2026"


def exception_text(exc, is_secret=None):
    """`Type: reason`, the reason taken from what the exception is whenever that says enough;
    `is_secret` as scrub_text takes it."""
    return "%s: %s" % (type(exc).__name__, _reason(exc, is_secret))


def _reason(exc, is_secret=None):
    seen, link = [], exc  # type: list, BaseException | None
    while link is not None and link not in seen and len(seen) < 6:
        seen.append(link)
        known = _known_reason(link)
        if known:
            return known
        nested = getattr(link, "reason", None)  # urllib's URLError wraps the socket's error
        link = nested if isinstance(nested, BaseException) else (link.__cause__ or link.__context__)
    return scrub_text(exc, is_secret=is_secret) or "no detail"


def _known_reason(exc):
    names = set(cls.__name__ for cls in type(exc).__mro__)
    if isinstance(exc, sockets.timeout) or any("Timeout" in n for n in names):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset by the peer"
    if "gaierror" in names:
        return "name or address not resolved"
    if "SSLCertVerificationError" in names:
        return "TLS certificate not verified"
    if "SSLError" in names:
        return "TLS handshake failed"
    if names & {"RemoteDisconnected", "RemoteProtocolError", "IncompleteRead"}:
        return "the server closed the connection without a complete answer"
    if isinstance(exc, ValueError) and str(exc).startswith("Invalid header"):
        return "a request header held a character HTTP forbids (its value is not shown)"
    if isinstance(exc, OSError) and isinstance(exc.errno, int) and exc.errno > 0:
        import errno

        return "%s (%s)" % (
            os.strerror(exc.errno).lower(),
            errno.errorcode.get(exc.errno, exc.errno),
        )
    return None


# -- a box file ---------------------------------------------------------------------------------
# Every file of the box this program reads goes through `read_file`: the box is not trusted to
# keep them regular. A `.env` that was a FIFO blocked the run for ever (open waits for a writer,
# read for data), one that was a symlink to /dev/zero filled the memory, and a directory or bytes
# that are not UTF-8 raised out of the run: the whole observation was lost. Typed by stat first,
# so that a device, a FIFO or a directory is never even opened (opening a tty could make it this
# process's controlling terminal; a serial or tape device acts on its open); then opened
# O_NONBLOCK | O_NOCTTY (a FIFO swapped in meanwhile opens at once, a tty is not taken) and
# typed again by fstat on the open file (what is read is what was checked), and read up to its
# limit and one byte more (a file that grows while it is read is over the limit, never held
# whole).
FILE_LIMIT = 4 * 1024 * 1024  # a lab box's .env and compose file are ~75 and ~150 KB
SMALL_FILE_LIMIT = 1024 * 1024  # ~/.docker's JSON, /proc/meminfo: a few KB
# What stat says a file is, by its type bits (a symlink is followed, or refused unfollowed).
_FILE_KINDS = {
    0o010000: "fifo", 0o020000: "character device", 0o040000: "directory",
    0o060000: "block device", 0o120000: "symlink", 0o140000: "socket",
}  # fmt: skip


class BoxFileError(OSError):
    """A box file that is there but is not one this program reads: not a regular file, over its
    limit, or not UTF-8. Its text is the reason, as the answer's `file_errors` gives it."""


def read_file(path, limit=FILE_LIMIT, follow=True):
    """(bytes, os.stat_result) of the regular file at `path`, at most `limit` bytes; symlinks
    followed unless `follow` is false. FileNotFoundError when there is none, BoxFileError when it
    is not a regular file or is over the limit, any other OSError as the system raised it."""
    _regular(os.stat(path) if follow else os.lstat(path))  # anything else is never opened
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        info = _regular(os.fstat(fd))  # what was opened: it may have been swapped since
        chunks, size = [], 0
        while size <= limit:
            # The size fstat gave and a byte more (at least 64 KB: /proc says 0): a file is
            # two reads, the second seeing its end.
            want = min(limit + 1 - size, max(info.st_size + 1 - size, 65536))
            data = os.read(fd, want)
            if not data:
                break
            chunks.append(data)
            size += len(data)
        if size > limit:
            raise BoxFileError("over %d bytes" % limit)
        return b"".join(chunks), info
    finally:
        os.close(fd)


def _regular(info):
    """`info` (an os.stat_result) if it is a regular file's, else BoxFileError naming its type."""
    if not _isreg(info):
        kind = _FILE_KINDS.get(info.st_mode & 0o170000, "unknown type")
        raise BoxFileError("not a regular file (%s)" % kind)
    return info


def read_text_file(path, limit=FILE_LIMIT):
    """The text of the regular file at `path`, every byte as it is, within `limit` bytes;
    BoxFileError when it is not UTF-8. No line ending is rewritten: compose's dotenv (and the
    converger, which reads the bytes) ends a `.env` line at LF only and keeps a CR inside a
    quoted value (`"a<CR><LF>b"` is `a<CR><LF>b`), dropping one before the LF of an unquoted
    value as a blank; CRLF read as LF here made that value `a<LF>b`, and universal newlines
    made `A=1<CR>GATEWAY_API_KEY=x` two entries (JSON and /proc/meminfo read alike either
    way)."""
    data, _ = read_file(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BoxFileError("not UTF-8") from None


def problem_text(exc, is_secret=None):
    """Why a box file could not be read, in a few words (`not a regular file (fifo)`,
    `permission denied (EACCES)`)."""
    return str(exc) if isinstance(exc, BoxFileError) else _reason(exc, is_secret)


def shown_name(name):
    r"""A file's name as the answer gives it (a key of `file_errors` or `files`). The controller
    takes only a name that str.isprintable() accepts and refuses the WHOLE answer for one it
    does not (`_name` in reconciler/observe/document.py), and a name in the deployment directory
    is whatever its owner made it: each character the controller would refuse is written as a
    Python string literal writes it (an ASCII control character `\x1b`, another character
    `\u0085` or `\u2028`), a byte of a name that is not UTF-8 (os.listdir's surrogate escape)
    as `\xe9`, and a backslash as `\\`: two names are never shown alike, and an escape never
    reads as the name's own text."""
    if name.isprintable() and "\\" not in name:
        return name
    out = []
    for char in name:
        code = ord(char)
        if char == "\\":
            out.append("\\\\")
        elif char.isprintable():
            out.append(char)
        elif 0xDC80 <= code <= 0xDCFF:  # the byte os.fsdecode could not decode
            out.append("\\x%02x" % (code - 0xDC00))
        elif code < 0x80:
            out.append("\\x%02x" % code)
        elif code < 0x10000:
            out.append("\\u%04x" % code)
        else:
            out.append("\\U%08x" % code)
    return "".join(out)


def _hmac_states(key):
    """HMAC-SHA256 (RFC 2104) of `key`, as its two started hashes: each value then costs two
    copies and two short updates (hmac.new went through OpenSSL, ~0.4 ms a value here)."""
    if len(key) > 64:
        key = sha256(key).digest()
    key = key.ljust(64, b"\0")
    return (
        sha256(bytes(b ^ 0x36 for b in key)),
        sha256(bytes(b ^ 0x5C for b in key)),
    )


class Run:
    def __init__(self, payload):
        self.p = payload
        key = payload.get("run_key")
        if not isinstance(key, str) or len(key) < MIN_RUN_KEY:
            key = os.urandom(32).hex()  # digests then compare only within this answer
        self.key = key.encode()
        self._keyed = _hmac_states(self.key)
        patterns = payload.get("secret_patterns")
        self.patterns = (
            [p for p in patterns if isinstance(p, str)] if isinstance(patterns, list) else []
        )
        self._patterns = _any_of(self.patterns)
        self._secret_names = {}  # name -> bool: the same names recur in every container
        # word -> mask_words' answer: a box's containers inherit the same environment (PATH,
        # the CUDA and NVIDIA variables, the lane's own keys) and its renders repeat it, so of
        # the ~2,000 values a run masks, about 120 are distinct (measured: 1-2 ms of a box's
        # ~36 ms of CPU a run).
        self._masked_words = {}
        self.home = os.path.expanduser("~")
        self.deploy = os.path.expanduser(payload["directory"])
        self.errors = []
        self.file_errors = {}  # type: dict  # a box file as shown -> why it could not be read
        self.timeout = float(payload.get("timeout_s", 10))
        # The names of the project's containers on the host network, as `containers` found
        # them (the audit's `host_network`, without asking the engine again); None: not found.
        self.host_network = None  # type: list | None
        # Why the engine could not be asked (refused, missing, hung): set by `containers`, so
        # the audit does not ask it again. Any other failure of the project's listing (a
        # container gone between list and inspect) leaves the audit to ask for itself.
        self.engine_down = None  # type: str | None
        self._once = {}  # type: dict
        self._lock = _thread.allocate_lock()

    def remember(self, key, value):
        """What `once(key, ...)` gives from now on (unless it was computed already)."""
        with self._lock:
            self._once.setdefault(key, value)

    def once(self, key, fn, *args):
        """fn(*args), computed once in this run (a raised error is not remembered)."""
        with self._lock:
            if key in self._once:
                return self._once[key]
        value = fn(*args)
        with self._lock:
            return self._once.setdefault(key, value)

    # -- box files -----------------------------------------------------------------------
    def box_file(self, path, shown, limit=FILE_LIMIT):
        """(text, None) of the box file at `path` (read_text_file); (None, None) when there is
        none; (None, why) when it is there but cannot be read, which is then this box's own
        problem, named `shown` in the answer's `file_errors`: one odd file costs the parts
        that read it, never the observation. A symlink that leads to no file is such a
        problem, not an absent file: "missing" would send its owner looking for a file that
        `ls` shows is there."""
        try:
            return read_text_file(path, limit), None
        except FileNotFoundError:
            if not os.path.islink(path):
                return None, None
            return None, self.file_problem(shown, BoxFileError(DANGLING))
        except OSError as exc:
            return None, self.file_problem(shown, exc)

    def box_text(self, path, shown, limit=FILE_LIMIT):
        """The text of the box file at `path`, None when there is none or it cannot be read."""
        return self.box_file(path, shown, limit)[0]

    def file_problem(self, name, exc):
        """Record why the box file `name` could not be read (`exc`), under the name the answer
        may carry (`shown_name`); the reason."""
        why = problem_text(exc, self.is_secret)
        with self._lock:
            self.file_errors.setdefault(shown_name(name), why)
        return why

    # -- secrets -------------------------------------------------------------------------
    def is_secret(self, name):
        known = self._secret_names.get(name)
        if known is None:
            known = bool(self._patterns(name)) or floor_secret(name)
            self._secret_names[name] = known
        return known

    def digest(self, value):
        if len(value.strip()) >= 4:
            _KNOWN.add(value)  # whatever is hashed is a secret: never in an error text either
        inner, outer = self._keyed[0].copy(), self._keyed[1].copy()
        inner.update(value.encode())
        outer.update(inner.digest())
        return "hmac:" + outer.hexdigest()

    def masked(self, name, value):
        if value is None or not self.is_secret(name):
            return value
        # A whitespace-only secret is no secret: lobes reads a blank key as none
        # (_gateway_api_key) and .env's lines say "empty" for it (audit_envfile_keys).
        return {"secret": self.digest(value)} if value.strip() else ""

    def masked_value(self, name, value):
        """`masked`, and a value whose name is no secret but that carries one
        (`VLLM_ARGS=--api-key sk-...`) with that secret hashed inline (`mask_words`)."""
        if value is None or self.is_secret(name):
            return self.masked(name, value)
        return self.mask_words(value)

    def mask_env_list(self, items):
        out = {}
        for item in items or []:
            name, _, value = item.partition("=")
            out[name] = self.masked_value(name, value)
        return out

    def mask_env_map(self, env):
        return {
            k: self.masked_value(k, "" if v is None else str(v)) for k, v in (env or {}).items()
        }

    def secret_flag(self, flag):
        """`--api-key`, `--hf-token`, `--db-password`, `--token`, `--key`: a flag named like a
        secret carries one. The rule of reconciler/scrub.py's `secret_flag` (the reports' guard
        and the history store mask by it): the patterns name it (`named_flag`), or its last word
        names a credential (`credential_flag`); never one of PLAIN_FLAGS."""
        return self.named_flag(flag) or credential_flag(flag)

    def named_flag(self, flag):
        """A long flag the run's patterns or the floor name (`--db-cred` -> `DB_CRED`): its
        value is any word but the next flag (`--hf-token -x` holds `-x`), where a flag only its
        last word names ends at a single `-` too (`--token -v` is two flags)."""
        if not flag.startswith("--") or flag in PLAIN_FLAGS:
            return False
        return flag == "--api-key" or self.is_secret(flag[2:].replace("-", "_").upper())

    def _flag_value(self, flag, word):
        """Whether `word`, after the secret flag `flag`, is its value (`named_flag`)."""
        if word.startswith("--"):
            return False
        return not word.startswith("-") or self.named_flag(flag)

    def mask_argv(self, argv):
        """`--api-key=X` / `--api-key X` (and every flag named like a secret) carry secrets in
        argv too, and so does any word that assigns a secret name (`mask_assignments`).
        vLLM's `--api-key` takes one or more keys (argparse nargs="+": `--api-key K1 K2`), so
        after a secret flag's value every following word is hashed too, up to the next word
        starting with `-` (argparse ends the list there): for every secret flag, as the
        simplest rule that never leaves a key in clear. The controller's guards read argv by
        the same rule (reconciler/scrub.py `flag_values`, history/masking.py `argv`)."""
        out = []  # type: list
        hide_next = None  # the secret flag whose value the next word may be
        hide_more = False  # a secret flag's value was just read: a list of them may go on
        for arg in argv or []:
            if hide_next and isinstance(arg, str) and self._flag_value(hide_next, arg):
                out.append({"secret": self.digest(arg)})
                hide_next, hide_more = None, True
                continue
            if hide_more and isinstance(arg, str) and not arg.startswith("-"):
                out.append({"secret": self.digest(arg)})  # `--api-key K1 K2`: K2
                continue
            hide_next, hide_more = None, False
            flag, eq, value = arg.partition("=") if isinstance(arg, str) else ("", "", "")
            if eq and self.secret_flag(flag):
                out.append(flag + "=" + json_dumps({"secret": self.digest(value)}))
                hide_more = True  # `--api-key=K1 K2`: K2 is a key too
            else:
                out.append(self.mask_words(arg) if isinstance(arg, str) else arg)
                if isinstance(arg, str) and self.secret_flag(arg):
                    hide_next = arg
        return out

    def mask_assignments(self, word):
        """`word` with the value of every assignment to a secret name hashed, in the form an
        inline flag's value takes (`HF_TOKEN={"secret": "hmac:..."}`): a command may set a
        variable itself (`env HF_TOKEN=x vllm ...`, `bash -c 'export KEY=x; exec "$@"'`).
        An assignment is what reconciler/scrub.py's assignment expressions take for one:
        `NAME=value`, or `NAME: value` with an upper-case NAME, the NAME possibly quoted
        (`{"HF_TOKEN": "x"}`), the value quoted or up to a blank or one of `,;)}`; any value
        but an empty or blank one is hashed (prose has no place in a command). Read without
        importing re. The render's command and a container's are masked alike with
        the run's key, so equal commands stay equal and a changed secret reads changed."""
        if "=" not in word and ":" not in word:  # nearly every word
            return word
        out, done, at, size = [], 0, 0, len(word)
        while at < size:
            eq, colon = word.find("=", at), word.find(":", at)
            sep = eq if colon < 0 or 0 <= eq < colon else colon
            if sep < 0:
                break
            at = sep + 1
            begin = sep + 1
            while begin < size and word[begin].isspace():
                begin += 1
            quote = word[begin : begin + 1]
            if not self._secret_name_before(word, sep, done, quote in ("'", '"')):
                continue
            close = word.find(quote, begin + 1) if quote in ("'", '"') else -1
            if close > 0:
                value, stop = word[begin + 1 : close], close + 1
            else:
                stop = begin
                while stop < size and not word[stop].isspace() and word[stop] not in ",;)}":
                    stop += 1
                value = word[begin:stop]
            if not value.strip():
                continue  # nothing assigned, or blanks: no secret (as `masked` reads them)
            out.append(word[done:begin])
            out.append(json_dumps({"secret": self.digest(value)}))
            done = at = stop
        if not out:
            return word
        out.append(word[done:])
        return "".join(out)

    def mask_words(self, word):
        """`word` with every secret it carries hashed inline, in `mask_assignments`' form:
        an assignment to a secret name, the value of a flag named like a secret
        (`sh -c "vllm serve m --api-key sk-..."`, `--hf-token=x`, `"--api-key" "x"`, `--token
        x`, `--hf-token -x`: judged and read as `secret_flag` and `mask_argv` judge and read a
        flag of its own) and a credential after `Bearer ` or `Authorization: `
        (`curl -H 'Authorization: Bearer x'`). Read without importing re."""
        # Each word once: its answer depends only on the run's key and patterns, fixed for
        # the run (a race between two threads computes it twice, alike).
        done = self._masked_words.get(word)
        if done is None:
            done = self._masked_words[word] = self._mask_words(word)
        return done

    def _mask_words(self, word):
        may = "--" in word or "://" in word or _may_credential(word)
        spans = self._inline_secrets(word) if may else ()
        if not spans:
            return self.mask_assignments(word)
        out, done = [], 0
        for start, stop in spans:
            out.append(self.mask_assignments(word[done:start]))
            out.append(json_dumps({"secret": self.digest(word[start:stop])}))
            done = stop
        out.append(self.mask_assignments(word[done:]))
        return "".join(out)

    def _inline_secrets(self, word):
        """(start, stop) of each secret value a flag or a credential header carries in `word`,
        in order, none overlapping."""
        found = []
        size = len(word)
        at = word.find("--")
        while at >= 0:
            end = at + 2
            while end < size and (word[end] in _NAME or word[end] == "-"):
                end += 1
            flag = word[at:end]
            prev = word[at - 1] if at else " "
            if (
                end > at + 2
                and word[at + 2] != "-"
                and not (prev in _NAME or prev == "-")
                and self.secret_flag(flag)
            ):
                if prev in "'\"" and word[end : end + 1] == prev:
                    # A shell word of its own in quotes (`sh -c 'vllm "--api-key" "x"'`,
                    # `'--hf-token' 'x'`): its closing quote, then the separator and the value.
                    end += 1
                begin = end
                if word[end : end + 1] == "=":
                    begin = end + 1
                elif word[end : end + 1].isspace():
                    while begin < size and word[begin].isspace():
                        begin += 1
                    if not self._flag_value(flag, word[begin : begin + 2]):
                        begin = -1  # the next flag: this one is bare
                else:
                    begin = -1
                span = _value_span(word, begin) if begin >= 0 else None
                if span:
                    found.append(span)
            at = word.find("--", end)
        if _may_credential(word):
            lower = word.lower()
            for marker in ("bearer", "authorization"):
                at = lower.find(marker)
                while at >= 0:
                    end = at + len(marker)
                    begin = -1
                    if at == 0 or not lower[at - 1].isalnum():
                        begin = end
                        if marker == "authorization":
                            if lower[begin : begin + 1] in ("'", '"'):
                                begin += 1
                            while begin < size and word[begin].isspace():
                                begin += 1
                            if word[begin : begin + 1] in (":", "="):
                                begin += 1
                            else:
                                begin = -1
                        elif not word[end : end + 1].isspace():
                            begin = -1
                    if begin >= 0:
                        while begin < size and word[begin].isspace():
                            begin += 1
                        scheme = begin
                        while scheme < size and word[scheme].isalpha():
                            scheme += 1
                        if marker == "authorization" and scheme > begin:
                            after = scheme
                            while after < size and word[after].isspace():
                                after += 1
                            if after > scheme and after < size:
                                begin = after  # `Basic x`, `Bearer x`: the credential
                        span = _value_span(word, begin)
                        if span:
                            found.append(span)
                    at = lower.find(marker, end)
        if "://" in word:
            # A URL that is the value of an assignment to a secret name (`DB_SECRET_URL=http://
            # u:PW@db`) is hashed whole by `mask_assignments`: its password alone as well made
            # two digests side by side, a mask no desired value fits (a drift that stays).
            found.extend(
                (start, stop)
                for scheme, start, stop in _url_passwords(word)
                if not self._secret_value_at(word, scheme)
            )
        found.sort()
        spans = []  # type: list
        for start, stop in found:
            if spans and start < spans[-1][1]:
                continue  # `Authorization: Bearer x` is found twice
            spans.append((start, stop))
        return spans

    def _secret_value_at(self, word, at):
        """Whether the value starting at `at` in `word` (after its opening quote, if any) is
        assigned to a secret name, as `mask_assignments` reads an assignment."""
        i = at - 1 if at > 0 and word[at - 1] in "'\"" else at
        while i > 0 and word[i - 1].isspace():
            i -= 1
        if i == 0 or word[i - 1] not in "=:":
            return False
        return self._secret_name_before(word, i - 1, 0, i != at)

    def _secret_name_before(self, word, sep, floor, quoted):
        """Whether `word[sep]` (`=` or `:`) ends an assignment to a secret name: the name before
        it (blanks and a closing quote between; nothing before `floor`), not inside a longer
        word. Before a colon only an upper-case NAME, or a mapping's key in quotes of any case
        given quoted text (`quoted`: the value opens with a quote; `{"api_key": "x"}` in
        `--hf-overrides`): a bare lower-case word before a colon is a label of prose, and a
        key given a list or a number holds no secret (`"classifier_from_token": ["no",
        "yes"]` of a reranker's overrides)."""
        end = sep
        while end > floor and word[end - 1].isspace():
            end -= 1
        closing = ""
        if end > floor and word[end - 1] in "\"'":
            end -= 1
            closing = word[end]
        start = end
        while start > floor and word[start - 1] in _NAME:
            start -= 1
        name = word[start:end]
        if not name or name[0] not in _FIRST or (start > 0 and word[start - 1] in _NAME):
            return False  # no name, or one inside a longer word
        keyed = closing and start > 0 and word[start - 1] == closing and quoted
        if word[sep] == ":" and name.upper() != name and not keyed:
            return False  # `label: x` is prose
        return self.is_secret(name)

    def mask_command(self, entrypoint, command):
        """(entrypoint, command), masked as the ONE line Docker runs: a secret flag ending the
        entrypoint has its value at the start of the command, and an entrypoint may carry a
        `--api-key=...` of its own."""
        if not isinstance(entrypoint, list) or not isinstance(command, (list, type(None))):
            return entrypoint, self.mask_argv(command)  # not argv lists: parsed as faults
        masked = self.mask_argv(entrypoint + (command or []))
        cut = len(entrypoint)
        return masked[:cut], (masked[cut:] if command is not None else None)

    # -- processes -----------------------------------------------------------------------
    def run(self, argv, env=None, timeout=None, stdin_text=None):
        limit = timeout or self.timeout
        cwd = self.deploy if os.path.isdir(self.deploy) else self.home
        try:
            return spawned(argv, env, cwd, limit, stdin_text)
        except FileNotFoundError as exc:
            return 127, "", str(exc)
        except TimeoutError:
            return 124, "", "timed out after %ss" % limit
        except OverLimit as exc:  # killed: the part that ran it fails with this line
            return -9, "", str(exc)

    def scrubbed_env(self):
        return {"PATH": SCRUBBED_PATH, "HOME": self.home}


# -- a child process ---------------------------------------------------------------------------
# subprocess.run(argv, input=stdin_text, capture_output=True, text=True, env=env, cwd=cwd,
# timeout=timeout), without importing subprocess: its imports (signal, selectors, locale with
# re, contextlib, warnings) cost every run ~3 ms. The child is started by os.posix_spawn,
# which cannot enter a directory for the child: this process enters `cwd` for the moment of
# the spawn and goes back (one spawn at a time; every path this program uses is absolute, its
# deployment directory is a HomePath). The program is found as subprocess finds it (the PATH
# of `env`), SIGPIPE and SIGXFSZ are reset to their default as subprocess does, and output is
# decoded as its text mode decodes it (the locale's encoding, universal newlines). A program
# not found raises FileNotFoundError with subprocess's text. Where this process cannot hold
# on to its own directory, subprocess itself runs the command.
_SPAWNING = _thread.allocate_lock()
_LIVE = set()  # type: set  # the children this process started and has not reaped (_SPAWNING)
# What a child may print: a login profile printing a gigabyte was held whole. compose's render
# of a lab box is ~200 KB and `docker inspect` of its containers ~100 KB; `bash -x` traces a
# login (bash-completion, conda, nvm) in a few MB. Past its limit the child is killed and the
# part that ran it fails saying so.
OUTPUT_LIMIT = 32 * 1024 * 1024
TRACE_LIMIT = 16 * 1024 * 1024


def spawned(argv, env, cwd, timeout, stdin_text=None, limits=(OUTPUT_LIMIT, TRACE_LIMIT)):
    """(returncode, stdout, stderr); TimeoutError once `timeout` s have passed (the child
    killed, as subprocess.run kills it); OverLimit once stdout or stderr passes its byte
    limit in `limits` (killed too)."""
    program = _which(argv[0], env)
    environ = os.environ if env is None else env
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    actions = [(os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]
    in_r = in_w = None
    if stdin_text is not None:
        in_r, in_w = os.pipe()
        actions.append((os.POSIX_SPAWN_DUP2, in_r, 0))
    pid = None
    try:
        with _SPAWNING:
            pid = _spawn_in(cwd, program, argv, environ, actions)
            if pid:
                _LIVE.add(pid)
    finally:
        _close(out_w, err_w, in_r)  # the child's ends
        if not pid:  # not started (an error, or subprocess is to run it)
            _close(out_r, err_r, in_w)
    if pid is False:
        return _subprocess_run(argv, env, cwd, timeout, stdin_text, limits)
    deadline = time.monotonic() + timeout
    if in_w is not None:
        try:  # noqa: SIM105 - contextlib is not imported for this
            os.write(in_w, stdin_text.encode(_TEXT_ENCODING))  # small: never fills the pipe
        except OSError:
            pass  # the child is gone: its status says why
        os.close(in_w)
    try:
        return _output(pid, argv[0], (out_r, err_r), limits, deadline)
    finally:
        _LIVE.discard(pid)  # reaped (or killed and reaped) by now
        os.close(out_r)
        os.close(err_r)


def _output(pid, name, fds, limits, deadline):
    """(returncode, stdout, stderr) of the child `pid`, read from its pipes `fds` (stdout,
    stderr) until both close and it ends; each pipe read to its limit in `limits` at most."""
    import select

    chunks = {fd: [] for fd in fds}  # type: dict
    room = {fds[0]: limits[0], fds[1]: limits[1]}
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    open_fds = set(fds)
    exited_at = None  # when the child was seen gone: what it left behind may hold its pipes
    while open_fds:
        now = time.monotonic()
        left = deadline - now
        if left <= 0:
            _kill(pid)
            raise TimeoutError("timed out")
        if exited_at is None and _exited(pid):
            exited_at = now
        if exited_at is not None:
            wait = exited_at + DRAIN_S - now
            if wait <= 0:  # `sleep 30 &` in a login profile: its output is not the child's
                _kill_group(pid)
                break
        else:
            wait = CHECK_S
        for fd, _ in poller.poll(min(left, wait) * 1000):
            data = os.read(fd, 65536)
            if not data:
                poller.unregister(fd)
                open_fds.discard(fd)
                continue
            room[fd] -= len(data)
            if room[fd] < 0:
                _kill(pid)
                stream = "stdout" if fd == fds[0] else "stderr"
                limit = limits[fds.index(fd)]
                raise OverLimit(
                    "%s printed over %d bytes on %s (stopped)"
                    % (os.path.basename(name), limit, stream)
                )
            chunks[fd].append(data)
    code = _wait(pid, deadline)
    return code, _text(b"".join(chunks[fds[0]])), _text(b"".join(chunks[fds[1]]))


def _spawn_in(cwd, program, argv, environ, actions):
    """The child's pid, started in `cwd`; False if this process cannot come back to its own
    directory afterwards (then nothing is started)."""
    from _signal import SIGPIPE, SIGXFSZ

    try:
        here = os.open(".", getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        os.chdir(cwd)
        return os.posix_spawn(
            program, list(argv), environ, file_actions=actions, setsigdef=(SIGPIPE, SIGXFSZ),
            setsid=True,  # its own session and process group: what it leaves behind is killed
        )  # fmt: skip
    finally:
        os.fchdir(here)
        os.close(here)


def _close(*fds):
    for fd in fds:
        if fd is not None:
            os.close(fd)


def _subprocess_run(argv, env, cwd, timeout, stdin_text, limits):
    """spawned's child started by subprocess (which can enter `cwd` for it), its output read
    within the same limits."""
    import subprocess

    pipe = subprocess.PIPE
    with _SPAWNING:
        proc = subprocess.Popen(
            argv, stdin=None if stdin_text is None else pipe, stdout=pipe, stderr=pipe, env=env,
            cwd=cwd, bufsize=0, start_new_session=True,
        )  # fmt: skip
        _LIVE.add(proc.pid)
    deadline = time.monotonic() + timeout
    code = -9  # what the child is if reading it fails: killed (_output killed and reaped it)
    try:
        if proc.stdin is not None:  # unbuffered: the write is the child's pipe's, as spawned's
            try:  # noqa: SIM105 - as spawned writes it
                proc.stdin.write(stdin_text.encode(_TEXT_ENCODING))  # small: never fills the pipe
            except OSError:
                pass  # the child is gone: its status says why
            proc.stdin.close()
        fds = (proc.stdout.fileno(), proc.stderr.fileno())  # type: ignore[union-attr]
        code, out, err = _output(proc.pid, argv[0], fds, limits, deadline)
        return code, out, err
    finally:
        _LIVE.discard(proc.pid)
        proc.returncode = code  # reaped here: subprocess must not wait for it again
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]


def _which(name, env):
    """subprocess's search: a name with a directory as it is, else each directory of the PATH
    in `env` (os.get_exec_path), the first executable file."""
    if os.path.dirname(name):
        return name
    for directory in os.get_exec_path(env):
        path = os.path.join(directory, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(2, "No such file or directory", name)


def _wait(pid, deadline):
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.WIFSIGNALED(status):
                return -os.WTERMSIG(status)
            return os.WEXITSTATUS(status)
        if time.monotonic() > deadline:
            _kill(pid)
            raise TimeoutError("timed out")
        time.sleep(0.001)


# A child gone while its pipes stay open (a background job holds them) is read DRAIN_S more,
# then its process group is killed; whether it is gone is asked every CHECK_S while it runs.
DRAIN_S = 0.2
CHECK_S = 0.1


def _exited(pid):
    """Whether the child `pid` has ended (not reaped: its process group stays its own)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except (AttributeError, OSError):
        return False


def _kill_group(pid):
    """Kill what is left of the child's process group (the child started one: setsid)."""
    try:
        if os.getpgid(pid) == pid:  # still its own group: never this process's
            os.killpg(pid, 9)
    except OSError:
        pass


def _kill(pid):
    _kill_group(pid)
    try:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    except OSError:
        pass


# -- what a child leaves running -------------------------------------------------------------------
# A login profile's daemon (`eval "$(ssh-agent -s)"`) leaves the child's process group (setsid,
# a double fork): killing the group missed it, and each drift left one more ssh-agent on the
# box. While the traced login shell runs, this process is a child subreaper: what the shell
# leaves behind is reparented here instead of to init, and is ended once the shell has exited.
PR_SET_CHILD_SUBREAPER = 36
_PRCTL = []  # type: list  # libc's prctl, looked up once (_ctypes is imported only for it)
ADOPTED_GRACE_S = 0.5  # a SIGTERM's time to clean up (ssh-agent removes its socket), then SIGKILL


def subreaper(on):
    """prctl(PR_SET_CHILD_SUBREAPER, on); False where it cannot be set (no _ctypes, no prctl:
    not Linux), and then nothing left behind is collected, as before."""
    try:
        if not _PRCTL:
            _PRCTL.append(_libc_prctl())
        return _PRCTL[0](PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) == 0
    except (ImportError, OSError, AttributeError, TypeError):
        return False


def _libc_prctl():
    """What `ctypes.CDLL(None, use_errno=True).prctl` is, made from _ctypes, the C module under
    ctypes: the function libc exports, returning a C int, its int arguments passed as C ints,
    errno kept. Every run traces the login shell and so needs it; importing ctypes itself (its
    Python layer, struct, ctypes._endian) cost each run ~1.7 ms of the box's CPU, _ctypes ~0.3."""
    import _ctypes

    class c_int(_ctypes._SimpleCData):  # ctypes.c_int: a direct subclass, so a result is an int
        _type_ = "i"

    class Function(_ctypes.CFuncPtr):  # ctypes.CDLL's _FuncPtr (cdecl, use_errno=True)
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = c_int

    # What CFuncPtr((name, library)) reads of a library: its handle, here dlopen(NULL), the
    # program's own symbols, as ctypes.CDLL(None) opens them (typeshed allows neither).
    class Libc:
        _handle = _ctypes.dlopen(None, _ctypes.RTLD_LOCAL)  # type: ignore[arg-type]

    return Function(("prctl", Libc()))  # type: ignore[arg-type]


def children():
    """The pids whose parent is this process (any of its threads): each thread's
    /proc/self/task/TID/children, else every /proc/PID/stat's parent."""
    found = set()  # type: set
    me = os.getpid()
    if _proc_read("/proc/self/task/%d/children" % me) is not None:  # else a kernel without it
        try:
            tasks = os.listdir("/proc/self/task")
        except OSError:
            tasks = []
        for tid in tasks:
            data = _proc_read("/proc/self/task/%s/children" % tid)  # None: a thread just ended
            found.update(int(pid) for pid in (data or b"").split())
        return found
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        data = _proc_read("/proc/%s/stat" % name)
        # pid (comm) state ppid ...: comm may hold anything, a `)` too; the last one ends it
        fields = data[data.rfind(b")") + 2 :].split(None, 2) if data else []
        if len(fields) > 1 and fields[1] == b"%d" % me:
            found.add(int(name))
    return found


def _proc_read(path):
    """The bytes of a /proc file (through the one reader), None if it cannot be read."""
    try:
        return read_file(path, SMALL_FILE_LIMIT)[0]
    except OSError:
        return None


def end_adopted(before):
    """End every child of this process that it did not start (reparented here, a subreaper,
    when its own parent exited) and that was not its child already (`before`): SIGTERM, a
    moment to exit, then SIGKILL; each reaped. What an ended one leaves comes here in turn,
    and is ended too. The number ended."""
    from _signal import SIGKILL, SIGTERM

    ended = 0
    for _ in range(8):  # a daemon's daemon's daemon: deeper is not met
        with _SPAWNING:  # no child of this process is started meanwhile, unlisted in _LIVE
            left = children() - before - _LIVE
        if not left:
            break
        ended += len(left)
        for pid in left:
            _signal(pid, SIGTERM)
        deadline = time.monotonic() + ADOPTED_GRACE_S
        while left and time.monotonic() < deadline:
            left = set(pid for pid in left if not _reaped(pid))
            if left:
                time.sleep(0.01)
        for pid in left:
            _signal(pid, SIGKILL)
            try:  # noqa: SIM105 - contextlib is not imported for this
                os.waitpid(pid, 0)
            except OSError:
                pass
    return ended


def _signal(pid, sig):
    try:  # noqa: SIM105 - contextlib is not imported for this
        os.kill(pid, sig)
    except OSError:
        pass


def _reaped(pid):
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except OSError:  # not a child any more (reaped): gone
        return True


def _text_encoding():
    import io

    return io.TextIOWrapper(io.BytesIO()).encoding  # what subprocess's text mode decodes with


_TEXT_ENCODING = _text_encoding()


def _text(data):
    # A byte the encoding refuses is replaced, not raised: one login variable holding Latin-1
    # bytes would otherwise cost the whole login part.
    return data.decode(_TEXT_ENCODING, "replace").replace("\r\n", "\n").replace("\r", "\n")


# -- .env ------------------------------------------------------------------------------------
# A `.env` line is an assignment when the regular expression
#     ^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$
# matches it (the key and the rest): `env_assignment` reads a line as it does, without importing
# re (with enum, ~5 ms a run); tests/unit/test_collector_cpu.py holds it to the expression.
_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_NAME = _FIRST | frozenset("0123456789")


def _may_credential(word):
    """Whether `word` may hold `Bearer x` or `Authorization: x` (a cheap look first)."""
    return "earer" in word or "EARER" in word or "uthoriz" in word or "UTHORIZ" in word


def _value_span(word, begin):
    """(start, stop) of the value starting at `begin` in `word`: quoted (its inside), or up
    to a blank, a quote or one of `,;)}`; None for an empty one."""
    size = len(word)
    quote = word[begin : begin + 1]
    if quote in ("'", '"'):
        close = word.find(quote, begin + 1)
        if close > begin + 1 and word[begin + 1 : close].strip():
            return begin + 1, close
        return None
    stop = begin
    while stop < size and not word[stop].isspace() and word[stop] not in ",;)}'\"":
        stop += 1
    return (begin, stop) if stop > begin else None


_LETTERS = _FIRST - {"_"}
_SCHEME = _NAME - {"_"} | frozenset("+.-")


def _url_passwords(word):
    """(scheme, start, stop) of each URL's password in `word` (`HTTPS_PROXY=http://svc:PW@proxy:
    3128`, `HF_ENDPOINT=https://deploy:PW@mirror`), `scheme` where the URL starts: from the
    user info's first `:` to the authority's last `@`, where URL parsers end the user info
    (`me@corp.com:PW@proxy`: the user may hold an `@`; the reports' `_USERINFO` reads it so).
    The user name stays: it says whose. The authority ends at `/`, `?`, `#` or a blank, and at
    a quote only when the URL opened inside that quote (`sh -c 'curl "http://u:PW@p" x'`):
    a password may hold a quote (RFC 3986), and cut there it would leave the box in clear."""
    spans = []
    size = len(word)
    at = word.find("://")
    while at >= 0:
        scheme = at
        while scheme > 0 and word[scheme - 1] in _SCHEME:
            scheme -= 1
        opener = word[scheme - 1] if scheme > 0 and word[scheme - 1] in "'\"" else ""
        begin = end = at + 3
        while end < size and not word[end].isspace() and word[end] not in "/?#" + opener:
            end += 1
        last = word.rfind("@", begin, end)
        colon = word.find(":", begin, last) if last > 0 else -1
        named = scheme < at and word[scheme] in _LETTERS  # `scheme://`, as the reports read it
        if named and colon >= 0 and colon + 1 < last:
            spans.append((scheme, colon + 1, last))
        # From just after this `://`: an authority without a path ran on to the next URL's
        # `/` (`sentinel://:pw@s1;sentinel://:pw@s2`), and searching from there skipped it.
        at = word.find("://", at + 3)
    return spans


def env_assignment(line):
    """(key, rest) of one line (no line break in it) that assigns, else None."""
    eq = line.find("=")
    if eq < 0:
        return None  # the expression needs its `=`
    key = line[:eq]
    if key.isidentifier() and key.isascii():  # KEY=value: nearly every line
        return key, line[eq + 1 :].lstrip()
    text = line.lstrip()
    if text.startswith("export") and text[6:7].isspace():
        found = _key_equals(text[6:].lstrip())
        if found is not None:
            return found
    return _key_equals(text)


def _key_equals(text):
    end = _name_end(text, 0)
    if end == 0:
        return None
    rest = text[end:].lstrip()
    return (text[:end], rest[1:].lstrip()) if rest[:1] == "=" else None


def _name_end(text, start):
    """Where the name `[A-Za-z_][A-Za-z0-9_]*` at `start` ends (`start`: no name there)."""
    if text[start : start + 1] not in _FIRST or start >= len(text):
        return start
    end = start + 1
    while end < len(text) and text[end] in _NAME:
        end += 1
    return end


def env_lines(text):
    """`.env` text in lines as compose's dotenv reads it (`_dotenv_lines`): at LF only, a quoted
    value spanning lines kept in one, a CR before the LF kept at its line's end; as the
    converger's `env_lines` with keepends (less the LF)."""
    return _dotenv_lines(text)


def parse_dotenv(text, problems=None, computed=()):
    """Each assignment of `.env` text to a key `[A-Za-z_][A-Za-z0-9_]*` as compose reads it,
    in order ({key, value, line}; the last of a key wins). A key whose value compose computes
    from what the box cannot know here (`_dotenv_read`) is left out, and so is every earlier
    assignment of it: it reads as absent, never as a value compose does not hold. Except a
    key of `computed` (those managed as null): compose reads it as present, which drift must
    say and a converge removes, so it is kept with its value as written (`_as_written`, as
    the audit reads such a line), never a value compose holds. A text compose refuses gives
    no entry at all (compose reads nothing from it); (line, why) is then added to `problems`
    when given."""
    statements, problem = _dotenv_read(text)
    if problem is not None:
        if problems is not None:
            problems.append(problem)
        return []
    entries = []  # type: list
    for key, value, line, _, value_at, value_end, _ in statements:
        if not (key.isidentifier() and key.isascii()):
            continue
        if value is None and key in computed:
            value = _as_written(text, value_at, value_end)
        if value is None:
            entries = [entry for entry in entries if entry["key"] != key]
        else:
            entries.append({"key": key, "value": value, "line": line})
    return entries


def _as_written(text, value_at, value_end):
    """A statement's value as its line writes it (quotes and `${...}` kept), stripped: what
    the answer shows for a value compose computes from what the box cannot know
    (`parse_dotenv`'s `computed`; the audit's active value, `audit_envfile_keys`)."""
    return text[value_at:value_end].strip() if value_at >= 0 else ""


def null_keys(run):
    """The keys the payload manages as null (`env: {KEY: null}`): a converge removes every
    statement assigning one, whatever its value, so each counts as present while one does."""
    return frozenset(k for k, spec in (run.p.get("managed_env") or {}).items() if spec is None)


def _dotenv_value(rest):
    """The value compose reads from `KEY=<rest>` standing alone (the audit reads a line at a
    time, commented-out ones too); `rest` itself, stripped, where compose would not read it."""
    statements, problem = _dotenv_read("K=" + rest)
    value = statements[0][1] if statements and problem is None else None
    return rest.strip() if value is None else value


def _comment_at(text):
    r"""Where `\s#` first matches in `text` (the blank before the `#`), else -1."""
    at = text.find("#", 1)
    while at > 0:
        if text[at - 1].isspace():
            return at - 1
        at = text.find("#", at + 1)
    return -1


def file_facts(run, names):
    """Each file's facts, by the name the answer gives it (`shown_name`); a file that is there but
    cannot be read (a symlink to nothing among them) is the box's problem, in `file_errors`."""
    known = StatDigests(run.once("cache_dir", _cache_dir))
    out = {}
    for name in names:
        path = os.path.join(run.deploy, name)
        shown = shown_name(name)
        try:
            info = _followed(path)
            digest = known.get(path, info)
            if digest is None:
                data, opened = read_file(path)
                digest = sha256(data).digest()
                known.put(path, opened, digest, len(data))
                size = len(data)
            else:
                size = info.st_size
            run.remember(("file", name), digest)  # the render cache keys on it too
            out[shown] = {
                "exists": True,
                "sha256": digest.hex(),
                "mode": oct(info.st_mode & 0o777),
                "size": size,
            }
        except FileNotFoundError:
            out[shown] = {"exists": False}
        except OSError as exc:  # a FIFO, a device, a directory, over the limit, unreadable
            out[shown] = {"exists": False, "error": run.file_problem(name, exc)}
    known.save()
    return out


DANGLING = "a symlink that leads to no file"


def _followed(path):
    """os.stat(path); a symlink that leads to no file is a BoxFileError, not FileNotFoundError:
    the converger refuses to snapshot one (check_managed_files: "... is a symlink that leads to
    no file"), so the box's problem is named before a plan is made, not when a converge starts."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise BoxFileError(DANGLING) from None
        raise


SETTLED_NS = 2 * 10**9  # a file changed this recently is hashed again next run too


class StatDigests:
    """The files' digests of the last run, by what stat says of each file: a file whose device,
    inode, size, mtime and ctime are all as they were is not read and hashed again (a lab box's
    .env and compose files are 225 KB: ~1.4 ms of the builtin SHA-256 every run).

    Safe against an edit that keeps the size and the mtime (mtime can be set back; two writes
    can share a clock tick): any write or `touch` sets ctime to the time it happens, which no
    user can set; and a digest is remembered only for a file whose mtime and ctime were over
    SETTLED_NS old when it was read, so a later change cannot fall in the same tick. A new
    file in its place has another inode. The store is a file in the private cache directory
    (0600, read only if it is the user's own regular file with no group/other bits, like the
    compiled code); anything odd about it is a miss, and every file is hashed."""

    NAME = "file-digests"  # not *.json: the render cache prunes those

    def __init__(self, cache_dir):
        self.path = os.path.join(cache_dir, self.NAME) if cache_dir else None
        self.old, self.new, self.changed = self._load(), {}, False

    def _load(self):
        if self.path is None:
            return {}
        try:
            data, info = read_file(self.path, 1 << 20, follow=False)
            found = json_loads(data) if _private_file(info) else None
        except (OSError, ValueError):  # the tool's own store: anything odd is a miss
            return {}
        return found if isinstance(found, dict) else {}

    def get(self, path, info):
        entry = self.old.get(path)
        if not (isinstance(entry, list) and entry[:5] == _stamp(info) and len(entry) == 6):
            return None
        try:
            digest = bytes.fromhex(entry[5])
        except (TypeError, ValueError):
            return None
        if len(digest) != 32:
            return None
        self.new[path] = entry
        return digest

    def put(self, path, info, digest, size):
        settled = time.time_ns() - SETTLED_NS
        if _isreg(info) and info.st_size == size and max(_times(info)) < settled:
            self.new[path] = _stamp(info) + [digest.hex()]
            self.changed = True
        elif path in self.old:
            self.changed = True  # its stale entry goes

    def save(self):
        if self.path is None or not (self.changed or self.new.keys() != self.old.keys()):
            return
        tmp = "%s.%d" % (self.path, os.getpid())
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            with os.fdopen(os.open(tmp, flags, 0o600), "w") as handle:
                handle.write(json_dumps(self.new))
            os.replace(tmp, self.path)
        except OSError:
            try:  # noqa: SIM105 - contextlib is not imported for this
                os.unlink(tmp)
            except OSError:
                pass


def _stamp(info):
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def _times(info):
    return (info.st_mtime_ns, info.st_ctime_ns)


def _isreg(info):
    return info.st_mode & 0o170000 == 0o100000  # stat.S_ISREG, without importing stat


def _private_file(info):
    return _isreg(info) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def deployed_env(run):
    """The deployment's `.env` text, read once a run; None without one, or when it cannot be
    read (then the box's problem, in `file_errors`)."""
    return run.once("deployed_env", run.box_text, os.path.join(run.deploy, ".env"), ".env")


def envfile_fact(run):
    """(the `.env` lines as the answer shows them, {key: value} as compose reads them; a key
    managed as null whose value compose computes, as written: `parse_dotenv`). A value is
    masked as a container's environment is (`masked_value`): a key that is no secret
    may still carry one (`VLLM_ARGS=--api-key sk-...`, `CURL_HDR=Authorization: Bearer x`),
    which a lane then runs; its secret is hashed inline, so the line compares with the
    containers' and the login shell's values and never leaves the box in clear."""
    text = deployed_env(run)
    if text is None:
        return None, {}
    problems = []  # type: list
    # A key managed as null whose value compose computes (`HAND_IMAGE=${HAND_PIN:-...}`) is
    # there for compose: shown as written, so drift says the line a converge removes.
    entries = parse_dotenv(text, problems, null_keys(run))
    if problems:  # compose reads nothing from it (`up` fails): not a file of no entries
        run.file_problem(".env", BoxFileError(refused_text(".env", problems[0])))
        return None, {}
    values = {e["key"]: e["value"] for e in entries}
    shown = [dict(e, value=run.masked_value(e["key"], e["value"])) for e in entries]
    return shown, values


def refused_text(name, problem):
    """Why compose refuses a dotenv file, as `file_errors` says it: the line and the reason,
    never the line's text (it may hold a value)."""
    return "docker compose refuses %s at line %d: %s" % (shown_name(name), problem[0], problem[1])


def envfile_desired(run):
    """{key: value masked as `envfile_fact` masks the key's line} for each managed key whose
    desired value carries a secret inline, and only those (nearly always none). The payload
    holds the desired value in clear, the answer the box's line with its secret hashed by
    this run's key, which the controller does not hold: it compares the line with this."""
    out = {}
    for key, spec in run.p.get("managed_env", {}).items():
        if isinstance(spec, str) and not run.is_secret(key):
            shown = run.mask_words(spec)
            if shown != spec:
                out[key] = shown
    return out


def knobs_desired(run):
    """{key: its command-line words masked as the render's command is} for each lane knob
    whose desired value carries a secret inline (`--api-key x`, `--hf-token=x`, a `Bearer x`
    in a JSON value), and only those: the payload's `knob_argv`, which the controller lexed
    (nearly always absent). The render holds such a secret hashed with this run's key, which
    the controller does not hold: it compares the knob's flags with these."""
    out = {}  # type: dict
    knobs = run.p.get("knob_argv")
    if not isinstance(knobs, dict):
        return out
    for key, words in knobs.items():
        if isinstance(words, list) and all(isinstance(w, str) for w in words):
            # As `mask_command` masks the render's line, a word at a time: a bare secret flag
            # hides the word after it, `--flag=x` keeps its flag name, any other word is masked
            # inline (`mask_words`).
            shown = run.mask_argv(words)
            if shown != words:
                out[key] = shown
    return out


def secret_sources(run, sent=None):
    """Read every box_file secret source and take the controller_env secrets the controller
    `sent` on stdin; return digests for the report, values for rendering and the audit probe.
    A controller value is hashed exactly like a value read here: every comparison (`.env`,
    the render, the containers, keyed access) treats both sources alike.
    Each entry's `source` is the source as the payload named it (a box_file's path as given
    and as expanded here, and its key; a controller_env's variable): names, never a value. A
    snapshot replayed against a desired state whose source changed since has read another
    source, which the controller tells by it (compare/envfile.py `stale_sources`). Under
    `source` (a record's metadata): a snapshot keeps it as it is (history/masking.py)."""
    shown, values, cache, refusals = {}, {}, {}, {}  # type: dict, dict, dict, dict
    for name, variable in sorted((run.p.get("controller_secrets") or {}).items()):
        value = (sent or {}).get(name)
        where = "$%s on the controller" % variable
        spec = {"variable": variable}
        if isinstance(value, str) and value.strip():
            values[name] = value
            shown[name] = {"status": "ok", "path": where, "digest": run.digest(value)}
        else:
            shown[name] = {"status": "not-sent", "path": where}
        shown[name]["source"] = spec
    for name, src in sorted(run.p.get("box_secrets", {}).items()):
        path = os.path.expanduser(src["path"])
        spec = {"path": src["path"], "expanded": path, "key": src["key"]}
        if path not in cache:
            text, problem = run.box_file(path, src["path"])
            # As the converger reads it: compose's reading, else a line at a time (a shell's
            # rc file holding the one export the importer pointed at).
            cache[path] = problem if text is None else _secret_file_values(text)
            refusals[path] = None if text is None else _dotenv_read(text)[1]
        found = cache[path]
        if isinstance(found, dict) and src["key"] not in found and refusals[path]:
            # Not even a line of it holds the key, and compose refuses the file: say where
            # compose stops rather than a missing key (the line may be the key's own).
            why = refused_text(src["path"], refusals[path])
            found = run.file_problem(src["path"], BoxFileError(why))
        if isinstance(found, str):  # there, but not a file to read: file_errors says why
            shown[name] = {"status": "file-unreadable", "path": src["path"]}
        elif found is None:
            shown[name] = {"status": "file-missing", "path": src["path"]}
        elif not found.get(src["key"], "").strip():  # blank is no key, as masked() says
            shown[name] = {"status": "key-missing", "path": src["path"]}
        else:
            values[name] = found[src["key"]]
            shown[name] = {
                "status": "ok",
                "path": src["path"],
                "digest": run.digest(found[src["key"]]),
            }
        shown[name]["source"] = spec
    return shown, values


def desired_env(run, secret_values):
    """({managed key: desired value}, {key managed as None}) as a converge writes them (its
    `desired_values`): a secret resolved; one whose source is missing (reported as an error)
    left out, the box's line kept as it is."""
    managed, absent = {}, set()
    for key, spec in run.p["managed_env"].items():
        if spec is None:
            absent.add(key)
        elif not isinstance(spec, dict):
            managed[key] = spec
        elif spec["secret"] in secret_values:
            managed[key] = secret_values[spec["secret"]]
        elif "value" in spec:
            managed[key] = spec["value"]  # a controller_env secret sent for this run
    return managed, absent


def desired_envfile(run, current_text, secret_values):
    """The .env a converge would write (converge.py `write_env`), read as compose reads it: each
    managed key whose value differs written over the value of the assignment compose keeps
    (its last; what comes before and after the value on its line stays: an inline comment,
    another statement after a closing quote) or appended, and every assignment of a key
    managed as None (`env: {KEY: null}`) taken out (its whole line when nothing else is on
    it), as a converge removes them; every other byte as it is. Statements, not lines: a line
    `V="a" W=3` assigns two keys, and writing V must keep W. A key managed as None is taken
    out wherever a statement assigns it, one whose value compose computes too (compose reads
    it as present; converge.py `differs`). A text compose refuses is kept whole (a converge
    refuses to write into it; file_errors says why). Used only to render; it is never
    written to a file (Shadow)."""
    managed, absent = desired_env(run, secret_values)
    text = current_text or ""
    statements, problem = _dotenv_read(text)
    if problem is not None:
        return text
    current = {}  # type: dict  # key -> (value, statement) of the assignment compose keeps
    for statement in statements:
        key = statement[0]
        if not (key.isidentifier() and key.isascii()):
            continue
        if statement[1] is None:  # a value the box cannot know: a converge appends the key
            current.pop(key, None)
        else:
            current[key] = (statement[1], statement)
    edits, appended = [], []
    for key, want in managed.items():
        found = current.get(key)
        if found is not None and found[0] == want:
            continue
        if found is not None and found[1][4] >= 0:
            start, end = found[1][4], found[1][5]
            edits.append((start, end, _env_value(want, text[end : _line_end(text, end)])))
        else:
            appended.append("%s=%s\n" % (key, _quote(want)))
    for statement in statements:
        if statement[0] in absent:
            edits.append(_removal(text, statement[3], statement[6]))
    out, done = [], 0
    for start, end, new in sorted(edits):
        if start < done:  # never: statements do not overlap
            continue
        out += [text[done:start], new]
        done = end
    out.append(text[done:])
    written = "".join(out)
    if appended and written and not written.endswith("\n"):
        written += "\n"
    return written + "".join(appended)


_PLAIN = _NAME | frozenset("./:,@+=-")


def _quote(value):
    """A value written as a converge writes it (converge.py `quote`, whose bare set also takes
    `%`: compose reads either form alike): bare where it can be, else in single quotes
    (literal: no interpolation, no escapes), else in double quotes. A value a converge refuses
    to write (a line break, a NUL, both ' and $) gets one of these forms too: the converge
    fails before what this renders could run."""
    # As `re.match(r"^[A-Za-z0-9_./:,@+=-]+$", value)` read it: `$` also matches before a
    # final line break.
    body = value[:-1] if value.endswith("\n") else value
    if value == "" or (body and all(c in _PLAIN for c in body)):
        return value
    return _quoted(value)


def _quoted(value):
    if "'" not in value:
        return "'%s'" % value
    return '"%s"' % value.replace("\\", "\\\\").replace('"', '\\"')


def _env_value(value, tail):
    """converge.py `replace_value`'s new value: quoted where, bare, it would run into `tail`,
    what follows it on its line (`A=new W=3` is one value; `A= # why` reads `# why`)."""
    new = _quote(value)
    return new if new != value or _bare_fits(new, tail) else _quoted(value)


def _bare_fits(new, tail):
    """Whether compose reads a bare `new` followed by `tail` on its line as `new`: the value
    runs to the line's end, cut at the first ` #`, and is trimmed (converge.py `_bare_fits`)."""
    if "\n" in tail:
        return False
    if not tail.strip(_SPACE):
        return True
    cut = tail.find(" #")
    return new != "" and cut >= 0 and not tail[:cut].strip(_SPACE)


def env_basis(run, text):
    """The digest of what compose reads from a `.env` text: its assignments parsed (the last
    one of a key wins, at its first place), secrets (whole values and inline ones) as this
    run's keyed digests, as the answer's `envfile` shows them (`envfile_fact`). The render
    of the box's own `.env` records it, so the controller can tell which render its `.env`
    gives, offline too (reconciler/compare/render_basis.py computes the same from `envfile`).
    None without a `.env`."""
    if text is None:
        return None
    return _pairs_basis(_env_pairs(run, text))


def desired_basis(run, current_text, secret_values):
    """The basis the render of the desired `.env` (`desired_envfile`) records: the box's own
    `.env` as `env_basis` reads it, each managed key set to its desired value (masked as its
    line would be) or, managed as None, taken out; what render_basis.py's `desired_pairs`
    computes from the answer's `envfile`, `envfile_desired` and the desired state alone.
    Not compose's reading of the desired text: there a line the converge leaves as it is
    may read otherwise (`C=${A}` reads A's new value), which the answer's `envfile` (values,
    not lines) cannot tell the controller, and a replay against this very desired state
    found no render of it. These pairs tell the text as well: given this `.env`, a converge
    writes exactly the keys whose value they change and takes out those they drop, so the
    same pairs give the same text, and the same render."""
    managed, absent = desired_env(run, secret_values)
    pairs = _env_pairs(run, current_text) if current_text is not None else {}
    for key in absent:
        pairs.pop(key, None)
    for key, want in managed.items():
        pairs[key] = run.masked_value(key, want)
    return _pairs_basis(pairs)


def _env_pairs(run, text):
    pairs = {}
    for entry in parse_dotenv(text, computed=null_keys(run)):
        pairs[entry["key"]] = run.masked_value(entry["key"], entry["value"])
    return pairs


def _pairs_basis(pairs):
    canonical = json_dumps(
        [[key, value] for key, value in pairs.items()], separators=(",", ":"), sort_keys=True
    )
    return sha256(canonical.encode("utf-8")).hexdigest()


# -- compose ----------------------------------------------------------------------------------
class Workspace:
    """The run's private temp directory, made only when a compose render must run: a render
    served from the cache needs no project directory (mkdtemp, a symlink per entry and their
    removal cost a run ~5 ms of system time). Its name carries this process's id, so a run
    that was killed (SIGKILL, the OOM killer: `remove` never ran) leaves a directory the next
    one that makes its own removes (`sweep_workspaces`)."""

    def __init__(self):
        self.path = None
        self.lock = _thread.allocate_lock()
        self.fds = []  # type: list  # the desired `.env` texts held in memory (Shadow)

    def directory(self):
        with self.lock:
            if self.path is None:
                import tempfile

                root = tempfile.gettempdir()
                sweep_workspaces(root)
                self.path = tempfile.mkdtemp(prefix="%s%d-" % (WORKSPACE_PREFIX, os.getpid()))
            return self.path

    def remove(self):
        if self.path is not None:
            import shutil

            shutil.rmtree(self.path, ignore_errors=True)
        for fd in self.fds:
            os.close(fd)
        self.fds = []


WORKSPACE_PREFIX = "fleet-collect-"
# A workspace whose process cannot be told (an older collector's name has no process id, or
# the id was taken by another process since) is stale past this age: a run lasts seconds,
# bounded by its box's timeout.
WORKSPACE_STALE_S = 3600


def sweep_workspaces(root):
    """Remove the workspaces of collectors that are gone from `root` (the temp directory): this
    user's own `fleet-collect-*` directories whose process no longer runs, or older than
    WORKSPACE_STALE_S. One an older collector left may hold a desired `.env` with its secrets
    in clear (0600, in a 0700 directory); anything not this user's, or not a directory, stays."""
    try:
        names = [n for n in os.listdir(root) if n.startswith(WORKSPACE_PREFIX)]
    except OSError:
        return
    if not names:
        return
    import shutil

    uid, stale = os.getuid(), time.time() - WORKSPACE_STALE_S
    for name in names:
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if info.st_mode & 0o170000 != 0o040000 or info.st_uid != uid:
            continue
        pid = name[len(WORKSPACE_PREFIX) :].partition("-")[0]
        if info.st_mtime >= stale and not (pid.isdigit() and _gone(int(pid))):
            continue
        shutil.rmtree(path, ignore_errors=True)


def _gone(pid):
    """Whether no process `pid` runs (one of another user's is still running)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


SHADOW_NAMES = ("project", "current")  # the Shadow views a run renders in (`name`)


class Shadow:
    """A private view of the deployment whose `.env` is the desired one and every other entry
    a symlink to the real file. Compose reads `.env` twice (interpolation, and each lane's
    `env_file`), so only a project directory holding the desired `.env` renders what a converge
    would run. Nothing in the real directory is touched.

    The view is built on disk only when compose is run (`path()`); the render cache reads the
    same contents straight from the deployment and the desired text (`names`, `digest`)."""

    def __init__(self, run, workspace, desired_env_text, name="project"):
        self.run, self.workspace, self.text, self.name = run, workspace, desired_env_text, name
        self.built = None
        self.lock = _thread.allocate_lock()

    def names(self):
        return sorted(set(os.listdir(self.run.deploy)) | {".env"})

    def digest(self, name):
        """SHA-256 of the entry as compose would read it; each is hashed once a run, however
        many renders key on it (CPython's builtin SHA-256 takes ~0.6 ms a 100 KB, and a lab
        box's compose file and .env are 150 and 75 KB); file_facts hashed the files first."""
        if name == ".env":  # the desired text: ~75 KB on a lab box, keyed by three renders
            return self.run.once(("shadow", self.name), _text_digest, self.text)
        return self.run.once(("file", name), _file_digest, self.path_of(name))

    def path_of(self, name):
        """Where the entry `name` is read from (the real deployment's)."""
        return os.path.join(self.run.deploy, name)

    def env_text(self):
        """The `.env` text compose reads in this project: the desired one."""
        return self.text

    def path(self):
        with self.lock:
            if self.built is None:
                self.built = shadow_project(
                    self.run, self.workspace.directory(), self.text, self.name, self.workspace
                )
            return self.built

    def __fspath__(self):  # as a path, it is the directory on disk (built then)
        return self.path()


class Existing:
    """A project directory that is already on disk (the real one, or a test's)."""

    def __init__(self, path):
        self.where = path

    def names(self):
        return sorted(os.listdir(self.where))

    def digest(self, name):
        return _file_digest(self.path_of(name))

    def path_of(self, name):
        return os.path.join(self.where, name)

    def env_text(self):
        try:
            return read_text_file(self.path_of(".env"))
        except OSError:
            return None

    def path(self):
        return self.where


class Deployed(Existing):
    """The deployment directory itself, as `docker compose up` reads it there: its own `.env`.
    Its entries' digests are the run's (file_facts hashed them first), not hashed again."""

    def __init__(self, run):
        Existing.__init__(self, run.deploy)
        self.run = run

    def digest(self, name):
        return self.run.once(("file", name), _file_digest, self.path_of(name))


def _text_digest(text):
    return sha256(text.encode("utf-8")).digest()


def _file_digest(path):
    return sha256(read_file(path)[0]).digest()


def shadow_project(run, tmpdir, desired_env_text, name="project", workspace=None):
    """The Shadow view, on disk under `tmpdir`. Its `.env` is a link to an anonymous file in
    this process's memory (memfd, through /proc/PID/fd): the desired `.env` holds the box's
    secrets and the controller's (sent on stdin, never on the box's disk otherwise), and a
    file under /tmp outlived a collector that was killed. Only where that cannot be done
    (no memfd_create, no /proc) is it written as a 0600 file, removed when the run ends
    (and by the next run's sweep if this one is killed)."""
    project = os.path.join(tmpdir, name)
    os.mkdir(project, 0o700)
    for entry in os.listdir(run.deploy):
        if entry != ".env":
            os.symlink(os.path.join(run.deploy, entry), os.path.join(project, entry))
    data = desired_env_text.encode("utf-8")
    held = _in_memory(data) if workspace is not None else None
    if held is not None:
        workspace.fds.append(held[0])
        os.symlink(held[1], os.path.join(project, ".env"))
        return project
    fd = os.open(os.path.join(project, ".env"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return project


def _write_all(fd, data):
    """All of `data` to `fd`: a write may take only part of it (a signal, a full pipe)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _in_memory(data):
    """(fd, /proc/PID/fd/FD) of an anonymous in-memory file holding `data` (close-on-exec: no
    child inherits it; compose opens it by that path, as this user); None where it cannot be
    made or read back that way."""
    try:
        fd = os.memfd_create("fleet-env", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return None
    where = "/proc/%d/fd/%d" % (os.getpid(), fd)
    try:
        _write_all(fd, data)
        if read_file(where)[0] != data:  # as compose will open it: by that path
            raise OSError("read back differs")
    except OSError:
        os.close(fd)
        return None
    return fd, where


def compose_argv(run, project):
    argv = ["docker", "compose", "--project-directory", project, "-p", run.p["project"]]
    argv += ["--env-file", os.path.join(project, ".env")]
    for name in run.p["compose_files"]:
        argv += ["-f", os.path.join(project, name)]
    return argv


CACHE_DIR = os.path.join("~", ".cache", "fleet-reconciler", "compose")
CACHE_KEEP = 64
# An entry's format, in its key and on its first line: an entry of an older collector (the bare
# render, no first line) is never looked up, and one found under a key is read as damaged
# unless its first line says this.
CACHE_FORMAT = "fleet-render-2"
CACHE_HEADER_LIMIT = 1024 * 1024
SYSTEM_PLUGIN_DIRS = (
    "/usr/local/lib/docker/cli-plugins",
    "/usr/local/libexec/docker/cli-plugins",
    "/usr/lib/docker/cli-plugins",
    "/usr/libexec/docker/cli-plugins",
)


def compose_cached(run, project, env, args, check=None):
    """`docker compose ... ARGS` through a cache on the box.

    A render is a pure function of the compose files, the files they read, the process
    environment and the compose binary; it costs ~0.25 CPU-seconds, which would dominate a
    drift run. The cache keys on the command line, the deployment's `.env*`,
    `docker-compose*` and `.secrets.env*` entries and the docker CLI and its compose plugin;
    each entry also records every other file the render may read (`compose_deps`: an
    `env_file:` of any name, an `extends:` or `include:` file, in a subdirectory or outside
    the deployment) with its digest, and is served only while each is as recorded. It lives
    in the deploy user's ~/.cache (0600: a raw render holds the box's own secrets, which
    never leave it) and keeps the newest 64. `project`: a Shadow (built on disk only on a
    miss) or a directory's path. `check(text)`: raises ValueError for a render that cannot be
    used (not JSON): such an entry is removed and rendered again, never served twice."""
    project = Existing(project) if isinstance(project, str) else project
    digest = sha256()
    # The command line's own inputs: the arguments, the environment, and the project name and
    # `-f` chain compose_argv adds. Without the chain, a render made with fewer files (the
    # importer's discovery run: lobes' own chain) was served to a run whose chain has an
    # override more, and the override's settings were missing from what it compared.
    # A directory on disk renders its own paths (a relative bind made absolute): keyed by
    # them. A Shadow is keyed by its contents alone: each run's view is a new directory, and
    # deployed_path maps its paths back to the deployment's.
    argv_inputs = [
        CACHE_FORMAT, args, sorted((env or {}).items()), run.p["project"], run.p["compose_files"],
        getattr(project, "where", None),
    ]  # fmt: skip
    digest.update(json_dumps(argv_inputs).encode())
    # The files this render reads are the box's problem when they cannot be read: its `.env`
    # and the `-f` chain (keyed whatever they are named). Every other `.env*`, `docker-compose*`
    # and `.secrets.env*` entry is keyed only in case a compose file reads it (an `env_file:`):
    # one that cannot be read (a `.envs/` directory, a root-owned `.env.bak`) is keyed by its
    # state, so a change to it still misses the cache, and is no one's error (compose never
    # fails on it).
    reads = set([".env"] + list(run.p["compose_files"]))
    keyed = set()
    for name in project.names():
        if name in reads or name.startswith(("docker-compose", ".env", ".secrets.env")):
            keyed.add(os.path.normpath(project.path_of(name)))
            digest.update(os.fsencode(name) + b"\0")  # a name not UTF-8 is its bytes
            try:
                digest.update(project.digest(name))
            except FileNotFoundError:  # gone since the listing
                digest.update(b"-")
            except OSError as exc:  # a FIFO, a device, over the limit, unreadable
                if name in reads:  # the box's problem: this render could not be made
                    run.file_problem(name, exc)
                digest.update(_entry_state(project.path_of(name)))
    digest.update(json_dumps(compose_binary(run, env)).encode())
    cache_dir = run.once("cache_dir", _cache_dir)
    path = os.path.join(cache_dir or "/nonexistent", digest.hexdigest() + ".json")
    if cache_dir:
        found = _cached_render(run, path, check)
        if found is not None:
            return 0, found, ""
    # What the render may read, each as it is BEFORE compose reads it: a file changed while
    # compose runs is seen changed by the next run, which renders again.
    deps = dep_states(run, compose_deps(run, project, env, keyed)) if cache_dir else None
    code, out, err = run.run(compose_argv(run, project.path()) + list(args), env=env)
    if code == 0 and cache_dir and deps is not None and _usable(check, out):
        _store_render(path, deps, out)
        _prune(cache_dir)
    return code, out, err


def _usable(check, text):
    if check is None:
        return True
    try:
        check(text)
    except ValueError:
        return False
    return True


def _cached_render(run, path, check):
    """The render stored at `path`, if it is whole, every file it recorded is as it was, and
    `check` takes it; None otherwise. A damaged entry (its first line not this format's, its
    size not the recorded one, not UTF-8, or a render `check` refuses) is removed: it would
    otherwise be served, and kept fresh by its use, for ever."""
    try:  # the tool's own private cache: anything odd there is a miss
        data, _ = read_file(path, OUTPUT_LIMIT + CACHE_HEADER_LIMIT, follow=False)
    except OSError:
        return None
    cut = data.find(b"\n")
    try:
        header = json_loads(data[:cut]) if 0 < cut <= CACHE_HEADER_LIMIT else None
        whole = (
            isinstance(header, dict)
            and header.get("format") == CACHE_FORMAT
            and header.get("size") == len(data) - cut - 1
            and isinstance(header.get("deps"), list)
        )
        text = data[cut + 1 :].decode("utf-8") if whole else None
    except (ValueError, UnicodeDecodeError):
        text = None
    if text is None or not isinstance(header, dict):
        _discard(path)
        return None
    if not deps_unchanged(run, header["deps"]):
        return None  # a file it read changed: rendered again, and stored over this
    if not _usable(check, text):
        _discard(path)
        return None
    try:  # noqa: SIM105 - its use keeps it among the newest (_prune)
        os.utime(path)
    except OSError:
        pass
    return text


def _discard(path):
    try:  # noqa: SIM105 - contextlib is not imported for this
        os.unlink(path)
    except OSError:
        pass


def _store_render(path, deps, out):
    """Write the entry: its first line (format, the render's size, the files it read), then the
    render. Through a temporary name of this process and thread (two runs storing the same key
    never write into one file), synced to disk before it is renamed over the last: a crash
    leaves the old entry or the new one whole, never a short one."""
    body = out.encode("utf-8")
    header = json_dumps(
        {"format": CACHE_FORMAT, "size": len(body), "deps": deps}, separators=(",", ":")
    ).encode()
    tmp = "%s.%d-%d.tmp" % (path, os.getpid(), _thread.get_ident())
    try:
        _discard(tmp)  # one a killed process with this id left
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            _write_all(fd, header + b"\n" + body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        _discard(tmp)  # a cache that cannot be written only costs time


# -- what a render reads beyond the key ---------------------------------------------------------
# compose reads more than its `-f` files and `.env`: a service's `env_file:` (any name, any
# directory), an `extends: {file: ...}`, an `include:` (its files, their own `env_file:`s and
# the `.env` of the included project's directory) and a `label_file:`, each relative to the file
# naming it or to the project, possibly through `${...}`; its render names none of them. So
# every word of every compose file the render reads (the chain, and each YAML file found so,
# recursively) is taken as a path: each one naming a regular file is a file the render may
# read (a few extra, e.g. a Dockerfile, only cost a miss when they change), and a name compose
# files carry (`*.env`, `.env*`, `*.yml`, `*.yaml`) that is not there yet is recorded as absent.
# Found only on a miss, from the same texts compose reads (~10 ms of the lab's 150 KB file).
DEPS_LIMIT = 512  # past this many, the render is not stored (every run renders)
SCAN_LIMIT = 64  # compose files read for their words, at most
_YAML = (".yml", ".yaml", ".json")
_PSEUDO = ("/proc/", "/sys/", "/dev/")


def compose_deps(run, project, env, keyed=()):
    """The paths (sorted) a render of `project` under `env` may read beyond `keyed` (what the
    cache key holds already); None when there are more than DEPS_LIMIT (not to be stored).
    Found once a run for each project and environment."""
    key = ("deps", id(project), json_dumps(sorted((env or {}).items())), tuple(sorted(keyed)))
    return run.once(key, _compose_deps, run, project, env, keyed)


def _compose_deps(run, project, env, keyed):
    base = os.path.dirname(project.path_of(".env"))
    text = project.env_text()
    values = {} if not text else {e["key"]: e["value"] for e in parse_dotenv(text)}
    found = set()  # type: set
    queue = [os.path.normpath(os.path.join(base, n)) for n in run.p["compose_files"]]
    found.update(queue)  # a `-f` file in a subdirectory is no top-level entry the key holds
    scanned = set()  # type: set
    listings = {}  # type: dict
    while queue and len(scanned) < SCAN_LIMIT:
        path = queue.pop()
        if path in scanned:
            continue
        scanned.add(path)
        try:
            source = read_text_file(path)
        except (OSError, ValueError):
            continue  # recorded by its state, as every dep is
        here = os.path.dirname(path)
        include = "project_directory" in source
        for word in _compose_words(source):
            for candidate in _word_paths(word, values, env or {}, here, base, listings):
                if candidate in found:
                    continue
                try:
                    info = os.stat(candidate)
                except (OSError, ValueError):
                    if _compose_name(candidate):
                        found.add(candidate)  # absent now: its arrival changes the render
                    continue
                if _isreg(info):
                    found.add(candidate)
                    if candidate.endswith(_YAML):  # an extends: or include: file, maybe
                        queue.append(candidate)
                        found.add(os.path.join(os.path.dirname(candidate), ".env"))
                elif include and info.st_mode & 0o170000 == 0o040000:
                    found.add(os.path.join(candidate, ".env"))  # an include's project_directory
        if len(found) > DEPS_LIMIT:
            return None
    if any(path not in scanned for path in queue):
        return None  # more compose files than are read for their words
    return sorted(found - set(keyed))


def _compose_words(text):
    """Every word of a YAML text that may be a path: each blank-separated token cut at commas
    and unwrapped of YAML's brackets, quotes and a key's colon (a `${...}` kept whole), each
    quoted string (a name with a blank in it), and each line's plain value after `key: ` or
    `- `. Comment lines are skipped, and a line's comment where no quote may hold its ` #`."""
    words = set()
    for line in text.split("\n"):
        line = line.strip()
        cut = line.find(" #")
        if cut >= 0 and "'" not in line[:cut] and '"' not in line[:cut]:
            line = line[:cut].rstrip()
        if not line or line[0] == "#":
            continue
        for token in line.split():
            for piece in token.split(","):
                piece = _unwrap(piece)
                if piece:
                    words.add(piece)
        at = 0
        while True:  # quoted strings
            quote = min((i for i in (line.find('"', at), line.find("'", at)) if i >= 0), default=-1)
            if quote < 0:
                break
            close = line.find(line[quote], quote + 1)
            if close < 0:
                break
            if close > quote + 1:
                words.add(line[quote + 1 : close])
            at = close + 1
        at = line.find(": ")
        value = line[at + 2 :] if at >= 0 else line[2:] if line.startswith("- ") else ""
        value = _unwrap(value.strip())
        if value:
            words.add(value)
    return words


def _unwrap(word):
    """`word` without the YAML around it: leading `[{"'`, trailing `]}"':,` (a `}` closing a
    `${` stays)."""
    start, end = 0, len(word)
    while start < end and word[start] in "[{\"'":
        start += 1
    while end > start and word[end - 1] in "]}\"':,":
        if word[end - 1] == "}" and word.count("{", start, end) >= word.count("}", start, end):
            break
        end -= 1
    return word[start:end]


def _word_paths(word, values, env, here, base, listings):
    """The files `word` may name: interpolated as compose interpolates (the environment, then
    `.env`'s values), then relative to the file it is in and to the project. A bare name is
    looked up in those directories' listings (thousands of words, a stat each cost ~50 ms)."""
    if "$" in word:
        try:
            word = _dotenv_expand(word, values, env, 0)
        except Exception:  # a `${...}` compose would refuse (_Refused): no path
            return ()
        if not word:
            return ()
    if "\0" in word or len(word) > 4096:
        return ()
    if word[:1] == "~":
        word = os.path.expanduser(word)
    if os.path.isabs(word):
        word = os.path.normpath(word)
        # A kernel file (`/proc/pressure/io` in a healthcheck) changes by itself, and compose
        # reads no env_file or compose file from there: never a dep.
        return () if word.startswith(_PSEUDO) else (word,)
    if "/" in word:
        return tuple({os.path.normpath(os.path.join(d, word)) for d in (here, base)})
    out = []
    for directory in dict.fromkeys((here, base)):
        names = listings.get(directory)
        if names is None:
            try:
                names = listings[directory] = set(os.listdir(directory))
            except OSError:
                names = listings[directory] = set()
        if word in names or _compose_name(word):
            out.append(os.path.join(directory, word))
    return out


def _compose_name(path):
    """A name compose files give the files they read (`lane.env`, `.env.local`, `base.yml`)."""
    name = os.path.basename(path)
    return name.endswith((".env", ".yml", ".yaml")) or name.startswith(".env")


def dep_states(run, paths):
    """[[path, stamp or None, state]] of each path, as an entry records them; None for None."""
    if paths is None:
        return None
    return [[path] + list(run.once(("dep", path), dep_state, path)) for path in paths]


def dep_state(path):
    """(stamp, state) of a file a render may read: its SHA-256 (hex) when it is a regular file
    within FILE_LIMIT, else what stat says of it (`absent`, its type and identity, an error).
    The stamp (device, inode, size, mtime, ctime) is kept only for a file settled when it was
    hashed (as StatDigests keeps one): a later run whose stat gives the same stamp does not
    read it again."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None, "absent" if not os.path.islink(path) else _entry_state(path).decode()
    except (OSError, ValueError) as exc:
        return None, "?%s" % getattr(exc, "errno", "")
    if not _isreg(info) or info.st_size > FILE_LIMIT:
        return None, _entry_state(path).decode()
    try:
        data, opened = read_file(path)
    except OSError:
        return None, _entry_state(path).decode()
    settled = max(_times(opened)) < time.time_ns() - SETTLED_NS and opened.st_size == len(data)
    return (_stamp(opened) if settled else None), sha256(data).hexdigest()


def deps_unchanged(run, deps):
    """Whether every file an entry recorded is as it was (a malformed record is a change)."""
    for dep in deps:
        if not (isinstance(dep, list) and len(dep) == 3 and isinstance(dep[0], str)):
            return False
        path, stamp, state = dep
        if stamp is not None:
            info = run.once(("stat", path), _stat_or_none, path)
            if info is not None and _stamp(info) == stamp:
                continue
        if run.once(("dep", path), dep_state, path)[1] != state:
            return False
    return True


def _stat_or_none(path):
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


def compose_binary(run, env):
    """What decides which compose renders: the identity (device, inode, size, mtime, ctime) of
    the `docker` the PATH in `env` finds and of every `docker-compose` plugin the docker CLI
    may run: in its config directory ($DOCKER_CONFIG, else ~/.docker) and the
    `cliPluginsExtraDirs` its config.json names (whose digest is keyed too), then the system
    directories. Asked once a run per environment."""
    env = env or {}
    key = ("compose_binary", env.get("PATH"), env.get("DOCKER_CONFIG"), env.get("HOME"))
    return run.once(key, _compose_binary, run, env)


def _compose_binary(run, env):
    home = env.get("HOME") or run.home
    config = env.get("DOCKER_CONFIG") or os.path.join(home, ".docker")
    found = []  # type: list
    try:
        docker = _which("docker", env)
    except (OSError, ValueError):
        docker = None
    config_file = os.path.join(config, "config.json")
    state = dep_state(config_file)[1]
    extra = []  # type: list
    if state != "absent":
        try:
            parsed = json_loads(read_text_file(config_file, SMALL_FILE_LIMIT))
        except (OSError, ValueError):
            parsed = None
        named = parsed.get("cliPluginsExtraDirs") if isinstance(parsed, dict) else None
        extra = [d for d in named if isinstance(d, str)] if isinstance(named, list) else []
    found.append([config_file, state])
    dirs = [os.path.join(config, "cli-plugins")] + extra + list(SYSTEM_PLUGIN_DIRS)
    for path in ([docker] if docker else []) + [os.path.join(d, "docker-compose") for d in dirs]:
        try:
            info = os.stat(path)
        except (OSError, ValueError):
            continue
        found.append([path] + _stamp(info))
    return found


def _entry_state(path):
    """What the render cache keys on for an entry it could not read: its type, identity, size
    and times (lstat's when a symlink leads to nothing), or the error that stat gives."""
    try:
        try:
            info = os.stat(path)
        except FileNotFoundError:
            info = os.lstat(path)
    except OSError as exc:
        return ("?%s" % exc.errno).encode()
    stamp = [info.st_mode] + _stamp(info)
    return ("!" + ":".join(str(n) for n in stamp)).encode()


def _cache_dir():
    """~/.cache/... if the user may write there, else a private dir under /tmp (0700, owned)."""
    for candidate in (
        os.path.expanduser(CACHE_DIR),
        os.path.join(_temp_root(), "fleet-reconciler-%d" % os.getuid()),
    ):
        try:
            _private_dirs(candidate)
            info = os.stat(candidate)
            if info.st_uid == os.getuid() and not info.st_mode & 0o077:
                return candidate
        except OSError:
            continue
    return None


def _private_dirs(path):
    """os.makedirs(path, 0o700), the directories above it made 0700 too (makedirs gives
    them the umask's 0755): ~/.cache/fleet-reconciler is also the controller's cache, which
    trusts only a directory of its user's alone."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        try:  # noqa: SIM105 (contextlib is not imported on the box: only os and C modules)
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass


def _temp_root():
    """tempfile.gettempdir()'s choice without importing tempfile (and random, shutil, bz2,
    lzma with it): $TMPDIR, $TEMP or $TMP, else /tmp, /var/tmp, /usr/tmp, the first one this
    user may create files in, else the working directory."""
    names = [os.environ.get(v) for v in ("TMPDIR", "TEMP", "TMP")]
    for candidate in [n for n in names if n] + ["/tmp", "/var/tmp", "/usr/tmp"]:
        if os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return os.path.abspath(candidate)
    return os.getcwd()


def _prune(cache_dir):
    """Keep the newest CACHE_KEEP entries; remove a temporary file a killed process left (one
    older than WORKSPACE_STALE_S: a store takes a moment)."""
    stale = time.time() - WORKSPACE_STALE_S
    entries = []
    for name in os.listdir(cache_dir):
        if not name.endswith((".json", ".tmp")):
            continue
        try:
            mtime = os.lstat(os.path.join(cache_dir, name)).st_mtime
        except OSError:
            continue
        if name.endswith(".json"):
            entries.append((mtime, name))
        elif mtime < stale:
            _discard(os.path.join(cache_dir, name))
    entries.sort()
    for _, name in entries[:-CACHE_KEEP]:
        _discard(os.path.join(cache_dir, name))


def render(run, project, env):
    # The check goes positionally (a stand-in for compose_cached taking `*args` takes it too);
    # whatever it read is used, else the text is read here.
    parsed = []  # type: list
    code, out, err = compose_cached(
        run, project, env, ["config", "--format", "json"], _reader(parsed, dict)
    )
    if code != 0:
        return {"error": compose_error(err, run) or "docker compose config exited %d" % code}
    if not parsed:
        try:
            _reader(parsed, dict)(out)
        except ValueError as exc:
            return {"error": "unreadable compose config: %s" % exc}
    doc = parsed[-1]
    services = {}
    for name, svc in sorted((doc.get("services") or {}).items()):
        entrypoint, command = run.mask_command(svc.get("entrypoint"), svc.get("command"))
        services[name] = {
            "image": svc.get("image"),
            "command": command,
            "entrypoint": entrypoint,
            "environment": run.mask_env_map(svc.get("environment")),
            "ports": svc.get("ports") or [],
            "profiles": svc.get("profiles") or [],
            "container_name": svc.get("container_name"),
            "runtime": svc.get("runtime"),
            "restart": svc.get("restart"),
            "volumes": render_mounts(run, svc.get("volumes"), doc.get("volumes")),
        }
    return {"services": services}


def render_mounts(run, volumes, named):
    """A service's `volumes` from the render, as a container's Mounts are recorded
    (`container_mounts`): {type, source, target, read_only}, the source a bind's host path as
    compose made it absolute, a volume's name as compose names it (`project_name`: the
    render's top-level `volumes`), None for a tmpfs or an anonymous volume; in target order.
    What decides where a lane reads its models from and writes its logs: a bind's source is
    interpolated (`${HF_CACHE:-${HOME}/.cache/huggingface}`), so a lane started from another
    environment (sudo, cron: another HOME) mounts another directory. None: unreadable."""
    if volumes is None:
        return []
    if not isinstance(volumes, list):
        return None
    out = []
    for v in volumes:
        if not isinstance(v, dict):
            return None
        kind, source = v.get("type"), v.get("source")
        if kind == "volume":
            top = named.get(source) if isinstance(named, dict) and isinstance(source, str) else None
            if isinstance(top, dict) and isinstance(top.get("name"), str):
                source = top["name"]
        elif kind == "tmpfs":
            source = None
        elif isinstance(source, str):
            source = deployed_path(run, source)
        if isinstance(v.get("target"), str):
            out.append(_mount(kind, source, v["target"], v.get("read_only") is True))
    return sorted(out, key=lambda m: m["target"])


def deployed_path(run, path):
    """A path compose made absolute against the render's project directory, as the
    deployment's own. The render's project is a Shadow view (TMPDIR/fleet-collect-PID-X/
    project) whose entries are links to the deployment's, and the render is cached, so a
    relative bind (`./logs`) names the view of whichever run rendered it; compose up, run in
    the deployment, mounts the deployment's."""
    parts = path.split("/")
    for at in range(len(parts) - 1):
        if parts[at].startswith(WORKSPACE_PREFIX) and parts[at + 1] in SHADOW_NAMES:
            return os.path.join(run.deploy, *parts[at + 2 :])
    return path


def container_mounts(mounts):
    """A container's Mounts (docker inspect) as `render_mounts` records a service's volumes;
    None when the engine said nothing usable."""
    if not isinstance(mounts, list):
        return None
    out = []
    for m in mounts:
        if not isinstance(m, dict):
            return None
        kind = m.get("Type")
        source = None if kind == "tmpfs" else m.get("Name" if kind == "volume" else "Source")
        if isinstance(m.get("Destination"), str):
            out.append(_mount(kind, source, m["Destination"], m.get("RW") is False))
    return sorted(out, key=lambda m: m["target"])


def _mount(kind, source, target, read_only):
    return {
        "type": kind if isinstance(kind, str) and kind else "bind",
        "source": source if isinstance(source, str) and source else None,
        "target": target,
        "read_only": read_only,
    }


def restart_policy(policy):
    """HostConfig.RestartPolicy as compose writes a service's `restart`: `unless-stopped`,
    `on-failure:3` (a retry count, when one is set), `no` (the engine's "" too); None when
    the engine said nothing usable."""
    if not isinstance(policy, dict):
        return None
    name = policy.get("Name")
    if not isinstance(name, str):
        return None
    count = policy.get("MaximumRetryCount")
    if name == "on-failure" and isinstance(count, int) and count > 0:
        return "on-failure:%d" % count
    return name or "no"


def _reader(into, kind):
    """check(text) for compose_cached: `text` read as JSON of type `kind`, appended to `into`
    (read once, whether served from the cache or just rendered); ValueError otherwise."""

    def read(text):
        value = json_loads(text)
        if not isinstance(value, kind):
            raise ValueError("not a JSON %s" % ("object" if kind is dict else "list"))
        into.append(value)

    return read


def variables(run, project, env):
    parsed = []  # type: list
    code, out, err = compose_cached(
        run,
        project,
        env,
        ["config", "--variables", "--format", "json"],
        _reader(parsed, (dict, list)),
    )
    if code != 0:
        return {"error": compose_error(err, run) or "docker compose config exited %d" % code}
    try:
        if not parsed:
            _reader(parsed, (dict, list))(out)
        return {"names": sorted(parsed[-1])}
    except (ValueError, TypeError):
        return {"error": "unreadable variables"}


def config_hashes(run, env, workspace):
    """compose's config hash of each service from the files on the box as they are: the
    deployment directory itself (a relative bind's path is part of a service's config, so a
    private view of it would hash another one) and its own `.env`, in the environment a
    converge runs compose in. `docker compose up` compares it with each container's
    `com.docker.compose.config-hash` label, and recreates a container whose label differs:
    the lane's model loads again, whoever runs it next and for whatever change.

    Not `config --hash` in the deployment: from compose 2.22 until its fix (compose #14001,
    #14002; 2.40.3 here still has it) that hashes a service without its `env_file:` merged into
    its environment, as `up` never does, so every lobes lane (each reads `.env` so) would seem
    to be pending. compose's render (`config`, which merges them and drops `env_file:`) is read
    back by compose in an empty directory instead, and hashed there: the labels `up` writes
    (on the lab's engines, every service of every box)."""
    code, out, err = compose_cached(run, Deployed(run), env, ["config", "--format", "json"])
    if code != 0:
        return {"error": compose_error(err, run) or "docker compose config exited %d" % code}
    parsed = []  # type: list
    digest = sha256()
    key = [CACHE_FORMAT, "config-hash", run.p["project"], compose_binary(run, env)]
    digest.update(json_dumps(key).encode() + b"\0" + out.encode("utf-8"))
    cache_dir = run.once("cache_dir", _cache_dir)
    path = os.path.join(cache_dir or "/nonexistent", digest.hexdigest() + ".json")
    found = _cached_render(run, path, _hash_reader(parsed)) if cache_dir else None
    if found is None:
        where = os.path.join(workspace.directory(), "config-hash")
        os.mkdir(where, 0o700)
        rendered = os.path.join(where, "compose.json")
        fd = os.open(rendered, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            _write_all(fd, out.encode("utf-8"))
        finally:
            os.close(fd)
        # Every profile: the render holds the services the box's COMPOSE_PROFILES enabled.
        argv = ["docker", "compose", "--project-directory", where, "-p", run.p["project"]]
        argv += ["-f", rendered, "--profile", "*", "config", "--hash", "*"]
        code, found, err = run.run(argv, env=env)
        if code != 0:
            return {"error": compose_error(err, run) or "docker compose config exited %d" % code}
        try:
            _hash_reader(parsed)(found)
        except ValueError:
            return {"error": "unreadable config hashes"}
        if cache_dir:
            _store_render(path, [], found)  # keyed by the render itself: nothing else to see
            _prune(cache_dir)
    return {"services": parsed[-1]}


def _hash_reader(into):
    """check(text) for compose_cached: `SERVICE HASH` lines (compose's `config --hash`), each
    hash 64 lowercase hex digits, read into {service: hash}; ValueError otherwise."""

    def read(text):
        hashes = {}
        for line in text.splitlines():
            if not line.strip():
                continue
            service, _, digest = line.strip().rpartition(" ")
            if not service or len(digest) != 64 or digest.strip("0123456789abcdef"):
                raise ValueError("not SERVICE HASH lines")
            hashes[service] = digest
        into.append(hashes)

    return read


def _last_line(text, run=None):
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return scrub_text(lines[-1], is_secret=run and run.is_secret) if lines else ""


# What compose quotes in its errors is the files' own text: a `.env` or `env_file` it refuses
# (`line 2: unterminated quoted value "Hunter2...`, `unexpected character "$" in variable name
# "MY$TOKEN=hf_..."`, `Invalid template: "${...`) quotes the value itself, which no mask can
# know for a secret (its name is lost with the line). So a line is cut at the first quote it
# holds: what stays says which file, which line and what is wrong.
QUOTED_HIDDEN = "(text quoted by compose not shown)"
_INTERPOLATION = "invalid interpolation format for "


def compose_error(text, run=None):
    """The line of compose's stderr `text` that says why it failed (its last), cut at the first
    quote (`"`, `'` or a backquote) it holds. compose's `invalid interpolation format for
    FIELD.` goes on with a hint and then the template itself, unquoted and possibly on several
    lines: only its first line is shown. A line that begins with a quote (`'services[g].
    mem_limit' invalid size: '...'`) keeps the line before it (`decoding failed due to the
    following error(s):`) as what is wrong."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    for line in lines:
        if _INTERPOLATION in line:
            shown = _before_quote(line)
            shown = line if shown is None else shown
            return scrub_text(shown + " " + QUOTED_HIDDEN, is_secret=run and run.is_secret)
    if not lines:
        return ""
    shown = _before_quote(lines[-1])
    if shown is None:
        return scrub_text(lines[-1], is_secret=run and run.is_secret)
    if not shown and len(lines) > 1:
        shown = _before_quote(lines[-2])
        shown = lines[-2].rstrip(" \t:") if shown is None else shown
    return scrub_text((shown + " " + QUOTED_HIDDEN).strip(), is_secret=run and run.is_secret)


# compose quotes the operator's own names after these words (`service "gateway" depends on
# undefined service "vllm"`, `additional properties 'imagee' not allowed`, `mapping key "image"
# already defined`): a quoted plain name after one of them is kept, it says what to fix.
_NAMED_BY = (
    "service ", "services ", "network ", "volume ", "config ", "secret ", "profile ",
    "property ", "properties ", "mapping key ",
)  # fmt: skip
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def _before_quote(line):
    """`line` up to its first quote that holds no name compose quotes (`_NAMED_BY`), its
    blanks and a colon at the end left out; None when there is no such quote (the whole line
    is shown)."""
    at = 0
    while True:
        cut = [i for i in (line.find('"', at), line.find("'", at), line.find("`", at)) if i >= 0]
        if not cut:
            return None
        start = min(cut)
        close = line.find(line[start], start + 1)
        name = line[start + 1 : close] if close > 0 else ""
        plain = 0 < len(name) <= 64 and name[0].isalnum() and _NAME_CHARS.issuperset(name)
        if not (plain and line[:start].lower().endswith(_NAMED_BY)):
            return line[:start].rstrip(" \t:")
        at = close + 1


# -- login shell ------------------------------------------------------------------------------
# A traced command assigns the variable the regular expression
#     ^(?:export|declare\s+-[a-zA-Z]*x[a-zA-Z]*|readonly)?\s*'?([A-Za-z_][A-Za-z0-9_]*)\+?=
# names: `assigned` reads it as that expression does, its backtracking included (held to it
# by tests/unit/test_collector_cpu.py), without importing re.


def assigned(command):
    for start in _assign_starts(command):
        name = _assigned_at(command, start)
        if name is not None:
            return name
    return None


def _assign_starts(text):
    """Where the optional prefix may end, in the order the expression tries them."""
    if text.startswith("export"):
        yield 6
    elif text.startswith("readonly"):
        yield 8
    elif text.startswith("declare"):
        at = 7
        while at < len(text) and text[at].isspace():
            at += 1
        if at > 7 and text[at : at + 1] == "-":
            first = at + 1
            end = first
            while end < len(text) and text[end] in _LETTERS:
                end += 1
            for x_at in range(end - 1, first - 1, -1):  # `[a-zA-Z]*x`: the last x first
                if text[x_at] == "x":
                    yield from range(end, x_at, -1)  # then `[a-zA-Z]*`, longest first
    yield 0


def _assigned_at(text, start):
    at = start
    while at < len(text) and text[at].isspace():
        at += 1
    if text[at : at + 1] == "'":
        at += 1
    end = _name_end(text, at)
    if end == at:
        return None
    after = end + 1 if text[end : end + 1] == "+" else end
    return text[at:end] if text[after : after + 1] == "=" else None


# What the login shell prints just before `env -0`: a profile's banner comes before it on the
# same stdout (and a `.bash_logout`'s words after), and only what follows it is the environment.
ENV_MARK = "fleet-reconciler-env"
# No ENV_MARK: the profile replaced the shell (`exec zsh`) or ended it (`exit`) before the traced
# command ran, and what the shell exports was never seen. Read as "no exports" that was a
# false clean for the very incident the trace is for (a profile arming a key).
NEVER_RAN = "the login shell never ran the traced command (it exec'd another program or exited)"
TRACE_PS4 = "+" + TRACE_SEP + "${BASH_SOURCE}" + TRACE_SEP + "${LINENO}" + TRACE_SEP
# As root, bash (>= 4.4) takes no PS4 from its environment: its trace then said no file:line
# for any export. So root's login is run as bash runs one, the profiles sourced in its order
# (/etc/profile, then the first of ~/.bash_profile, ~/.bash_login, ~/.profile) by an
# interactive login shell that reads no startup file itself (`--login --noprofile`: `shopt -q
# login_shell` in a profile still holds, `logout` works), with PS4 set inside it before `set -x`.
ROOT_LOGIN = (
    "PS4='" + TRACE_PS4 + "'; set -x; "
    "if [ -r /etc/profile ]; then . /etc/profile; fi; "
    "if [ -r ~/.bash_profile ]; then . ~/.bash_profile; "
    "elif [ -r ~/.bash_login ]; then . ~/.bash_login; "
    "elif [ -r ~/.profile ]; then . ~/.profile; fi; "
)


def env_entries(out):
    """The variables of `env -0`'s output in `out`: the NAME=value items after the last
    ENV_MARK (no variable's item can be it: each has its `=`), each NAME a shell identifier;
    anything else (a banner, a logout's words) is not the environment, and is left out."""
    items = out.split("\0")
    if ENV_MARK in items:
        items = items[len(items) - items[::-1].index(ENV_MARK) :]
    env = {}
    for item in items:
        name, eq, value = item.partition("=")
        if eq and name.isidentifier() and name.isascii():  # [A-Za-z_][A-Za-z0-9_]*
            env[name] = value
    return env


def login_shell(run):
    """The environment the deploy user's interactive login shell builds (what an operator's
    `docker compose` sees), with the file:line that last assigned each variable."""
    base = {
        "PATH": SCRUBBED_PATH,
        "HOME": run.home,
        "USER": os.environ.get("USER", ""),
        "LOGNAME": os.environ.get("LOGNAME", ""),
        "SHELL": "/bin/bash",
        "TERM": "dumb",
        "PS4": TRACE_PS4,
    }
    command = "printf '\\0%s\\0' " + ENV_MARK + "; env -0"
    if os.geteuid() == 0:
        argv = ["bash", "--login", "--noprofile", "--norc", "-i", "-c", ROOT_LOGIN + command]
    else:
        argv = ["bash", "-l", "-i", "-x", "-c", command]
    reaping = subreaper(True)  # what the profile leaves running comes back here, to be ended
    before = children() if reaping else set()
    try:
        code, out, err = run.run(argv, env=base, timeout=run.timeout, stdin_text="")
    finally:
        if reaping:
            end_adopted(before)
            subreaper(False)
    if code != 0 and not out:
        return {"error": _last_line(err, run) or "bash exited %d" % code}, {}
    if "\0%s\0" % ENV_MARK not in out:
        return {"error": NEVER_RAN}, {}
    env = env_entries(out)
    origins = {}
    for line in err.splitlines():
        if TRACE_SEP not in line:
            continue
        parts = line.split(TRACE_SEP)
        if len(parts) < 4:
            continue
        source, lineno, command = parts[1], parts[2], TRACE_SEP.join(parts[3:]).strip()
        name = assigned(command)
        if name and source:
            shown = source.replace(run.home, "~", 1) if source.startswith(run.home) else source
            origins[name] = "%s:%s" % (shown, lineno)
    noise = {"PS4", "SHLVL", "_", "PWD", "OLDPWD", "TERM", "SHELL", "USER", "LOGNAME", "HOME"}
    exports = {}
    for name, value in sorted(env.items()):
        if name in noise or base.get(name) == value:
            continue
        exports[name] = {"value": run.masked_value(name, value), "source": origins.get(name)}
    return {"exports": exports}, {k: v for k, v in env.items() if k != "PS4"}


# -- docker ------------------------------------------------------------------------------------
def docker_socket(run):
    """The Engine socket the docker CLI would use here: DOCKER_HOST, else the current context
    of ~/.docker/config.json, else the default. None when it is not a unix socket."""
    host = os.environ.get("DOCKER_HOST")
    if not host:
        config = _docker_json(run, os.path.join(".docker", "config.json"))
        context = config.get("currentContext") if isinstance(config, dict) else None
        if isinstance(context, str) and context and context != "default":
            name = sha256(context.encode()).hexdigest()
            meta = _docker_json(run, os.path.join(".docker", "contexts", "meta", name, "meta.json"))
            try:
                host = meta["Endpoints"]["docker"]["Host"]
            except (TypeError, KeyError):
                return None
            if not isinstance(host, str):
                return None
    host = host or "unix:///var/run/docker.sock"
    return host[len("unix://") :] if host.startswith("unix://") else None


def _docker_json(run, relative):
    """~/RELATIVE as JSON; None when it is absent, not JSON, or not a file to read. Read through
    the one reader (a FIFO or a device is never held), but a file that cannot be read is as
    if absent, no error of the box: the docker CLI and compose only warn about one (a
    config.json root left 0600 by `sudo docker login` is common) and go on with the defaults."""
    try:
        text = read_text_file(os.path.join(run.home, relative), SMALL_FILE_LIMIT)
        return json_loads(text)
    except (OSError, ValueError):
        return None


def engine_get(conn, path):
    status, _, body = conn.ask("GET", path)
    if status != 200:
        raise OSError("engine %s: HTTP %d %s" % (path, status, body[:200]))
    return json_loads(body)


def engine_inspect(run):
    """`docker ps` + `docker inspect` + `docker image inspect` through the Engine API on one
    unix-socket connection: the same JSON, without starting the docker CLI three times."""
    path = docker_socket(run)
    if path is None:
        return None
    conn = unix_connection(path, run.timeout)
    conn.until = time.monotonic() + run.timeout  # every request within the one timeout
    conn.max_body = OUTPUT_LIMIT  # as a child's output: more is not held
    try:
        label = json_dumps({"label": ["com.docker.compose.project=" + run.p["project"]]})
        listed = engine_get(conn, "/containers/json?all=1&filters=" + quote(label))
        found = [engine_get(conn, "/containers/%s/json" % c["Id"]) for c in listed]
        image_ids = sorted({c.get("Image") for c in found if c.get("Image")})
        images = [engine_get(conn, "/images/%s/json" % i) for i in image_ids]
        return found, images
    finally:
        conn.close()


def cli_inspect(run):
    project = run.p["project"]
    code, out, err = run.run(
        [
            "docker",
            "ps",
            "-aq",
            "--no-trunc",
            "--filter",
            "label=com.docker.compose.project=" + project,
        ],
        env=run.scrubbed_env(),
    )
    if code != 0:
        return {"error": _last_line(err, run) or "docker ps exited %d" % code}
    ids = out.split()
    if not ids:
        return [], []
    code, out, err = run.run(["docker", "inspect"] + ids, env=run.scrubbed_env())
    if code != 0:
        return {"error": _last_line(err, run)}
    inspected = json_loads(out)
    image_ids = sorted({c.get("Image") for c in inspected if c.get("Image")})
    images = []
    if image_ids:
        code, out, err = run.run(["docker", "image", "inspect"] + image_ids, env=run.scrubbed_env())
        if code == 0:
            images = json_loads(out)
    return inspected, images


def engine_hung(run):
    """What a request to an engine that took the connection and then never answered says."""
    return (
        "docker engine did not answer within %g s: it takes connections but does not answer"
        " (hung); the docker CLI was not tried, it would wait on the same engine" % run.timeout
    )


def _timed_out(exc):
    return isinstance(exc, (TimeoutError, sockets.timeout))


def containers(run):
    try:
        raw = engine_inspect(run)
    except (OSError, ValueError, HTTPException) as exc:
        if isinstance(exc, (ConnectionRefusedError, FileNotFoundError)):
            run.engine_down = "docker engine not reachable: %s" % _reason(exc)
            return {"error": run.engine_down}
        if _timed_out(exc):  # the engine is there but hung: the CLI would wait as long again
            run.engine_down = engine_hung(run)
            return {"error": run.engine_down}
        raw = None  # anything odd: let the CLI try, it knows more about contexts than we do
    if raw is None:
        raw = cli_inspect(run)
        if isinstance(raw, dict):
            return raw
    inspected, raw_images = raw
    found = []
    host_network = []
    for c in inspected:
        cfg, state, host = c.get("Config") or {}, c.get("State") or {}, c.get("HostConfig") or {}
        labels = cfg.get("Labels") or {}
        nets = (c.get("NetworkSettings") or {}).get("Networks") or {}
        if host.get("NetworkMode") == "host" or "host" in nets:  # `docker ps --filter network=host`
            host_network.append((c.get("Name") or "").lstrip("/"))
        entrypoint, command = run.mask_command(cfg.get("Entrypoint"), cfg.get("Cmd"))
        found.append(
            {
                "name": (c.get("Name") or "").lstrip("/"),
                "id": c.get("Id", "")[:12],
                "service": labels.get("com.docker.compose.service"),
                "config_hash": labels.get("com.docker.compose.config-hash"),
                "config_files": labels.get("com.docker.compose.project.config_files"),
                "image_ref": cfg.get("Image"),
                "image_id": c.get("Image"),
                "cmd": command,
                "entrypoint": entrypoint,
                "env": run.mask_env_list(cfg.get("Env")),
                "status": state.get("Status"),
                "health": (state.get("Health") or {}).get("Status"),
                "restart_count": c.get("RestartCount", 0),
                "exit_code": state.get("ExitCode"),
                "started_at": state.get("StartedAt"),
                "ports": host.get("PortBindings") or {},
                "runtime": host.get("Runtime"),
                "restart_policy": restart_policy(host.get("RestartPolicy")),
                "mounts": container_mounts(c.get("Mounts")),
                "ips": sorted(n.get("IPAddress") for n in nets.values() if n.get("IPAddress")),
                # A `docker compose run` container: compose labels it oneoff "True" (its
                # service's own "False"); it keeps the service's label, yet is never the
                # service's container (compare/containers.py, converge.py `containers`).
                "oneoff": str(labels.get("com.docker.compose.oneoff", "")).lower() == "true",
            }
        )
    images = {}
    for img in raw_images:
        images[img["Id"]] = {
            "repo_digests": img.get("RepoDigests") or [],
            "repo_tags": img.get("RepoTags") or [],
            "env": run.mask_env_list((img.get("Config") or {}).get("Env")),
        }
    run.host_network = sorted(host_network)
    return {"containers": sorted(found, key=lambda c: c["name"]), "images": images}


# -- host and probes ----------------------------------------------------------------------------
def meminfo(run):
    out = {}
    text = run.box_text("/proc/meminfo", "/proc/meminfo", SMALL_FILE_LIMIT) or ""
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemTotal", "MemAvailable", "MemFree", "Cached", "SwapTotal"):
            out[name + "_kib"] = int(rest.split()[0])
    return out


def http_get(url, timeout, headers=None):
    started = time.monotonic()
    try:
        answer = http_ask(url, timeout, "GET", sorted((headers or {}).items()))
        if answer is None:  # urllib goes on within what is left of the one timeout
            return _urllib_get(url, timeout, headers, started)
    except Exception as exc:  # a probe failure is a result, not a crash
        return {"status": None, "error": exception_text(exc), "ms": _ms(started)}
    status, _, body = answer
    return {"status": status, "body": _json(body), "ms": _ms(started)}


def _urllib_get(url, timeout, headers, started):
    """http_get through urllib: a redirect to follow (direct, as every probe); the whole probe,
    begun at `started` (its first request included), ends within `timeout` s."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers=headers or {})
    try:
        left = _left(started, timeout)
        with within(left).open(request, timeout=left) as resp:
            body = resp.read(262144)
            return {"status": resp.status, "body": _json(body), "ms": _ms(started)}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": _json(exc.read(65536)), "ms": _ms(started)}
    except Exception as exc:  # a probe failure is a result, not a crash
        return {"status": None, "error": exception_text(exc), "ms": _ms(started)}


def within(timeout):
    """urllib's opener (redirects followed within the origin asked), whose requests each end
    within `timeout` s from now, every redirect and the body's reads included: urllib's
    timeout bounds each socket operation only, and a gateway dripping a byte a second kept a
    probe alive for ever. Each connection it opens has its socket's reads bounded by what is
    left (`_bounded`); past it they fail as timed out.

    Every request goes direct, never through a proxy: urlopen's default ProxyHandler reads the
    environment (http_proxy, HTTP_PROXY, all_proxy, no_proxy, ...), and a box whose deploy user
    has one set sent the keyed probes' Authorization (the gateway's and the mesh's keys) to that
    proxy, whose answer then stood in for the gateway's. So the opener's ProxyHandler has no
    proxies, and a request that is a proxied one anyway is refused before it is sent."""
    import urllib.parse
    import urllib.request

    deadline = time.monotonic() + timeout

    def connection(http_class):
        def connect(conn):
            http_class.connect(conn)
            conn.sock.__class__ = _bounded(type(conn.sock), deadline)

        return type(http_class.__name__, (http_class,), {"connect": connect})

    class BoundedOpen:  # before urllib's handler: its connections are bounded ones
        def do_open(self, http_class, req, **kwargs):
            if req.has_proxy():  # its headers (a key) would go to the proxy: never sent
                raise URLError("refusing to send a probe through a proxy (%s)" % req.host)
            return super().do_open(connection(http_class), req, **kwargs)  # type: ignore[misc]

    class SameOrigin(urllib.request.HTTPRedirectHandler):
        # urllib carries a request's headers to wherever a redirect points: the audit's keyed
        # probe would send its Authorization (the gateway's or the mesh's key) to any host the
        # answer names. A redirect is followed to the origin asked only; any other is the
        # probe's answer (its 3xx status), as the converger's gateway check takes it.
        def redirect_request(self, req, fp, code, msg, headers, newurl):
            if _origin(urllib.parse.urljoin(req.full_url, newurl)) != _origin(req.full_url):
                return None  # urllib then raises HTTPError(code): the probe's status
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    handlers = [  # type: list
        urllib.request.ProxyHandler({}),  # replaces build_opener's environment-reading default
        SameOrigin,
        type("HTTPHandler", (BoundedOpen, urllib.request.HTTPHandler), {}),
    ]
    if hasattr(urllib.request, "HTTPSHandler"):  # a redirect to https (urllib has ssl)
        handlers.append(type("HTTPSHandler", (BoundedOpen, urllib.request.HTTPSHandler), {}))
    return urllib.request.build_opener(*handlers)


def _origin(url):
    """(scheme, host, port) of `url`, the port as the scheme implies it when not written."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # a port that is no number: an origin of its own, never the one asked
        return (parts.scheme, parts.netloc, None)
    return (parts.scheme, parts.hostname, port or {"http": 80, "https": 443}.get(parts.scheme))


def _bounded(socket_class, deadline):
    """A subclass of `socket_class` (a socket's, or ssl's over it) of the same layout, whose
    reads each wait at most until `deadline`: the class of a connected socket is switched to
    it, so that http.client's reader (socket.makefile) goes through it, TLS or not."""

    def bounded(read):
        def call(self, *args):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            self.settimeout(min(left, self.gettimeout() or left))
            return read(self, *args)

        return call

    return type(
        socket_class.__name__,
        (socket_class,),
        {
            "__slots__": (),
            "recv": bounded(socket_class.recv),
            "recv_into": bounded(socket_class.recv_into),
        },
    )


def _left(started, timeout):
    """What is left of `timeout` s from `started`: a probe that hands its request over to urllib
    (a redirect to follow) has one deadline, not one for each part; none left: timed out."""
    left = timeout - (time.monotonic() - started)
    if left <= 0:
        raise TimeoutError("timed out")
    return left


def _ms(started):
    return int((time.monotonic() - started) * 1000)


def _json(body):
    try:
        return json_loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None


def parallel_get(requests, timeout):
    """GET several URLs at once: a slow gateway costs one timeout, not one per probe."""
    results = {}

    def fetch(name, url):
        results[name] = http_get(url, timeout)

    threads = [Thread(fetch, *item) for item in requests]
    for thread in threads:
        thread.join()
    return results


def gateway_base(run):
    """(base URL, None) where the box asks its own gateway, or (None, why) when it must not
    ask. At the desired `gateway_bind`: Docker publishes the port on that address only (a
    gateway published on 10.77.0.12 or 127.0.0.2 answers nothing on 127.0.0.1); 127.0.0.1 for
    every interface (0.0.0.0) and for an older payload that sends none. Never an address that
    is not this box's own: the keyed probes carry the gateway's and the mesh's keys, which do
    not leave the box."""
    host, why = run.once("gateway_host", _gateway_host, run.p.get("gateway_bind"))
    if host is None:
        return None, why
    return "http://%s:%d" % (host, run.p["gateway_port"]), None


def _gateway_host(bind):
    if bind is None or bind == "0.0.0.0":
        return "127.0.0.1", None
    try:
        sockets.inet_pton(sockets.AF_INET, bind)  # one dotted IPv4 address, nothing else
    except (OSError, TypeError, ValueError):
        return None, "gateway_bind is not an IPv4 address: not requested"
    if bind.split(".", 1)[0] == "127":
        return bind, None  # the whole 127.0.0.0/8 is the box's own loopback
    probe = None
    try:
        # Binding succeeds only to an address of one of the box's own interfaces.
        probe = sockets.socket(sockets.AF_INET, sockets.SOCK_DGRAM)
        probe.bind((bind, 0))
    except OSError as exc:
        return None, "%s is not an address of this box (%s): not requested" % (bind, _reason(exc))
    finally:
        if probe is not None:
            probe.close()
    return bind, None


def _not_requested(why):
    return {"status": None, "error": why, "ms": 0}


def gateway_probes(run):
    base, why = gateway_base(run)
    if base is None:
        return {name: _not_requested(why) for name in ("health", "capabilities", "models_noauth")}
    timeout = float(run.p.get("probe_timeout_s", 3))
    out = parallel_get(
        [
            ("health", base + "/health"),
            ("capabilities", base + "/capabilities"),
            ("models_noauth", base + "/v1/models"),
        ],
        timeout,
    )
    out["models_noauth"].pop("body", None)  # the posture is the status code
    return out


def lane_probes(run, found):
    requests = [
        (c["service"], "http://%s:8000/v1/models" % c["ips"][0])
        for c in found
        if (c.get("service") or "").startswith("vllm-")
        and c.get("status") == "running"
        and c.get("ips")
    ]
    return parallel_get(requests, float(run.p.get("probe_timeout_s", 3)))


# -- audit (payload["audit"], `reconcile audit`) ---------------------------------------------------
# Only when the payload asks for it: the extra probes cost a request each and the chat probe can
# reach a model. Nothing here changes a box; the keys read here are used on the box's own
# loopback and never printed (only their keyed digests are).
_AUDIT_HEADERS = ("X-Lobes-Mesh-Member", "X-Lobes-Proxied-By", "X-Lobes-Route-Reason")


def audit_section(run, secret_values, docker=None):
    """`docker()`: the run's `containers` result (waiting for it): the engine is not asked
    again what it already answered, nor again when it did not answer (a hung engine cost
    the audit its 20 s three times over, past the controller's time for the box)."""
    spec = run.p["audit"]
    keys, active = audit_envfile_keys(run, spec.get("env_keys") or [])
    probes = audit_probes(run, spec, secret_values, active)
    found = docker() if docker is not None else None
    section = {
        "envfile_keys": keys,
        "probes": probes,
        "host_network": audit_host_network(run, found),
        "running": _running_or_error(run, found),
    }
    problem = run.file_errors.get(".env")
    if problem:  # its keys read as "no-file": the audit's own warning says why
        section["error"] = "file .env: %s" % problem
    return section


def audit_envfile_keys(run, names):
    r"""The raw state of each key's lines in .env: set, empty, commented-out or absent (an
    operator's `# GATEWAY_API_KEY=...` is how seed #209's .env said "off" while a shell armed
    it). Returns the states (digests only) and the active values, for the keyed probe.

    Active keys are compose's statements (`_dotenv_read`: `V="a" W=3` assigns both, the last
    assignment wins), at the physical line each starts on (a quoted value spanning lines
    counts its lines); a text compose refuses is read up to the statement it refuses (the
    audit's error says so). A commented-out key is a comment line that assigns it, read as
    `^\s*#+\s*(?:export\s+)?NAME\s*=\s*(.*)$` reads one, never a line inside a quoted
    value."""
    text = deployed_env(run) or ""
    active, commented = {}, {}  # type: dict, dict
    inside = set()  # type: set  # lines inside a quoted value that spans lines
    for key, value, line, start, value_at, value_end, end in _dotenv_read(text)[0]:
        inside.update(range(line + 1, line + 1 + text.count("\n", start, end)))
        if key in names:
            if value is None:  # computed by compose from what the box cannot know
                value = _as_written(text, value_at, value_end)
            active[key] = (line, value)
    for number, raw in enumerate(text.split("\n"), 1):
        body = raw.lstrip()
        if body[:1] != "#" or number in inside:
            continue
        found = env_assignment(body.lstrip("#"))
        if found and found[0] in names and found[0] not in active:
            commented[found[0]] = (number, _dotenv_value(found[1]))
    out = {}
    for name in names:
        if name in active:
            number, value = active[name]
            # lobes treats a whitespace-only key as no key (_gateway_api_key).
            state = "set" if value.strip() else "empty"
        elif name in commented:
            number, value = commented[name]
            state = "commented-out"
        else:
            out[name] = {"state": "absent" if deployed_env(run) is not None else "no-file"}
            continue
        entry = {"state": state, "line": number}  # type: dict
        if value.strip():
            entry["digest"] = run.digest(value)
        out[name] = entry
    return out, {name: value for name, (_, value) in active.items()}


def http_post_json(url, body, timeout, headers=None):
    """POST a JSON body; keep the status, the error type and the mesh headers, never the
    answer (a model's output is not evidence, and could echo anything)."""
    data = json_dumps(body).encode()
    hdrs = {"Content-Type": "application/json"}
    hdrs.update(headers or {})
    started = time.monotonic()
    try:
        answer = http_ask(url, timeout, "POST", list(hdrs.items()), data, 65536)
        if answer is None:  # urllib goes on within what is left of the one timeout
            answer = _urllib_post(url, data, hdrs, timeout, started)
    except Exception as exc:  # a probe failure is a result, not a crash
        return {"status": None, "error": exception_text(exc), "ms": _ms(started)}
    status, got, content = answer
    payload = None if 200 <= status < 300 else _json(content)
    out = {"status": status, "ms": _ms(started)}
    error = (payload or {}).get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("type"):
        out["error_type"] = str(error["type"])[:80]
    seen = {h: got.get(h.lower()) for h in _AUDIT_HEADERS if got is not None and got.get(h.lower())}
    if seen:
        out["headers"] = seen
    return out


def _urllib_post(url, data, hdrs, timeout, started=None):
    """http_post_json's request through urllib (a redirect, direct): (status, headers as
    name -> first value, body); the whole probe, begun at `started` (now if None), ends
    within `timeout` s."""
    import urllib.error
    import urllib.request

    left = _left(time.monotonic() if started is None else started, timeout)
    request = urllib.request.Request(url, data=data, headers=hdrs, method="POST")
    try:
        with within(left).open(request, timeout=left) as resp:
            status, got, content = resp.status, resp.headers, resp.read(65536)
    except urllib.error.HTTPError as exc:
        status, got, content = exc.code, exc.headers, exc.read(65536)
    heads = {h.lower(): got.get(h) for h in _AUDIT_HEADERS if got is not None and got.get(h)}
    return status, heads, content


def audit_probes(run, spec, secret_values, active_env):
    base, why = gateway_base(run)
    model = spec.get("chat_model")
    if base is None:  # no request at all: the keys stay on the box
        skipped = {"status": None, "skipped": why}
        return {
            "chat_noauth": dict(_not_requested(why), model=model),
            "models_key": skipped,
            "models_mesh_key": dict(skipped),
        }
    timeout = float(run.p.get("probe_timeout_s", 3))
    out = {}
    body = {"messages": [{"role": "user", "content": "audit"}], "max_tokens": 1}
    if model:
        body["model"] = model
    out["chat_noauth"] = http_post_json(base + "/v1/chat/completions", body, timeout)
    out["chat_noauth"]["model"] = model
    # "The right key": the desired secret as the box's source holds it; if that source is
    # missing, the inbound key .env declares (GATEWAY_API_KEY, else lobes' fallback).
    candidates = [
        (
            "secret:%s" % spec.get("api_key_secret"),
            secret_values.get(spec.get("api_key_secret") or ""),
        )
    ]
    candidates += [
        (".env:" + n, active_env.get(n)) for n in ("GATEWAY_API_KEY", "CULTURE_VLLM_API_KEY")
    ]
    out["models_key"] = _keyed_get(run, base + "/v1/models", candidates, timeout)
    mesh = [
        (
            "secret:%s" % spec.get("mesh_key_secret"),
            secret_values.get(spec.get("mesh_key_secret") or ""),
        ),
        (".env:LOBES_MESH_KEY", active_env.get("LOBES_MESH_KEY")),
    ]
    out["models_mesh_key"] = _keyed_get(run, base + "/v1/models", mesh, timeout)
    return out


def _keyed_get(run, url, candidates, timeout):
    for source, key in candidates:
        if key and key.strip():
            result = http_get(url, timeout, {"Authorization": "Bearer " + key.strip()})
            result.pop("body", None)
            result["key_from"] = source
            result["key"] = run.digest(key)
            return result
    return {"status": None, "skipped": "no key in the desired source or .env"}


def audit_host_network(run, found=None):
    """Containers of the project on the host network: every port they open is on the box.
    `found`: the run's `containers` result, whose listing is used when it has one; an engine
    it found down or hung is not asked again (`run.engine_down`)."""
    if run.engine_down is not None:
        return {"error": run.engine_down}
    if isinstance(found, dict) and not found.get("error") and run.host_network is not None:
        return {"containers": list(run.host_network)}
    code, out, err = run.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            "label=com.docker.compose.project=" + run.p["project"],
            "--filter",
            "network=host",
            "--format",
            "{{.Names}}",
        ],
        env=run.scrubbed_env(),
    )
    if code != 0:
        return {"error": _last_line(err, run) or "docker ps exited %d" % code}
    return {"containers": sorted(out.split())}


RUNNING_LIMIT = 500  # containers listed for the audit; more is said, never silently cut


def audit_running(run, found=None):
    """Every running container on the box, of any compose project or none (no label filter: a
    `docker run -p 0.0.0.0:18001:8000 vllm ...` beside the project is reachable as well): its
    name, image, compose project, whether it is on the host network, and the ports it publishes
    ("8000/tcp" -> [{HostIp, HostPort}], as bound now). Never its environment or command.
    `found`: the run's `containers` result, awaited: an engine it found down or hung is not
    asked again (`run.engine_down`); another failure of the project's listing is not the
    engine's, and every running container is still listed."""
    if run.engine_down is not None:
        return {"error": run.engine_down}
    try:
        listed = _engine_running(run)
    except (OSError, ValueError, HTTPException) as exc:
        if isinstance(exc, (ConnectionRefusedError, FileNotFoundError)):
            return {"error": "docker engine not reachable: %s" % _reason(exc)}
        if _timed_out(exc):
            return {"error": engine_hung(run)}
        listed = None  # anything odd: let the CLI try, as containers() does
    if listed is None:
        listed = _cli_running(run)
        if isinstance(listed, dict):
            return listed
    out = []
    for c in listed:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"]:
            continue
        labels = c.get("labels")
        labels = labels if isinstance(labels, dict) else {}
        image = c.get("image")
        out.append(
            {
                "name": c["name"],
                "image": image if isinstance(image, str) else None,
                "project": labels.get("com.docker.compose.project"),
                "service": labels.get("com.docker.compose.service"),
                "host_network": c.get("network") == "host",
                "ports": c.get("ports") or {},
            }
        )
    out.sort(key=lambda c: c["name"])
    section = {"containers": out[:RUNNING_LIMIT]}  # type: dict
    if len(out) > RUNNING_LIMIT:
        section["error"] = "%d running containers: only the first %d are listed" % (
            len(out),
            RUNNING_LIMIT,
        )
    return section


def _running_or_error(run, found=None):
    try:
        return audit_running(run, found)
    except Exception as exc:  # this part failing must not lose the audit's others
        return {"error": exception_text(exc, run.is_secret)}


def _engine_running(run):
    """GET /containers/json (running ones, no filter) on the Engine's socket; None: no socket."""
    path = docker_socket(run)
    if path is None:
        return None
    conn = unix_connection(path, run.timeout)
    conn.until = time.monotonic() + run.timeout
    conn.max_body = OUTPUT_LIMIT
    try:
        listed = engine_get(conn, "/containers/json")
    finally:
        conn.close()
    out = []
    for c in listed if isinstance(listed, list) else []:
        if not isinstance(c, dict):
            continue
        names = c.get("Names") or []
        ports = {}  # type: dict
        for p in c.get("Ports") or []:
            if not isinstance(p, dict) or not p.get("PublicPort"):
                continue  # exposed, not published
            key = "%s/%s" % (p.get("PrivatePort"), p.get("Type") or "tcp")
            ports.setdefault(key, []).append(
                {"HostIp": p.get("IP") or "", "HostPort": str(p.get("PublicPort"))}
            )
        out.append(
            {
                "name": (names[0] if names and isinstance(names[0], str) else "").lstrip("/"),
                "image": c.get("Image"),
                "labels": c.get("Labels") or {},
                "network": (c.get("HostConfig") or {}).get("NetworkMode"),
                "ports": ports,
            }
        )
    return out


_RUNNING_FORMAT = (
    '{"name": {{json .Name}}, "image": {{json .Config.Image}}, '
    '"labels": {{json .Config.Labels}}, "network": {{json .HostConfig.NetworkMode}}, '
    '"ports": {{json .NetworkSettings.Ports}}}'
)


def _cli_running(run):
    code, out, err = run.run(["docker", "ps", "-q", "--no-trunc"], env=run.scrubbed_env())
    if code != 0:
        return {"error": _last_line(err, run) or "docker ps exited %d" % code}
    ids = out.split()
    if not ids:
        return []
    argv = ["docker", "inspect", "--format", _RUNNING_FORMAT] + ids
    code, out, err = run.run(argv, env=run.scrubbed_env())
    if code != 0 and not out.strip():  # one gone since `ps`: the others are still printed
        return {"error": _last_line(err, run) or "docker inspect exited %d" % code}
    found = []
    for line in out.splitlines():
        if line.strip():
            c = json_loads(line)
            if isinstance(c, dict):
                name = c.get("name")
                c["name"] = name.lstrip("/") if isinstance(name, str) else ""
                ports = c.get("ports")
                ports = ports if isinstance(ports, dict) else {}
                # NetworkSettings.Ports also names exposed ports (null): only published ones.
                c["ports"] = {k: v for k, v in ports.items() if v}
                found.append(c)
    return found


# -- a converge under way ----------------------------------------------------------------------
# A converge (converge.py `Lock`) holds an exclusive flock on `.fleet/lock` for its whole life
# and writes its record there ({"holder", "pid", "host", "since"}), emptied before it unlocks.
# A drift taken meanwhile sees a half-converged box: said, so that no one takes it for the
# box's steady state (compare/box.py makes it an error of the box). Read without taking the
# lock (a converge waits out a moment's shared lock, but takes none while it is held): an empty
# or absent file is no converge (the usual case, one small read); a record is one only while
# /proc/locks shows an exclusive flock on that file (a killed converge leaves its record).
CONVERGE_LOCK = os.path.join(".fleet", "lock")


def converge_holder(run):
    """The record of the converge holding this deployment's lock now ({"pid", "holder",
    "since"}; each None where the record does not say), or None when none does."""
    path = os.path.join(run.deploy, CONVERGE_LOCK)
    try:
        data, info = read_file(path, SMALL_FILE_LIMIT, follow=False)
    except OSError:
        return None
    if not data.strip():
        return None
    try:
        locks = read_file("/proc/locks", SMALL_FILE_LIMIT)[0].decode("ascii", "replace")
    except OSError:
        return None  # not known: nothing is said
    inode = str(info.st_ino)
    for line in locks.split("\n"):
        # `1: FLOCK  ADVISORY  WRITE 4242 08:02:1234 0 EOF`; a waiter's line has `->` second.
        # Matched by the inode: the device as /proc/locks numbers it is not always stat's.
        fields = line.split()
        if (
            len(fields) >= 6
            and fields[1:4] == ["FLOCK", "ADVISORY", "WRITE"]
            and fields[5].rpartition(":")[2] == inode
        ):
            return _holder_record(data, fields[4])
    return None


def _holder_record(data, locked_by):
    try:
        record = json_loads(data)
    except ValueError:
        record = None
    record = record if isinstance(record, dict) else {}
    pid = record.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 2**31:
        pid = int(locked_by) if locked_by.isdigit() and 0 < int(locked_by) < 2**31 else None
    out = {"pid": pid}
    for name in ("holder", "since"):
        value = record.get(name)
        ok = isinstance(value, str) and value.isprintable() and 0 < len(value) <= 200
        out[name] = value if ok else None
    return out


# -- main ----------------------------------------------------------------------------------------
def collect(payload, sent=None):
    """`sent`: the controller_env secrets' values the controller sent (name -> value)."""
    run = Run(payload)
    doc = {}  # type: dict
    doc["collector"] = 1
    doc["user"] = os.environ.get("USER") or os.environ.get("LOGNAME")
    doc["home"] = run.home
    doc["deploy_dir"] = run.deploy
    doc["deploy_dir_exists"] = os.path.isdir(run.deploy)
    doc["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = {}
    timings = {}
    started = time.monotonic()
    converging = converge_holder(run)  # before anything is read, and again after (below)

    def task(name, fn, *args):
        def wrapped():
            begun = time.monotonic()
            try:
                results[name] = fn(*args)
            except Exception as exc:  # one failed part must not lose the rest
                results[name] = {"error": exception_text(exc, run.is_secret)}
            timings[name] = int((time.monotonic() - begun) * 1000)

        return Thread(wrapped)

    threads = [
        task("containers", containers, run),
        task("gateway", gateway_probes, run),
        task("login", login_shell, run),
    ]
    doc["meminfo"] = meminfo(run)
    names = list(
        dict.fromkeys([".env"] + list(run.p["compose_files"]) + list(run.p.get("extra_files", [])))
    )
    # The main thread's parts: an OSError (an unlistable deployment directory) is the box's
    # problem, named in the answer, never a traceback instead of one.
    if doc["deploy_dir_exists"]:
        try:
            listed = sorted(os.listdir(run.deploy))
        except OSError as exc:
            listed = []
            run.file_problem(".", exc)
        for entry in listed:
            if entry.startswith("docker-compose") and entry.endswith((".yml", ".yaml")):
                names.append(entry)
    try:
        doc["files"] = file_facts(run, list(dict.fromkeys(names)))
    except OSError as exc:
        doc["files"] = {}
        run.file_problem(".", exc)
    try:
        doc["envfile"], current = envfile_fact(run)
    except OSError as exc:
        doc["envfile"], current = None, {}
        run.file_problem(".env", exc)
    desired_inline = envfile_desired(run)
    if desired_inline:  # absent otherwise: every answer without one stays as it was
        doc["envfile_desired"] = desired_inline
    knobs_inline = knobs_desired(run)
    if knobs_inline:  # likewise absent when no knob carries a secret
        doc["knobs_desired"] = knobs_inline
    try:
        doc["secret_sources"], secret_values = secret_sources(run, sent)
    except OSError as exc:
        doc["secret_sources"], secret_values = {}, {}
        doc["secret_sources_error"] = exception_text(exc, run.is_secret)
    if payload.get("audit"):

        def docker():  # the audit's view of the engine is `containers`' (asked once a run)
            threads[0].join()
            return results.get("containers")

        threads.append(task("audit", audit_section, run, secret_values, docker))
    # A render starts from the box's own .env: one that is there but cannot be read (a FIFO,
    # a directory, not UTF-8) would be rendered as if it were empty. Not rendered, said why.
    unread = run.file_errors.get(".env")

    workspace = Workspace()  # a temp directory only if a render misses the cache
    bases = {}  # render name -> the basis of the .env it renders
    own = None  # a project of the box's own .env, when the payload asks and it differs
    try:
        try:
            current_text = deployed_env(run)
        except OSError:
            current_text = None  # said in file_errors by envfile_fact
        if doc["deploy_dir_exists"]:
            desired_text = desired_envfile(run, current_text, secret_values)
            project = Shadow(run, workspace, desired_text)
            scrubbed = run.scrubbed_env()
            # compose's `--variables` reads that .env too, and its refusal quotes the text it
            # refused (a secret's value): not asked either.
            if unread:
                results["render"] = {"error": "not rendered: file .env: %s" % unread}
                results["variables"] = {"error": "not read: file .env: %s" % unread}
            else:
                threads.append(task("render", render, run, project, scrubbed))
                threads.append(task("variables", variables, run, project, scrubbed))
                threads.append(task("config_hashes", config_hashes, run, scrubbed, workspace))
            # A snapshot replayed against another desired state (an import adopting this
            # box's own .env) needs compose's render of the .env on the box too, and each
            # render's basis. Asked for by `drift --save-snapshot` only, and the second render
            # made only when the two differ (else one serves both): a live drift never pays.
            if run.p.get("render_current") and not unread:
                bases["render"] = bases["render_login"] = desired_basis(
                    run, current_text, secret_values
                )
                basis = env_basis(run, current_text)
                if basis is not None and basis != bases["render"]:
                    own = Shadow(run, workspace, current_text, "current")
                    bases["render_current"] = bases["render_login_current"] = basis
                    threads.append(task("render_current", render, run, own, scrubbed))
        for thread in threads[:3]:
            thread.join()
        traced = results.get("login", ({"error": "no result"}, {}))
        # login_shell's pair, or the task's own {"error": ...} when it raised
        login, login_env = traced if isinstance(traced, tuple) else (traced, {})
        doc["login_shell"] = login
        if doc["deploy_dir_exists"] and login_env and not unread:
            # Compose under the operator's shell: the same files and .env, the shell's variables.
            threads.append(task("render_login", render, run, project, login_env))
            if own is not None:
                threads.append(task("render_login_current", render, run, own, login_env))
        elif doc["deploy_dir_exists"] and not unread and login.get("error"):
            # No shell's variables to render with: said why, never an empty render's silence.
            why = {"error": "not rendered: login shell: %s" % login["error"]}
            results["render_login"] = why
            if own is not None:
                results["render_login_current"] = dict(why)
        for thread in threads:
            thread.join()
    finally:
        workspace.remove()

    found = results.get("containers", {})
    doc["docker"] = found
    doc["gateway"] = results.get("gateway", {})
    doc["lanes"] = lane_probes(run, found.get("containers", [])) if "containers" in found else {}
    doc["render"] = results.get("render", {"error": "deployment directory missing"})
    doc["render_login"] = results.get("render_login")
    for name in ("render_current", "render_login_current"):
        if name in results:
            doc[name] = results[name]
    for name, basis in bases.items():
        if isinstance(doc.get(name), dict):
            doc[name]["basis"] = basis
    doc["variables"] = results.get("variables", {})
    if "config_hashes" in results:  # absent otherwise: no render was asked for
        doc["config_hashes"] = results["config_hashes"]
    doc["current_env_keys"] = sorted(current)
    converging = converging or converge_holder(run)
    if converging is not None:  # absent otherwise: every answer without one stays as it was
        doc["converge"] = converging
    if payload.get("audit"):
        doc["audit"] = results.get("audit")
    # Every box file that is there but could not be read, each the box's own error; read
    # last: the renders' threads read files too.
    doc["file_errors"] = dict(sorted(run.file_errors.items()))
    timings["total"] = int((time.monotonic() - started) * 1000)
    timings["cpu"] = _cpu_ms()  # what one observation costs the box (this program + children)
    doc["timings_ms"] = timings
    return doc


def _cpu_ms():
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return int(total * 1000)


def without_known_secrets(doc):
    """The last line of defence: no value this run hashed appears in any string of the answer
    (keys are names and stay). A quick search of the whole text first: nearly always a miss."""
    text = json_dumps(doc, sort_keys=True)
    known = [v for v in _KNOWN if len(v) >= 8]
    if not any(json_dumps(v)[1:-1] in text for v in known):
        return text
    known.sort(key=len, reverse=True)

    def mask(node):
        if isinstance(node, dict):
            return dict((k, mask(v)) for k, v in node.items())
        if isinstance(node, list):
            return [mask(v) for v in node]
        if isinstance(node, str):
            for value in known:
                node = node.replace(value, "***")
        return node

    return json_dumps(mask(doc), sort_keys=True)


STDIN_LIMIT = 1024 * 1024  # the controller's collectors.STDIN_LIMIT_BYTES
STDIN_WAIT_S = 10


def read_input(stream=None):
    """(payload, sent) from stdin, where the controller sends them: one JSON object,
    `{"payload": {...}, "sent": {name: value}}`. Never from the command line: argv is in
    /proc/PID/cmdline and `ps` for every user of the box, and the payload holds the run's key
    (and any secret a setting carries inline). `sent`: the controller_env secrets' values,
    taken only when the payload names some ({} otherwise). Raises ValueError, quoting nothing
    of what came, when no payload did: nothing, too much, not that object, or a stdin still
    open after STDIN_WAIT_S."""
    stream = stream if stream is not None else sys.stdin.buffer
    import select

    chunks, size, deadline = [], 0, time.monotonic() + STDIN_WAIT_S
    while size <= STDIN_LIMIT:
        ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise ValueError("no payload on stdin within %d s" % STDIN_WAIT_S)
        chunk = os.read(stream.fileno(), 65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > STDIN_LIMIT:
        raise ValueError("more than %d bytes on stdin" % STDIN_LIMIT)
    try:
        found = json_loads(b"".join(chunks).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        found = None
    payload = found.get("payload") if isinstance(found, dict) else None
    if not isinstance(payload, dict):
        raise ValueError("no payload on stdin (%d bytes, not the controller's JSON)" % size)
    sent = found.get("sent") if payload.get("controller_secrets") else None
    if not isinstance(sent, dict):
        return payload, {}
    named = dict((k, v) for k, v in sent.items() if isinstance(k, str) and isinstance(v, str))
    return payload, named


def main():
    try:
        payload, sent = read_input()
    except (OSError, ValueError) as exc:
        sys.stderr.write("collector: %s\n" % exc)
        sys.exit(2)
    sys.stdout.write(without_known_secrets(collect(payload, sent)))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
