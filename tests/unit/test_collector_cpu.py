"""The box collector's cheap paths give the answers of the stdlib paths they replace.

A repeated drift runs the collector on every box; its CPU went mostly to importing http.client
and urllib, to OpenSSL's HMAC and to building a shadow compose project the render cache then
did not need. Each replacement is checked here against what it replaced: the raw HTTP/1.1
client against urllib and http.client on the same bytes from a server, the HMAC against
hmac.new, the pattern matcher against fnmatch, and a render served from the cache without
a project directory.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import ROOT, load_box_program, packed_program

collector = load_box_program("box_collector_cpu", "reconciler/observe/remote/collector.py")
FIXTURE = ROOT / "tests" / "fixtures"


# -- a server that answers with given bytes -----------------------------------------------------
class Canned:
    """A TCP (or unix) server: each connection gets the next answer's bytes, then is closed
    (an answer of None closes at once). Records each request it read."""

    def __init__(self, answers: list[bytes | None], unix: str | None = None) -> None:
        self.answers, self.requests = list(answers), []  # type: list[bytes]
        family = socket.AF_UNIX if unix else socket.AF_INET
        self.server = socket.socket(family, socket.SOCK_STREAM)
        self.server.bind(unix or ("127.0.0.1", 0))
        self.server.listen(8)
        self.port = 0 if unix else self.server.getsockname()[1]
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while self.answers:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                answer = self.answers.pop(0)
                if answer is None:
                    continue
                for part in answer.split(b"<NEXT>"):  # keep-alive: one answer per request
                    self.requests.append(_request(conn))
                    conn.sendall(part)

    def close(self) -> None:
        self.server.close()


def _request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            while len(body) < int(line.split(b":")[1]):
                body += conn.recv(65536)
    return data


ANSWERS = {
    "content-length": b'HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{"ok": true}',
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'5;ext=1\r\n{"ok"\r\n7\r\n: true}\r\n0\r\nX-Trailer: 1\r\n\r\n',
    "until-close": b'HTTP/1.0 200 OK\r\n\r\n{"ok": [1, 2]}',
    "continue": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
    "401": b'HTTP/1.1 401 Unauthorized\r\nContent-Length: 25\r\n\r\n{"error": {"type": "no"}}',
    "204": b"HTTP/1.1 204 No Content\r\n\r\n",
    "short": b'HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{"ok": 1}',
    "cut chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",
    "bad status": b"SMTP ready\r\n\r\n",
    "not json": b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\noops",
    "silent": b"",  # the request read, the connection closed without an answer
}


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_a_probe_reads_an_answer_as_urllib_does(name: str) -> None:
    server = Canned([ANSWERS[name], ANSWERS[name]])
    try:
        url = f"http://127.0.0.1:{server.port}/health"
        raw = collector.http_get(url, 2)
        old = collector._urllib_get(url, 2, None, time.monotonic())
    finally:
        server.close()
    for answer in (raw, old):
        answer.pop("ms")
    assert raw == old
    assert set(raw) in ({"status", "body"}, {"status", "error"})


def test_an_unknown_length_answer_stops_at_the_limit_as_urllib_read_n() -> None:
    big = b"HTTP/1.1 200 OK\r\n\r\n" + b"[" + b"1," * 200000 + b"1]"
    server = Canned([big])
    try:
        status, _, body = collector.http_ask(f"http://127.0.0.1:{server.port}/", 2)
    finally:
        server.close()
    assert status == 200 and len(body) == 262144


def test_the_request_says_what_urllib_said() -> None:
    server = Canned([ANSWERS["content-length"]])
    try:
        collector.http_get(f"http://127.0.0.1:{server.port}/v1/models", 2, {"authorization": "x"})
    finally:
        server.close()
    head = server.requests[0].decode("latin-1").split("\r\n")
    assert head[0] == "GET /v1/models HTTP/1.1"
    assert f"Host: 127.0.0.1:{server.port}" in head and "Connection: close" in head
    assert "Authorization: x" in head and "Accept-Encoding: identity" in head
    assert "User-Agent: Python-urllib/{}.{}".format(*sys.version_info[:2]) in head


def test_a_refused_connection_reads_as_urllib_said_it() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed
    answer = collector.http_get(f"http://127.0.0.1:{port}/health", 2)
    assert answer["status"] is None
    assert answer["error"] == "URLError: connection refused"


def test_a_header_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    server = Canned([ANSWERS["content-length"]])
    secret = "k3y-Value-With\r\nX-Injected: 1"
    try:
        answer = collector.http_get(
            f"http://127.0.0.1:{server.port}/", 2, {"Authorization": "Bearer " + secret}
        )
    finally:
        server.close()
    assert answer["error"].startswith("ValueError: a request header held a character")
    assert "k3y" not in json.dumps(answer) and server.requests == []


def test_a_redirect_within_its_origin_is_followed_by_urllib() -> None:
    moved = b"HTTP/1.1 302 Found\r\nLocation: /moved\r\nContent-Length: 0\r\n\r\n"
    server = Canned([moved, moved, ANSWERS["content-length"]])  # urllib asks again, from the start
    try:
        answer = collector.http_get(f"http://127.0.0.1:{server.port}/health", 2)
    finally:
        server.close()
    assert answer["status"] == 200 and answer["body"] == {"ok": True}
    assert len(server.requests) == 3  # urllib followed it


def test_a_redirect_to_another_origin_is_the_answer() -> None:
    # urllib would carry the probe's headers (a keyed probe's Authorization) to the other port.
    target = Canned([ANSWERS["content-length"]])
    moved = f"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{target.port}/\r\n"
    moved_answer = (moved + "Content-Length: 0\r\n\r\n").encode()
    server = Canned([moved_answer, moved_answer])
    try:
        answer = collector.http_get(f"http://127.0.0.1:{server.port}/health", 2)
    finally:
        server.close()
        target.close()
    assert answer["status"] == 302 and target.requests == []


def test_the_audit_post_keeps_the_first_mesh_header_as_urllib_did() -> None:
    answer = (
        b"HTTP/1.1 401 Unauthorized\r\nX-Lobes-Proxied-By: thor\r\n"
        b"X-Lobes-Proxied-By: spark\r\nX-Lobes-Route-Reason:  a\r\n  folded\r\n"
        b'Content-Length: 25\r\n\r\n{"error": {"type": "no"}}'
    )
    server = Canned([answer, answer])
    try:
        url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
        raw = collector.http_post_json(url, {"max_tokens": 1}, 2)
        import urllib.request  # what the collector sent before: the same bytes, read by urllib

        request = urllib.request.Request(
            url, data=b"{}", headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            urllib.request.urlopen(request, timeout=2)
        except urllib.error.HTTPError as exc:
            old = {h: exc.headers.get(h) for h in ("X-Lobes-Proxied-By", "X-Lobes-Route-Reason")}
    finally:
        server.close()
    assert raw["status"] == 401 and raw["error_type"] == "no"
    assert raw["headers"] == old
    assert b'"max_tokens": 1' in server.requests[0]


def test_the_engine_answers_on_one_unix_connection(tmp_path: Path) -> None:
    listed = json.dumps([{"Id": "abc"}]).encode()
    inspected = b'{"Id": "abc", "Image": "sha256:1"}'
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s<NEXT>" % (len(listed), listed)
        + b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n<NEXT>"
        % (len(inspected), inspected)
        + b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nno such i"
    )
    path = str(tmp_path / "docker.sock")
    server = Canned([answer], unix=path)
    conn = collector.unix_connection(path, 2)
    try:
        assert collector.engine_get(conn, "/containers/json?all=1") == [{"Id": "abc"}]
        assert collector.engine_get(conn, "/containers/abc/json")["Image"] == "sha256:1"
        with pytest.raises(OSError, match=r"engine /images/sha256:1/json: HTTP 404 b'no such i'"):
            collector.engine_get(conn, "/images/sha256:1/json")
    finally:
        conn.close()
        server.close()
    assert [r.split(b"\r\n")[1] for r in server.requests] == [b"Host: localhost"] * 3


def test_an_engine_body_short_of_its_length_is_an_incomplete_read(tmp_path: Path) -> None:
    path = str(tmp_path / "docker.sock")
    server = Canned([b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n[]"], unix=path)
    conn = collector.unix_connection(path, 2)
    try:
        with pytest.raises(collector.IncompleteRead):
            collector.engine_get(conn, "/containers/json")
    finally:
        conn.close()
        server.close()


def test_the_engine_filter_is_quoted_as_urllib_quotes() -> None:
    from urllib.parse import quote

    label = json.dumps({"label": ["com.docker.compose.project=lobes ü/x?&"]})
    assert collector.quote(label) == quote(label)


# -- HMAC and the secret-name patterns ---------------------------------------------------------
@pytest.mark.parametrize("key", ["k" * 32, "f" * 200])
def test_the_digest_is_hmac_sha256(key: str) -> None:
    run = collector.Run({"run_key": key, "directory": "/nonexistent"})
    for value in ("", "hunter2", "é" * 100, "x" * 5000):
        expected = hmac.new(key.encode(), value.encode(), hashlib.sha256).hexdigest()
        assert run.digest(value) == "hmac:" + expected


PATTERNS = [
    *collector.FLOOR,
    "MY_EXACT",
    "*",
    "",
    "A*B*C",
    "*MID*",
    "PRE*",
    "X**Y",
    "AB*BA",
]


def _names() -> list[str]:
    """Every variable name of a real lab capture, and some made to hit the patterns' edges."""
    names: set[str] = set()
    for path in (FIXTURE / "import" / "pristine").glob("*.json"):
        names.update(_keys(json.loads(path.read_text(encoding="utf-8"))))
    names.update(["MY_EXACT", "MY_EXACTLY", "ABC", "AXBYC", "AC", "ABBA", "ABA", "XY", "X", ""])
    names.update(["PRE", "PREFIX", "MID", "aMIDb", "HF_TOKEN", "hf_token", "DB_PASSWORD2"])
    return sorted(names)


def _keys(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [str(k) for k in node] + [k for v in node.values() for k in _keys(v)]
    if isinstance(node, list):
        return [k for v in node for k in _keys(v)]
    return []


def test_the_pattern_matcher_answers_as_fnmatch() -> None:
    names = _names()
    assert len(names) > 200  # a real capture's names, not only the made-up ones
    for patterns in (PATTERNS, list(collector.FLOOR), [], ["*_KEY", "HF_?OKEN", "[AB]*"]):
        match = collector._any_of(patterns)
        for name in names:
            expected = any(fnmatch.fnmatchcase(name, p) for p in patterns)
            assert bool(match(name)) == expected, (patterns, name)


# -- a render served from the cache builds no project -------------------------------------------
def test_a_cached_render_needs_no_project_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deploy = tmp_path / "lobes"
    deploy.mkdir()
    (deploy / ".env").write_text("A=1\n", encoding="utf-8")
    (deploy / "docker-compose.yml").write_text("services: {}\n", encoding="utf-8")
    (deploy / "data").mkdir()
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setattr(collector, "_cache_dir", lambda: str(cache))
    seen: list[dict[str, str]] = []

    def fake_run(self: Any, argv: list[str], env: Any = None, **_: Any) -> tuple[int, str, str]:
        project = Path(argv[argv.index("--project-directory") + 1])
        seen.append({p.name: p.read_text() for p in project.iterdir() if p.is_file()})
        return 0, "{}", ""

    monkeypatch.setattr(collector.Run, "run", fake_run)
    payload = {"run_key": "k" * 32, "directory": str(deploy), "project": "lobes",
               "compose_files": ["docker-compose.yml"]}  # fmt: skip
    args, env = ["config", "--format", "json"], {"PATH": "/usr/bin"}
    renders = []
    for _ in range(2):
        run = collector.Run(payload)
        workspace = collector.Workspace()
        shadow = collector.Shadow(run, workspace, "A=2\n")
        renders.append(collector.compose_cached(run, shadow, env, args))
        renders.append(collector.compose_cached(run, shadow, env, args))
        if workspace.path is None:
            break
        assert sorted(os.listdir(Path(workspace.path) / "project")) == sorted(
            [".env", "data", "docker-compose.yml"]
        )
        workspace.remove()
        assert not Path(workspace.path).exists()
    assert len(seen) == 1 and seen[0][".env"] == "A=2\n"  # the desired .env, rendered once
    assert workspace.path is None  # the second run was served without a temp directory
    assert len(renders) == 4 and len(set(renders)) == 1
    # A render made in a real directory of the same contents holds that directory's paths (a
    # relative bind made absolute; what a config hash is taken of): its own entry, served
    # again to that directory.
    same = tmp_path / "same"
    same.mkdir()
    (same / ".env").write_text("A=2\n", encoding="utf-8")
    (same / "docker-compose.yml").write_text("services: {}\n", encoding="utf-8")
    for _ in range(2):
        collector.compose_cached(collector.Run(payload), str(same), env, args)
        assert len(seen) == 2 and seen[1][".env"] == "A=2\n"


def _record_hashes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every input the collector hashes from now on, in order."""
    hashed: list[bytes] = []
    real = collector.sha256

    def counting(data: bytes = b"") -> Any:
        hashed.append(data)
        return real(data)

    monkeypatch.setattr(collector, "sha256", counting)
    return hashed


# -- the program on a python3 -I -S, as the box runs it ------------------------------------------
def test_the_collector_imports_nothing_heavy_at_start() -> None:
    """What a run imports before any work: http.client, urllib, hashlib, tempfile, shutil and
    socket cost each repeated drift ~40 ms of the box's CPU when they were imported here."""
    program = packed_program("reconciler/observe/remote/collector.py")
    code = (
        "import sys; g = {'__name__': 'collector'}; "
        "exec(compile(open(sys.argv[1]).read(), 'collector', 'exec'), g); "
        "g['http_get']('http://127.0.0.1:9/', 1); print(' '.join(sorted(sys.modules)))"
    )  # a probe too (port 9: refused): an IP host must not pull in the idna codec
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(program)],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    heavy = {"http.client", "urllib.request", "urllib.parse", "email", "ssl", "hashlib",
             "hmac", "tempfile", "shutil", "socket", "fnmatch", "base64",
             "encodings.idna", "subprocess", "json", "re", "enum", "threading",
             "functools", "collections"}  # fmt: skip
    assert "_json" in out and "_socket" in out
    assert heavy.isdisjoint(out), heavy.intersection(out)


def test_each_file_and_the_desired_env_are_hashed_once_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The builtin SHA-256 takes ~0.6 ms a 100 KB (a lab box's compose file is 150 KB): the
    file facts and the three renders' cache keys share one digest of each."""
    deploy = tmp_path / "lobes"
    deploy.mkdir()
    (deploy / ".env").write_text("A=1\n", encoding="utf-8")
    (deploy / "docker-compose.yml").write_text("services: {big: {}}\n", encoding="utf-8")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setattr(collector, "_cache_dir", lambda: str(cache))
    monkeypatch.setattr(collector.Run, "run", lambda self, argv, env=None, **_: (0, "{}", ""))
    hashed = _record_hashes(monkeypatch)
    run = collector.Run({"run_key": "k" * 32, "directory": str(deploy), "project": "lobes",
                         "compose_files": ["docker-compose.yml"]})  # fmt: skip
    facts = collector.file_facts(run, [".env", "docker-compose.yml"])
    workspace = collector.Workspace()
    shadow = collector.Shadow(run, workspace, "A=2\n")
    try:
        for args in (["config"], ["config", "--variables"], ["config"]):
            collector.compose_cached(run, shadow, {"PATH": "/usr/bin"}, args)
    finally:
        workspace.remove()
    assert hashed.count(b"services: {big: {}}\n") == 1
    assert hashed.count(b"A=2\n") == 1 and hashed.count(b"A=1\n") == 1
    expected = hashlib.sha256(b"services: {big: {}}\n").hexdigest()
    assert facts["docker-compose.yml"]["sha256"] == expected


# -- the file digests of the last run, by stat ----------------------------------------------------
@pytest.fixture
def settled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, list[bytes]]:
    """A deployment, a private cache, every file taken as settled at once, and a record of
    what was hashed."""
    deploy = tmp_path / "lobes"
    deploy.mkdir()
    (deploy / ".env").write_text("A=1\n", encoding="utf-8")
    (deploy / "docker-compose.yml").write_text("services: {}\n", encoding="utf-8")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setattr(collector, "_cache_dir", lambda: str(cache))
    monkeypatch.setattr(collector, "SETTLED_NS", 0)
    hashed = _record_hashes(monkeypatch)
    return deploy, cache, hashed


def _facts(deploy: Path) -> dict[str, Any]:
    run = collector.Run({"run_key": "k" * 32, "directory": str(deploy)})
    return collector.file_facts(run, [".env", "docker-compose.yml", "missing.yml"])


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_an_unchanged_file_is_not_hashed_again(settled: tuple[Path, Path, list[bytes]]) -> None:
    deploy, cache, hashed = settled
    first = _facts(deploy)
    assert hashed.count(b"A=1\n") == 1 and hashed.count(b"services: {}\n") == 1
    store = cache / "file-digests"
    assert store.stat().st_mode & 0o777 == 0o600
    hashed.clear()
    assert _facts(deploy) == first  # the same facts, from the store
    assert b"A=1\n" not in hashed and b"services: {}\n" not in hashed
    assert first[".env"] == {"exists": True, "sha256": _sha(b"A=1\n"), "mode": "0o644",
                             "size": 4}  # fmt: skip
    assert first["missing.yml"] == {"exists": False}


def test_an_edit_that_keeps_the_size_and_the_mtime_is_seen(
    settled: tuple[Path, Path, list[bytes]],
) -> None:
    deploy, _, hashed = settled
    env = deploy / ".env"
    _facts(deploy)
    before = env.stat()
    time.sleep(0.02)  # past the coarse clock's tick: the edit's ctime differs
    env.write_text("A=2\n", encoding="utf-8")
    os.utime(env, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime set back, size equal
    hashed.clear()
    assert _facts(deploy)[".env"]["sha256"] == _sha(b"A=2\n")
    assert b"A=2\n" in hashed and b"services: {}\n" not in hashed


def test_a_file_changed_just_now_is_hashed_every_run(
    settled: tuple[Path, Path, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    deploy, _, hashed = settled
    monkeypatch.setattr(collector, "SETTLED_NS", 3600 * 10**9)  # nothing is an hour old
    _facts(deploy)
    _facts(deploy)
    assert hashed.count(b"A=1\n") == 2 and hashed.count(b"services: {}\n") == 2


@pytest.mark.parametrize("mode", [0o644, 0o620])
def test_a_store_others_could_write_or_read_is_not_used(
    settled: tuple[Path, Path, list[bytes]], mode: int
) -> None:
    deploy, cache, hashed = settled
    _facts(deploy)
    store = cache / "file-digests"
    entries = json.loads(store.read_text())
    for entry in entries.values():
        entry[5] = "00" * 32  # a planted digest for each file, under the right stamp
    store.write_text(json.dumps(entries))
    store.chmod(0o600)
    hashed.clear()
    assert _facts(deploy)[".env"]["sha256"] == "00" * 32  # the control: a private store is read
    store.write_text(json.dumps(entries))
    store.chmod(mode)
    hashed.clear()
    assert _facts(deploy)[".env"]["sha256"] == _sha(b"A=1\n")
    assert b"A=1\n" in hashed


# -- a child process without subprocess -----------------------------------------------------------
def _both(argv: list[str], env: Any, cwd: Path, stdin_text: str | None = None) -> list[Any]:
    fast = collector.spawned(argv, env, str(cwd), 5, stdin_text)
    proc = subprocess.run(
        argv, input=stdin_text, capture_output=True, text=True, env=env, cwd=cwd, timeout=5
    )
    return [fast, (proc.returncode, proc.stdout, proc.stderr)]


@pytest.mark.parametrize(
    "script",
    [
        'printf "a\\r\\nb\\rc\\n"; printf "err\\n" >&2; exit 3',  # universal newlines, status
        'pwd; echo "$PATH" "${HOME-unset}" "${PWD-unset}"',  # the directory and the env
        'cat; echo "stdin: $?"',  # stdin as given
        "kill -TERM $$",  # a signal: negative status
        "trap - PIPE; yes | head -c 3",  # SIGPIPE at its default: yes ends
        "head -c 200000 /dev/zero | tr '\\0' x",  # more than a pipe holds
    ],
)
def test_a_child_runs_as_subprocess_runs_it(script: str, tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for stdin_text in (None, "", "given\n"):
        fast, slow = _both(["sh", "-c", script], env, tmp_path, stdin_text)
        if stdin_text is None and "cat" in script:
            continue  # stdin inherited: pytest's, whatever it holds
        assert fast == slow


def test_a_program_not_found_reads_as_subprocess_says(tmp_path: Path) -> None:
    run = collector.Run({"run_key": "k" * 32, "directory": str(tmp_path)})
    code, out, err = run.run(["no-such-program-x"], env={"PATH": str(tmp_path)})
    with pytest.raises(FileNotFoundError) as raised:
        subprocess.run(["no-such-program-x"], env={"PATH": str(tmp_path)}, check=False)
    assert (code, out, err) == (127, "", str(raised.value))


def test_a_child_past_its_time_is_killed(tmp_path: Path) -> None:
    run = collector.Run({"run_key": "k" * 32, "directory": str(tmp_path), "timeout_s": 0.3})
    started = time.monotonic()
    code, out, err = run.run(["sleep", "5"], env={"PATH": "/usr/bin:/bin"})
    assert (code, out, err) == (124, "", "timed out after 0.3s")
    assert time.monotonic() - started < 2


def test_this_process_stays_in_its_own_directory(tmp_path: Path) -> None:
    here = os.getcwd()
    threads = [
        collector.Thread(collector.spawned, ["pwd"], None, str(tmp_path), 5) for _ in range(8)
    ]
    for thread in threads:
        thread.join()
    assert os.getcwd() == here
    assert collector.spawned(["pwd"], None, str(tmp_path), 5) == (0, f"{tmp_path}\n", "")


# -- JSON through json's C scanner and encoder ----------------------------------------------------
def _fixture_documents() -> list[Path]:
    found = sorted(FIXTURE.rglob("*.json"))
    assert len(found) > 20
    return found[:: max(1, len(found) // 40)]  # a spread of the captures, not all of them


def test_json_reads_and_writes_the_captures_as_json_does() -> None:
    for path in _fixture_documents():
        raw = path.read_bytes()
        value = json.loads(raw)
        assert collector.json_loads(raw) == value
        assert collector.json_loads(raw.decode("utf-8")) == value
        for sort_keys in (False, True):
            assert collector.json_dumps(value, sort_keys=sort_keys) == json.dumps(
                value, sort_keys=sort_keys
            )
        compact = collector.json_dumps(value, sort_keys=True, separators=(",", ":"))
        assert compact == json.dumps(value, sort_keys=True, separators=(",", ":"))


ODD = [
    ' \n {"a": [1, 2.5, -0.0, 1e400, NaN, -Infinity, true, null]} \r\n',
    '"\\ud83d\\ude00 caf\\u00e9 \\u2028"',
    '{"a": 1, "a": 2}',
    "12345678901234567890123",
    '"lone \\udc80 surrogate"',
]
BAD = ["", "  ", '{"a": 1} x', "[1,]", "{'a': 1}", "\ufeff[]", '"a\u0001b"', "[1] [2]"]


@pytest.mark.parametrize("text", ODD + BAD)
def test_json_odd_documents_read_or_fail_as_json_does(text: str) -> None:
    for given in (text, text.encode("utf-8", "surrogatepass")):
        try:
            expected: Any = ("ok", json.loads(given))
        except ValueError as exc:
            expected = ("error", type(exc), str(exc))
        try:
            got: Any = ("ok", collector.json_loads(given))
        except ValueError as exc:
            got = ("error", type(exc), str(exc))
        assert repr(got) == repr(expected)  # repr: NaN equals itself there


def test_json_writes_odd_values_as_json_does() -> None:
    value = {"b": [float("nan"), float("inf"), 1e-7, 10**30, "é\u2028\x00"], "a": {2: None}}
    assert collector.json_dumps(value, sort_keys=True) == json.dumps(value, sort_keys=True)
    with pytest.raises(TypeError, match="Object of type bytes is not JSON serializable"):
        collector.json_dumps({"x": b"raw"})


# -- the regular expressions the collector no longer compiles -----------------------------------
LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$")
ASSIGN = re.compile(
    r"^(?:export|declare\s+-[a-zA-Z]*x[a-zA-Z]*|readonly)?\s*'?([A-Za-z_][A-Za-z0-9_]*)\+?="
)
PIECES = ["export", "declare", "readonly", " ", "\t", "\u00a0", "\u3000", "=", "+", "#", "'",
          '"', "-", "x", "X", "a", "_", "9", "FOO", "\\", ":", "é", "\x0b", "xz", "-x",
          "\r"]  # fmt: skip


def _fuzz(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 9))) for _ in range(count)]
    return out


def _env_lines() -> list[str]:
    """`.env` lines as the captures hold them (key and value: secrets there are digests)."""
    lines: list[str] = []
    for path in sorted((FIXTURE / "import" / "pristine").glob("*.json")):
        collected = json.loads(path.read_text(encoding="utf-8")).get("collected") or {}
        for entry in collected.get("envfile") or []:
            value = entry["value"] if isinstance(entry["value"], str) else "x"
            lines += [f"{entry['key']}={value}", f"export {entry['key']} = '{value}' # c"]
    assert len(lines) > 100
    return lines


def test_an_env_line_is_read_as_the_expression_reads_it() -> None:
    lines = _env_lines() + _fuzz(40000, 1) + [
        "export FOO=1", "export=1", "export  =1", "exportFOO=1", "export FOO BAR=1",
        "  FOO =  bar # c", "\u00a0A=\u00a0b", "1A=2", "_=x", "A", "=x", "export\tB = c",
    ]  # fmt: skip
    for line in lines:
        line = line.replace("\n", "")
        match = LINE.match(line)
        expected = (match.group(1), match.group(2)) if match else None
        assert collector.env_assignment(line) == expected, repr(line)


def test_a_traced_assignment_is_read_as_the_expression_reads_it() -> None:
    commands = [
        *_fuzz(40000, 2),
        "export FOO=bar", "declare -x FOO=bar", "declare -xFOO=1", "declare -rx A+=1",
        "readonly B=2", "'C=3'", "D+=4", "exportE=5", "declare -ax", "declare  -axb Q=1",
        "declare -x", "FOO", "echo hi", "declare -y A=1",
    ]  # fmt: skip
    for command in commands:
        match = ASSIGN.match(command)
        assert collector.assigned(command) == (match.group(1) if match else None), repr(command)


def test_a_comment_and_a_plain_value_are_found_as_the_expressions_find_them() -> None:
    for text in [*_fuzz(20000, 3), "a #b", "#a", "a#b", "a\u00a0#b", "a \t# b # c"]:
        found = re.search(r"\s#", text)
        assert collector._comment_at(text) == (found.start() if found else -1), repr(text)
    for value in [*_fuzz(20000, 4), "abc\n", "\n", "a/b:c@d+e=f-g.h,i", "a b", "x\n\n"]:
        plain = value == "" or re.match(r"^[A-Za-z0-9_./:,@+=-]+$", value) is not None
        assert (collector._quote(value) == value) == plain, repr(value)


def test_http_header_checks_answer_as_the_expressions_do() -> None:
    illegal = re.compile(rb"\n(?![ \t])|\r(?![ \t\n])")
    header = re.compile(r"[\041-\071\073-\176]*:")
    rng = random.Random(5)
    alphabet = ["a", " ", "\t", "\r", "\n", ":", "\x7f", "é", "-", "~", "!"]
    for _ in range(20000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
        assert collector._header_line(text) == bool(header.match(text)), repr(text)
        raw = text.encode("utf-8")
        assert collector._illegal_value(raw) == bool(illegal.search(raw)), repr(raw)
