"""What a child of the collector prints is bounded, and only the environment is read from the
login shell's output.

The login shell (`bash -l -i -x`) runs the deploy user's profiles: one that printed a gigabyte
was held whole (stdout and the `-x` trace alike), and a banner it printed before `env -0`'s
output was read as part of the first variable, or as variables of its own. Here real bash runs
real profiles in a home of the test's own.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import load_box_program

collector = load_box_program("box_collector_children", "reconciler/observe/remote/collector.py")

BIG = 40 * 1024 * 1024  # over the collector's 32 MiB of stdout


def login(home: Path, profile: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """login_shell's answer for a deploy user whose ~/.bash_profile is `profile`."""
    (home / ".bash_profile").write_text(profile, encoding="utf-8")
    monkeypatch.setenv("HOME", str(home))
    run = collector.Run({"run_key": "k" * 32, "directory": str(home), "timeout_s": 20})
    return collector.login_shell(run)


def test_a_profile_printing_past_the_limit_fails_the_login_part_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shell, env = login(tmp_path, f"head -c {BIG} /dev/zero | tr '\\0' x\n", monkeypatch)
    assert shell == {"error": "bash printed over 33554432 bytes on stdout (stopped)"}
    assert env == {}


def test_a_child_past_its_limit_is_stopped_and_its_part_says_so(tmp_path: Path) -> None:
    run = collector.Run({"run_key": "k" * 32, "directory": str(tmp_path), "timeout_s": 20})
    code, out, err = run.run(["sh", "-c", f"head -c {BIG} /dev/zero; sleep 30"])
    assert (code, out, err) == (-9, "", "sh printed over 33554432 bytes on stdout (stopped)")


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_each_stream_has_its_limit(tmp_path: Path, stream: str) -> None:
    script = "head -c 5000 /dev/zero" + (" >&2" if stream == "stderr" else "")
    with pytest.raises(collector.OverLimit, match=f"sh printed over 4096 bytes on {stream}"):
        collector.spawned(["sh", "-c", script], None, str(tmp_path), 5, None, (4096, 4096))
    # Within its limits the same child is read whole.
    code, out, err = collector.spawned(
        ["sh", "-c", script], None, str(tmp_path), 5, None, (5000, 5000)
    )
    assert code == 0 and len(out if stream == "stdout" else err) == 5000


def test_subprocess_runs_a_child_within_the_same_limits(tmp_path: Path) -> None:
    # Where the collector cannot come back to its own directory, subprocess starts the child.
    argv = ["sh", "-c", 'cat; printf "a\\r\\nb\\n"; printf "err\\n" >&2; exit 3']
    got = collector._subprocess_run(argv, None, str(tmp_path), 5, "in\n", (1000, 1000))
    proc = subprocess.run(argv, input="in\n", capture_output=True, text=True, cwd=tmp_path)
    assert got == (proc.returncode, proc.stdout, proc.stderr)
    with pytest.raises(collector.OverLimit, match="over 1000 bytes on stdout"):
        collector._subprocess_run(
            ["sh", "-c", "head -c 5000 /dev/zero"], None, str(tmp_path), 5, None, (1000, 1000)
        )


# -- env -0 after a profile's banner ---------------------------------------------------------------
def test_a_banner_before_env_is_not_read_as_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = (
        "printf 'Welcome to thor, operator!\\n'\n"  # no `=`: glued to env's first variable
        "printf 'BANNER_SAYS=hello\\n'\n"  # shaped like a variable, but printed, not set
        "export FLEET_PROBE_VAR=kept\n"
    )
    shell, env = login(tmp_path, profile, monkeypatch)
    assert "BANNER_SAYS" not in env and "BANNER_SAYS" not in shell["exports"]
    assert all(name.isidentifier() and name.isascii() for name in env)
    assert env["FLEET_PROBE_VAR"] == "kept"
    assert shell["exports"]["FLEET_PROBE_VAR"]["value"] == "kept"  # (bash takes no PS4 as root)
    # Nothing of the environment is lost to the banner: every variable env prints is there.
    plain = subprocess.run(
        ["bash", "-l", "-i", "-c", "env -0"], capture_output=True, text=True, check=False,
        stdin=subprocess.DEVNULL,
        env={"HOME": str(tmp_path), "PATH": collector.SCRUBBED_PATH, "TERM": "dumb"},
    ).stdout  # fmt: skip
    items = plain.split("\0")
    items[0] = items[0].rpartition("\n")[2]  # env's first variable, after the banner's lines
    names = {item.partition("=")[0] for item in items if "=" in item}
    assert "BANNER_SAYS" not in names and len(names) > 3
    assert names - {"SHLVL", "_"} <= set(env)


@pytest.mark.parametrize(
    ("out", "expected"),
    [
        ("A=1\0B=x=y\0", {"A": "1", "B": "x=y"}),  # no mark: every well-formed entry
        ("hi\n\0fleet-reconciler-env\0A=1\0", {"A": "1"}),
        ("X=1\n\0fleet-reconciler-env\0A=1\0", {"A": "1"}),  # before the mark: not env
        ("fleet-reconciler-env\0B=2\0\0fleet-reconciler-env\0A=1\0", {"A": "1"}),  # the last
        ("\0fleet-reconciler-env\0A=1\0bye\n", {"A": "1"}),  # a logout's words after
        ("\0fleet-reconciler-env\0A=1\0BASH_FUNC_f%%=() {  :\n}\0=x\0 B=1\0", {"A": "1"}),
        ("\0fleet-reconciler-env\0MULTI=a\nb\0", {"MULTI": "a\nb"}),
    ],
)
def test_only_identifier_entries_after_the_mark_are_the_environment(
    out: str, expected: dict[str, str]
) -> None:
    assert collector.env_entries(out) == expected


def test_a_variable_that_is_not_utf8_costs_only_its_own_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Latin-1 value in one profile variable used to fail the whole login part
    # (UnicodeDecodeError), losing every other export with it.
    profile = "export FLEET_LATIN=$'caf\\xe9'\nexport FLEET_PROBE_VAR=kept\n"
    shell, env = login(tmp_path, profile, monkeypatch)
    assert "error" not in shell
    assert env["FLEET_PROBE_VAR"] == "kept" and env["FLEET_LATIN"] == "caf\ufffd"
