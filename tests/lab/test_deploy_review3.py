"""The real `pyinfra inventory.py deploys/<x>.py --dry` against the lab when a box's plan is
blocked (review 3, defect 6): a controller secret of inventory/lab-controller.yaml unset. The
dry run used to exit 0, listing the refusal as a change; it exits 1 now, naming the box and
why, and with -y the other boxes are still observed and planned. Dry runs only: nothing on
any box changes, so nothing is reset.

Run under the lab lock:
    flock /tmp/lab.lock .venv/bin/pytest tests/lab/test_deploy_review3.py
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest

from lab.config import REPO
from tests.lab import audit_scenarios as sc
from tests.lab.test_controller_secrets import INVENTORY, OWN_ENV, controller_env

pytestmark = pytest.mark.lab

PYINFRA = REPO / ".venv" / "bin" / "pyinfra"


def dry_run(deploy: str, *flags: str, env: dict[str, str]) -> tuple[int, str]:
    """`pyinfra FLAGS inventory.py deploys/DEPLOY --dry`, stdin not a terminal (as in CI)."""
    done = subprocess.run(
        [str(PYINFRA), *flags, "inventory.py", f"deploys/{deploy}", "--dry"],
        cwd=REPO, env={**OWN_ENV, "FLEET_INVENTORY": INVENTORY, "PYINFRA_PROGRESS": "off", **env},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    text = done.stdout + done.stderr
    for value in sc.lab_secrets().values():
        assert value not in text, "a secret value appears in pyinfra's output"
    return done.returncode, text


def plans(text: str) -> dict[str, list[str]]:
    """Each box's plan lines, as the deploy prints them ("[thor]  plan: ...")."""
    found: dict[str, list[str]] = {}
    for box, line in re.findall(r"\[(\w+)\]\s+plan: (.*)", text):
        found.setdefault(box, []).append(line)
    return found


def test_a_dry_run_of_a_box_whose_controller_secret_is_unset_exits_1(lab: Any) -> None:
    """The reviewer's repro: thor's gateway key and the mesh key unset, no -y."""
    env = controller_env()
    for name in ("FLEET_LAB_THOR_GATEWAY_KEY", "FLEET_LAB_MESH_KEY"):
        env.pop(name)
    code, text = dry_run("thor.py", env=env)
    assert code == 1, text
    refusal = [line for line in text.splitlines() if line.startswith("thor: not converged: ")]
    assert len(refusal) == 1, text
    assert "$FLEET_LAB_THOR_GATEWAY_KEY is not set" in refusal[0]
    assert "$FLEET_LAB_MESH_KEY is not set" in refusal[0]
    # deploys/thor.py connects thor alone (inventory.py): no other box to go on with.
    assert "thor cannot be converged and no other box of this run is left" in text
    assert "Traceback" not in text


def test_one_blocked_box_fails_the_mesh_dry_run_and_the_others_are_planned(lab: Any) -> None:
    env = controller_env()
    env.pop("FLEET_LAB_SPARK_GATEWAY_KEY")
    code, text = dry_run("mesh.py", "-y", env=env)
    assert code == 1, text
    found = plans(text)
    assert sorted(found) == ["orin", "spark", "thor"], text
    assert found["spark"][0].startswith("cannot converge: controller secret: ")
    for box in ("thor", "orin"):  # observed over SSH and planned, whatever their plan says
        assert not any(line.startswith("cannot converge") for line in found[box]), text
    assert [line for line in text.splitlines() if ": not converged: " in line] == [
        line for line in text.splitlines() if line.startswith("spark: not converged: blocked: ")
    ]
    assert "Traceback" not in text


def test_the_mesh_verify_skips_a_blocked_last_box_and_a_lone_blocked_box_says_so(
    lab: Any,
) -> None:
    """Review 4, defect 4: orin, last in mesh order (thor, spark, orin), blocked. The verify
    was orin's operation, which never runs (its host fails while planning): thor and spark
    would be converged and never verified. It is spark's now, naming the boxes it verifies.
    Operations are only listed (--debug-operations), none runs. Then orin alone (--limit
    orin): pyinfra's "No hosts remaining!" was the last word; the run now says why it ends."""
    env = controller_env()
    env.pop("FLEET_LAB_ORIN_GATEWAY_KEY")
    code, text = dry_run("mesh.py", "-y", "--debug-operations", env=env)
    assert code == 1, text
    order = [line.strip() for line in text.split("--> Operation order:", 1)[1].splitlines()]
    verify = [line for line in order if "mesh: verify" in line]
    assert len(verify) == 1, text
    assert "names={'mesh: verify thor, spark (no drift left)'}, hosts={" in verify[0]
    # On every box verified (the last one still active checks the mesh), never on the blocked.
    assert "Host(thor)" in verify[0] and "Host(spark)" in verify[0], verify[0]
    assert "Host(orin)" not in verify[0], verify[0]
    code, text = dry_run("mesh.py", "-y", "--limit", "orin", env=env)
    assert code == 1, text
    assert "orin: not converged: blocked: controller secret: " in text
    assert "No hosts remaining" not in text and "Traceback" not in text
    assert text.rstrip().endswith(
        "orin cannot be converged and no other box of this run is left: nothing converged"
    ), text
