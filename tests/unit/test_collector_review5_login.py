"""Review 5 of the collector's login-shell trace.

- A profile that replaces the shell (`exec zsh`) or ends it (`exit`) never runs the traced
  command: no mark on stdout, and the answer was `{"exports": {}}` with no error, a false
  clean for the very incident the trace is for (a shell arming a key).
- A daemon the profile starts in a session of its own (`eval "$(ssh-agent -s)"`) left the
  login shell's process group, which is all that was killed: each drift left one more on the
  box. The collector is now a child subreaper while the shell runs, and ends what it left.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import load_box_program

collector = load_box_program(
    "box_collector_review5_login", "reconciler/observe/remote/collector.py"
)
NEVER_RAN = "the login shell never ran the traced command (it exec'd another program or exited)"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def _run(**extra: Any) -> Any:
    payload = {"run_key": "k" * 32, "directory": "~/lobes", "secret_patterns": [], "timeout_s": 5}
    return collector.Run(payload | extra)


# -- a profile that never lets the traced command run ---------------------------------------------
@pytest.mark.parametrize(
    "tail",
    ["exec sh\n", "exit 0\n", "echo 'Welcome to thor'\nexit 3\n"],
    ids=["exec", "exit", "banner-then-exit"],
)
def test_a_shell_that_never_ran_the_trace_is_an_error_not_a_clean_one(
    home: Path, tail: str
) -> None:
    (home / ".bash_profile").write_text("export GATEWAY_API_KEY=sk-shell-armed-1234\n" + tail)
    result, env = collector.login_shell(_run())
    assert result == {"error": NEVER_RAN} and env == {}


def test_the_render_under_that_shell_is_said_not_taken(home: Path) -> None:
    (home / ".bash_profile").write_text("export GATEWAY_API_KEY=sk-shell-armed-1234\nexec sh\n")
    (home / "lobes").mkdir()
    (home / "lobes" / "compose.yml").write_text("services:\n  g:\n    image: busybox\n")
    payload = {
        "run_key": "k" * 32, "directory": "~/lobes", "project": "lobes",
        "compose_files": ["compose.yml"], "managed_env": {}, "box_secrets": {},
        "controller_secrets": {}, "secret_patterns": [], "gateway_port": 1, "timeout_s": 5,
        "probe_timeout_s": 0.5,
    }  # fmt: skip
    doc = collector.collect(payload, {})
    assert doc["login_shell"] == {"error": NEVER_RAN}
    assert doc["render_login"] == {"error": "not rendered: login shell: " + NEVER_RAN}


def test_a_shell_that_ran_the_trace_still_gives_its_exports(home: Path) -> None:
    (home / ".bash_profile").write_text("export WHO=me\necho banner\n")
    result, env = collector.login_shell(_run())
    assert result["exports"]["WHO"]["value"] == "me" and env["WHO"] == "me"


# -- what the profile leaves running -------------------------------------------------------------
def _with(marker: str) -> list[int]:
    """The pids of every process whose command line holds `marker`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path("/proc", name, "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(name))
    return found


@pytest.fixture
def marker() -> Iterator[str]:
    """A number no other process's command line holds (a `sleep` takes it as its seconds)."""
    mark = f"300.{random.randrange(10**9):09d}"
    yield mark
    for pid in _with(mark):  # whatever a failing run left
        with contextlib.suppress(OSError):
            os.kill(pid, 9)


def test_a_daemon_the_profile_starts_in_a_session_of_its_own_is_ended(
    home: Path, marker: str
) -> None:
    daemon = f"setsid sh -c 'sleep {marker} & wait; : {marker}' >/dev/null 2>&1 &"
    (home / ".bash_profile").write_text(f'export WHO=me\nsh -c "{daemon}"\n')
    result, _ = collector.login_shell(_run())
    assert result["exports"]["WHO"]["value"] == "me"
    assert _with(marker) == []


def test_the_collectors_own_children_are_left_running(home: Path, marker: str) -> None:
    (home / ".bash_profile").write_text("export WHO=me\nsleep 0.3\n")
    # One started before the trace (by whatever embeds this program), one by another of the
    # collector's threads while the profile runs: neither is the profile's.
    before = subprocess.Popen(["sleep", marker])
    spawned: list[Any] = []

    def meanwhile() -> None:
        time.sleep(0.1)  # once the trace runs: not a child the collector had before it
        spawned.append(collector.spawned(["sh", "-c", "sleep 0.6; echo done"], None, "/", 5))

    thread = threading.Thread(target=meanwhile)
    try:
        thread.start()
        result, _ = collector.login_shell(_run())
        thread.join()
        assert result["exports"]["WHO"]["value"] == "me"
        assert before.poll() is None
        assert spawned == [(0, "done\n", "")]
    finally:
        before.kill()
        before.wait()


# -- root's trace says where each export comes from ------------------------------------------------
# bash (>= 4.4) takes no PS4 from its environment when it runs as root: the trace said no file:line
# for any export. (Run as another user, bash's own login gave them all along.)
@pytest.mark.parametrize(
    ("files", "source"),
    [
        ({".bash_profile": "# armed by hand\nexport WHO=me\n"}, "~/.bash_profile:2"),
        ({".bash_login": "export WHO=me\n", ".profile": "export WHO=no\n"}, "~/.bash_login:1"),
        ({".profile": "\nexport WHO=me\n"}, "~/.profile:2"),
    ],
    ids=["bash_profile", "bash_login-before-profile", "profile"],
)
def test_each_export_says_the_file_and_line_that_set_it(
    home: Path, files: dict[str, str], source: str
) -> None:
    for name, text in files.items():
        (home / name).write_text(text)
    result, _ = collector.login_shell(_run())
    assert result["exports"]["WHO"] == {"value": "me", "source": source}


def test_a_profile_that_asks_whether_it_is_a_login_shell_is_answered_yes(home: Path) -> None:
    """Root's login is emulated (PS4 above): `shopt -q login_shell` in a profile must still
    hold there, as in `bash -l`, or the exports it guards were lost."""
    (home / ".bash_profile").write_text(
        "shopt -q login_shell && export MODEL_DIR=/models\nexport A=1\n"
    )
    result, _ = collector.login_shell(_run())
    assert result["exports"]["MODEL_DIR"] == {"value": "/models", "source": "~/.bash_profile:1"}
    assert result["exports"]["A"]["value"] == "1"
