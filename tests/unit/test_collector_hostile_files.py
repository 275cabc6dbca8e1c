"""A box file the collector cannot read as text is that box's own, named error, never a hung or
lost observation.

The collector reads the deploy user's files: the deployment's `.env` and its `.env*` and
`docker-compose*` files, the box_file secrets, ~/.docker's config, /proc/meminfo. Any of them
may be a FIFO (opening it waited for a writer for ever), a symlink to /dev/zero (read whole: the
memory), a directory or bytes that are not UTF-8 (raised out of the run: no answer at all).
Here the real program runs as a box runs it (`python3 collector.py -`, its payload on stdin, in
a home of its own) over each such file; its answer is read by the controller, compared and reported.

Only a file a converge or the box's compose run meets is an error of the box (it blocks a
converge): the `.env`, the compose files, the secret sources, and any `docker-compose*.yml` the
converger snapshots. An entry read only for the render cache's key (a `.envs/` directory, an
unreadable `.env.bak`) or a ~/.docker file docker only warns about is not.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.box import compare_box
from reconciler.compare.drift import DriftReport, Part
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import expectations
from reconciler.observe.document import Fault, Observed, parse_answer
from reconciler.plan import plan_box
from reconciler.report.document import DriftReportDoc
from reconciler.report.json_report import render_json
from reconciler.report.markdown import render_markdown
from reconciler.report.text import render_text
from tests.unit.box_program_opens import opens
from tests.unit.conftest import ROOT, load_box_program, packed_program

PROGRAM = packed_program("reconciler/observe/remote/collector.py")
collector = load_box_program("box_collector_hostile", "reconciler/observe/remote/collector.py")
EXAMPLE = ROOT / "examples" / "lab-incidents"
COMPOSE = b"services:\n  gateway:\n    image: busybox\n"
ENV = "WORKER_MAX_MODEL_LEN=4096\nGW=from-env\n"
LIMIT = 4 * 1024 * 1024  # the collector's FILE_LIMIT
RUN_S = 60  # far over a run here (~1-4 s): a FIFO held the old collector for ever


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def box(tmp_path: Path) -> Path:
    """A deploy user's home: a lobes deployment (a `.env` and a compose file) and a box_file
    secret, each a regular file to start with."""
    home = tmp_path / "home"
    deploy = home / "lobes"
    deploy.mkdir(parents=True)
    (deploy / ".env").write_text(ENV, encoding="utf-8")
    (deploy / "docker-compose.yml").write_bytes(COMPOSE)
    (home / "secrets.env").write_text("GW=from-secrets\n", encoding="utf-8")
    # The deploy user's login profile (bash -l reads it): its export is the login's own.
    (home / ".bash_profile").write_text(f"export {PROFILE_MARK}=from-profile\n")
    return home


def read_from(home: Path) -> dict[str, str]:
    """The `source` the collector records for the box_file secret `collect` names."""
    return {"path": "~/secrets.env", "expanded": str(home / "secrets.env"), "key": "GW"}


def collect(home: Path, engine: str | None = None) -> tuple[str, dict[str, Any]]:
    """The collector's stdout, run over `home` as the controller runs it, and its document;
    `engine`: the unix socket of a Docker Engine to ask (DOCKER_HOST), else the default."""
    payload = {
        "run_key": "k" * 32,
        "directory": "~/lobes",
        "project": "lobes",
        "compose_files": ["docker-compose.yml"],
        "managed_env": {"GW": {"secret": "gw"}},
        "box_secrets": {"gw": {"path": "~/secrets.env", "key": "GW"}},
        "secret_patterns": [],
        "gateway_port": closed_port(),
        "timeout_s": 2,  # a docker CLI that meets a FIFO config waits for it: not for long
        "probe_timeout_s": 1,
    }
    sent = json.dumps({"payload": payload, "sent": {}})  # on stdin, as the controller sends it
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "USER": "lobes"}
    if engine is not None:
        env["DOCKER_HOST"] = "unix://" + engine
    proc = subprocess.run(
        [sys.executable, str(PROGRAM), "-"], input=sent,
        capture_output=True, text=True, env=env, cwd=home, timeout=RUN_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, json.loads(proc.stdout)


PROFILE_MARK = "FLEET_TEST_PROFILE_MARK"  # what the box fixture's login profile exports


@pytest.fixture
def engine() -> Iterator[tuple[str, list[str]]]:
    """A Docker Engine on a unix socket of its own, with no container of the project: every
    GET answered `[]`. Its socket's path and the paths it was asked for."""
    where = tempfile.mkdtemp(prefix="eng-")  # short: a unix socket's path is at most 107 bytes
    path = os.path.join(where, "docker.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    asked: list[str] = []

    def answer(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                asked.append(head.split(b" ")[1].decode())
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 2\r\n\r\n[]"
                )

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield path, asked
    server.close()
    shutil.rmtree(where, ignore_errors=True)


def fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def directory(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.mkdir()


def dev_zero(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


def too_big(path: Path) -> None:
    with path.open("wb") as handle:  # sparse: costs no disk
        handle.truncate(LIMIT + 1)


def not_utf8(path: Path) -> None:
    path.write_bytes(b"WORKER_MAX_MODEL_LEN=4096\nNAME=caf\xe9\n")


HOSTILE: dict[str, Callable[[Path], None]] = {
    "fifo": fifo,
    "directory": directory,
    "dev-zero": dev_zero,
    "too-big": too_big,
    "not-utf8": not_utf8,
}
WHY = {
    "fifo": "not a regular file (fifo)",
    "directory": "not a regular file (directory)",
    "dev-zero": "not a regular file (character device)",
    "too-big": f"over {LIMIT} bytes",
    "not-utf8": "not UTF-8",
}


# -- the collector: each problem named, the rest observed ---------------------------------------
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_hostile_env_is_the_boxes_named_problem_and_the_rest_is_observed(
    box: Path, kind: str, engine: tuple[str, list[str]]
) -> None:
    HOSTILE[kind](box / "lobes" / ".env")
    _, doc = collect(box, engine[0])
    assert doc["file_errors"] == {".env": WHY[kind]}
    if kind == "not-utf8":  # a file all the same: its bytes are digested as always
        assert doc["files"][".env"]["exists"] and doc["files"][".env"]["size"] == 36
    else:
        assert doc["files"][".env"] == {"exists": False, "error": WHY[kind]}
    assert doc["envfile"] is None and doc["current_env_keys"] == []
    # Not rendered from a .env it could not read (that would render an empty one)...
    assert doc["render"] == {"error": f"not rendered: file .env: {WHY[kind]}"}
    # ... and everything else observed as always.
    compose = doc["files"]["docker-compose.yml"]
    assert compose["exists"] and compose["size"] == len(COMPOSE)
    assert doc["secret_sources"]["gw"]["status"] == "ok"
    assert doc["meminfo"]["MemTotal_kib"] > 0
    assert doc["gateway"]["health"]["status"] is None  # asked: nothing listens there
    # The login shell ran its profile, and the engine was asked for the project's containers.
    assert doc["login_shell"]["exports"][PROFILE_MARK]["value"] == "from-profile"
    assert doc["docker"] == {"containers": [], "images": {}}
    assert engine[1] and engine[1][0].startswith("/containers/json?all=1&filters=")


@pytest.mark.parametrize(
    ("relative", "shown"),
    [
        ("lobes/docker-compose.override.yml", "docker-compose.override.yml"),  # a listed one
        ("lobes/docker-compose.yml", "docker-compose.yml"),  # the -f chain's own
        ("secrets.env", "~/secrets.env"),  # a box_file secret
    ],
)
def test_any_other_fifo_the_collector_reads_is_named_too(
    box: Path, relative: str, shown: str
) -> None:
    path = box / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    fifo(path)
    _, doc = collect(box)
    assert doc["file_errors"] == {shown: "not a regular file (fifo)"}
    assert doc["envfile"] is not None  # the .env itself was read
    if shown == "~/secrets.env":
        assert doc["secret_sources"]["gw"] == {
            "status": "file-unreadable",
            "path": "~/secrets.env",
            "source": read_from(box),
        }


def test_a_regular_file_reads_as_before(box: Path) -> None:
    (box / "lobes" / ".env").write_bytes(b"A=1\r\nB='two words' # note\r\n")
    _, doc = collect(box)
    assert doc["file_errors"] == {}
    assert [(e["key"], e["value"]) for e in doc["envfile"]] == [("A", "1"), ("B", "two words")]
    assert doc["secret_sources"]["gw"]["status"] == "ok"


# -- the controller: parsed, an error of the box, in every report -------------------------------
@pytest.fixture(scope="module")
def thor() -> Any:
    return expectations(load_fleet(EXAMPLE, "lab"), ["thor"])["thor"]


def test_the_controller_reports_the_boxes_own_file_error(box: Path, thor: Any) -> None:
    fifo(box / "lobes" / ".env")
    (box / "lobes" / "docker-compose.override.yml").mkdir()
    stdout, _ = collect(box)
    doc = parse_answer(stdout)
    assert isinstance(doc, Observed), doc
    assert dict(doc.file_errors) == {
        ".env": "not a regular file (fifo)",
        "docker-compose.override.yml": "not a regular file (directory)",
    }
    result = compare_box(thor, doc)
    assert result.reachable and result.observation == "full"
    named = [e for e in result.errors if e.part is Part.BOX_FILE]
    assert named == [
        "file .env: not a regular file (fifo)",
        "file docker-compose.override.yml: not a regular file (directory)",
    ]
    # The .env is there: its drift says it could not be read, not that it is missing.
    (missing,) = [d for d in result.drifts if d.subject == "file:.env" and d.path == "(file)"]
    assert missing.note == "the deployment's .env could not be read: not a regular file (fifo)"
    assert plan_box(result, thor).blocked  # a converge would meet the same FIFO

    report = DriftReport((result,), "lab", "2026-11-30T18:00:00Z", "r1")
    assert report.exit_code == 1
    parsed = DriftReportDoc.model_validate_json(render_json(report))
    assert "file .env: not a regular file (fifo)" in parsed.boxes[0].errors
    assert "error: file .env: not a regular file (fifo)" in render_text(report, color=False)
    assert "file .env: not a regular file (fifo)" in render_markdown(report)


def test_an_older_answer_without_file_errors_reads_as_none(box: Path, thor: Any) -> None:
    _, raw = collect(box)
    raw.pop("file_errors")
    doc = parse_answer(json.dumps(raw))
    assert isinstance(doc, Observed) and dict(doc.file_errors) == {}
    assert not [e for e in compare_box(thor, doc).errors if e.part is Part.BOX_FILE]


@pytest.mark.parametrize("bad", [["x"], {"a": 1}, {"a\x1b[31m": "x"}])
def test_file_errors_of_the_wrong_shape_are_the_boxes_fault(box: Path, bad: Any) -> None:
    _, raw = collect(box)
    raw["file_errors"] = bad
    fault = parse_answer(json.dumps(raw))
    assert isinstance(fault, Fault) and fault.path.startswith("file_errors")


def test_a_large_replay_reads_the_file_errors_alike(box: Path) -> None:
    from reconciler.observe.document_c import read_snapshot_file  # msgspec: a large replay's

    fifo(box / "lobes" / ".env")
    _, raw = collect(box)
    typed = read_snapshot_file(json.dumps({"box": "thor", "collected": raw}).encode())
    assert typed is not None
    assert dict(typed.document.file_errors) == {".env": "not a regular file (fifo)"}


# -- what neither compose nor docker fails on is no error of the box ----------------------------
def _envs_layout(home: Path) -> None:  # cookiecutter-django's: .envs/.production/.django
    (home / "lobes" / ".envs" / ".production").mkdir(parents=True)


NOT_READ: dict[str, Callable[[Path], None]] = {
    ".envs/": _envs_layout,
    ".env.d/": lambda home: directory(home / "lobes" / ".env.d"),
    ".env.bak fifo": lambda home: fifo(home / "lobes" / ".env.bak"),
    ".env.bak over the limit": lambda home: too_big(home / "lobes" / ".env.bak"),
    "docker-compose.d/": lambda home: directory(home / "lobes" / "docker-compose.d"),
    "~/.docker/config.json/": lambda home: (home / ".docker" / "config.json").mkdir(parents=True),
}


@pytest.mark.parametrize("case", sorted(NOT_READ))
def test_an_entry_no_compose_run_reads_is_no_error_of_the_box(
    box: Path, thor: Any, case: str
) -> None:
    """Hashed for the render cache's key only (or a ~/.docker file the docker CLI only warns
    about): it neither blocks a converge nor stops the render."""
    NOT_READ[case](box)
    stdout, raw = collect(box)
    assert raw["file_errors"] == {}
    assert not str(raw["render"].get("error", "")).startswith("not rendered")
    doc = parse_answer(stdout)
    assert isinstance(doc, Observed), doc
    result = compare_box(thor, doc)
    assert not [e for e in result.errors if e.part is Part.BOX_FILE]
    assert not [why for why in plan_box(result, thor).blocked if why.startswith("file ")]


@pytest.fixture
def cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[list[str]]]:
    """A deployment, a private render cache, and a stand-in for `docker compose` that records
    each render it is asked for."""
    deploy = tmp_path / "lobes"
    deploy.mkdir()
    (deploy / ".env").write_text("A=1\n", encoding="utf-8")
    (deploy / "docker-compose.yml").write_bytes(COMPOSE)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setattr(collector, "_cache_dir", lambda: str(cache))
    calls: list[list[str]] = []

    def fake_run(self: Any, argv: list[str], env: Any = None, **_: Any) -> tuple[int, str, str]:
        calls.append(argv)
        return 0, "{}", ""

    monkeypatch.setattr(collector.Run, "run", fake_run)
    return deploy, calls


def refuse(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """The collector's reader answers EACCES for these names (as a root-owned 0600 file does
    to the deploy user: the tests may run as root, whom no mode stops)."""
    real = collector.read_file

    def read_file(path: str, *args: Any, **kwargs: Any) -> Any:
        if os.path.basename(path) in names:
            raise PermissionError(13, "Permission denied", path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(collector, "read_file", read_file)


def cache_run(deploy: Path) -> Any:
    return collector.Run(
        {"run_key": "k" * 32, "directory": str(deploy), "project": "lobes",
         "compose_files": ["docker-compose.yml"], "managed_env": {}, "box_secrets": {}}
    )  # fmt: skip


def test_an_unreadable_entry_keys_the_render_cache_by_its_state_not_an_error(
    cached: tuple[Path, list[list[str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    deploy, calls = cached
    (deploy / ".env.bak").write_text("OLD=1\n", encoding="utf-8")
    refuse(monkeypatch, ".env.bak")
    args, env = ["config", "--format", "json"], {"PATH": "/usr/bin"}
    run = cache_run(deploy)
    collector.compose_cached(run, str(deploy), env, args)
    assert run.file_errors == {}  # compose never reads it: no error of the box
    collector.compose_cached(cache_run(deploy), str(deploy), env, args)
    assert len(calls) == 1  # the same state: served from the cache
    (deploy / ".env.bak").write_text("OLDER=2\n", encoding="utf-8")  # another size and ctime
    collector.compose_cached(cache_run(deploy), str(deploy), env, args)
    assert len(calls) == 2  # its state changed: the render is made again


def test_a_file_the_render_reads_that_cannot_be_read_is_the_boxes_error(
    cached: tuple[Path, list[list[str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    deploy, _ = cached
    refuse(monkeypatch, "docker-compose.yml", ".env")
    run = cache_run(deploy)
    collector.compose_cached(run, str(deploy), {"PATH": "/usr/bin"}, ["config"])
    assert run.file_errors == {
        ".env": "permission denied (EACCES)",
        "docker-compose.yml": "permission denied (EACCES)",
    }


def test_a_docker_config_that_cannot_be_read_is_as_if_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Docker warns and goes on with its defaults (a config.json that `sudo docker login`
    left root's own, 0600): so does the collector, and it is no error of the box."""
    (tmp_path / ".docker").mkdir()
    (tmp_path / ".docker" / "config.json").write_text('{"currentContext": "remote"}')
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    refuse(monkeypatch, "config.json")
    run = cache_run(tmp_path / "lobes")
    assert collector.docker_socket(run) == "/var/run/docker.sock"  # docker's default
    assert run.file_errors == {}


# -- an odd name: shown as the controller takes it ----------------------------------------------
@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (".env", ".env"),
        ("docker-compose copy.yml", "docker-compose copy.yml"),
        (".env.café", ".env.café"),
        (".env\x1b[2J", ".env\\x1b[2J"),
        (".env\t\x7f", ".env\\x09\\x7f"),
        (os.fsdecode(b".env.caf\xe9"), ".env.caf\\xe9"),  # a byte that is not UTF-8
        (".env\x85", ".env\\u0085"),  # not the byte \x85: a character, shown apart
        (".env\u2028", ".env\\u2028"),
        (".env\U000e0001", ".env\\U000e0001"),
        ("a\\x1b", "a\\\\x1b"),  # a name's own backslash is never read as an escape
    ],
)
def test_a_name_is_shown_as_the_controller_takes_it(raw: str, shown: str) -> None:
    from reconciler.observe.document import _name

    assert collector.shown_name(raw) == shown
    assert _name(shown, "file_errors") == shown  # accepted as it is


def test_entries_with_odd_names_are_named_safely_and_the_answer_is_read(
    box: Path, thor: Any
) -> None:
    """A control character or a byte that is not UTF-8 in an entry's name: the controller
    refused the whole answer for the one, the render failed (UnicodeEncodeError) for the
    other; now each is named, escaped, and the rest is observed."""
    deploy = bytes(box / "lobes")
    os.mkdir(deploy + b"/docker-compose\x1b[2J.yml")  # a directory the converger would meet
    os.mkfifo(deploy + b"/docker-compose.caf\xe9.yml")
    os.mkfifo(deploy + b"/.env\x1b[2J")  # hashed for the cache key only: no error
    with open(deploy + b"/.env.caf\xe9", "wb") as handle:
        handle.write(b"X=1\n")
    stdout, raw = collect(box)
    shown = {
        "docker-compose\\x1b[2J.yml": "not a regular file (directory)",
        "docker-compose.caf\\xe9.yml": "not a regular file (fifo)",
    }
    assert raw["file_errors"] == shown
    assert {name: raw["files"][name]["error"] for name in shown} == shown
    assert "Unicode" not in json.dumps(raw["render"])  # the render keyed the odd name too
    doc = parse_answer(stdout)
    assert isinstance(doc, Observed), doc
    result = compare_box(thor, doc)
    named = sorted(e for e in result.errors if e.part is Part.BOX_FILE)
    assert named == sorted(f"file {name}: {why}" for name, why in shown.items())
    text = render_text(DriftReport((result,), "lab", "2026-11-30T18:00:00Z", "r1"), color=False)
    assert "file docker-compose\\x1b[2J.yml: not a regular file (directory)" in text
    assert "\x1b[2J" not in text


# -- a symlink that leads to no file: the converger's refusal, known before a plan ----------------
@pytest.mark.parametrize("name", ["docker-compose.gpu.yml", "docker-compose.yml", ".env"])
def test_a_symlink_to_nothing_is_the_boxes_problem_as_the_converger_says(
    box: Path, thor: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = box / "lobes" / name
    link.unlink(missing_ok=True)
    link.symlink_to("/nonexistent-fleet-test/gone.yml")
    stdout, raw = collect(box)
    why = "a symlink that leads to no file"
    assert raw["file_errors"] == {name: why}
    assert raw["files"][name] == {"exists": False, "error": why}
    if name == ".env":  # not rendered as if it were empty
        assert raw["render"] == {"error": f"not rendered: file .env: {why}"}
    doc = parse_answer(stdout)
    assert isinstance(doc, Observed), doc
    assert f"file {name}: {why}" in plan_box(compare_box(thor, doc), thor).blocked
    # What the converger says of the same file, under its lock, before it writes anything.
    converge = load_box_program("box_converge_dangling", "reconciler/apply/remote/converge.py")
    monkeypatch.setenv("HOME", str(box))
    payload = {"directory": "~/lobes", "project": "lobes", "compose_files": ["docker-compose.yml"]}
    with pytest.raises(converge.Failed, match=f"{name} is {why}"):
        converge.check_managed_files(converge.Box(payload))


def test_a_secret_source_that_is_a_symlink_to_nothing_is_named_so_not_missing(box: Path) -> None:
    (box / "secrets.env").unlink()
    (box / "secrets.env").symlink_to("/nonexistent-fleet-test/secrets.env")
    _, raw = collect(box)
    assert raw["file_errors"] == {"~/secrets.env": "a symlink that leads to no file"}
    assert raw["secret_sources"]["gw"] == {
        "status": "file-unreadable",
        "path": "~/secrets.env",
        "source": read_from(box),
    }
    (box / "secrets.env").unlink()  # no file and no link: missing, and no error of the box's
    _, raw = collect(box)
    assert raw["secret_sources"]["gw"] == {
        "status": "file-missing",
        "path": "~/secrets.env",
        "source": read_from(box),
    }
    assert "file_errors" not in raw or not raw["file_errors"]


# -- the one reader: stat first, nothing else opened ---------------------------------------------
@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every os.open of the collector's from now on: (path, flags)."""
    calls: list[tuple[str, int]] = []
    real = os.open

    def spy(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        calls.append((os.fsdecode(path), flags))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(collector.os, "open", spy)
    return calls


def _odd_files(tmp_path: Path) -> dict[str, tuple[str, str]]:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "dir").mkdir()
    (tmp_path / "zero").symlink_to("/dev/zero")
    return {
        "/dev/null": ("/dev/null", "character device"),
        "pipe": (str(tmp_path / "pipe"), "fifo"),
        "dir": (str(tmp_path / "dir"), "directory"),
        "zero": (str(tmp_path / "zero"), "character device"),
    }


def test_the_reader_never_opens_what_is_not_a_regular_file(
    tmp_path: Path, opened: list[tuple[str, int]]
) -> None:
    """A tty opened without O_NOCTTY could become the controlling terminal, and a serial or
    tape device acts on its open: what stat says is no regular file is refused unopened."""
    for path, kind in _odd_files(tmp_path).values():
        with pytest.raises(collector.BoxFileError, match=rf"not a regular file \({kind}\)"):
            collector.read_file(path)
    with pytest.raises(collector.BoxFileError, match=r"not a regular file \(symlink\)"):
        collector.read_file(str(tmp_path / "zero"), follow=False)
    assert opened == []


def test_the_reader_opens_a_regular_file_without_taking_a_terminal(
    tmp_path: Path, opened: list[tuple[str, int]]
) -> None:
    (tmp_path / "f").write_bytes(b"A=1\n")
    assert collector.read_file(str(tmp_path / "f"))[0] == b"A=1\n"
    ((path, flags),) = opened
    assert path == str(tmp_path / "f")
    assert flags & os.O_NOCTTY and flags & os.O_NONBLOCK


def test_a_file_swapped_after_the_stat_is_refused_by_its_open_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the stat and the open a FIFO can take the regular file's place: what was
    opened is typed again (fstat), so it is still refused, and the open did not wait."""
    regular, pipe = tmp_path / "regular", tmp_path / "pipe"
    regular.write_bytes(b"A=1\n")
    os.mkfifo(pipe)
    real = os.stat

    def stat_before_the_swap(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        return real(regular if os.fspath(path) == str(pipe) else path, *args, **kwargs)

    monkeypatch.setattr(collector.os, "stat", stat_before_the_swap)
    with pytest.raises(collector.BoxFileError, match=r"not a regular file \(fifo\)"):
        collector.read_file(str(pipe))


# -- every box file read goes through the one reader ---------------------------------------------
# Each call in the collector that opens or reads a file by its path, but the reader's own: where
# it is and why it is not a read of a box file. Anything else that opens one fails the test.
OPENS_ALLOWED = {
    # Its own working directory (O_PATH), held to come back after spawning a child there.
    ("_spawn_in", 'os.open(".", getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY)'),
    # Writes of its own files, never reads: the stat-digest store (in its private cache) ...
    ("StatDigests.save", "os.open(tmp, flags, 0o600)"),
    # ... the desired .env in the private temp project (O_EXCL: a new file) ...
    (
        "shadow_project",
        'os.open(os.path.join(project, ".env"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)',
    ),
    # ... compose's render of the deployment, in the private temp directory, to hash it ...
    (
        "config_hashes",
        "os.open(rendered, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)",
    ),
    # ... and a render into the private cache.
    ("_store_render", "os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)"),
    # HTTP requests through urllib's opener (a redirect, a proxy): no file at all.
    ("_urllib_get", "within(left).open(request, timeout=left)"),
    ("_urllib_post", "within(left).open(request, timeout=left)"),
}
READER = "read_file"


def test_every_box_file_read_goes_through_the_one_reader() -> None:
    """`open(`, `os.open(`, `io.open`, `.read_text(`, `.read_bytes(` anywhere in the program
    (a call or not, at any place in a line): only the reader itself and the allowed list."""
    found = opens(PROGRAM.read_text(encoding="utf-8"))
    reader = [source for where, source in found if where == READER]
    assert reader == ["os.open(path, flags)"]  # the one reader's open
    others = {(where, source) for where, source in found if where != READER}
    assert others == OPENS_ALLOWED


def test_the_one_reader_check_sees_each_way_of_opening() -> None:
    for used in (
        "open(p)",
        "Path(p).read_text()",
        "Path(p).read_bytes()",
        "os.open(p, os.O_RDONLY)",
        "io.open(p)",
        "Path(p).open()",
        "os.open",  # taken to call later
        "builtins.open",
    ):
        program = f"def f(p):\n    x = len([1, {used}])\n"  # anywhere in a line
        assert opens(program) == [("f", used)], used
