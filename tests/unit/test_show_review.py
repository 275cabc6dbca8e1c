"""`reconcile show` and the pyinfra inventory's host.data, as a review found them:

1. a value drift shows as `***` under the fleet's own `secret_patterns` was shown in clear;
2. `show --format json` of every box printed a document per box: no JSON;
3. a failed write to stdout (`>/dev/full`, `>&-`) ended in a traceback;
4. list values (and empty maps) had no comment naming the file:line that set them.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from ruamel.yaml import YAML

from reconciler import cli
from reconciler.cli import main
from reconciler.desired import secret_names
from reconciler.desired.load import load_fleet
from reconciler.desired.pyinfra_data import pyinfra_groups
from reconciler.desired.show import show_json, show_text

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"
CLEAR = "clear-SECRET5"  # set under a name only the fleet's `*_PW` names
FLAGGED = "clear-SECRET6"  # after a flag only the fleet's `*_PW` names
ORIN_EXTRA = f"""
secret_patterns: ["*_PW"]
env: {{ZDB: "DB_PW={CLEAR}", ZFLAG: "--db-pw {FLAGGED}"}}
audit:
  expected_containers:
    - {{name: node-exporter, ports: [9100]}}
    - name: "cadvisor*"
"""


@pytest.fixture(autouse=True)
def _no_fleet_patterns() -> Iterator[None]:
    # A pattern another test adopted (a process-wide setting) must not mask for show here.
    secret_names.adopt_fleet_patterns(())
    yield
    secret_names.adopt_fleet_patterns(())


@pytest.fixture
def fleet_root(tmp_path: Path) -> Path:
    root = tmp_path / "fleet"
    shutil.copytree(EXAMPLE, root)
    orin = root / "group_vars" / "orin.yaml"
    orin.write_text(orin.read_text("utf-8") + ORIN_EXTRA, "utf-8")
    return root


def _show(capsys: pytest.CaptureFixture[str], root: Path, *argv: str) -> str:
    assert main(["--root", str(root), "-i", "lab", "show", *argv]) == 0
    return capsys.readouterr().out


def _yaml_part(text: str) -> str:
    """A box's text output up to its `.env` lines (KEY=value lines are no YAML)."""
    return text.split("\n# .env keys managed on ")[0]


# -- 1. the fleet's own secret patterns -------------------------------------------------------


@pytest.mark.parametrize(
    "form", [(), ("orin",), ("--format", "json"), ("orin", "--format", "json")]
)
def test_show_masks_what_the_fleets_own_patterns_name(
    capsys: pytest.CaptureFixture[str], fleet_root: Path, form: tuple[str, ...]
) -> None:
    out = _show(capsys, fleet_root, *form)
    assert CLEAR not in out and FLAGGED not in out
    # The rest of the value stays, as drift shows it.
    assert "DB_PW=***" in out and "--db-pw ***" in out


def test_show_adopts_its_fleets_patterns_again_once_another_run_changed_them(
    fleet_root: Path,
) -> None:
    fleet = load_fleet(fleet_root, "lab")
    assert CLEAR not in show_text(fleet, "orin")
    secret_names.adopt_fleet_patterns(())  # a drift of another fleet, in the same process
    assert CLEAR not in show_text(fleet, "orin")
    assert CLEAR not in show_json(fleet, "orin")


def test_pyinfra_host_data_masks_what_the_fleets_own_patterns_name(fleet_root: Path) -> None:
    groups = pyinfra_groups(load_fleet(fleet_root, "lab"))
    orin = dict(groups["boxes"])["@openssh/orin"]
    printed = json.dumps(groups)  # debug-inventory prints host.data as it is
    assert CLEAR not in printed and FLAGGED not in printed
    assert orin["desired"]["env"] == {"ZDB": "DB_PW=***", "ZFLAG": "--db-pw ***"}
    assert orin["desired_env"]["ZDB"] == "DB_PW=***"


# -- 2. one JSON document for every box -------------------------------------------------------


def test_show_json_of_every_box_is_one_document_of_each_boxs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = json.loads(_show(capsys, EXAMPLE, "--format", "json"))
    assert list(doc) == ["boxes"]
    assert list(doc["boxes"]) == ["thor", "spark", "orin"]  # the inventory's order
    for box, shown in doc["boxes"].items():
        assert shown == json.loads(_show(capsys, EXAMPLE, box, "--format", "json"))


# -- 3. a failed output ------------------------------------------------------------------------


def _reconcile(argv: list[str], shell: str = "", **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """The program; `shell`: a redirection of its stdout (`>&-`)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FLEET_INVENTORY", None)
    env.pop("PYTHONUNBUFFERED", None)  # stdout buffered, as an operator's is
    command = [sys.executable, "-m", "reconciler", *argv]
    if shell:
        command = ["sh", "-c", f'exec "$@" {shell}', "sh", *command]
    return subprocess.run(
        command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True, check=False, **kwargs
    )


EXAMPLE_ARGS = ["--root", str(EXAMPLE), "-i", "lab"]
REPLAY = [*EXAMPLE_ARGS, "drift", "--from-snapshot", str(EXAMPLE / "snapshot"), "--no-history"]
WRITERS = {
    "show": [*EXAMPLE_ARGS, "show"],
    "show-json": [*EXAMPLE_ARGS, "show", "thor", "--format", "json"],
    "validate": [*EXAMPLE_ARGS, "validate"],  # a line: out only when flushed
    "schema": ["schema"],
    "drift": REPLAY,  # ends with os._exit (cli._end_now)
    "history": ["history", "--history", "{tmp}/none.sqlite3"],
}


@pytest.mark.parametrize("command", WRITERS)
def test_a_full_output_is_an_error_said_in_one_line(tmp_path: Path, command: str) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in WRITERS[command]]
    with open("/dev/full", "w") as full:
        done = _reconcile(argv, stdout=full)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert done.stderr.endswith("error: writing the output: No space left on device\n")


@pytest.mark.parametrize(
    ("redirect", "said"),
    [
        (">&-", "standard output is closed"),
        ("1</dev/null", "Bad file descriptor"),  # open for reading only
    ],
)
@pytest.mark.parametrize("command", ["show", "drift"])
def test_a_closed_or_unwritable_output_is_an_error_said_in_one_line(
    command: str, redirect: str, said: str
) -> None:
    done = _reconcile(WRITERS[command], redirect, stdout=subprocess.DEVNULL)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.endswith(f"error: writing the output: {said}\n")


class _FullStream:
    """A stdout whose every write and flush fails as a full disk's."""

    def __init__(self) -> None:
        self.failures = 0

    def write(self, text: str) -> int:
        self.failures += 1
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self) -> None:
        self.failures += 1
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_another_oserror_is_not_taken_for_the_outputs(capsys: pytest.CaptureFixture[str]) -> None:
    def handler(args: argparse.Namespace) -> int:
        print("half a report")
        raise OSError(errno.ENOSPC, "No space left on device", "/srv/history.sqlite3")

    with pytest.raises(OSError, match=r"history\.sqlite3"):
        cli._run(argparse.Namespace(handler=handler))
    assert "writing the output" not in capsys.readouterr().err


def test_the_outputs_own_error_is_said_and_stdout_is_given_back(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stream = _FullStream()
    monkeypatch.setattr(sys, "stdout", stream)

    def handler(args: argparse.Namespace) -> int:
        print("the report")
        return 0

    assert cli._run(argparse.Namespace(handler=handler)) == 1
    assert sys.stdout is stream and stream.failures == 1
    assert capsys.readouterr().err == "error: writing the output: No space left on device\n"


class _Exited(Exception):
    pass


def test_a_drifts_last_flush_failing_is_said_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def exit_now(code: int) -> NoReturn:
        raise _Exited(code)

    monkeypatch.setattr(cli.os, "_exit", exit_now)
    monkeypatch.setattr(sys, "stdout", _FullStream())
    with pytest.raises(_Exited) as ended:
        cli._end_now(2)  # a drift found: its report not out is no exit 2
    assert ended.value.args == (1,)
    assert capsys.readouterr().err == "error: writing the output: No space left on device\n"


# -- 4. every value annotated, the output still YAML ------------------------------------------


@pytest.mark.parametrize("box", ["thor", "orin"])
def test_every_value_names_where_it_was_set_and_the_yaml_is_the_desired_state(
    capsys: pytest.CaptureFixture[str], fleet_root: Path, box: str
) -> None:
    text = _yaml_part(_show(capsys, fleet_root, box))
    doc = json.loads(_show(capsys, fleet_root, box, "--format", "json"))
    assert YAML(typ="safe").load(text) == doc["desired"]
    for line in text.splitlines():
        if not line.startswith("#") and not line.endswith(":"):  # a mapping's key: its own say
            assert " # " in line, line


def _set_at(root: Path, layer: str, start: str) -> str:
    """FILE:LINE of the first line of group_vars/`layer` that starts with `start` (indented)."""
    lines = (root / "group_vars" / layer).read_text("utf-8").splitlines()
    line = next(i for i, x in enumerate(lines, 1) if x.strip().startswith(start))
    return f"group_vars/{layer}:{line}"


def test_lists_name_the_layer_that_set_them(
    capsys: pytest.CaptureFixture[str], fleet_root: Path
) -> None:
    thor = _show(capsys, fleet_root, "thor")
    compose = "[docker-compose.yml, docker-compose.shape.yml, docker-compose.override.yml]"
    where = _set_at(fleet_root, "thor.yaml", "compose_files:")
    assert f"  compose_files: {compose} # {where}\n" in thor
    assert "\n    env: {} # default\n" in thor  # a lane's, none set
    orin = _show(capsys, fleet_root, "orin")
    # Every layer's patterns (a layer only adds names): each file that added some.
    patterns = [_set_at(fleet_root, f, "secret_patterns:") for f in ("all.yaml", "orin.yaml")]
    assert f"'*_CREDENTIALS'] # {', '.join(patterns)}\n" in orin
    listed = _set_at(fleet_root, "orin.yaml", "expected_containers:")
    assert f"  expected_containers: # {listed}\n" in orin
    ports = _set_at(fleet_root, "orin.yaml", "- {name: node-exporter")
    assert f"      ports: [9100] # {ports}\n" in orin
