"""A live `reconcile import` with a bad $FLEET_BOX_TIMEOUT or $FLEET_MAX_PARALLEL names the
variable, exit 1, before any box is contacted. import has neither --timeout nor
--max-parallel, so before it printed only "error: a timeout is more than 0 s ..., not nan":
nothing said where the value came from. Captured data: examples/lab-incidents' inventory."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.observe import transport
from tests.unit.test_import_hostile import INCIDENTS


@pytest.mark.parametrize(
    ("variable", "value"), [("FLEET_BOX_TIMEOUT", "nan"), ("FLEET_MAX_PARALLEL", "abc")]
)
def test_a_bad_setting_is_named_before_any_box_is_contacted(
    variable: str,
    value: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spawned: list[object] = []
    monkeypatch.setattr(transport, "spawn", lambda *a, **k: spawned.append(a))
    monkeypatch.setenv(variable, value)
    out = tmp_path / "adopted"
    code = main(["--root", str(INCIDENTS), "-i", "lab", "import", "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert f"${variable}:" in err, err
    assert spawned == [] and not out.exists()
