"""The pyinfra side after review (/tmp/review-deploys' repros): the deploys plan from the
repository pyinfra's hosts came from, never $FLEET_ROOT or the working directory; boxes
converge one at a time in mesh order whatever order pyinfra keeps its hosts in, and
deploys/mesh.py refuses --serial and --no-wait; a box that cannot be planned (a controller
secret unset, an invalid desired state) fails alone, in one line, without pyinfra's traceback;
a connection pyinfra was told to make elsewhere than the inventory says is refused; the mesh
verify checks only this run's boxes, from the last of them; a mesh in sync reports no change.

The fleet is the lab-incidents example, observed from its snapshot. `pyinfra` runs as a
subprocess through a wrapper that fakes the boxes (connect, observe, converge, verify), as
the reviewer's fakepyi*.py did; `reconcile apply` runs in this process (test_apply_review_fixes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler import records
from reconciler.apply import engine, operation, session
from reconciler.desired.load import load_fleet
from reconciler.desired.pyinfra_data import host_data
from reconciler.plan import Plan
from tests.unit.test_apply_review_fixes import EXAMPLE, apply_main, observed

ROOT = Path(__file__).resolve().parents[2]

# pyinfra's CLI with the boxes faked. Imported first, as `pyinfra` does: its gevent patching.
FAKE_PYINFRA = """
import os, sys
import pyinfra_cli  # noqa: F401
from pathlib import Path

from reconciler.observe.openssh_connector import OpenSSHConnector

OpenSSHConnector.connect = lambda self: None

import reconciler.apply.engine as E
import reconciler.apply.operation as O
from reconciler.drift import run_drift_on
from reconciler.drift_inputs import drift_inputs
from reconciler.observe.controller_secrets import MissingControllerSecret
from reconciler.plan import Plan

SNAPSHOT = Path(os.environ["FAKE_SNAPSHOT"])
MISSING = os.environ.get("FAKE_MISSING_SECRET_FOR", "")


def observe(fleet, boxes, *a, **k):
    print(f"[observe {','.join(boxes)} from {fleet.root}]", file=sys.stderr)
    if MISSING in boxes:
        raise MissingControllerSecret({("FLEET_TEST_KEY", "gateway_key"): [MISSING]})
    return run_drift_on(drift_inputs(fleet), boxes, from_snapshot=SNAPSHOT)


def execute(prep, who, on_event=None):
    print(f"[converge {prep.box}]", file=sys.stderr)
    return E.Outcome(prep.box, ok=True, changed=True, plan=prep.plan, started_at="t")


def settle(fleet, boxes):
    print(f"[verify {','.join(boxes)}]", file=sys.stderr)
    return None, []


E.run_drift, O.execute, O.settle = observe, execute, settle
if os.environ.get("FAKE_IN_SYNC"):
    E.plan_box = lambda result, exp: Plan(result.box)

from pyinfra_cli.main import main

sys.argv[0] = "pyinfra"
sys.exit(main())
"""


@pytest.fixture(scope="module")
def fleet_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fleet repository: lab-incidents' desired state and snapshot, this repository's
    inventory.py, deploys/ and roles/ (the reconciler package comes from PYTHONPATH)."""
    base = tmp_path_factory.mktemp("deploys")
    repo = base / "fleet"
    shutil.copytree(EXAMPLE, repo)
    shutil.copy(ROOT / "inventory.py", repo / "inventory.py")
    for part in ("deploys", "roles"):
        shutil.copytree(ROOT / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    (base / "fake_pyinfra.py").write_text(FAKE_PYINFRA)
    return repo


def pyinfra(
    repo: Path, *args: str, cwd: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """`pyinfra ARGS` through the fake, in `cwd` (default: the repository)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "FAKE_"))}
    environ |= {
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
        "XDG_CACHE_HOME": str(repo.parent / "cache"),
        "FLEET_INVENTORY": "lab",
        "FAKE_SNAPSHOT": str(repo / "snapshot"),
        "PYINFRA_PROGRESS": "off",
        **env,
    }
    argv = [sys.executable, str(repo.parent / "fake_pyinfra.py"), *args]
    return subprocess.run(
        argv, cwd=cwd or repo, env=environ, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip


def said(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout + done.stderr


def fake_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    """What the fake said it did: observations, converges and verifications, in order."""
    return [line for line in said(done).splitlines() if line.startswith("[")]


# -- 1. one repository: the one inventory.py is in --------------------------------------------
def test_the_deploy_plans_from_its_inventorys_repository_whatever_fleet_root_and_cwd(
    fleet_repo: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"  # another fleet repository, exported as operators do
    for part in ("inventory", "group_vars", "facts"):
        shutil.copytree(fleet_repo / part, other / part)
    elsewhere = tmp_path / "elsewhere"  # no repository here or above
    elsewhere.mkdir()
    done = pyinfra(
        fleet_repo, "-y", str(fleet_repo / "inventory.py"), str(fleet_repo / "deploys/thor.py"),
        cwd=elsewhere, FLEET_ROOT=str(other),
    )  # fmt: skip
    assert done.returncode == 0, said(done)
    assert "Traceback" not in said(done)
    assert fake_lines(done) == [f"[observe thor from {fleet_repo}]", "[converge thor]"]


def test_the_inventorys_host_data_names_its_repository_and_inventory(fleet_repo: Path) -> None:
    done = pyinfra(fleet_repo, "inventory.py", "debug-inventory")
    assert done.returncode == 0, said(done)
    assert f'"fleet_root": "{fleet_repo}"' in said(done)
    assert '"fleet_inventory": "inventory/lab.yaml"' in said(done)


# -- 2. mesh order, whatever order pyinfra keeps its hosts in ---------------------------------
def test_reconcile_apply_converges_in_mesh_order_whatever_order_pyinfra_keeps_hosts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from pyinfra.api.inventory import Inventory

    order = ["thor", "spark", "orin"]
    # pyinfra's active hosts are a set: any order is theirs. The reverse of mesh order here.
    monkeypatch.setattr(
        Inventory,
        "get_active_hosts",
        lambda self: sorted(self.state.active_hosts, key=lambda h: -order.index(h.name)),
    )
    ran: list[str] = []

    def execute(prep: engine.Prepared, who: str, on_event: Any = None) -> engine.Outcome:
        ran.append(prep.box)
        return engine.Outcome(prep.box, ok=True, changed=True, plan=prep.plan, started_at="t")

    monkeypatch.setattr(operation, "execute", execute)
    assert apply_main(monkeypatch, "--yes", "--evidence", str(tmp_path)) == 0
    assert session.mesh_boxes() == order
    assert ran == order


def test_a_box_that_fails_in_apply_leaves_the_others_to_converge(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[str] = []

    def execute(prep: engine.Prepared, who: str, on_event: Any = None) -> engine.Outcome:
        ran.append(prep.box)
        ok = prep.box != "thor"
        return engine.Outcome(prep.box, ok=ok, changed=True, plan=prep.plan, started_at="t")

    monkeypatch.setattr(operation, "execute", execute)
    assert apply_main(monkeypatch, "--yes", "--evidence", str(tmp_path)) == 1
    assert ran == ["thor", "spark", "orin"]
    out = capsys.readouterr().out
    assert "thor: FAILED" in out and "spark: converged" in out and "orin: converged" in out


@pytest.mark.parametrize("flag", ["--serial", "--no-wait"])
def test_the_mesh_deploy_refuses_a_flow_that_cannot_keep_mesh_order(
    fleet_repo: Path, flag: str
) -> None:
    done = pyinfra(fleet_repo, "-y", flag, "inventory.py", "deploys/mesh.py")
    assert done.returncode == 1
    assert f"{flag} would run them host by host in no set order" in said(done)
    assert "Traceback" not in said(done)
    assert not [line for line in fake_lines(done) if line.startswith("[converge")]


# -- 3. a box that cannot be planned fails alone, in one line ---------------------------------
def test_an_unset_controller_secret_blocks_that_box_only_without_a_traceback(
    fleet_repo: Path,
) -> None:
    done = pyinfra(
        fleet_repo, "-y", "inventory.py", "deploys/mesh.py", FAKE_MISSING_SECRET_FOR="spark"
    )
    text = said(done)
    assert done.returncode == 1, text
    assert "Traceback" not in text and "exception" not in text.lower()
    refusal = (
        "spark: not converged: blocked: controller secret: secret gateway_key: "
        "$FLEET_TEST_KEY is not set on this controller (needed to check spark); "
        "no box was contacted"
    )
    assert refusal in text.splitlines()
    converged = [line for line in fake_lines(done) if not line.startswith("[observe")]
    assert converged == ["[converge thor]", "[converge orin]", "[verify thor,orin]"]


def test_an_invalid_desired_state_blocks_the_box_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in (("_fleet", []), ("_prepared", {}), ("_blocked", {})):
        monkeypatch.setattr(session, name, value)
    plan = session.plan("thor", {"fleet_box": "thor"})  # host data of another inventory
    assert plan.blocked and not plan.steps
    assert "names no fleet_root" in plan.blocked[0]
    assert session.plan("thor") is plan  # the operation reads the same refusal


# -- 4. pyinfra told to connect elsewhere ------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "key"),
    [(["--user", "admin"], "ssh_user"), (["--data", "ssh_hostname=10.9.9.9"], "ssh_hostname")],
)
def test_a_connection_override_is_refused_naming_the_key(
    fleet_repo: Path, args: list[str], key: str
) -> None:
    done = pyinfra(fleet_repo, "-y", *args, "inventory.py", "deploys/thor.py")
    assert done.returncode == 1, said(done)
    assert f"thor: not converged: blocked: connection: pyinfra connects with {key} " in said(done)
    assert fake_lines(done) == []  # neither observed nor converged


def test_the_inventorys_own_connection_is_no_override() -> None:
    fleet = load_fleet(EXAMPLE, "lab")
    data = host_data(fleet, "thor")
    assert session.connection_overrides(fleet, "thor", data) == []
    same = data | {"ssh_port": "22", "ssh_key": os.path.relpath(data["ssh_key"])}
    assert session.connection_overrides(fleet, "thor", same) == []
    moved = data | {"ssh_port": 2222, "ssh_key": "/tmp/other-key", "ssh_password": "x"}
    assert session.connection_overrides(fleet, "thor", moved) == [
        "ssh_key", "ssh_password", "ssh_port",
    ]  # fmt: skip


# -- 5. --limit: this run's boxes only --------------------------------------------------------
@pytest.mark.parametrize(
    ("limit", "verified"), [(["thor", "spark"], "thor,spark"), (["spark", "orin"], "spark,orin")]
)
def test_the_mesh_verify_checks_only_the_limited_boxes_from_the_last_of_them(
    fleet_repo: Path, limit: list[str], verified: str
) -> None:
    flags = [arg for box in limit for arg in ("--limit", box)]
    done = pyinfra(fleet_repo, "-y", *flags, "inventory.py", "deploys/mesh.py")
    assert done.returncode == 0, said(done)
    converged = [line for line in fake_lines(done) if not line.startswith("[observe")]
    assert converged == [*(f"[converge {b}]" for b in limit), f"[verify {verified}]"]
    assert f"mesh: no drift left on {verified.replace(',', ', ')}" in said(done)


# -- 6. a mesh in sync reports no change ------------------------------------------------------
@pytest.mark.parametrize(("todo", "changes"), [((), 0), (("spark",), 1)])
def test_the_mesh_verify_is_a_change_only_when_a_box_converges(
    monkeypatch: pytest.MonkeyPatch, todo: tuple[str, ...], changes: int
) -> None:
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all
    from pyinfra.api.operation import add_op

    from reconciler.observe.openssh_connector import OpenSSHConnector

    fleet = load_fleet(EXAMPLE, "lab")
    boxes = ["thor", "spark", "orin"]
    run = observed(fleet, boxes)
    prepared = {b: engine.prepare(fleet, b, run) for b in boxes}
    for box in boxes:  # in sync, but for the boxes in `todo`
        if box not in todo:
            prepared[box] = records.replace(prepared[box], plan=Plan(box))
    session.use(fleet, prepared)
    monkeypatch.setattr(OpenSSHConnector, "connect", lambda self: None)
    state = State(Inventory(([("@openssh/orin", host_data(fleet, "orin"))], {})), Config())
    connect_all(state)
    add_op(state, operation.verify_mesh, boxes=boxes)
    (host,) = state.inventory
    assert state.get_meta_for_host(host).ops_change == changes


def test_the_collected_fact_reads_the_inventorys_repository_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pyinfra inventory.py fact reconciler.observe.fact.Collected` builds the payload from the
    repository inventory.py names in host data, as the deploys do, whatever FLEET_ROOT or the
    working directory say."""
    from types import SimpleNamespace

    from reconciler.observe import fact

    example = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("FLEET_ROOT", str(tmp_path / "not-a-repository"))
    monkeypatch.chdir(tmp_path)
    fact._inputs.cache_clear()
    data = {"fleet_root": str(example), "fleet_inventory": "lab", "fleet_box": "thor"}
    host = SimpleNamespace(name="thor", data=SimpleNamespace(get=data.get))
    collected = fact.Collected()
    assert collected.check_preconditions(None, host) is None  # type: ignore[arg-type]
    assert collected.command()  # the collector's command line, its payload from the example
    assert fact._inputs.cache_info().currsize == 1
    inputs = fact._inputs(str(example), "lab")
    assert sorted(inputs.boxes) == ["orin", "spark", "thor"]
    fact._inputs.cache_clear()
