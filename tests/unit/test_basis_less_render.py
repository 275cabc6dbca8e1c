"""A snapshot whose renders record no basis (saved by an older version: examples/lab-incidents)
replayed against a desired state edited since (compare/render_basis.py stale_without_basis).

The first thing an operator tries: copy the example, edit a knob, replay. The lanes' rendered
environments are still the old desired `.env`'s, and were reported as the new one's: after
`VLLM_GDN_DECODE_KERNEL: triton` -> `flashinfer`, the `.env` cause said `flashinfer` and its four
lane symptoms `triton`, nothing saying the render is another state's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reconciler.compare.box import compare_box
from reconciler.compare.drift import BoxResult, Part
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from reconciler.drift_inputs import drift_inputs
from reconciler.observe.observe import load_snapshot
from tests.unit.example_replay import EXAMPLE

EDIT = ("VLLM_GDN_DECODE_KERNEL: triton", "VLLM_GDN_DECODE_KERNEL: flashinfer")


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def example(tmp_path: Path, edit: tuple[str, str] | None = None) -> Path:
    root = tmp_path / "fleet"
    shutil.copytree(EXAMPLE, root)
    if edit is not None:
        path = root / "group_vars" / "thor.yaml"
        text = path.read_text(encoding="utf-8")
        assert text.count(edit[0]) == 1
        path.write_text(text.replace(*edit), encoding="utf-8")
    return root


def replayed(root: Path) -> dict[str, BoxResult]:
    fleet = load_fleet(root, "lab")
    run = run_drift(fleet, list(fleet.boxes), from_snapshot=root / "snapshot")
    return {b.box: b for b in run.report.boxes}


def render_errors(result: BoxResult) -> list[str]:
    return [str(e) for e in result.errors if getattr(e, "part", None) is Part.RENDER]


def test_the_premise_the_examples_renders_record_no_basis() -> None:
    for name, obs in load_snapshot(EXAMPLE / "snapshot")[1].items():
        assert obs.document is not None and obs.document.render.basis is None, name
        assert obs.document.render_current is None, name


def test_the_unedited_example_reads_its_renders(tmp_path: Path) -> None:
    for name, result in replayed(example(tmp_path)).items():
        assert render_errors(result) == [], name
        assert [d for d in result.drifts if d.kind.value == "env"], name  # lanes compared


def test_an_edited_knob_is_not_compared_against_the_old_render(tmp_path: Path) -> None:
    boxes = replayed(example(tmp_path, EDIT))
    (error,) = render_errors(boxes["thor"])
    assert "disagrees with the desired .env on VLLM_GDN_DECODE_KERNEL" in error
    assert "save the snapshot again" in error
    # No lane entry shows the old desired value; the .env line still shows the new one.
    gdn = [d for d in boxes["thor"].drifts if d.path == "VLLM_GDN_DECODE_KERNEL"]
    assert [(d.kind.value, d.desired) for d in gdn] == [("envfile", "flashinfer")]
    for name in ("spark", "orin"):  # the edit is thor's alone
        assert render_errors(boxes[name]) == [], name


def test_a_live_answer_is_never_judged_so(tmp_path: Path) -> None:
    """The check is a replay's: a live collector renders the desired `.env` itself (the same
    answer compared without `replay` keeps its render)."""
    root = example(tmp_path, EDIT)
    inputs = drift_inputs(load_fleet(root, "lab"))
    obs = load_snapshot(root / "snapshot")[1]["thor"]
    assert obs.document is not None
    live = compare_box(inputs.expectations["thor"], obs.document, obs.probes)
    assert render_errors(live) == []
