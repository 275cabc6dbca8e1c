"""An inventory that names no box: `validate`, `drift`, `audit` and `apply` passed it green
("ok: 0 boxes", "no differences on 0 of 0 boxes", "mesh ok"), so a gate pointed at an emptied
or template inventory judged nothing and said all was well. It is now refused at its line,
exit 1, before anything runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.unit.history_helpers import INCIDENTS, reconcile


@pytest.mark.parametrize("boxes", ["{}", ""])
@pytest.mark.parametrize(
    "command", [["validate"], ["drift"], ["audit"], ["apply", "--dry"], ["show"]]
)
def test_an_inventory_without_boxes_is_refused_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], boxes: str
) -> None:
    root = tmp_path / "fleet"
    shutil.copytree(INCIDENTS / "group_vars", root / "group_vars")
    (root / "inventory").mkdir()
    (root / "inventory" / "lab.yaml").write_text(
        f"group_order: [gpu, jetson, dgx]\n# every box retired\nboxes: {boxes}\n"
    )
    code, out, err = reconcile(capsys, *command, root=root)
    assert (code, out) == (1, "")
    assert err.startswith("inventory/lab.yaml:3:1: boxes: ")
    assert "invalid desired state: 1 problem" in err
    if boxes == "{}":
        assert "no boxes: an inventory names at least one box" in err
