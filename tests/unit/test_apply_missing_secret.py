"""A controller_env secret whose variable is not set stops that box's converge before anything
is sent: one clear failure naming the variable and the secret, no exception, no SSH call."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reconciler.apply import engine
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift_on
from reconciler.drift_inputs import drift_inputs

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"


@pytest.fixture
def controller_sourced(tmp_path: Path) -> Path:
    """The lab-incidents example with the mesh key read from the controller's environment."""
    root = tmp_path / "fleet"
    shutil.copytree(EXAMPLE, root)
    layer = root / "group_vars" / "all.yaml"
    text = layer.read_text(encoding="utf-8")
    box_file = (
        "  mesh_key:                    # shared by every mesh member\n"
        "    source: box_file\n    path: ~/.lobes/.secrets.env\n    key: LOBES_MESH_KEY\n"
    )
    assert box_file in text
    layer.write_text(
        text.replace(
            box_file,
            "  mesh_key:\n    source: controller_env\n    variable: FLEET_TEST_MESH_KEY\n",
        ),
        encoding="utf-8",
    )
    return root


def test_an_unset_controller_variable_fails_the_box_before_anything_is_sent(
    controller_sourced: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLEET_TEST_MESH_KEY", raising=False)
    fleet = load_fleet(controller_sourced, "lab")
    # The drift of the state the snapshot was saved against: replayed against this one, whose
    # mesh key it never read, the key's line is not compared and the plan refused.
    saved = drift_inputs(load_fleet(EXAMPLE, "lab"))
    run = run_drift_on(saved, ["thor"], from_snapshot=controller_sourced / "snapshot")
    prep = engine.prepare(fleet, "thor", run)
    assert not prep.plan.empty and not prep.plan.blocked  # the incidents need a converge

    def no_ssh(*_args: object, **_kw: object) -> None:
        raise AssertionError("nothing may be sent to the box")

    monkeypatch.setattr(engine, "call_box", no_ssh)
    outcome = engine.execute(prep, "test")
    assert not outcome.ok and not outcome.changed and outcome.snapshot is None
    assert outcome.failed is not None
    assert "FLEET_TEST_MESH_KEY" in outcome.failed and "mesh_key" in outcome.failed
