"""Review 2 of the desired state: what reaches `.env`, the compose project, one box per machine,
and what `reconcile show` prints of a secret carried inline. Each test failed before its fix.

1. an `.env` value compose cannot read back through the box's quoting is refused;
2. an `env:` pin of a variable compose or docker reads itself is refused, and so is a
   deployment.project other than the one compose derives from the deployment directory;
3. two boxes at one (ssh host, port), or at one gateway origin, are refused at both lines;
4. `show` prints a secret carried inline in a setting as ***, and the rest of the value.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from reconciler.compare import shell
from reconciler.desired import checks
from reconciler.desired.load import load_fleet
from reconciler.desired.models import EnvValue
from reconciler.desired.problems import DesiredStateError
from reconciler.desired.show import show_json, show_text
from tests.unit.conftest import load_box_program

from .test_desired_bad_inputs import FIXTURE

converge = load_box_program("review2_converge", "reconciler/apply/remote/converge.py")
Edit = tuple[str, str | None, str]  # file, text replaced (None: appended), new text


def _fleet(tmp_path: Path, *edits: Edit) -> Path:
    root = tmp_path / "fleet"
    shutil.copytree(FIXTURE, root)
    for file, old, new in edits:
        target = root / file
        text = target.read_text(encoding="utf-8")
        if old is None:
            text += new
        else:
            assert old in text, f"the fixture no longer contains {old!r}"
            text = text.replace(old, new, 1)
        target.write_text(text, encoding="utf-8")
    return root


def _problems(root: Path) -> list[str]:
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(root)
    return [str(p) for p in caught.value.problems]


def _one(problems: list[str], expected: str) -> None:
    """One problem, `expected` (a layer shared by boxes may be followed by which boxes)."""
    assert len(problems) == 1, problems
    assert problems[0] == expected or problems[0].startswith(f"{expected} (boxes ")


def _accepted(value: Any) -> bool:
    try:
        TypeAdapter(EnvValue).validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


# -- 1. a value compose cannot read back through the box's single quotes ----------------------
TRAILING = (
    "an .env value without ' cannot end in an odd number of backslashes: the box writes it in "
    "single quotes, compose reads the last \\' as an escaped quote and refuses the whole .env as "
    "an unterminated quoted value (the value is not shown)"
)


def test_an_env_value_ending_in_a_backslash_is_refused_at_its_line(tmp_path: Path) -> None:
    # YAML's single quotes keep backslashes: the value is C:\models\ (the reviewer's).
    root = _fleet(tmp_path, ("group_vars/all.yaml", None, "env:\n  MODEL_DIR: 'C:\\models\\'\n"))
    _one(_problems(root), f"group_vars/all.yaml:34:3: env.MODEL_DIR: {TRAILING}")


# Each value, and whether the loader accepts it: an odd run of backslashes at the end escapes
# the closing quote; anything else the box writes reads back.
TRAILING_CASES = {
    "C:\\models\\": False,
    "\\": False,
    "a b\\\\\\": False,  # three: the last still escapes the quote
    "a\\\\": True,  # two: compose reads '\\' back as two backslashes
    "a\\b c": True,  # a backslash anywhere but at the end
    "x'y\\": True,  # holds ': written in double quotes, every backslash doubled
    "plain": True,
}


def test_a_trailing_backslash_is_refused_only_when_its_run_is_odd() -> None:
    assert {value: _accepted(value) for value in TRAILING_CASES} == TRAILING_CASES


def _compose_reads(tmp_path: Path, line_value: str) -> str | None:
    """What `docker compose config` reads as V from an `.env` line `V=<line_value>`; None when
    it refuses the file."""
    (tmp_path / "compose.yaml").write_text(
        "services:\n  s:\n    image: busybox\n    environment:\n      V: ${V}\n", encoding="utf-8"
    )
    env = tmp_path / "test.env"
    env.write_text(f"A=1\nV={line_value}\nB=2\n", encoding="utf-8")
    done = subprocess.run(
        ["docker", "compose", "--env-file", str(env), "config", "--format", "json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode:
        assert "unterminated quoted value" in done.stderr
        return None
    value: str = json.loads(done.stdout)["services"]["s"]["environment"]["V"]
    return value


@pytest.mark.skipif(shutil.which("docker") is None, reason="needs the docker compose CLI")
def test_the_loader_accepts_exactly_what_compose_reads_back_from_the_box_quoting(
    tmp_path: Path,
) -> None:
    """The box's writer (converge.py `quote`) against the real `docker compose`: what it cannot
    read back unchanged (or at all) is what the loader refuses."""
    values = [
        "C:\\models\\",
        "a\\",
        "a\\\\",
        "a\\\\\\",
        "a\\b",
        "\\x y",
        "x'y\\",
        "it's \\\\",
        "a\\'b",
    ]
    read_back = {
        value: _compose_reads(tmp_path, converge.quote(value)) == value for value in values
    }
    assert {value: _accepted(value) for value in values} == read_back
    assert not all(read_back.values())  # the case the reviewer found is among them


# -- 2. the compose project is pinned: no control variable in env:, project = directory's ----
CONTROL = (
    "{key} is read by compose or docker itself: in .env it would move compose to another "
    "project, other files or another engine, or remove containers (the fleet derives "
    "COMPOSE_FILE and COMPOSE_PROFILES; null leaves the key out)"
)


@pytest.mark.parametrize(
    "key",
    [
        "COMPOSE_PROJECT_NAME",
        "COMPOSE_FILE",
        "COMPOSE_PATH_SEPARATOR",
        "DOCKER_HOST",
        "DOCKER_CONTEXT",
        "COMPOSE_REMOVE_ORPHANS",
    ],
)
def test_an_env_pin_of_a_compose_or_docker_variable_is_refused(tmp_path: Path, key: str) -> None:
    root = _fleet(tmp_path, ("group_vars/all.yaml", None, f"env:\n  {key}: other\n"))
    _one(_problems(root), f"group_vars/all.yaml:34:3: env.{key}: {CONTROL.format(key=key)}")


def test_a_lane_env_pin_of_one_is_refused_and_a_null_pin_is_not(tmp_path: Path) -> None:
    root = _fleet(
        tmp_path,
        ("group_vars/thor.yaml", "WORKER_MAX_NUM_SEQS: 1", "COMPOSE_PROJECT_NAME: other"),
        ("group_vars/all.yaml", None, "env:\n  DOCKER_HOST: null\n"),  # removes a stray line
    )
    key = "COMPOSE_PROJECT_NAME"
    _one(
        _problems(root),
        f"group_vars/thor.yaml:14:7: lanes.worker.env.{key}: {CONTROL.format(key=key)}",
    )


def test_the_refused_pins_are_within_the_shell_leak_floor() -> None:
    """One list (compare/shell.py): every variable a pin may not set is one a login shell may
    not export either."""
    assert checks.redirecting_variable is shell.redirecting_variable
    assert all(shell.control_variable(name) for name in shell.REDIRECTING)


def test_a_compose_tuning_knob_may_be_pinned(tmp_path: Path) -> None:
    """COMPOSE_PARALLEL_LIMIT or COMPOSE_HTTP_TIMEOUT move nothing: refusing them cost an
    operator a real setting for no safety."""
    knobs = "env:\n  COMPOSE_PARALLEL_LIMIT: '1'\n  COMPOSE_HTTP_TIMEOUT: '300'\n"
    fleet = load_fleet(_fleet(tmp_path, ("group_vars/all.yaml", None, knobs)))
    box = next(iter(fleet.boxes.values()))
    assert box.env["COMPOSE_PARALLEL_LIMIT"] == "1"


PROJECT = (
    "project {project!r} is not the directory's: compose derives the project {derived!r} from "
    "{directory}, so a `docker compose` run there would manage another project than the "
    "converge's (its last part, lowercase, only a-z 0-9 _ -, no leading _ or -); make them agree"
)


def test_a_project_other_than_the_directorys_is_refused_at_the_project(tmp_path: Path) -> None:
    root = _fleet(tmp_path, ("group_vars/all.yaml", "deployment:\n", "deployment:\n  project: x\n"))
    message = PROJECT.format(project="x", derived="lobes", directory="~/.lobes")
    _one(_problems(root), f"group_vars/all.yaml:4:3: deployment.project: {message}")


def test_a_directory_moved_from_the_default_project_is_refused_at_the_directory(
    tmp_path: Path,
) -> None:
    edit = ("group_vars/all.yaml", "deployment:\n", "deployment:\n  directory: ~/.lobes2\n")
    message = PROJECT.format(project="lobes", derived="lobes2", directory="~/.lobes2")
    _one(
        _problems(_fleet(tmp_path, edit)),
        f"group_vars/all.yaml:4:3: deployment.directory: {message}",
    )
    agreeing = "deployment:\n  directory: ~/x/My.Lobes\n  project: mylobes\n"
    shutil.rmtree(tmp_path / "fleet")
    load_fleet(_fleet(tmp_path, ("group_vars/all.yaml", "deployment:\n", agreeing)))
    # One layer moves the directory, a later one (every box's group) names the project: the
    # merged state is judged, not each layer alone.
    shutil.rmtree(tmp_path / "fleet")
    later = ("group_vars/gpu.yaml", None, "deployment:\n  project: lobes2\n")
    load_fleet(_fleet(tmp_path, edit, later))


@pytest.mark.parametrize(
    ("directory", "project"),
    [("~/.lobes", "lobes"), ("~/a/My.Lobes_2-x", "mylobes_2-x"), ("~/_-abc", "abc"), ("~/.", "")],
)
def test_the_project_is_derived_as_compose_derives_it(directory: str, project: str) -> None:
    """As `docker compose config` names a project in such a directory (checked by hand)."""
    from reconciler.desired.models import compose_project_name  # new: each test fails alone

    assert compose_project_name(directory) == project


# -- 3. one box per machine, one gateway per origin --------------------------------------------
SSH = (
    "{host} port {port} is also boxes.{other}.ssh_hostname: two boxes cannot be one machine (an "
    "apply of one would converge the other's host)"
)


@pytest.mark.parametrize(("thor", "spark"), [("10.0.0.11", "10.0.0.11"), ("Thor.LAN.", "thor.lan")])
def test_two_boxes_at_one_ssh_host_and_port_are_refused_at_both_lines(
    tmp_path: Path, thor: str, spark: str
) -> None:
    root = _fleet(
        tmp_path,
        ("inventory/hosts.yaml", "ssh_hostname: 10.0.0.11", f"ssh_hostname: {thor}"),
        ("inventory/hosts.yaml", "ssh_hostname: 10.0.0.12", f"ssh_hostname: {spark}"),
    )
    host = thor.lower().rstrip(".")
    assert _problems(root) == [
        "inventory/hosts.yaml:5:5: boxes.thor.ssh_hostname: "
        + SSH.format(host=host, port=22, other="spark"),
        "inventory/hosts.yaml:9:5: boxes.spark.ssh_hostname: "
        + SSH.format(host=host, port=22, other="thor"),
    ]
    # The same host on another port is another machine (a NAT's forwards): accepted.
    shutil.rmtree(tmp_path / "fleet")
    other_port = f"ssh_hostname: {spark}\n    ssh_port: 2222"
    load_fleet(
        _fleet(
            tmp_path,
            ("inventory/hosts.yaml", "ssh_hostname: 10.0.0.11", f"ssh_hostname: {thor}"),
            ("inventory/hosts.yaml", "ssh_hostname: 10.0.0.12", other_port),
        )
    )


@pytest.mark.parametrize(
    ("thor", "spark", "shown"),
    [
        ("http://Mesh.LAN.:8000", "http://mesh.lan:8000", "mesh.lan:8000"),
        ("http://mesh.lan", "http://mesh.lan:80", "mesh.lan:80"),
    ],
)
def test_two_boxes_at_one_gateway_origin_are_refused_at_both_lines(
    tmp_path: Path, thor: str, spark: str, shown: str
) -> None:
    root = _fleet(
        tmp_path,
        ("inventory/hosts.yaml", "10.0.0.11", f"10.0.0.11\n    gateway_origin: {thor}"),
        ("inventory/hosts.yaml", "10.0.0.12", f"10.0.0.12\n    gateway_origin: {spark}"),
    )
    why = "two boxes cannot be one gateway of the mesh"
    assert _problems(root) == [
        f"inventory/hosts.yaml:6:5: boxes.thor.gateway_origin: the gateway at {shown} is also "
        f"boxes.spark.gateway_origin: {why}",
        f"inventory/hosts.yaml:11:5: boxes.spark.gateway_origin: the gateway at {shown} is also "
        f"boxes.thor.gateway_origin: {why}",
    ]


# -- 4. show masks a secret carried inline, keeps the rest ------------------------------------
CANARY = "canary-5f0e1d2c3b4a"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (f"--api-key {CANARY} --port 9", "--api-key *** --port 9"),
        (f"--hf-token={CANARY}  --x 1", "--hf-token=***  --x 1"),
        (f"HF_TOKEN={CANARY} --x 1", "HF_TOKEN=*** --x 1"),
        (f"Authorization: Bearer {CANARY}", "***"),  # no word to mask alone: all of it
        (f'--api-key "{CANARY} b" --port 9', "***"),  # a quoted secret spans words
    ],
)
def test_show_prints_a_secret_carried_inline_as_stars_and_keeps_the_rest(
    tmp_path: Path, value: str, shown: str
) -> None:
    pin = f"  LOBES_EXTRA_ARGS: {json.dumps(value)}"
    root = _fleet(
        tmp_path,
        ("group_vars/thor.yaml", "VLLM_GDN_DECODE_KERNEL: triton", f"{pin.strip()}"),
        ("group_vars/thor.yaml", "WORKER_MAX_NUM_SEQS: 1", f"WORKER_EXTRA: {json.dumps(value)}"),
    )
    fleet = load_fleet(root)
    text = show_text(fleet, "thor")
    doc = json.loads(show_json(fleet, "thor"))
    assert CANARY not in text
    assert CANARY not in json.dumps(doc)
    assert f"LOBES_EXTRA_ARGS={shown}" in text  # the .env lines
    assert f"WORKER_EXTRA={shown}" in text
    assert doc["env"]["LOBES_EXTRA_ARGS"]["value"] == shown
    assert doc["desired"]["env"]["LOBES_EXTRA_ARGS"] == shown  # the desired state's YAML too
    assert doc["desired"]["lanes"]["worker"]["env"]["WORKER_EXTRA"] == shown
    assert f"LOBES_EXTRA_ARGS: {shown}" in text or f"LOBES_EXTRA_ARGS: '{shown}'" in text


def test_show_prints_a_value_carrying_no_secret_as_it_is(tmp_path: Path) -> None:
    value = f"--max-num-batched-tokens 8192 --tokenizer {CANARY} --api-key"
    root = _fleet(
        tmp_path,
        ("group_vars/thor.yaml", "VLLM_GDN_DECODE_KERNEL: triton", f"X_ARGS: {json.dumps(value)}"),
        ("group_vars/thor.yaml", "WORKER_MAX_NUM_SEQS: 1", f"X_HDR: 'Authorization: {CANARY}'"),
    )
    fleet = load_fleet(root)
    assert f"X_ARGS={value}" in show_text(fleet, "thor")
    # ...and one that does, beside it, is still masked (the regression this guards).
    assert "X_HDR=***" in show_text(fleet, "thor")
