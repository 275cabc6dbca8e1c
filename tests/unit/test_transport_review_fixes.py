"""Review of the SSH transport and its fan-out: what was found, one test each.

1. A runtime directory whose sockets ssh cannot bind (too long for sun_path with the master's
   temporary suffix, or a path ssh's config parser would read) shares no connection, said
   once, instead of making every box unreachable.
2. stderr keeps its LAST bytes: what a failure reports is its last line.
3. Cancelling an early start (EarlyStart.cancel) starts no box that was still waiting in line.
4. A payload that cannot be sent (secrets too large for stdin) raises before any ssh starts.
5. run_bounded writes stdin beside its readers and within its timeout.
6. A pinned known_hosts file is the only source of trusted host keys.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from reconciler.observe import collectors, early, fanout, openssh_connector, transport
from reconciler.observe.bounded_process import run_bounded
from reconciler.observe.transport import (
    STDERR_LIMIT_BYTES,
    RemoteResult,
    Running,
    Target,
    control_dir,
    private_dir,
    ssh_argv,
)

ROOT = Path(__file__).resolve().parents[2]
SUN_PATH_BYTES = transport.SUN_PATH_BYTES  # 108 on Linux, 104 on macOS and the BSDs
TARGET = Target("thor", "10.0.0.11", "lobes", 22, None, None)


def _sharing(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith(("ControlMaster=", "ControlPath=", "ControlPersist="))]


# -- 1. a control directory ssh cannot keep sockets in -------------------------------------------
@pytest.fixture
def short_base(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A runtime base short enough to be padded to an exact length (pytest's tmp_path is
    already too long for ssh's sockets), and no remembered verdict."""
    base = Path(tempfile.mkdtemp(prefix="fr", dir="/tmp"))
    for name in ("XDG_RUNTIME_DIR", "TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    private_dir.cache_clear()
    yield base
    private_dir.cache_clear()
    subprocess.run(["rm", "-rf", "--", str(base)], check=False)


def _runtime_with_sockets_of(base: Path, length: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A runtime directory whose fleet-reconciler-ssh-UID is `length` bytes long."""
    suffix = f"/fleet-reconciler-ssh-{os.getuid()}"
    pad = length - len(str(base)) - len("/") - len(suffix)
    assert pad > 0
    runtime = base / ("r" * pad)
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    sockets = runtime / suffix[1:]
    assert len(str(sockets)) == length
    return sockets


# The longest directory whose DIR/NAME.XXXXXXXXXXXXXXXX (ssh's temporary name for a new master's
# socket: 1 + 40 + 17 bytes more) fits sun_path, NUL included.
LONGEST = SUN_PATH_BYTES - 1 - (1 + 40 + 1 + 16)


def test_a_directory_short_enough_for_ssh_sockets_is_used(
    short_base: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sockets = _runtime_with_sockets_of(short_base, LONGEST, monkeypatch)
    assert control_dir() == sockets
    path = transport.control_path(TARGET)
    assert path is not None and path.parent == sockets
    assert _sharing(ssh_argv(TARGET, "true")) == [
        "ControlMaster=auto",
        f'ControlPath="{path}"',  # the master's name covers its trust (test_review3_transport)
        "ControlPersist=120",
    ]
    assert len(str(path)) + len(".") + 16 == SUN_PATH_BYTES - 1
    assert capsys.readouterr().err == ""


def test_a_directory_too_long_for_ssh_sockets_shares_nothing_said_once(
    short_base: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sockets = _runtime_with_sockets_of(short_base, LONGEST + 1, monkeypatch)
    assert control_dir() is None
    argv = ssh_argv(TARGET, "true")
    ssh_argv(TARGET, "true")
    assert _sharing(argv) == ["ControlMaster=no", "ControlPath=none"]
    assert transport.control_path(TARGET) is None
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"reconcile: not sharing SSH connections: {sockets} is too long: ssh's sockets in it "
        f"would need {SUN_PATH_BYTES} bytes, a socket path holds at most {SUN_PATH_BYTES - 1}"
    ]


def test_a_directory_ssh_would_parse_shares_nothing_and_every_box_still_connects(
    short_base: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime = short_base / 'q"d'
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    argv = ssh_argv(TARGET, "true")  # no UnsafeTarget: the box is not refused for our directory
    assert _sharing(argv) == ["ControlMaster=no", "ControlPath=none"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "would read as syntax" in err[0]


# -- 2. stderr: its last line is what is reported ------------------------------------------------
NOISE_THEN_ERROR = textwrap.dedent(
    """\
    import sys
    for i in range(4000):
        sys.stderr.write(f"+ export PATH=/usr/bin # login shell trace {i:06d}\\n")
    sys.stderr.write("LAST: the real error\\n")
    sys.exit(int(sys.argv[1]))
    """
)


def _local(code: int) -> Running:
    proc = subprocess.Popen(
        [sys.executable, "-S", "-c", NOISE_THEN_ERROR, str(code)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    return Running("thor", proc)


def test_an_unreachable_box_reports_sshs_last_line_past_64_kib_of_noise() -> None:
    result = _local(255).finish(30.0)
    assert result.error == "unreachable: LAST: the real error"
    assert len(result.stderr.encode()) <= STDERR_LIMIT_BYTES


def test_a_failed_collector_reports_its_last_line_past_64_kib_of_noise() -> None:
    from reconciler.observe.observe import _answer

    _, fault = _answer(_local(1), 30.0)
    assert str(fault).endswith("LAST: the real error")


def test_the_pyinfra_connector_keeps_the_last_stderr_lines_within_the_bound() -> None:
    code, output = run_bounded([sys.executable, "-S", "-c", NOISE_THEN_ERROR, "255"])
    assert code == 255
    assert output.stderr_lines[-1] == "LAST: the real error"
    assert sum(len(line) + 1 for line in output.stderr_lines) <= STDERR_LIMIT_BYTES


def test_the_pyinfra_connector_keeps_stdout_and_stderr_in_their_order() -> None:
    code, output = run_bounded(
        [sys.executable, "-S", "-u", "-c",
         "import sys,time\nfor i in range(3):\n print(i); time.sleep(0.05)\n"
         " print('e', i, file=sys.stderr); time.sleep(0.05)"]
    )  # fmt: skip
    assert code == 0
    assert [(line.buffer_name, line.line) for line in output] == [
        (name, text) for i in range(3) for name, text in (("stdout", str(i)), ("stderr", f"e {i}"))
    ]


# -- 3. cancelling an early start starts no box waiting in line ----------------------------------
class _Fake(Running):
    def __init__(self, box: str) -> None:
        super().__init__(box, None)
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def finish(self, timeout: float, limit: int = 0) -> RemoteResult:
        return RemoteResult(self.box, 0, "{}", "", None)


def _queued(n: int, size: int) -> tuple[dict[str, Running], list[str]]:
    started: list[str] = []
    slots = fanout.Slots(size)
    handles: dict[str, Running] = {}

    def starter(box: str) -> Any:
        def start() -> Running:
            started.append(box)
            return _Fake(box)

        return start

    for i in range(n):
        queued = fanout.Queued(f"b{i}", starter(f"b{i}"), slots)
        handles[queued.box] = queued
        slots.take(queued)
    return handles, started


def test_cancelling_an_early_start_starts_no_box_that_was_waiting() -> None:
    handles, started = _queued(6, size=2)
    assert started == ["b0", "b1"]
    early.EarlyStart(None, handles, "key", None).cancel()  # type: ignore[arg-type]
    assert started == ["b0", "b1"]
    for box in ("b2", "b3", "b4", "b5"):
        begun = time.monotonic()
        result = handles[box].finish(10.0)  # at once: its turn will never come
        assert time.monotonic() - begun < 1.0
        assert result.error == "not started: the run was cancelled"


def test_without_a_cancel_every_waiting_box_starts_as_slots_free() -> None:
    handles, started = _queued(6, size=2)
    results = [handle.finish(10.0) for handle in handles.values()]
    assert started == [f"b{i}" for i in range(6)]
    assert all(result.error is None for result in results)


def test_a_box_cancelled_while_it_was_starting_is_stopped() -> None:
    slots = fanout.Slots(1)
    made: list[_Fake] = []

    def start() -> Running:  # the cancel arrives between the slot and the ssh client
        handle.cancel()
        made.append(_Fake("b0"))
        return made[0]

    handle = fanout.Queued("b0", start, slots)
    slots.take(handle)
    assert made[0].cancelled


# -- 4. every box's work is made before the first ssh starts -------------------------------------
@pytest.mark.parametrize("max_parallel", [8, 1])  # all at once; in line
def test_secrets_too_large_for_one_box_raise_before_any_box_is_contacted(
    monkeypatch: pytest.MonkeyPatch, max_parallel: int
) -> None:
    spawned: list[str] = []
    monkeypatch.setattr(collectors, "collector_command", lambda payload: "true")
    monkeypatch.setattr(collectors, "spawn", lambda target, *a: spawned.append(target.box))
    targets = {box: Target(box, "127.0.0.1", "root", 22, None, None) for box in ("a", "b", "c")}
    payloads = {box: {"controller_secrets": {"k": box.upper()}} for box in targets}
    # The longest value a .env line holds (longer is refused earlier): too large with its name.
    env = {"A": "small", "B": "small", "C": "x" * 65536}
    with pytest.raises(ValueError, match="more than"):
        collectors.start_collectors(targets, payloads, env, max_parallel=max_parallel)
    assert spawned == []


# -- 5. stdin is written beside the readers, within the timeout ----------------------------------
def _in_own_process(code: str, limit: float) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter (and its own process group: a hang is killed whole)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"still running after {limit} s")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


FILLS_STDOUT_FIRST = "from reconciler.observe.bounded_process import run_bounded\n"


def test_a_command_that_writes_before_it_reads_stdin_gets_all_of_it() -> None:
    code = FILLS_STDOUT_FIRST + (
        "code, out = run_bounded(['sh', '-c', 'head -c 999999 /dev/zero; echo; wc -c'],"
        " stdin='x' * 2999999, timeout=20)\n"
        "print(code, len(out.stdout_lines[0]), out.stdout_lines[-1].strip())"
    )
    done = _in_own_process(code, 30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "999999", "3000000"]  # stdin ends with its newline


def test_a_command_that_never_reads_stdin_ends_at_its_timeout() -> None:
    code = FILLS_STDOUT_FIRST + (
        "import time\nbegun = time.monotonic()\n"
        "try:\n"
        "    run_bounded(['sh', '-c', 'head -c 1000000 /dev/zero; exec sleep 30'],"
        " stdin='x' * 3000000, timeout=1)\n"
        "except TimeoutError:\n"
        "    print('timeout', time.monotonic() - begun)\n"
    )
    done = _in_own_process(code, 15)
    assert done.returncode == 0, done.stderr
    said, took = done.stdout.split()
    assert said == "timeout" and 1.0 <= float(took) < 5.0


# -- 6. a pinned known_hosts file alone decides ---------------------------------------------------
def resolved_by_openssh(tmp_path: Path, config: Path) -> dict[str, str]:
    """What this OpenSSH makes of ssh_argv's options (`ssh -G`) under `config` as the user's
    ssh config: each option as ssh will use it."""
    target = Target("thor", "10.0.0.11", "lobes", 22, None, str(tmp_path / "known_hosts"))
    argv = ssh_argv(target, "true")
    out = subprocess.run(
        ["ssh", "-G", "-F", str(config), *argv[1:]],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def test_a_pinned_known_hosts_file_is_the_only_source_of_host_keys(tmp_path: Path) -> None:
    """What this OpenSSH makes of the argv (`ssh -G`), with a user config that names other
    known_hosts files and a KnownHostsCommand: only the pinned file is left."""
    config = tmp_path / "config"
    config.write_text(
        "Host *\n  GlobalKnownHostsFile /etc/elsewhere\n  KnownHostsCommand /bin/echo %H\n"
    )
    resolved = resolved_by_openssh(tmp_path, config)
    assert resolved["userknownhostsfile"] == str(tmp_path / "known_hosts")
    assert resolved["globalknownhostsfile"] == "/dev/null"
    assert "knownhostscommand" not in resolved  # `none`: no command at all
    assert resolved["stricthostkeychecking"] == "true"


def test_the_pyinfra_connector_pins_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[list[str]] = []

    def run(argv: list[str], **kw: Any) -> tuple[int, None]:
        ran.append(argv)
        return 0, None

    monkeypatch.setattr(openssh_connector, "run_bounded", run)
    connector = openssh_connector.OpenSSHConnector.__new__(openssh_connector.OpenSSHConnector)
    connector.host = SimpleNamespace(  # type: ignore[assignment]
        name="thor", data={"ssh_user": "lobes", "ssh_known_hosts_file": "/keys/known_hosts"}
    )
    connector.connect()
    assert "GlobalKnownHostsFile=/dev/null" in ran[0]
    assert "KnownHostsCommand=none" in ran[0]


def test_no_forwarding_a_user_config_asks_for_reaches_a_box(tmp_path: Path) -> None:
    """What this OpenSSH makes of the argv (`ssh -G`) under a user config that forwards the
    agent, X11 and ports, forces a TTY, runs a local command and sets a remote command: none
    of it is left (a box could otherwise use the operator's agent to log in elsewhere)."""
    config = tmp_path / "config"
    config.write_text(
        "Host *\n  ForwardAgent yes\n  ForwardX11 yes\n  RemoteForward 9999 127.0.0.1:22\n"
        "  LocalForward 8888 127.0.0.1:22\n  DynamicForward 7777\n  RequestTTY force\n"
        "  PermitLocalCommand yes\n  LocalCommand touch /tmp/x\n  RemoteCommand id\n"
        "  Tunnel yes\n"
    )
    resolved = resolved_by_openssh(tmp_path, config)
    assert resolved["forwardagent"] == "no"
    assert resolved["forwardx11"] == "no"
    assert resolved["clearallforwardings"] == "yes"
    assert not {"remoteforward", "localforward", "dynamicforward"} & set(resolved)
    assert resolved["requesttty"] == "false"
    assert resolved["permitlocalcommand"] == "no"
    assert resolved["tunnel"] == "false"
    assert "remotecommand" not in resolved
