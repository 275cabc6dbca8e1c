"""A bad $FLEET_BOX_TIMEOUT or $FLEET_MAX_PARALLEL on the converge routes: named on one line,
exit 1, before any box is observed, as drift, audit and import name it. Before, `apply` (and
`--dry`) ended in a traceback from the observation (observe.py's fanout.box_timeout()), and a
pyinfra deploy in "An exception occurred in: deploys/thor.py" and the same traceback.
Captured data: the lab-incidents example (its inventory, desired state and snapshot)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.apply import session
from reconciler.apply.summary import summary_line
from reconciler.cli import main
from reconciler.desired.load import load_fleet
from reconciler.desired.pyinfra_data import host_data
from reconciler.observe import fanout
from tests.unit.test_apply_review_fixes import EXAMPLE, faked_calls
from tests.unit.test_observe_review_fixes import no_box_contacted

BAD = [
    ("FLEET_BOX_TIMEOUT", "0", "a timeout is more than 0 s and at most 86400 s, not 0"),
    ("FLEET_MAX_PARALLEL", "abc", "not a whole number of boxes: 'abc'"),
]


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No box is contacted, no cache outside tmp_path, no option left by an earlier test's
    command, and a session of its own (pyinfra's route keeps one per process)."""
    no_box_contacted(monkeypatch)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(fanout, "_configured", {})
    for name, value in (("_fleet", []), ("_prepared", {}), ("_blocked", {}), ("outcomes", {})):
        monkeypatch.setattr(session, name, value)


@pytest.mark.parametrize("dry", [True, False])
@pytest.mark.parametrize(("variable", "value", "said"), BAD)
def test_apply_names_the_variable_before_any_box_is_observed(
    variable: str,
    value: str,
    said: str,
    dry: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    asked = faked_calls(monkeypatch)  # any converge, rollback or mark-good call: recorded
    monkeypatch.setenv(variable, value)
    evidence = tmp_path / "evidence"
    mode = ["--dry"] if dry else ["--yes", "--evidence", str(evidence)]
    code = main(["--root", str(EXAMPLE), "-i", "lab", "apply", "thor", *mode])
    out, err = capsys.readouterr()
    assert code == 1
    assert err == f"error: ${variable}: {said}; nothing changed\n"
    assert out == ""  # no drift printed: nothing was observed
    assert asked == [] and not evidence.exists()


def test_an_earlier_commands_timeout_does_not_hide_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """apply has no --timeout: it reads the environment, not what a drift run in the same
    process was given (fanout.configure: each command starts from its own options)."""
    fanout.configure(timeout=5.0)
    monkeypatch.setenv("FLEET_BOX_TIMEOUT", "nan")
    code = main(["--root", str(EXAMPLE), "-i", "lab", "apply", "thor", "--dry"])
    assert code == 1
    assert capsys.readouterr().err.startswith("error: $FLEET_BOX_TIMEOUT: ")


@pytest.mark.parametrize(("variable", "value", "said"), BAD)
def test_a_pyinfra_deploy_fails_the_host_in_one_line_naming_the_variable(
    variable: str, value: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """roles/box.py's converge_box asks session.plan with the host's data (inventory.py's):
    a blocked plan fails that host while planning, with its summary line; no traceback."""
    monkeypatch.setenv(variable, value)
    data = host_data(load_fleet(EXAMPLE, "lab"), "thor") | {"fleet_root": str(EXAMPLE)}
    plan = session.plan("thor", data)
    assert plan.blocked and not plan.steps
    assert summary_line(plan) == f"blocked: ${variable}: {said}"
    assert session.plan("thor") is plan  # the operation reads the same refusal


@pytest.mark.parametrize(("variable", "value", "said"), BAD)
def test_pyinfra_refuses_a_bad_setting_before_it_connects_to_any_host(
    tmp_path: Path, variable: str, value: str, said: str
) -> None:
    """The real pyinfra CLI on a copy of the repository: inventory.py refuses the setting
    while pyinfra loads the inventory, before "Connecting to hosts" (before, it connected to
    thor, then blocked the plan)."""
    import os
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    for part in ("inventory", "group_vars", "deploys", "roles"):
        shutil.copytree(root / part, fleet / part)
    shutil.copy(root / "inventory.py", fleet / "inventory.py")
    (fleet / "reconciler").symlink_to(root / "reconciler")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        variable: value,
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("pyinfra")), "-y", "inventory.py",
         "deploys/thor.py", "--dry"],
        cwd=fleet, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"error: ${variable}: {said}; nothing changed" in done.stderr
    assert "Connecting" not in done.stdout + done.stderr
