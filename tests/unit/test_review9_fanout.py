"""Review 9, the fan-out and unreachable boxes: what a reviewer's hostile loopback boxes found,
one test (or two) each.

1. Ctrl-C during a live drift or audit ended in a traceback (`ValueError: flush of closed
   file`, exit 1) and left ssh clients running: Running.cancel() called communicate() on the
   stdin spawn() had closed, EarlyStart.cancel stopped at the first handle's error, and the
   audit cancelled nothing.
2. The gateway probes took three sockets and threads for every box of the fleet at once,
   whatever --max-parallel: under a small open-file limit the boxes' ssh clients failed with
   EMFILE (and a finished box kept its two pipes open to the end of the run); what the
   controller could not make was said as the gateway's.
3. A gateway the box saw running that the controller could not reach was dropped silently.
4. The @openssh connector let a hanging box's TimeoutError end every host's run.
5. ssh exiting 255 without a word said only "ssh failed".

The fresh-interpreter tests run `python -m reconciler` against loopback servers made here (a
port that accepts and never speaks is a box that hangs), on a copy of the production
inventory whose boxes point at them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from reconciler.observe import early, openssh_connector, probes
from reconciler.observe.bounded_process import run_bounded
from reconciler.observe.transport import Running
from tests.unit.counting_gateway import CountingGateway

REPO = Path(__file__).resolve().parents[2]
INCIDENTS = REPO / "examples" / "lab-incidents"


# -- loopback boxes --------------------------------------------------------------------------------
class Silent:
    """Listening sockets that accept and never say a word (a hung sshd, or a gateway that
    never answers), on one port of each address; counts the connections open at once.

    Open means not yet closed by the client, as the kernel knows it at each accept: every
    connection held is asked then (poll, POLLRDHUP), so the count never waits for the
    thread that holds it to notice its end (on a loaded machine that thread lagged, and
    a box's closed probes were counted beside the next box's: 25 against 24)."""

    def __init__(self, addresses: list[str], port: int = 0) -> None:
        self.lock = threading.Lock()
        self.held: set[socket.socket] = set()
        self.peak = 0
        self.listeners = []
        for address in addresses:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(256)
            port = sock.getsockname()[1]  # the same port on every address
            self.listeners.append(sock)
            threading.Thread(target=self._accept, args=(sock,), daemon=True).start()
        self.port = port

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with self.lock:
                self.held.add(conn)
                self.held = {c for c in self.held if not _closed_by_peer(c)}
                self.peak = max(self.peak, len(self.held))
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        try:
            while conn.recv(4096):  # until the client closes it
                pass
        except OSError:
            pass
        finally:
            with self.lock:
                self.held.discard(conn)
                conn.close()

    def close(self) -> None:
        for sock in self.listeners:
            sock.close()


def _closed_by_peer(conn: socket.socket) -> bool:
    """Whether the client has closed its end (its FIN is in, whatever data is still unread)."""
    try:
        poller = select.poll()
        poller.register(conn, select.POLLRDHUP)
        return bool(poller.poll(0))  # POLLRDHUP, or POLLHUP/POLLERR, which poll always reports
    except (OSError, ValueError):  # closed here already
        return True


@pytest.fixture
def silent() -> Iterator[type[Silent]]:
    made: list[Silent] = []

    class Made(Silent):
        def __init__(self, addresses: list[str], port: int = 0) -> None:
            super().__init__(addresses, port)
            made.append(self)

    yield Made
    for server in made:
        server.close()


def free_port() -> int:
    """A port nothing listens on (a box whose sshd is down: refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fleet(root: Path, ssh_ports: list[int], extra: int = 0, gateway_port: int = 0) -> Path:
    """The production desired state, its three boxes at 127.0.0.2-4 on `ssh_ports`, and
    `extra` more boxes (thor's desired state) at 127.0.1.2... whose gateways are on
    `gateway_port`, all on ssh_ports[0]. Selected as `-i x`."""
    shutil.copytree(REPO / "group_vars", root / "group_vars")
    (root / "inventory").mkdir()
    text = (REPO / "inventory" / "hosts.yaml").read_text(encoding="utf-8")
    addresses = iter(["127.0.0.2", "127.0.0.3", "127.0.0.4"])
    text = re.sub(r"ssh_hostname: \S+", lambda _: f"ssh_hostname: {next(addresses)}", text)
    ports = iter(ssh_ports)
    text = re.sub(r"ssh_port: 22\b", lambda _: f"ssh_port: {next(ports)}", text)
    thor = (root / "group_vars" / "thor.yaml").read_text(encoding="utf-8")
    for i in range(extra):
        text += (
            f"  g{i:02d}:\n    groups: [gpu, jetson]\n    ssh_hostname: 127.0.1.{i + 2}\n"
            f"    ssh_user: lobes\n    ssh_port: {ssh_ports[0]}\n"
        )
        layer = thor + f"\ngateway:\n  port: {gateway_port}\n"
        (root / "group_vars" / f"g{i:02d}.yaml").write_text(layer, encoding="utf-8")
    (root / "inventory" / "x.yaml").write_text(text, encoding="utf-8")
    return root


def env_for(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("FLEET_INVENTORY", "FLEET_ROOT", "FLEET_MAX_PARALLEL", "FLEET_BOX_TIMEOUT"):
        env.pop(name, None)
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    return env


def alive(pid: int) -> bool:
    """A process that still runs (a zombie waiting for its reaper does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def ssh_children(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=,comm=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    ).stdout
    return [int(line.split()[0]) for line in out.splitlines() if line.split()[1:] == ["ssh"]]


# -- 1. Ctrl-C -------------------------------------------------------------------------------------
def _sleeping(stdin_closed: bool = True) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["sleep", "60"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    if stdin_closed and proc.stdin is not None:
        proc.stdin.close()  # as spawn() leaves it once the payload is written
    return proc


def test_cancelling_a_command_whose_stdin_was_sent_kills_and_reaps_it() -> None:
    proc = _sleeping()
    try:
        Running("thor", proc).cancel()  # before: ValueError: flush of closed file
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL


class _Stubborn(Running):
    def cancel(self) -> None:
        raise RuntimeError("cannot be stopped")


def test_one_box_that_cannot_be_stopped_leaves_no_other_box_running() -> None:
    procs = [_sleeping(), _sleeping()]
    handles = {
        "thor": Running("thor", procs[0]),
        "spark": _Stubborn("spark", None),
        "orin": Running("orin", procs[1]),
    }
    started = early.EarlyStart(None, handles, "k", None)  # type: ignore[arg-type]
    try:
        started.cancel()  # before: raised spark's error, and orin's ssh ran on
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [p.returncode for p in procs] == [-signal.SIGKILL, -signal.SIGKILL]


@pytest.mark.parametrize("command", ["drift", "audit"])
def test_ctrl_c_during_a_live_run_exits_130_and_leaves_no_ssh_running(
    command: str, tmp_path: Path, silent: type[Silent]
) -> None:
    """Three boxes whose sshd accepts and never speaks: SIGINT to the reconcile process alone
    (as `kill -INT`, or a service manager's stop), its ssh clients running."""
    hung = [silent(["127.0.0.2"]), silent(["127.0.0.3"]), silent(["127.0.0.4"])]
    root = fleet(tmp_path / "fleet", [s.port for s in hung])
    argv = [sys.executable, "-m", "reconciler", "--root", str(root), "-i", "x", command]
    proc = subprocess.Popen(
        [*argv, "--timeout", "60", "--no-history"],
        cwd=tmp_path,
        env=env_for(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group: the signal reaches it alone, not its ssh
    )
    try:
        deadline = time.monotonic() + 30
        kids: list[int] = []
        while len(kids) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            kids = ssh_children(proc.pid)
        assert len(kids) == 3, proc.communicate(timeout=5)
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    time.sleep(0.2)
    left = [pid for pid in kids if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert (proc.returncode, left) == (130, []), err.decode()
    assert b"Traceback" not in err, err.decode()


# -- 2. the probes within the open-file limit ------------------------------------------------------
def test_silent_gateways_under_a_small_open_file_limit_leave_every_box_its_ssh(
    tmp_path: Path, silent: type[Silent]
) -> None:
    """40 boxes whose gateways accept and never answer, and whose sshd is down, under a soft
    limit of 128 open files: the default limit is 8 boxes at once ((128 - 64) // 8). Before,
    the probes opened 3 sockets for every box at once (120), and 23 boxes' ssh could not be
    started: `cannot run ssh: OSError: too many open files (EMFILE)`."""
    gateways = silent([f"127.0.1.{i + 2}" for i in range(40)])
    root = fleet(tmp_path / "fleet", [free_port()] * 3, extra=40, gateway_port=gateways.port)
    argv = [sys.executable, "-m", "reconciler", "--root", str(root), "-i", "x", "drift"]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ran = subprocess.run(
        [*argv, "--format", "json", "--timeout", "0.5", "--no-history"],
        cwd=tmp_path,
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard)),
    )
    assert ran.returncode == 1, ran.stderr
    assert "too many open files" not in ran.stdout + ran.stderr
    boxes = json.loads(ran.stdout)["boxes"]
    assert len(boxes) == 43
    for box in boxes:  # each one's only error: its sshd refusing
        assert len(box["errors"]) == 1 and "Connection refused" in box["errors"][0], box
    assert 0 < gateways.peak <= 8 * 3


def test_a_finished_box_keeps_no_pipe_open() -> None:
    """A box's handle lives until the whole run is gathered: its pipes were closed only then,
    two descriptors per box of the fleet, whatever --max-parallel said."""
    proc = subprocess.Popen(
        ["sh", "-c", "echo answer; echo said >&2"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    result = Running("thor", proc).finish(10)
    assert (result.stdout, result.stderr) == ("answer\n", "said\n")
    assert proc.stdout is not None and proc.stderr is not None
    assert (proc.stdout.closed, proc.stderr.closed) == (True, True)


class _Slow(CountingGateway):
    """A gateway that answers every GET after 0.2 s; counts the requests in flight."""

    delay = 0.2


def test_boxes_in_line_for_their_probes_get_their_answers_past_the_runs_first_deadline() -> None:
    """One box at a time: six boxes' probes take six turns of 0.2 s. gather asks with what it
    gives probes that all began with the run (0.1 s left here): the boxes that waited for
    their turn are waited for, each within its own budget, and none is said unanswered."""
    _Slow.reset()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        bases = {f"b{i}": f"{url}/b{i}" for i in range(6)}  # each box's requests told apart
        run = probes.ProbeRun(probes.probe_gateways, bases, 5.0, 1)
        found = run.result(0.1)
    finally:
        server.shutdown()
        server.server_close()
    assert list(found) == list(bases)
    assert {found[b][p]["status"] for b in bases for p in ("health", "models_noauth")} == {200}
    assert _Slow.peak <= 3  # one box's three GETs at a time
    # Turns, in the boxes' order: each box's requests all came in after the one before had
    # its answers (counted, not timed: a loaded machine changes the time, not the turns).
    turns = [path.split("/")[1] for _, path in _Slow.events]
    assert turns == [box for box in bases for _ in range(6)]


def test_a_probe_the_controller_cannot_make_is_said_as_the_controllers() -> None:
    """Out of open files (EMFILE), the probe's failure is the controller's: its entry says so,
    and stderr says it once; before, it read `OSError: too many open files (EMFILE)`, as if
    the gateway had failed."""
    script = textwrap.dedent(
        """
        import json, os, resource, socket, sys
        from urllib.parse import urlsplit
        from reconciler.observe import probes
        from reconciler.box_shared import http11  # the probes' reader, before the files run out
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        url = "http://127.0.0.1:%d" % server.getsockname()[1]
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        held = []
        try:
            while True:
                held.append(os.dup(0))
        except OSError:
            pass
        print(json.dumps(probes.probe_gateways({"thor": url}, 2.0)), flush=True)
        run = probes.ProbeRun(probes.probe_gateways, {"thor": url}, 2.0, 4)
        print(json.dumps(run.result(5.0)), flush=True)
        """
    )
    ran = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    first = ran.stdout.splitlines()[0] if ran.stdout else ""
    said = "the controller could not make the probe: too many open files (EMFILE)"
    assert json.loads(first)["thor"]["health"] == {"status": None, "error": said}, ran.stderr
    assert json.loads(ran.stdout.splitlines()[1])["thor"]["models_noauth"]["error"] == said
    assert ran.stderr.count("could not make 3 of its gateway probes: too many open files") == 1


# -- 3. a gateway the controller could not reach ---------------------------------------------------
# What the controller got from thor's gateway when its port was refused to it (captured by the
# reviewer: snapE/thor.json, `controller`), while thor's own loopback probes answered.
REFUSED = {"status": None, "error": "connect to 10.77.0.11:8000: Connection refused"}


def _replayed(snapshot: Path, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    argv = [sys.executable, "-m", "reconciler", "--root", str(INCIDENTS), "-i", "lab", "drift"]
    ran = subprocess.run(
        [*argv, "--from-snapshot", str(snapshot), "--format", "json"],
        cwd=REPO,
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return ran.returncode, {b["box"]: b for b in json.loads(ran.stdout)["boxes"]}


def _edit(snapshot: Path, box: str, edit: Any) -> None:
    """Change a box's file of the snapshot, and its digest in the index with it (the file is
    then read as saved, not as altered since)."""
    path = snapshot / f"{box}.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    edit(raw)
    path.write_text(json.dumps(raw), encoding="utf-8")
    index = json.loads((snapshot / "index.json").read_text(encoding="utf-8"))
    if isinstance(index.get("sha256"), dict):
        index["sha256"][box] = hashlib.sha256(path.read_bytes()).hexdigest()
    (snapshot / "index.json").write_text(json.dumps(index), encoding="utf-8")


def test_a_running_gateway_the_controller_could_not_reach_is_an_error_of_its_box(
    tmp_path: Path,
) -> None:
    """The lab incidents' snapshot: thor's controller answers refused (its gateway running,
    its loopback answering) lost the `GET /v1/models without key (controller)` entry in
    silence, exit 2. orin's gateway published on 127.0.0.1 only (captured so: the controller
    was refused) already has its port entry, and spark's gateway stopped its state entry:
    neither gets a second error."""
    snapshot = tmp_path / "snapshot"
    shutil.copytree(INCIDENTS / "snapshot", snapshot)

    def refused(raw: dict[str, Any]) -> None:
        for probe in ("health", "capabilities", "models_noauth"):
            raw["controller"][probe] = dict(REFUSED)

    def stopped(raw: dict[str, Any]) -> None:
        refused(raw)
        raw["controller"]["base"] = "http://10.77.0.12:8000"
        for container in raw["collected"]["docker"]["containers"]:
            if container["name"] == "model-gear-gateway":
                container["status"] = "exited"
        loopback = {"status": None, "error": "connect to 127.0.0.1:8000: Connection refused"}
        for probe in ("health", "capabilities", "models_noauth"):
            raw["collected"]["gateway"][probe] = dict(loopback)

    _edit(snapshot, "thor", refused)
    _edit(snapshot, "spark", stopped)
    code, boxes = _replayed(snapshot, tmp_path)
    assert code == 1
    assert boxes["thor"]["errors"] == [
        f"gateway {probe} (from the controller): {REFUSED['error']}"
        for probe in ("health", "capabilities", "models_noauth")
    ]
    assert not any("(from the controller)" in e for e in boxes["orin"]["errors"])
    assert any(d["kind"] == "port" and d["subject"] == "gateway" for d in boxes["orin"]["drifts"])
    assert not any("(from the controller)" in e for e in boxes["spark"]["errors"])
    assert any(d["kind"] == "state" and d["subject"] == "gateway" for d in boxes["spark"]["drifts"])


# -- 4. the @openssh connector and a box that hangs ------------------------------------------------
def _connector(port: int) -> Any:
    connector = openssh_connector.OpenSSHConnector.__new__(openssh_connector.OpenSSHConnector)
    connector.host = SimpleNamespace(  # type: ignore[assignment]
        name="thor",
        data={"ssh_hostname": "127.0.0.1", "ssh_port": port, "ssh_user": "lobes"},
    )
    return connector


def test_a_box_that_hangs_is_that_hosts_connect_error(
    monkeypatch: pytest.MonkeyPatch, silent: type[Silent]
) -> None:
    """Before: run_bounded's TimeoutError escaped connect(): pyinfra's `An internal exception
    occurred`, every host's run ended. The connector's 20 s made 1 s here."""
    from pyinfra.api.exceptions import ConnectError

    hung = silent(["127.0.0.1"])
    monkeypatch.setattr(openssh_connector, "CONNECT_S", 1.0, raising=False)

    def bounded(argv: list[str], timeout: float | None = None, **kwargs: Any) -> Any:
        return run_bounded(argv, timeout=min(timeout or 1.0, 1.0), **kwargs)

    monkeypatch.setattr(openssh_connector, "run_bounded", bounded)
    with pytest.raises(ConnectError, match=r"^no answer within 1 s$"):
        _connector(hung.port).connect()


def test_an_ssh_that_cannot_be_started_is_that_hosts_connect_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyinfra.api.exceptions import ConnectError

    monkeypatch.setenv("PATH", str(tmp_path))  # no ssh to be found
    with pytest.raises(ConnectError, match=r"^cannot run ssh: FileNotFoundError: "):
        _connector(free_port()).connect()


# -- 5. ssh exiting 255 without a word -------------------------------------------------------------
def test_ssh_exiting_255_without_a_word_says_what_that_means() -> None:
    """OpenSSH logs a timeout after the banner, "Bad packet length" or a reset at INFO, which
    LogLevel=ERROR keeps to itself: exit 255, nothing on stderr."""
    proc = subprocess.Popen(
        ["sh", "-c", "exit 255"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    result = Running("thor", proc).finish(10)
    assert result.error == (
        "unreachable: ssh gave up without a reason: the connection timed out or broke "
        "(sshd silent, or the network cut)"
    )


def test_an_interrupted_observe_cancels_every_box(monkeypatch: pytest.MonkeyPatch) -> None:
    """observe() (an apply's drift) interrupted while the boxes work cancels them all, as the
    drift command's own early start does: no ssh is left running."""
    from types import SimpleNamespace

    from reconciler.observe import observe as observe_module

    cancelled: list[bool] = []
    early = SimpleNamespace(
        run_key="k", running={"thor": None}, probes=None, cancel=lambda: cancelled.append(True)
    )

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(observe_module, "gather", interrupted)
    with pytest.raises(KeyboardInterrupt):
        observe_module.observe(None, ["thor"], "k", 1.0, early)  # type: ignore[arg-type]
    assert cancelled == [True]
