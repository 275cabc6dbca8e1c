"""The pyinfra deploys and the apply payload after review 7 (/tmp/rev-deploy-reviewer):

1. a controller_env secret whose value no `.env` line can hold (CR, LF, NUL, both ' and $, an
   odd run of trailing backslashes) is refused by `managed_env`, naming the variable, never
   the value, before anything is sent;
2. `pyinfra inventory.py debug-inventory` prints the desired state masked as `reconcile show`
   masks it: a secret held inside an `env:` value whose key is no secret is not printed;
3. `pyinfra inventory.py deploys/thor.py` connects to thor alone: another box unreachable does
   not fail it, while deploys/mesh.py still connects to every box;
4. inventory.py puts its own repository first on sys.path, so the code pyinfra runs is this
   repository's whatever the working directory (pyinfra appends the cwd, after
   site-packages, where an editable or installed fleet-reconciler of another checkout is).

pyinfra runs as a subprocess: the real CLI for debug-inventory (nothing is connected), and for
the deploys through a wrapper that fakes ssh's connect (one box unreachable) and observes the
lab-incidents example from its snapshot, as tests/unit/test_deploys_review_fixes.py does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.apply.payload import MissingControllerSecret, managed_env
from reconciler.desired.load import load_fleet
from reconciler.desired.models import ControllerEnvSecret
from reconciler.desired.pyinfra_data import host_data, pyinfra_groups
from reconciler.drift_inputs import expectations

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"
PYINFRA = Path(sys.executable).parent / "pyinfra"  # the console script, as operators run it


# -- 1. a controller secret .env cannot hold ---------------------------------------------------
@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("mesh-key-0451\r", "a carriage return"),
        ("mesh-key\n0451", "a line feed"),
        ("mesh-key\x000451", "NUL"),
        ("it's-$HOME-0451", "both ' and $"),
        ("mesh-key-0451\\", "odd number of backslashes"),
    ],
)
def test_a_controller_secret_no_env_line_can_hold_is_refused_naming_the_variable(
    value: str, said: str
) -> None:
    fleet = load_fleet(EXAMPLE, "lab")
    spec = fleet.boxes["thor"]
    box = spec.model_copy(
        update={"secrets": {**spec.secrets, "mesh_key": ControllerEnvSecret(
            source="controller_env", variable="FLEET_MESH_KEY")}}
    )  # fmt: skip
    exp = expectations(fleet, ["thor"])["thor"]
    assert any(e.key == "LOBES_MESH_KEY" for e in exp.env)  # the secret is one of thor's keys
    with pytest.raises(MissingControllerSecret) as caught:
        managed_env(exp, box, {"FLEET_MESH_KEY": value})
    message = str(caught.value)
    assert message.startswith("secret mesh_key: $FLEET_MESH_KEY cannot be written to .env: ")
    assert said in message
    assert "0451" not in message  # never the value
    # A value .env can hold still travels, unchanged.
    sent = managed_env(exp, box, {"FLEET_MESH_KEY": "mesh-key-0451"})["LOBES_MESH_KEY"]
    assert sent == {"secret": "mesh_key", "value": "mesh-key-0451"}


# -- 2. debug-inventory prints no value of the desired state ----------------------------------
# key: (the env: value, the secret inside it, the value as `reconcile show` prints it)
PLANTED = {
    "EXTRA_ARGS": ("--api-key inlineSECRET2 --port 9", "inlineSECRET2", "--api-key *** --port 9"),
    "PROXY_URL": (
        "http://svc:pwSECRET3@proxy.lan:3128",
        "pwSECRET3",
        "http://svc:***@proxy.lan:3128",
    ),
    "HDRS": ("Authorization: Bearer tokSECRET4", "tokSECRET4", "***"),
}


def _repo(base: Path) -> Path:
    """A fleet repository: lab-incidents' desired state, this repository's inventory.py,
    deploys/ and roles/ (the reconciler package comes from PYTHONPATH)."""
    repo = base / "fleet"
    shutil.copytree(EXAMPLE, repo)
    shutil.copy(ROOT / "inventory.py", repo / "inventory.py")
    for part in ("deploys", "roles"):
        shutil.copytree(ROOT / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def _env(base: Path, **more: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "FAKE_"))}
    return environ | {
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
        "XDG_CACHE_HOME": str(base / "cache"),
        "FLEET_INVENTORY": "lab",
        "PYINFRA_PROGRESS": "off",
        **more,
    }


def test_debug_inventory_prints_the_desired_state_masked_as_show_does(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    thor = repo / "group_vars" / "thor.yaml"
    text = thor.read_text()
    pins = "".join(f'  {key}: "{value}"\n' for key, (value, _, _) in PLANTED.items())
    thor.write_text(text.replace("\nenv:\n", f"\nenv:\n{pins}", 1))
    fleet = load_fleet(repo, "lab")
    env = {e.key: e.value for e in expectations(fleet, ["thor"])["thor"].env}
    assert {k: env[k] for k in PLANTED} == {k: v for k, (v, _, _) in PLANTED.items()}  # loaded
    done = subprocess.run(
        [str(PYINFRA), "inventory.py", "debug-inventory"], cwd=repo, env=_env(tmp_path),
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert '"fleet_box": "thor"' in said  # thor's host data was printed
    for _, secret, _ in PLANTED.values():
        assert secret not in said
    # The rest of each value, and the rest of the desired state, still shown.
    data = host_data(fleet, "thor")
    for key, (_, _, shown) in PLANTED.items():
        assert data["desired"]["env"][key] == data["desired_env"][key] == shown
        assert f'"{key}": {json.dumps(shown)}' in said
    assert data["desired_env"]["VLLM_GDN_DECODE_KERNEL"] == "triton"
    assert data["desired_env"]["GATEWAY_API_KEY"] == {"secret": "gateway_api_key"}  # a reference
    assert data["desired"]["lanes"]["worker"]["role"] == "worker"


# -- 3. a per-box deploy connects to its box alone ---------------------------------------------
def test_a_per_box_deploy_names_its_box_and_anything_else_every_box(tmp_path: Path) -> None:
    from reconciler.desired.pyinfra_data import deploy_boxes  # new in review 7

    boxes = ["thor", "spark", "orin", "mesh"]  # a box named mesh: deploys/mesh.py is the mesh's
    (tmp_path / "deploys").mkdir()
    for name in ("thor", "orin", "mesh", "other"):
        (tmp_path / "deploys" / f"{name}.py").write_text("")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "thor.py").write_text("")
    d = tmp_path / "deploys"
    assert deploy_boxes([str(d / "thor.py")], tmp_path, boxes) == ["thor"]
    assert deploy_boxes(
        [str(d / "orin.py"), str(d / "thor.py"), str(d / "orin.py")], tmp_path, boxes
    ) == [
        "orin",
        "thor",
    ]
    for operations in (
        [str(d / "mesh.py")],
        [str(d / "thor.py"), str(d / "mesh.py")],
        [str(d / "other.py")],  # not a box
        [str(d / "spark.py")],  # no such file: pyinfra says so
        [str(tmp_path / "elsewhere" / "thor.py")],  # not this repository's deploys/
        ["debug-inventory"],
        ["exec", "--", "uptime"],
        ["fact", "server.Hostname"],
        [],
    ):
        assert deploy_boxes(operations, tmp_path, boxes) is None, operations
    fleet = load_fleet(EXAMPLE, "lab")
    only = pyinfra_groups(fleet, ["thor"])
    assert [name for name, _ in only["boxes"]] == ["@openssh/thor"]
    assert only["dgx"] == [] and only["jetson"] == ["@openssh/thor"]
    assert len(pyinfra_groups(fleet)["boxes"]) == 3


# pyinfra's CLI, ssh's connect faked (FAKE_UNREACHABLE fails as an unreachable box does),
# the boxes observed from the example's snapshot. Imported first, as `pyinfra` does: gevent.
FAKE_PYINFRA = """
import os, sys
import pyinfra_cli  # noqa: F401
from pathlib import Path

from pyinfra.api.exceptions import ConnectError
from reconciler.observe.openssh_connector import OpenSSHConnector
import reconciler.apply.engine as E
import reconciler.apply.operation as O
from reconciler.drift import run_drift_on
from reconciler.drift_inputs import drift_inputs


def connect(self):
    print(f"[connect {self.host.name}]", file=sys.stderr)
    if self.host.name in os.environ["FAKE_UNREACHABLE"].split(","):
        raise ConnectError("ssh: connect to host 10.77.0.99 port 22: No route to host")


def observe(fleet, boxes, *a, **k):
    return run_drift_on(drift_inputs(fleet), boxes, from_snapshot=Path(os.environ["FAKE_SNAPSHOT"]))


def execute(*a, **k):
    raise AssertionError("a dry run executed a converge")


OpenSSHConnector.connect = connect
E.run_drift, O.execute = observe, execute

from pyinfra_cli.main import main

sys.argv[0] = "pyinfra"
sys.exit(main())
"""


def _fake_pyinfra(base: Path, repo: Path, *args: str) -> tuple[int, str, list[str]]:
    fake = base / "fake_pyinfra.py"
    fake.write_text(FAKE_PYINFRA)
    done = subprocess.run(
        [sys.executable, str(fake), *args], cwd=repo,
        env=_env(base, FAKE_UNREACHABLE="spark", FAKE_SNAPSHOT=str(repo / "snapshot")),
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    said = done.stdout + done.stderr
    connected = [
        line[len("[connect ") : -1] for line in said.splitlines() if line.startswith("[connect ")
    ]
    return done.returncode, said, sorted(connected)


def planned(said: str) -> set[str]:
    """The boxes the deploy planned (its "[thor]  plan: ..." lines)."""
    return set(re.findall(r"^\s*\[(\w+)\]\s+plan: ", said, re.MULTILINE))


def test_a_box_deploy_connects_to_its_box_alone_and_the_mesh_to_every_box(tmp_path: Path) -> None:
    """The reviewer's repro: spark unreachable, `deploys/thor.py --dry` without -y and no
    terminal died in pyinfra's "continue?" prompt (EOFError, pyinfra-debug.log in the cwd)."""
    repo = _repo(tmp_path)
    code, said, connected = _fake_pyinfra(
        tmp_path, repo, "inventory.py", "deploys/thor.py", "--dry"
    )
    assert code == 0, said
    assert connected == ["thor"], said
    assert planned(said) == {"thor"}, said
    assert "EOFError" not in said and not (repo / "pyinfra-debug.log").exists()
    # The mesh still acts on every box: the unreachable one is said and fails the run (exit 1),
    # the others are planned (-y: pyinfra's rule goes on with them).
    code, said, connected = _fake_pyinfra(
        tmp_path, repo, "-y", "inventory.py", "deploys/mesh.py", "--dry"
    )
    assert code == 1, said
    assert connected == ["orin", "spark", "thor"], said
    assert "[spark] ssh: connect to host 10.77.0.99 port 22: No route to host" in said
    assert planned(said) == {"thor", "orin"}, said
    assert "Traceback" not in said


# -- 4. the repository's own code, whatever the working directory ------------------------------
def test_pyinfra_runs_this_repositorys_code_run_from_the_repository(tmp_path: Path) -> None:
    """A `reconciler` package ahead of this repository on sys.path (PYTHONPATH here; an
    editable install of another checkout in site-packages is the same): run from the
    repository, inventory.py imported it, since the cwd pyinfra appends made the check
    `root not in sys.path` false."""
    decoy = tmp_path / "decoy" / "reconciler"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text(
        "import sys\nprint('DECOY reconciler imported', file=sys.stderr)\nsys.exit(3)\n"
    )
    done = subprocess.run(
        [str(PYINFRA), "inventory.py", "debug-inventory"], cwd=ROOT,
        env=_env(tmp_path, PYTHONPATH=str(decoy.parent), FLEET_INVENTORY="hosts"),
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert "DECOY" not in said
    assert done.returncode == 0, said
    assert f'"fleet_root": "{ROOT}"' in said
