"""The YAML loader's limits, one case per class of issue 10 (class 3): each hostile file is one
exact error at FILE:LINE:COL, exit 1 through the real commands (validate, show, drift, audit,
apply --dry, `pyinfra inventory.py`), no traceback, nothing written, and no hang (a subprocess
timeout is the hang detector; nothing here asserts a speed).

Each case edits one file of a copy of this repository's desired state (tests/unit/conftest.py
`repo`); the generated counterpart is test_generated_inputs.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError
from reconciler.desired.yaml_source import MAX_DEPTH, MAX_NODES
from tests.unit.conftest import ROOT

HANG_S = 20  # a subprocess still running after this long is a hang (each takes about 1 s)
DGX = "group_vars/dgx.yaml"  # the smallest layer; every box of group dgx reads it


def _write(file: str, content: bytes | str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        data = content.encode("utf-8") if isinstance(content, str) else content
        (root / file).write_bytes(data)

    return edit


def _replace(file: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        (root / file).unlink()
        make(root / file)

    return edit


def _symlink(file: str, target: str) -> Callable[[Path], None]:
    return _replace(file, lambda p: p.symlink_to(target))


def _bomb() -> str:
    """The billion laughs: nine levels of nine aliases each, about 1.4 KB."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    return "\n".join(lines) + "\n"


def _nested_block(levels: int) -> str:
    return "".join(f"{'  ' * i}k{i}:\n" for i in range(levels)) + f"{'  ' * levels}v\n"


ANCHORS = "anchors and aliases are refused, write the value out"
NOT_FINITE = "number is not finite (.inf, .nan, or too large)"
EMPTY_INVENTORY = (
    "inventory/hosts.yaml:1:1: file is empty, expected a mapping with `boxes:` (and `group_order:`)"
)

# (id, edit of the repository copy, every problem expected, in order)
CASES: list[tuple[str, Callable[[Path], None], list[str]]] = [
    # -- aliases, anchors, merge keys
    ("alias_bomb", _write(DGX, _bomb()), [f"{DGX}:1:4: anchor &a is not allowed: {ANCHORS}"]),
    ("alias", _write(DGX, "env: *key\n"), [f"{DGX}:1:6: alias *key is not allowed: {ANCHORS}"]),
    (
        "merge_key",
        _write(DGX, "env:\n  <<: {A: b}\n"),
        [f"{DGX}:2:3: env: merge keys (<<) are not allowed: write the keys out"],
    ),
    # -- nesting
    (
        "flow_nesting_900",
        _write(DGX, "env: " + "[" * 900 + "]" * 900 + "\n"),
        [f"{DGX}:1:{6 + MAX_DEPTH - 1}: nested deeper than {MAX_DEPTH} levels"],
    ),
    (
        "block_nesting_40",
        _write(DGX, _nested_block(40)),
        [f"{DGX}:{MAX_DEPTH + 1}:{2 * MAX_DEPTH + 1}: nested deeper than {MAX_DEPTH} levels"],
    ),
    # -- tags and directives
    (
        "python_tag",
        _write(DGX, "env: !!python/object/apply:os.system ['touch /tmp/x']\n"),
        [f"{DGX}:1:6: tag !!python/object/apply:os.system is not allowed"],
    ),
    (
        "binary_tag",
        _write(DGX, "env: !!binary aGk=\n"),
        [f"{DGX}:1:6: tag !!binary is not allowed"],
    ),
    ("set_tag", _write(DGX, "env: !!set {a}\n"), [f"{DGX}:1:6: tag !!set is not allowed"]),
    ("local_tag", _write(DGX, "env: !vault x\n"), [f"{DGX}:1:6: tag !vault is not allowed"]),
    (
        "timestamp_tag",
        _write(DGX, "env: !!timestamp 2024-01-01\n"),
        [f"{DGX}:1:6: tag !!timestamp is not allowed"],
    ),
    (
        "yaml_1_1_directive",
        _write(DGX, "%YAML 1.1\n---\nyes: on\n"),
        [f"{DGX}:1:1: %YAML and %TAG directives are not allowed"],
    ),
    (
        "second_document",
        _write(DGX, "memory: {}\n---\nmemory: {}\n"),
        [f"{DGX}:2:1: a second YAML document (---); a file holds one document"],
    ),
    # -- keys
    (
        "integer_key",
        _write(DGX, "env:\n  1: x\n"),
        [f"{DGX}:2:3: env: key 1 is an integer, not a name: quote it"],
    ),
    (
        "boolean_key",
        _write(DGX, "true: x\n"),
        [f"{DGX}:1:1: key true is a boolean, not a name: quote it"],
    ),
    ("null_key", _write(DGX, "~: x\n"), [f"{DGX}:1:1: key ~ is null, not a name: quote it"]),
    (
        "list_key",
        _write(DGX, "? [a]\n: x\n"),
        [f"{DGX}:1:3: a list cannot be a key; keys are names"],
    ),
    (
        "yes_is_a_string_key",  # YAML 1.2: `yes` is text, so it is only an unknown key
        _write(DGX, "yes: 1\n"),
        [
            f"{DGX}:1:1: yes: unknown key (valid keys: audit, contract, deployment, env, gateway, "
            "gpu_memory_budget, images, lanes, lobes, login_shell, memory, mesh, name, "
            "secret_patterns, secrets)"
        ],
    ),
    (
        "duplicate_secret_key_never_echoes",
        _write(DGX, "env:\n  HF_TOKEN: hf_first\n  HF_TOKEN: hf_second\n"),
        [f"{DGX}:3:3: env.HF_TOKEN: duplicate key (first at line 2)"],
    ),
    # -- text
    ("empty_inventory", _write("inventory/hosts.yaml", ""), [EMPTY_INVENTORY]),
    ("comments_only_inventory", _write("inventory/hosts.yaml", "# later\n"), [EMPTY_INVENTORY]),
    ("null_inventory", _write("inventory/hosts.yaml", "---\n~\n"), [EMPTY_INVENTORY]),
    (
        "lone_surrogate_escape",
        _write(DGX, 'env:\n  A: "\\ud800"\n'),
        [f"{DGX}:2:6: env.A: lone surrogate U+D800 is not allowed in a value"],
    ),
    (
        "surrogate_bytes",
        _write(DGX, b"env:\n  A: \xed\xa0\x80\n"),
        [f"{DGX}:2:6: not UTF-8 text: invalid continuation byte"],
    ),
    (
        "latin1_byte",
        _write(DGX, b"env:\n  A: caf\xe9\n"),
        [f"{DGX}:2:9: not UTF-8 text: invalid continuation byte"],
    ),
    (
        "secret_never_echoed",  # an explicit tag that does not fit never quotes the value
        _write(DGX, "env:\n  HF_TOKEN: !!int hf_abc\n  B: !!bool maybe\n  C: !!float x\n"),
        [
            f"{DGX}:2:13: env.HF_TOKEN: !!int value is not an integer",
            f"{DGX}:3:6: env.B: !!bool value is not true or false",
            f"{DGX}:4:6: env.C: !!float value is not a number",
        ],
    ),
    (
        "lone_carriage_return",  # YAML breaks the line there, an editor does not
        _write(DGX, b"env:\n  A: x\rB: y\n"),
        [f"{DGX}:2:7: carriage return without a line feed is not allowed in a YAML file"],
    ),
    (
        "raw_nul",
        _write(DGX, b"env:\n  A: x\x00y\n"),
        [f"{DGX}:2:7: control character U+0000 is not allowed in a YAML file"],
    ),
    (
        "nul_escape",
        _write(DGX, 'env:\n  A: "x\\0y"\n'),
        [f"{DGX}:2:6: env.A: control character U+0000 is not allowed in a value"],
    ),
    (
        "terminal_escape",
        _write(DGX, 'env:\n  A: "\\e[2J"\n'),
        [f"{DGX}:2:6: env.A: control character U+001B is not allowed in a value"],
    ),
    # -- numbers
    (
        "infinity",
        _write(DGX, "gpu_memory_budget: .inf\n"),
        [f"{DGX}:1:20: gpu_memory_budget: {NOT_FINITE}"],
    ),
    (
        "nan",
        _write(DGX, "gpu_memory_budget: .nan\n"),
        [f"{DGX}:1:20: gpu_memory_budget: {NOT_FINITE}"],
    ),
    (
        "overflowing_float",
        _write(DGX, "gpu_memory_budget: 1e400\n"),
        [f"{DGX}:1:20: gpu_memory_budget: {NOT_FINITE}"],
    ),
    (
        "huge_integer",
        _write(DGX, "mesh:\n  heartbeat_s: " + "9" * 5000 + "\n"),
        [f"{DGX}:2:16: mesh.heartbeat_s: integer out of range (more than 64 bits)"],
    ),
    # -- size
    (
        "oversized",
        _write(DGX, "#" + "x" * 70_000 + "\n"),
        [f"{DGX}:1:1: file is larger than 64 KiB (70002 bytes or more); a layer is small"],
    ),
    (
        "too_many_values",
        _write(DGX, "env:\n" + "".join(f"  K{i}: {i}\n" for i in range(MAX_NODES))),
        [f"{DGX}:1000:9: more than {MAX_NODES} values in one file"],
    ),
    # -- what the file is
    (
        "fifo_layer",
        _replace(DGX, os.mkfifo),
        [f"{DGX}:1:1: is a named pipe (FIFO), expected a regular file"],
    ),
    (
        "directory_layer",
        _replace(DGX, Path.mkdir),
        [f"{DGX}:1:1: is a directory, expected a regular file"],
    ),
    (
        "dangling_symlink",
        _symlink(DGX, "gone.yaml"),
        [f"{DGX}:1:1: dangling symlink (to 'gone.yaml' that does not exist)"],
    ),
    ("symlink_loop", _symlink(DGX, "dgx.yaml"), [f"{DGX}:1:1: symlink loop"]),
    (
        "symlink_to_dev_zero",
        _symlink(DGX, "/dev/zero"),
        [f"{DGX}:1:1: symlink to '/dev/zero', which is outside the repository"],
    ),
    (
        "symlink_out_of_the_repo",
        _symlink(DGX, "/etc/hostname"),
        [f"{DGX}:1:1: symlink to '/etc/hostname', which is outside the repository"],
    ),
    (
        "inventory_is_dev_zero",
        lambda root: None,  # see INVENTORY below: `-i /dev/zero`
        ["/dev/zero:1:1: is a device, expected a regular file"],
    ),
]


INVENTORY = {"inventory_is_dev_zero": "/dev/zero"}  # the others load inventory/hosts.yaml
BY_ID = {case_id: (edit, expected) for case_id, edit, expected in CASES}


@pytest.mark.parametrize(("case_id"), list(BY_ID))
def test_hostile_yaml_is_one_located_error(repo: Path, case_id: str) -> None:
    edit, expected = BY_ID[case_id]
    edit(repo)
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(repo, INVENTORY.get(case_id, "hosts"))
    assert [str(p) for p in caught.value.problems] == expected


def test_a_directory_symlink_out_of_the_repo_is_refused_for_every_file_under_it(
    repo: Path,
) -> None:
    """`group_vars -> /elsewhere` in a cloned repository: each layer under it is outside the
    repository just as a layer's own symlink out would be (its values would be quoted)."""
    layers = sorted(p.name for p in (repo / "group_vars").glob("*.yaml"))
    elsewhere = repo.parent / "elsewhere"
    (repo / "group_vars").rename(elsewhere)
    (repo / "group_vars").symlink_to(elsewhere)
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(repo, "hosts")
    said = f"group_vars/ is a symlink to {str(elsewhere)!r}, which is outside the repository"
    assert [str(p) for p in caught.value.problems] == [
        f"group_vars/{name}:1:1: {said}" for name in layers
    ]


def test_a_directory_symlink_inside_the_repo_is_fine(repo: Path) -> None:
    (repo / "group_vars").rename(repo / "layers")
    (repo / "group_vars").symlink_to("layers")
    assert load_fleet(repo, "hosts").boxes["thor"].lobes.shape == "thor-worker"


# -- what is plain YAML still loads ---------------------------------------------------------------
def test_a_byte_order_mark_an_empty_layer_and_a_symlink_inside_the_repo_are_fine(
    repo: Path,
) -> None:
    thor = repo / "group_vars" / "thor.yaml"
    thor.write_bytes(b"\xef\xbb\xbf" + thor.read_bytes())
    (repo / DGX).write_text("# nothing for dgx boxes yet\n", encoding="utf-8")
    shared = repo / "shared" / "jetson.yaml"
    shared.parent.mkdir()
    (repo / "group_vars" / "jetson.yaml").rename(shared)
    (repo / "group_vars" / "jetson.yaml").symlink_to("../shared/jetson.yaml")
    fleet = load_fleet(repo, "hosts")
    assert fleet.boxes["thor"].lobes.shape == "thor-worker"
    assert fleet.positions["orin"][("memory", "mem_available_floor_gib")].file == (
        "group_vars/jetson.yaml"  # the link's own name: what the operator edits
    )


def test_dates_and_yaml_1_1_booleans_stay_the_text_they_are(tmp_path: Path) -> None:
    from reconciler.desired.yaml_source import load_yaml

    layer = tmp_path / "layer.yaml"
    layer.write_text("a: 2024-01-01\nb: yes\non: off\nc: 0x10\nd: '1'\n", encoding="utf-8")
    doc = load_yaml(layer, "layer.yaml")
    assert doc.data == {"a": "2024-01-01", "b": "yes", "on": "off", "c": 16, "d": "1"}


# -- through the real commands --------------------------------------------------------------------
def _snapshot(root: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        regular = path.is_file() and not path.is_symlink()
        out[str(path.relative_to(root))] = path.read_bytes() if regular else None
    return out


def _run(repo: Path, command: list[str]) -> subprocess.CompletedProcess[str]:
    """One command in a subprocess; HANG_S is only the hang detector."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    try:
        return subprocess.run(
            command,
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{command} still running after {HANG_S} s: a hang")


RECONCILE = [sys.executable, "-m", "reconciler", "--root", "."]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
COMMANDS = {
    "validate": [*RECONCILE, "validate"],
    "show": [*RECONCILE, "show", "thor"],
    "drift": [*RECONCILE, "drift"],
    "audit": [*RECONCILE, "audit"],
    "apply": [*RECONCILE, "apply", "--dry"],
    "pyinfra": [PYINFRA, "inventory.py", "debug-inventory"],
}
CLI_CASES = [
    ("alias_bomb", list(COMMANDS)),
    ("fifo_layer", list(COMMANDS)),
    ("flow_nesting_900", ["validate", "pyinfra"]),
    ("python_tag", ["validate", "show"]),
    ("empty_inventory", ["validate", "drift"]),
    ("lone_surrogate_escape", ["validate", "show"]),
    ("merge_key", ["validate"]),
    ("symlink_to_dev_zero", ["drift"]),
]


@pytest.mark.parametrize(
    ("case_id", "command"),
    [pytest.param(c, cmd, id=f"{c}-{cmd}") for c, cmds in CLI_CASES for cmd in cmds],
)
def test_every_command_reports_the_located_error_exits_1_and_touches_nothing(
    repo: Path, tmp_path: Path, case_id: str, command: str
) -> None:
    shutil.copy(ROOT / "inventory.py", repo / "inventory.py")
    edit, expected = BY_ID[case_id]
    edit(repo)
    before = _snapshot(tmp_path)
    done = _run(repo, COMMANDS[command])
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert [line for line in lines if line in expected] == expected, done.stderr
    if command != "pyinfra":  # pyinfra adds its own progress lines before ours
        assert lines == [*expected, "invalid desired state: 1 problem"]
    else:
        assert lines[-2:] == [*expected, "invalid desired state: 1 problem"]
    assert done.stdout == "" or command == "pyinfra"
    assert _snapshot(tmp_path) == before


# -- the lab's overlays are read the same way ------------------------------------------------------
@pytest.mark.parametrize(
    ("overlay", "make", "expected"),
    [
        (
            ".lab/images.yaml",
            os.mkfifo,
            ".lab/images.yaml:1:1: is a named pipe (FIFO), expected a regular file",
        ),
        (
            ".lab/overlay/thor.yaml",
            lambda p: p.symlink_to("/dev/zero"),
            ".lab/overlay/thor.yaml:1:1: symlink to '/dev/zero', which is outside the repository",
        ),
        (
            ".lab/overlay/spark.yaml",
            lambda p: p.write_text("deployment: &d {}\n", encoding="utf-8"),
            f".lab/overlay/spark.yaml:1:13: anchor &d is not allowed: {ANCHORS}",
        ),
    ],
)
def test_a_hostile_overlay_is_its_own_located_error(
    tmp_path: Path, overlay: str, make: Callable[[Path], None], expected: str
) -> None:
    from tests.unit.yaml_mutations import make_repo

    root = make_repo(tmp_path / "fleet")
    assert list(load_fleet(root, "lab").boxes) == ["thor", "spark", "orin"]
    (root / overlay).unlink()
    make(root / overlay)
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(root, "lab")
    assert [str(p) for p in caught.value.problems] == [expected]


@contextlib.contextmanager
def _hang_detector() -> Iterator[None]:
    """In-process: an open() blocked on a FIFO is interrupted (EINTR -> the handler's error)."""

    def hang(signum: int, frame: object) -> None:
        raise AssertionError(f"still blocked after {HANG_S} s: a hang")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(HANG_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- the caches never keep or serve what the loader refuses --------------------------------------
def test_a_remembered_state_is_not_served_once_a_layer_became_a_fifo(repo: Path) -> None:
    from reconciler.desired.cache import cached_fleet, load_fleet_cached
    from reconciler.drift_inputs import cached_inputs, remembered_inputs
    from tests.unit.conftest import hosts_inventory

    fleet = load_fleet_cached(repo, "hosts")
    remembered_inputs(fleet, hosts_inventory(repo))
    assert cached_fleet(repo, hosts_inventory(repo)) is not None
    assert cached_inputs(repo, hosts_inventory(repo)) is not None
    (repo / DGX).unlink()
    os.mkfifo(repo / DGX)  # reading it would block: a miss must not read it
    with _hang_detector():
        assert cached_fleet(repo, hosts_inventory(repo)) is None
        assert cached_inputs(repo, hosts_inventory(repo)) is None
        with pytest.raises(DesiredStateError) as caught:
            load_fleet_cached(repo, "hosts")
    assert [str(p) for p in caught.value.problems] == [
        f"{DGX}:1:1: is a named pipe (FIFO), expected a regular file"
    ]


def test_a_refused_state_is_never_remembered(repo: Path) -> None:
    from reconciler.desired.cache import cached_fleet, load_fleet_cached
    from tests.unit.conftest import hosts_inventory

    _write(DGX, _bomb())(repo)
    for _ in range(2):  # the second run is refused from the files again, not from a cache
        with pytest.raises(DesiredStateError):
            load_fleet_cached(repo, "hosts")
        assert cached_fleet(repo, hosts_inventory(repo)) is None
