"""A snapshot replayed against a desired state changed since (review 6): compare read a render
of another `.env` (reconciler/compare/render_basis.py `for_desired`).

tests/fixtures/import/lab_desired/ is the pristine lab observed by `drift --save-snapshot`:
each answer holds compose's render of the lab's desired `.env` and of the box's own, each with
its basis. Replayed against the lab's state with thor's worker window changed to 131072 (the
reviewer's repo2), neither render is of the desired `.env`: compare fell back to the render of
the old one and reported a false dead knob (`--max-model-len 131072 -> 262144`, restore-file)
while missing the argv and env drift a live run shows. Where the snapshot held one render,
it was read without looking at its basis at all. Now the render-based checks are not made for
that box, and the box says why (a render error): partial, never wrong.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reconciler.compare import render_basis
from reconciler.compare.box import compare_box
from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import Kind, Part
from reconciler.desired.facts import snapshot_facts
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import drift_inputs
from reconciler.observe.document import Observed
from reconciler.observe.observe import load_snapshot
from reconciler.plan import plan_box
from reconciler.records import replace

REPO = Path(__file__).resolve().parents[2]
LAB_DESIRED = REPO / "tests/fixtures/import/lab_desired"
EXAMPLE = REPO / "examples/lab-incidents"  # saved before renders had a basis


def docs(snapshot: Path) -> dict[str, Observed]:
    out = {}
    for name, obs in load_snapshot(snapshot)[1].items():
        assert obs.document is not None, name
        out[name] = obs.document
    return out


def expectations(tmp_path: Path, window: int | None) -> dict[str, BoxExpectation]:
    """The lab's desired state (a copy), thor's worker window set to `window` (None: as is)."""
    root = tmp_path / "fleet"
    for part in ("group_vars", "inventory"):
        shutil.copytree(REPO / part, root / part)
    if window is not None:
        thor = root / "group_vars" / "thor.yaml"
        text = thor.read_text(encoding="utf-8")
        assert text.count("262144") == 2  # lanes.worker.max_model_len, contract.worker.context
        thor.write_text(text.replace("262144", str(window)), encoding="utf-8")
    fleet = load_fleet(root, "lab", facts=snapshot_facts(LAB_DESIRED))
    return drift_inputs(fleet).expectations


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _render_error(result_errors: tuple[str, ...]) -> list[str]:
    return [e for e in result_errors if getattr(e, "part", None) is Part.RENDER]


def test_the_unchanged_state_reads_the_snapshots_render(tmp_path: Path, cache: None) -> None:
    """The premise: the snapshot holds the render of the lab's desired `.env`, read as is."""
    exp = expectations(tmp_path, None)
    thor = docs(LAB_DESIRED)["thor"]
    assert render_basis.for_desired(thor, exp["thor"].env) is thor
    assert not _render_error(compare_box(exp["thor"], thor).errors)


def test_a_changed_desired_state_is_not_compared_with_a_stale_render(
    tmp_path: Path, cache: None
) -> None:
    exp = expectations(tmp_path, 131072)["thor"]
    doc = docs(LAB_DESIRED)["thor"]
    result = compare_box(exp, doc)
    # Before: `compose-file lane:vllm-worker --max-model-len 131072 -> 262144` (the old
    # render's window taken for a hard-coded flag), no error.
    dead = [d for d in result.drifts if d.kind is Kind.COMPOSE_FILE]
    assert dead == [], dead
    # Nothing compared with a render: no argv, env or runtime entry; the box says why.
    assert [d for d in result.drifts if d.kind in (Kind.ARGV, Kind.ENV)] == []
    (error,) = _render_error(result.errors)
    assert "no compose render of this desired .env" in error
    # What needs no render is still compared: the `.env` key the state changed.
    assert any(d.kind is Kind.ENVFILE and d.path == "WORKER_MAX_MODEL_LEN" for d in result.drifts)
    # A plan is refused rather than made from half a comparison.
    assert plan_box(result, exp).blocked


def test_a_snapshot_holding_one_render_is_judged_by_its_basis(tmp_path: Path, cache: None) -> None:
    """An answer with a single render (the collector renders the box's own `.env` only where
    it differs from the desired one) was read whatever its basis."""
    doc = docs(LAB_DESIRED)["thor"]
    one = replace(doc, render_current=None, render_login_current=None)
    assert one.render.basis is not None
    unchanged = expectations(tmp_path / "a", None)["thor"]
    assert render_basis.for_desired(one, unchanged.env) is one
    changed = expectations(tmp_path / "b", 131072)["thor"]
    chosen = render_basis.for_desired(one, changed.env)
    assert chosen.render.services is None and chosen.render.error == render_basis.NO_RENDER
    assert chosen.render_login is not None and chosen.render_login.services is None
    assert _render_error(compare_box(changed, one).errors)


def test_an_answer_without_bases_is_read_as_before() -> None:
    """A live answer (and a snapshot saved before renders had a basis) carries no basis: its
    render is the desired `.env`'s, whatever the desired state (a live run renders it)."""
    fleet = load_fleet(EXAMPLE, "lab")
    exp = drift_inputs(fleet).expectations
    for name, doc in docs(EXAMPLE / "snapshot").items():
        assert doc.render.basis is None and doc.render_current is None, name
        assert render_basis.for_desired(doc, exp[name].env) is doc
        assert render_basis.for_desired(doc, ()) is doc
