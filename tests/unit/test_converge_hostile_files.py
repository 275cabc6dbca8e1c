"""The box-side converge (reconciler/apply/remote/converge.py) against hostile files and a slow
gateway, on real files in a temp home posing as the deploy user's, docker faked:

- a managed file (`.env`, a compose file, a box_file secret source) or the lock file that is a
  FIFO, a device (a symlink to /dev/zero), a directory, a dangling symlink or over the 64 MiB
  cap is refused by name BEFORE anything changes: no hang, no memory blow-up, lock released,
  exit 1, and the controller shows it as that box's failure;
- what a snapshot copies, a rollback can restore (one reader, one cap), and a managed path that
  was a symlink comes back from a rollback as that symlink;
- a snapshot that saw a link, then a file (or the other way round), looks again: it never
  records a link over a file's bytes; a stray `docker-compose copy.yml` is not snapshotted, so
  the rollback of a failed converge beside one restores exactly;
- the temp-file sweep and an unpinned restore never follow a symlinked `known-good` out of the
  deployment (the restore reads through the one fd it checked);
- a gateway that drips its answer a byte at a time cannot keep a request, or the verification
  as a whole, past its deadline; one that redirects to itself (`/health` -> `/health/`) is
  followed within that deadline, a redirect elsewhere is its status.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from reconciler.apply import boxcall, engine
from reconciler.apply.payload import converge_payload as controller_payload
from reconciler.apply.progress import Reporter
from reconciler.apply.summary import outcome_lines
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift_on
from reconciler.drift_inputs import drift_inputs
from tests.unit.box_program_opens import opens
from tests.unit.conftest import load_box_program, packed_program
from tests.unit.converge_helpers import COMPOSE, base_payload, deployment, fake_docker

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = packed_program("reconciler/apply/remote/converge.py")
converge = load_box_program("box_converge_hostile", "reconciler/apply/remote/converge.py")

ENV = "GATEWAY_API_KEY=s3cret-gateway-key-0123456789\nWORKER_MAX_MODEL_LEN=262144\n"
CAP = 64 << 20  # the reader's cap, as the messages say it


# -- a deployment in a temp home -------------------------------------------------------------------
@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return deployment(tmp_path, monkeypatch, ENV)


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every command the box program runs: none really runs (docker faked)."""
    return fake_docker(monkeypatch, converge)


@pytest.fixture
def no_hang() -> Iterator[None]:
    """A read that blocks (a FIFO opened for reading waits for a writer) fails the test after
    10 s instead of hanging it: SIGALRM interrupts the blocked open or read."""

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError("the converge blocked on a file")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, 10)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def payload(action: str = "converge", **more: Any) -> dict[str, Any]:
    """A converge that writes one .env key and recreates nothing."""
    base = base_payload(action, "alice@ctl pid 1 (reconcile apply)")
    if action == "converge":
        base.update(
            titles=["write .env"],
            fingerprint={"files": {}, "containers": None},
            managed_env={"WORKER_MAX_MODEL_LEN": "131072"},
            box_secrets={},
            env_keys=["WORKER_MAX_MODEL_LEN"],
            restore=[],
            pulls=[],
            services=[],
            removes=[],
            images={},
            verify={"port": 8000, "version": "0.92.0", "auth": "keyed", "windows": {}},
            keep=10,
        )
    return {**base, **more}


def with_secret_source(p: dict[str, Any]) -> dict[str, Any]:
    p["box_secrets"] = {"gateway_api_key": {"path": "~/.lobes/.secrets.env", "key": "K"}}
    p["managed_env"]["GATEWAY_API_KEY"] = {"secret": "gateway_api_key"}
    p["env_keys"].append("GATEWAY_API_KEY")
    return p


def entries(path: Path) -> dict[str, tuple[Any, ...]]:
    """What is under `path`, read without opening anything: type, size, mtime, link text."""
    found: dict[str, tuple[Any, ...]] = {}
    for p in sorted(path.rglob("*")):
        st = p.lstat()
        link = os.readlink(p) if p.is_symlink() else None
        kind = stat.S_IFMT(st.st_mode)
        seen = None if kind == stat.S_IFDIR else (st.st_size, st.st_mtime_ns)  # not its entries
        found[str(p.relative_to(path))] = (kind, seen, link)
    return found


# -- the box program as it ships: its own process, payload on stdin --------------------------------
# The program loaded by path and run by its main(), with Box.run faked (docker never runs; the
# commands it would have run are logged), under an address-space limit: a converge that reads
# /dev/zero fails there instead of filling this machine's memory.
RUNNER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("converge", sys.argv[1])
converge = importlib.util.module_from_spec(spec)
spec.loader.exec_module(converge)
def run(self, argv, timeout=120):
    with open(sys.argv[2], "a") as log:
        log.write(json.dumps(argv) + "\\n")
    return 0, "", ""
converge.Box.run = run
sys.exit(converge.main())
"""


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def box_argv(home: Path, log: Path) -> list[str]:
    # `timeout`: a converge that blocks is killed and fails the test, never hangs it.
    return ["timeout", "-s", "KILL", "30", "env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin",
            sys.executable, "-I", "-S", "-c", RUNNER, str(PROGRAM), str(log)]  # fmt: skip


def run_box(home: Path, p: dict[str, Any]) -> tuple[int, list[dict[str, Any]], list[Any]]:
    """(exit code, events, docker commands) of one run of the box program on `p`."""
    log = home.parent / "commands.log"
    done = subprocess.run(
        box_argv(home, log),
        input=json.dumps(p),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=_limit_memory,
    )
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    ran = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done.returncode, events, ran


def fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def symlink(path: Path, target: str | Path) -> None:
    path.unlink(missing_ok=True)
    os.symlink(target, path)


def _env_fifo(home: Path) -> None:
    fifo(home / ".lobes" / ".env")


def _compose_fifo(home: Path) -> None:
    fifo(home / ".lobes" / "docker-compose.yml")


def _listed_compose_fifo(home: Path) -> None:
    fifo(home / ".lobes" / "docker-compose.extra.yml")  # managed by its name, not the payload


def _env_to_dev_zero(home: Path) -> None:
    symlink(home / ".lobes" / ".env", "/dev/zero")


def _env_to_fifo(home: Path) -> None:
    os.mkfifo(home / "pipe")
    symlink(home / ".lobes" / ".env", home / "pipe")


def _env_over_cap(home: Path) -> None:
    os.truncate(home / ".lobes" / ".env", CAP + 1)  # sparse: no disk, no reading


def _env_directory(home: Path) -> None:
    (home / ".lobes" / ".env").unlink()
    (home / ".lobes" / ".env").mkdir()


def _env_dangling(home: Path) -> None:
    symlink(home / ".lobes" / ".env", home / "gone.env")


def _secret_fifo(home: Path) -> None:
    fifo(home / ".lobes" / ".secrets.env")


def _secret_to_dev_zero(home: Path) -> None:
    symlink(home / ".lobes" / ".secrets.env", "/dev/zero")


def _lock_fifo(home: Path) -> None:
    (home / ".lobes" / ".fleet").mkdir(mode=0o700)
    fifo(home / ".lobes" / ".fleet" / "lock")


HOSTILE = [
    (".env is a FIFO", _env_fifo, "~/.lobes/.env is not a regular file (fifo)"),
    ("compose file is a FIFO", _compose_fifo,
     "~/.lobes/docker-compose.yml is not a regular file (fifo)"),
    ("listed compose file is a FIFO", _listed_compose_fifo,
     "~/.lobes/docker-compose.extra.yml is not a regular file (fifo)"),
    (".env links to /dev/zero", _env_to_dev_zero,
     "~/.lobes/.env is not a regular file (symlink to a character device)"),
    (".env links to a FIFO", _env_to_fifo,
     "~/.lobes/.env is not a regular file (symlink to a fifo)"),
    (".env over the cap", _env_over_cap,
     "~/.lobes/.env is larger than 64 MiB, the most a converge reads"),
    (".env is a directory", _env_directory, "~/.lobes/.env is not a regular file (directory)"),
    (".env links to nothing", _env_dangling,
     "~/.lobes/.env is a symlink that leads to no file (No such file or directory)"),
    ("secret source is a FIFO", _secret_fifo,
     "~/.lobes/.secrets.env is not a regular file (fifo)"),
    ("secret source links to /dev/zero", _secret_to_dev_zero,
     "~/.lobes/.secrets.env is not a regular file (symlink to a character device)"),
    ("lock file is a FIFO", _lock_fifo, "~/.lobes/.fleet/lock is not a regular file (fifo)"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "make", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_box_file_is_refused_by_name_before_anything_changes(home, name, make, message):
    (home / ".lobes" / ".secrets.env").write_text("K=s3cret-from-the-box-file\n")
    make(home)
    before = entries(home)
    started = time.monotonic()
    code, events, ran = run_box(home, with_secret_source(payload()))
    assert time.monotonic() - started < 20
    assert code == 1, events
    assert events and events[-1]["event"] == "result"
    assert events[-1]["ok"] is False and events[-1]["failed"] == message
    assert "snapshot" not in events[-1]
    assert ran == []  # not a docker command
    fleet = home / ".lobes" / ".fleet"
    assert not (fleet / "snapshots").exists()  # no snapshot, no write: refused first
    after = entries(home)
    mine = {".lobes/.fleet", ".lobes/.fleet/lock"}  # what taking the lock makes
    assert {k: v for k, v in after.items() if k not in mine} == {
        k: v for k, v in before.items() if k not in mine
    }
    lock = fleet / "lock"
    if lock.exists() and stat.S_ISREG(lock.lstat().st_mode):
        assert lock.read_text() == ""  # released: the holder's record is cleared
        again = converge.Lock(converge.Box(payload()))
        again.acquire("next")  # and free
        again.release()


def test_a_regular_deployment_converges_through_the_same_harness(home):
    """The control: with every file regular, the same run converges (the refusals above are
    the files', not the harness's)."""
    code, events, ran = run_box(home, payload())
    assert (code, events[-1]["ok"]) == (0, True), events
    assert "WORKER_MAX_MODEL_LEN=131072" in (home / ".lobes" / ".env").read_text()
    assert len(list((home / ".lobes" / ".fleet" / "snapshots").iterdir())) == 1
    assert ran  # docker (faked) was asked: the converge went all the way


# -- the controller shows the refusal as that box's failure ----------------------------------------
EXAMPLE = ROOT / "examples" / "lab-incidents"


def test_the_controller_shows_the_refusal_as_the_boxs_failure(home, tmp_path, monkeypatch):
    """`reconcile apply`'s own path (engine.execute, the typed answer, the outcome lines) with
    the real box program behind a local process instead of ssh: the box's named refusal is what
    the operator reads for that box; no snapshot is claimed, nothing is to roll back."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fleet = load_fleet(EXAMPLE, "lab")
    run = run_drift_on(drift_inputs(fleet), ["thor"], from_snapshot=EXAMPLE / "snapshot")
    prep = engine.prepare(fleet, "thor", run)
    sent = controller_payload(prep.exp, prep.spec, prep.plan, None, "me", environ={})
    keys = sorted({src["key"] for src in sent["box_secrets"].values()})
    (home / ".lobes" / ".secrets.env").write_text("".join(f"{k}=value-of-{k}\n" for k in keys))
    fifo(home / ".lobes" / ".env")
    log = tmp_path / "commands.log"
    monkeypatch.setattr(boxcall, "ssh_argv", lambda *a, **k: box_argv(home, log))
    shown = io.StringIO()
    reporter = Reporter("thor", shown, bar=False)
    out = engine.execute(prep, "test", reporter.on_event)
    message = "~/.lobes/.env is not a regular file (fifo)"
    assert (out.ok, out.changed, out.snapshot, out.rollback) == (False, False, None, None)
    assert out.failed == message
    assert outcome_lines(out) == [f"FAILED: {message}"]
    assert out.events[-1] == {**out.events[-1], "event": "result", "ok": False}
    assert not log.exists()  # the box ran no docker command
    assert stat.S_ISFIFO((home / ".lobes" / ".env").lstat().st_mode)


# -- the one reader ------------------------------------------------------------------------------
def test_the_reader_refuses_a_fifo_without_blocking(tmp_path, no_hang):
    os.mkfifo(tmp_path / "pipe")
    for follow in (False, True):
        with pytest.raises(converge.Failed, match=r"pipe is not a regular file \(fifo\)"):
            converge.read_regular(str(tmp_path / "pipe"), follow=follow)


def test_the_reader_refuses_a_device_behind_a_symlink(tmp_path):
    os.symlink("/dev/zero", tmp_path / "zero")
    with pytest.raises(converge.Failed, match=r"symlink to a character device"):
        converge.read_regular(str(tmp_path / "zero"), follow=True)
    with pytest.raises(converge.Failed, match=r"not a regular file \(symlink\)"):
        converge.read_regular(str(tmp_path / "zero"))  # a file of ours is never a link


def test_the_reader_reads_at_most_its_cap(tmp_path):
    (tmp_path / "ten").write_bytes(b"0123456789")
    assert converge.read_regular(str(tmp_path / "ten"), limit=10)[0] == b"0123456789"
    with pytest.raises(converge.Failed, match="larger than 9 bytes"):
        converge.read_regular(str(tmp_path / "ten"), limit=9)
    (tmp_path / "big").touch()
    os.truncate(tmp_path / "big", CAP + 1)
    with pytest.raises(converge.Failed, match="larger than 64 MiB"):
        converge.read_regular(str(tmp_path / "big"), follow=True)


# Every other open of the program, and why it is no read of a box file past the reader.
OPENS_ALLOWED = {
    # Directories, opened to fsync them or to walk below them without following links.
    ("fsync_dir", 'os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY)'),
    ("open_dir", "os.open(name, flags, dir_fd=parent)"),
    # A new temporary file of its own (O_EXCL, O_NOFOLLOW), written, never read.
    ("atomic_write", "os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)"),
    # The lock file: non-blocking, not followed, typed by fstat before it is used.
    (
        "Lock.open_fd",
        "os.open(self.path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, 0o600)",
    ),
    # The kernel's files.
    ("meminfo", 'open("/proc/meminfo", encoding="utf-8")'),
    ("drop_caches", 'open("/proc/sys/vm/drop_caches", "w")'),
}


def test_every_box_file_read_goes_through_the_one_reader():
    """Any use of an opener (`open`, `os.open`, `io.open`, `.read_text`...) anywhere in the
    program: only read_regular's own and the allowed list."""
    found = opens(PROGRAM.read_text(encoding="utf-8"))
    assert [s for where, s in found if where == "read_regular"] == [
        "os.open(path, flags, dir_fd=dir_fd)"
    ]
    assert {(where, s) for where, s in found if where != "read_regular"} == OPENS_ALLOWED


# -- snapshot and rollback agree -------------------------------------------------------------------
def box(**more: Any) -> Any:
    return converge.Box(payload(**more))


def snapshot() -> str:
    sid, _ = converge.take_snapshot(box(), {"holder": "me", "plan": [], "services": []})
    return str(sid)


def snaps(home: Path) -> Path:
    return home / ".lobes" / ".fleet" / "snapshots"


def test_a_file_over_the_cap_is_refused_by_the_snapshot_not_copied(home, commands):
    """The snapshot copied any size while the restore read at most 64 MiB: a snapshot it could
    never restore. Now one reader, one cap: refused up front, no copy left behind."""
    os.truncate(home / ".lobes" / ".env", CAP + 1)
    with pytest.raises(converge.Failed, match=r"~/.lobes/.env is larger than 64 MiB"):
        snapshot()
    assert list(snaps(home).iterdir()) == []


def test_a_file_at_the_cap_is_snapshotted_and_restored(home, commands):
    env = home / ".lobes" / ".env"
    os.truncate(env, CAP)  # sparse zeros up to the cap: the most both sides take
    sid = snapshot()
    env.write_text("A=changed\n")
    result = converge.rollback(box(), sid, reason="test")
    assert result["ok"] is True, result
    assert env.stat().st_size == CAP


def test_a_symlinked_env_comes_back_from_a_failed_converge_as_that_symlink(
    home, commands, monkeypatch
):
    """Apply replaces a managed symlink by a regular file and never writes its target (see
    converge.write_managed); the rollback puts the link itself back, its text as it was. (A
    link inside the deployment directory: one out of it is refused, test_review3_converge.)"""
    target = home / ".lobes" / "config" / "thor.env"
    target.parent.mkdir()
    target.write_text(ENV)
    target.chmod(0o600)
    env = home / ".lobes" / ".env"
    symlink(env, "config/thor.env")
    seen: dict[str, Any] = {}

    def pull_fails(box: Any, refs: list[str]) -> None:
        seen.update(link=env.is_symlink(), env=env.read_text(), target=target.read_text())
        raise converge.Failed("docker pull failed: registry down")

    monkeypatch.setattr(converge, "pull", pull_fails)
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    result = converge.run_action(box(), payload())
    assert result["ok"] is False and result["failed"] == "docker pull failed: registry down"
    assert result["rollback"]["ok"] is True and result["rollback"]["files"] == [".env"]
    # While it ran: a regular .env with the new value; the link's target never written.
    assert seen == {
        "link": False,
        "env": ENV.replace("262144", "131072"),
        "target": ENV,
    }
    # After the rollback: the link itself, its text exactly, the target untouched.
    assert env.is_symlink() and os.readlink(env) == "config/thor.env"
    assert target.read_text() == ENV
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert any("~/.lobes/.env was a symlink" in e.get("message", "") for e in events)


def test_a_symlinked_compose_file_is_recorded_as_a_link_and_restored_as_one(home, commands):
    deploy = home / ".lobes"
    (deploy / "shapes").mkdir()
    (deploy / "shapes" / "base.yml").write_text(COMPOSE)
    symlink(deploy / "docker-compose.yml", "shapes/base.yml")
    sid = snapshot()
    meta = json.loads((snaps(home) / sid / "meta.json").read_text())
    assert meta["files"]["docker-compose.yml"]["symlink"] == "shapes/base.yml"
    assert not (snaps(home) / sid / "docker-compose.yml").exists()  # the link, not a copy
    (deploy / "docker-compose.yml").unlink()
    (deploy / "docker-compose.yml").write_text("services: {}\n")  # what a restore wrote
    result = converge.rollback(box(), sid, reason="test")
    assert result["ok"] is True and result["files"] == ["docker-compose.yml"], result
    assert os.readlink(deploy / "docker-compose.yml") == "shapes/base.yml"
    assert (deploy / "shapes" / "base.yml").read_text() == COMPOSE
    assert [p.name for p in deploy.iterdir() if "fleet-tmp" in p.name] == []


def test_a_regular_file_linked_since_the_snapshot_comes_back_regular(home, commands, tmp_path):
    sid = snapshot()
    elsewhere = tmp_path / "elsewhere.env"
    elsewhere.write_text("OTHER=1\n")
    symlink(home / ".lobes" / ".env", elsewhere)
    assert converge.rollback(box(), sid, reason="test")["ok"] is True
    assert not (home / ".lobes" / ".env").is_symlink()
    assert (home / ".lobes" / ".env").read_text() == ENV
    assert elsewhere.read_text() == "OTHER=1\n"


def test_a_rollback_replaces_a_fifo_without_reading_it(home, commands, no_hang):
    sid = snapshot()
    fifo(home / ".lobes" / ".env")
    result = converge.rollback(box(), sid, reason="test")
    assert result["ok"] is True, result
    assert (home / ".lobes" / ".env").read_text() == ENV


def test_a_damaged_symlink_record_refuses_the_whole_rollback(home, commands):
    symlink(home / ".lobes" / "docker-compose.yml", "x.yml")
    (home / ".lobes" / "x.yml").write_text(COMPOSE)
    sid = snapshot()
    meta_path = snaps(home) / sid / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["files"]["docker-compose.yml"]["symlink"] = ["not", "text"]
    meta_path.write_text(json.dumps(meta))
    result = converge.rollback(box(), sid, reason="test")
    assert result["ok"] is False and "metadata of docker-compose.yml is damaged" in result["failed"]


# -- the sweep stays inside the deployment ---------------------------------------------------------
def test_the_sweep_does_not_follow_a_symlinked_known_good(home, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / f"notes.fleet-tmp-{'ab' * 6}"
    victim.write_text("not ours\n")
    fleet = home / ".lobes" / ".fleet"
    fleet.mkdir(mode=0o700)
    os.symlink(outside, fleet / "known-good")
    left = home / ".lobes" / f".env.fleet-tmp-{'cd' * 6}"
    left.write_text(ENV)
    converge.sweep_temp_files(box())
    assert victim.read_text() == "not ours\n"
    assert not left.exists()  # the deployment's own leftovers still go


def test_the_sweep_clears_a_real_known_good_and_a_leftover_temp_link(home, tmp_path):
    good = home / ".lobes" / ".fleet" / "known-good"
    good.mkdir(parents=True)
    left = good / f"docker-compose.yml.fleet-tmp-{'ef' * 6}"
    left.write_text(COMPOSE)
    kept = tmp_path / "kept"
    kept.write_text("kept\n")
    link = home / ".lobes" / f".env.fleet-tmp-{'01' * 6}"  # an atomic_symlink killed mid-way
    os.symlink(kept, link)
    converge.sweep_temp_files(box())
    assert not left.exists() and not os.path.lexists(link)
    assert kept.read_text() == "kept\n"


def test_an_unpinned_restore_takes_no_copy_from_a_symlinked_known_good(home, tmp_path):
    """A `known-good` that links elsewhere vouches (its meta.json) for bytes from elsewhere."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    planted = b"services: {planted: {image: evil}}\n"
    (outside / "docker-compose.yml").write_bytes(planted)
    sha = hashlib.sha256(planted).hexdigest()
    (outside / "meta.json").write_text(json.dumps({"files": {"docker-compose.yml": sha}}))
    fleet = home / ".lobes" / ".fleet"
    fleet.mkdir(mode=0o700)
    os.symlink(outside, fleet / "known-good")
    assert converge.find_copy(box(), "docker-compose.yml", None) is None
    (fleet / "known-good").unlink()
    (fleet / "known-good").mkdir()  # the same files, in the deployment's own directory
    for name in ("docker-compose.yml", "meta.json"):
        (fleet / "known-good" / name).write_bytes((outside / name).read_bytes())
    assert converge.find_copy(box(), "docker-compose.yml", None) == planted


# -- a gateway that drips ------------------------------------------------------------------------
DRIP_FOR = 8.0  # how long one connection drips before it gives up (the old code's wait)
HEADERS = b"HTTP/1.1 200 OK\r\nX-Slow: "
BODY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"


class Drip:
    """A server on the loopback that answers every request with `head`, then one byte every
    0.2 s: each receive is quick, the answer never completes."""

    def __init__(self, head: bytes) -> None:
        self.head = head
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self.drip, args=(conn,), daemon=True).start()

    def drip(self, conn: socket.socket) -> None:
        with conn, _quiet():
            conn.recv(65536)
            conn.sendall(self.head)
            end = time.monotonic() + DRIP_FOR
            while time.monotonic() < end and not self.stop.wait(0.2):
                conn.sendall(b"a")

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)


@pytest.fixture(params=[HEADERS, BODY], ids=["dripping headers", "dripping body"])
def drip(request: pytest.FixtureRequest) -> Iterator[Drip]:
    server = Drip(request.param)
    yield server
    server.close()


def gateway_box(port: int, **verify: Any) -> Any:
    spec = {"port": port, "version": "0.92.0", "auth": "keyed", "windows": {}, **verify}
    return converge.Box(payload(verify=spec))


def test_a_request_to_a_dripping_gateway_ends_at_its_deadline(drip):
    started = time.monotonic()
    assert converge.http_status(f"http://127.0.0.1:{drip.port}/health", 1.0) == (None, None)
    assert time.monotonic() - started < 2.0


def test_the_verification_deadline_holds_against_a_dripping_gateway(drip, monkeypatch):
    monkeypatch.setattr("sys.stdout", io.StringIO())
    started = time.monotonic()
    with pytest.raises(converge.Failed, match="gateway verification failed: /health"):
        converge.verify_gateway(gateway_box(drip.port), 2)
    assert time.monotonic() - started < 3.5


class _Gateway(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, json.dumps({"status": "ok", "version": "0.92.0"}).encode())
        elif self.path == "/capabilities":  # chunked, as a streaming server may send it
            body = json.dumps({"worker": {"context": 262144}, "hand": {"feasible": False}})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (body[:10], body[10:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part.encode()))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/v1/models":
            self._send(401, b'{"error": "unauthorized"}')
        else:  # an error status whose body never ends: the status alone is the answer
            self.send_response(401)
            self.end_headers()
            self.wfile.flush()
            time.sleep(3)

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_gateway_that_answers_is_verified(monkeypatch):
    """The bounded client reads what urllib read: a Content-Length body, a chunked one, an
    error status (without waiting for its body, as urllib raised at the status)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    try:
        port = server.server_address[1]
        assert converge.http_status(f"http://127.0.0.1:{port}/v1/models") == (401, None)
        started = time.monotonic()
        assert converge.http_status(f"http://127.0.0.1:{port}/endless", 2.0) == (401, None)
        assert time.monotonic() - started < 1.0
        box_ = gateway_box(port, windows={"worker": 262144}, infeasible=["hand"])
        converge.verify_gateway(box_, 5)
    finally:
        server.shutdown()
        server.server_close()
    assert json.loads(out.getvalue().splitlines()[-1])["status"] == "done"


# -- a stray compose file beside the managed ones --------------------------------------------------
def sha(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def test_a_failed_converge_beside_a_stray_compose_copy_is_rolled_back_exactly(home):
    """A `docker-compose copy.yml` (a file manager's copy) was copied into every snapshot, whose
    rollback then refused its name: the failed converge's own rollback too, leaving the new
    .env in place. Now the snapshot keeps to plain names (a converge writes no other), the
    plan's fingerprint may name the stray (the collector observes it), and the failed converge
    is rolled back to the byte, the stray untouched. The program as it ships, through main()."""
    deploy = home / ".lobes"
    stray = "services: {copy: {image: busybox}}\n"
    (deploy / "docker-compose copy.yml").write_text(stray)
    before = entries(home)
    files = {
        ".env": sha(ENV),
        "docker-compose.yml": sha(COMPOSE),
        "docker-compose copy.yml": sha(stray),
    }
    p = payload(
        fingerprint={"files": files, "containers": None},
        # After the .env write, a restore with no stored copy fails the converge.
        restore=[{"name": "docker-compose.gpu.yml", "sha256": "0" * 64}],
    )
    code, events, _ = run_box(home, p)
    result = events[-1]
    assert code == 1 and result["ok"] is False, events
    assert result["failed"].startswith("cannot restore docker-compose.gpu.yml"), result
    assert result["rollback"]["ok"] is True and result["rollback"]["files"] == [".env"], result
    after = entries(home)
    ours = [k for k in after if k.startswith(".lobes/.fleet")]
    assert {k: v[0] for k, v in after.items() if k not in ours} == {
        k: v[0] for k, v in before.items()
    }  # nothing else made, nothing removed
    assert (deploy / ".env").read_text() == ENV
    assert stat.S_IMODE((deploy / ".env").stat().st_mode) == 0o600
    assert (deploy / "docker-compose copy.yml").read_text() == stray
    (sid,) = [p.name for p in snaps(home).iterdir()]
    meta = json.loads((snaps(home) / sid / "meta.json").read_text())
    assert sorted(meta["files"]) == [".env", "docker-compose.gpu.yml", "docker-compose.yml"]
    assert meta["status"] == "rolled-back"


# -- the snapshot looks again when the path changes under it ---------------------------------------
def swapping(monkeypatch: pytest.MonkeyPatch, swap: Any) -> None:
    """managed_state, with `swap(path, state)` run right after it looked: what an editor saving
    by rename, or another tool, does between the snapshot's look and its read."""
    real = converge.managed_state

    def racy(path: str) -> Any:
        state = real(path)
        if path.endswith("/.env"):
            swap(path, state)
        return state

    monkeypatch.setattr(converge, "managed_state", racy)


def replace(path: str, make: Any) -> None:
    tmp = path + ".new"
    make(tmp)
    os.replace(tmp, path)


EDITED = "OPERATOR=edited\n"


def test_a_link_replaced_by_a_file_while_snapshotted_is_copied_not_recorded_as_the_link(
    home, commands, monkeypatch
):
    """The snapshot saw a link, then the path became a regular file (an editor's save by
    rename): it recorded the old link text with no copy, and a rollback put the link back,
    the edited bytes lost. Now the link is looked at again after the read: changed, the
    snapshot looks again and keeps a copy of the file."""
    (home / "shared.env").write_text(ENV)
    env = home / ".lobes" / ".env"
    symlink(env, "../shared.env")

    def to_file(path: str, state: Any) -> None:
        if state and state[0] and env.is_symlink():  # once: the snapshot's first look
            replace(path, lambda tmp: Path(tmp).write_text(EDITED))

    swapping(monkeypatch, to_file)
    sid = snapshot()
    meta = json.loads((snaps(home) / sid / "meta.json").read_text())
    assert meta["files"][".env"] == {"sha256": sha(EDITED), "mode": meta["files"][".env"]["mode"]}
    assert (snaps(home) / sid / ".env").read_text() == EDITED
    env.write_text("A=what a converge wrote\n")
    assert converge.rollback(box(), sid, reason="test")["ok"] is True
    assert not env.is_symlink() and env.read_text() == EDITED
    assert (home / "shared.env").read_text() == ENV


def test_a_file_replaced_by_a_link_while_snapshotted_is_recorded_as_the_link(
    home, commands, monkeypatch
):
    """The other way round: read without following (O_NOFOLLOW), the link swapped in is not
    read as the file; the snapshot looks again and records the link."""
    (home / "shared.env").write_text(ENV)

    def to_link(path: str, state: Any) -> None:
        if state and not state[0]:
            replace(path, lambda tmp: os.symlink("../shared.env", tmp))

    swapping(monkeypatch, to_link)
    sid = snapshot()
    meta = json.loads((snaps(home) / sid / "meta.json").read_text())
    assert meta["files"][".env"]["symlink"] == "../shared.env"
    assert not (snaps(home) / sid / ".env").exists()


def test_a_path_that_keeps_changing_is_refused_not_snapshotted(home, commands, monkeypatch):
    (home / "shared.env").write_text(ENV)

    def flip(path: str, state: Any) -> None:
        if state and state[0]:
            replace(path, lambda tmp: Path(tmp).write_text(EDITED))
        else:
            replace(path, lambda tmp: os.symlink("../shared.env", tmp))

    swapping(monkeypatch, flip)
    with pytest.raises(converge.Failed, match=r"~/.lobes/.env kept changing while it was snap"):
        snapshot()
    assert list(snaps(home).iterdir()) == []


# -- the unpinned restore reads known-good through one fd ------------------------------------------
def test_an_unpinned_restore_reads_the_known_good_it_checked(home, tmp_path, monkeypatch):
    """The check was `os.path.islink(known-good)`, the reads by path after it: a known-good
    swapped for a link between them vouched for bytes from elsewhere. Now `.fleet` and
    `known-good` are opened once without following and both files read from that fd."""
    good = home / ".lobes" / ".fleet" / "known-good"
    good.mkdir(parents=True)
    kept = COMPOSE.encode()
    (good / "docker-compose.yml").write_bytes(kept)
    (good / "meta.json").write_text(json.dumps({"files": {"docker-compose.yml": sha(kept)}}))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    planted = b"services: {planted: {image: evil}}\n"
    (outside / "docker-compose.yml").write_bytes(planted)
    (outside / "meta.json").write_text(json.dumps({"files": {"docker-compose.yml": sha(planted)}}))
    real = converge.read_regular
    swapped: list[bool] = []

    def read_after_swap(*args: Any, **kwargs: Any) -> Any:
        if not swapped:  # after the check, before the first read: known-good becomes a link
            good.rename(good.with_name("known-good.real"))
            os.symlink(outside, good)
            swapped.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(converge, "read_regular", read_after_swap)
    assert converge.find_copy(box(), "docker-compose.yml", None) == kept
    assert swapped


# -- a gateway that redirects --------------------------------------------------------------------
class _Redirecting(_Gateway):  # its _send and its silence
    """Every endpoint one redirect away, as a trailing-slash redirect puts it; `other` is the
    port of another server on the loopback that must never be asked."""

    protocol_version = "HTTP/1.1"
    other: ClassVar[int] = 0  # set per server by the fixture, as `asked`
    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.asked.append(self.path)
        port = self.server.server_address[1]
        moves = {
            "/health": (307, "/health/"),
            "/capabilities": (301, f"http://127.0.0.1:{port}/capabilities/"),
            "/v1/models": (308, "models/"),  # relative to /v1/
            "/away": (302, f"http://127.0.0.1:{self.other}/health/"),
            "/secure": (307, f"https://127.0.0.1:{port}/health/"),
            "/loop": (307, "/loop"),
            "/odd": (307, "/health/ x"),  # a space: no request line can carry it
            "/slow": (307, "/slow/"),
        }
        if self.path.startswith("/slow"):
            time.sleep(0.6)
        if self.path in moves:
            status, location = moves[self.path]
            self.send_response(status)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path in ("/health/", "/slow/"):
            self._send(200, json.dumps({"status": "ok", "version": "0.92.0"}).encode())
        elif self.path == "/capabilities/":
            self._send(200, json.dumps({"worker": {"context": 262144}}).encode())
        else:
            self._send(401, b'{"error": "unauthorized"}')


@pytest.fixture
def redirecting() -> Iterator[tuple[int, list[str], list[str]]]:
    """(port, paths it was asked, paths the other server was asked)."""

    def serve(other: int) -> tuple[ThreadingHTTPServer, list[str]]:
        asked: list[str] = []
        handler = type("Handler", (_Redirecting,), {"asked": asked, "other": other})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, asked

    elsewhere, asked_elsewhere = serve(0)
    gateway, asked = serve(elsewhere.server_address[1])
    try:
        yield gateway.server_address[1], asked, asked_elsewhere
    finally:
        for server in (gateway, elsewhere):
            server.shutdown()
            server.server_close()


def test_a_gateway_behind_a_redirect_is_verified(redirecting, monkeypatch):
    """A `/health` answering 307 -> `/health/` gave (307, None) and rolled the converge back,
    while the collector (urllib) followed it and saw a healthy gateway. Followed now, to the
    same host and port: relative, absolute, 301/307/308."""
    port, asked, _ = redirecting
    url = f"http://127.0.0.1:{port}"
    assert converge.http_status(url + "/health") == (200, {"status": "ok", "version": "0.92.0"})
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    converge.verify_gateway(gateway_box(port, windows={"worker": 262144}), 5)
    assert json.loads(out.getvalue().splitlines()[-1])["status"] == "done"
    assert {"/health/", "/capabilities/", "/v1/models/"} <= set(asked)


def test_a_redirect_elsewhere_is_its_own_status(redirecting):
    """Another port, another scheme, a path no request line can carry: not followed, the
    redirect's status is the answer; and a loop ends after MAX_REDIRECTS."""
    port, asked, other = redirecting
    url = f"http://127.0.0.1:{port}"
    assert converge.http_status(url + "/away") == (302, None)
    assert converge.http_status(url + "/secure") == (307, None)
    assert converge.http_status(url + "/odd") == (307, None)
    assert other == []  # never asked
    asked.clear()
    assert converge.http_status(url + "/loop") == (307, None)
    assert asked == ["/loop"] * (converge.MAX_REDIRECTS + 1)


def test_a_redirect_gets_only_what_is_left_of_the_one_deadline(redirecting):
    """Two answers of 0.6 s each: within 3 s they are followed; within 1 s the redirect does
    not start a second second, it is no answer (each hop is not given its own timeout)."""
    port, _, _ = redirecting
    url = f"http://127.0.0.1:{port}/slow"
    assert converge.http_status(url, 3.0) == (200, {"status": "ok", "version": "0.92.0"})
    started = time.monotonic()
    assert converge.http_status(url, 1.0) == (None, None)
    assert time.monotonic() - started < 1.5
