"""Review 3, item 1: a snapshot without `lanes` or `gateway` is never read as "in sync".

Before, a replayed snapshot whose `lanes` was absent or null read as no lane probes (the lane
contract drifts vanished without a word) and one without `gateway` as no gateway probes (the
capabilities drifts vanished): the box's result now says which checks were not made, as for
`docker`, `render`, `variables` and `login_shell`, and the msgspec fast path reads the same
document. A live answer without either, or with either null, is that box's fault, naming it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from reconciler import records
from reconciler.compare.box import compare_box
from reconciler.compare.drift import BoxResult, Part
from reconciler.observe.document import Fault, FaultKind, parse_answer
from reconciler.observe.observe import snapshot_observation
from reconciler.report import render
from tests.unit.test_document_c import _both
from tests.unit.test_observe_review2_nulls import _snapshot_doc, answer, capture, report
from tests.unit.test_observe_review2_nulls import thor_exp as thor_exp

SECTIONS = ("lanes", "gateway")


@pytest.mark.parametrize("key", SECTIONS)
@pytest.mark.parametrize("how", ["absent", "null"])
def test_a_snapshot_without_lanes_or_gateway_says_which_checks_were_not_made(
    thor_exp: Any,
    key: str,
    how: str,
) -> None:
    full = compare_box(thor_exp, _snapshot_doc())
    assert not [e for e in full.errors if "not in this observation" in e]
    doc = _snapshot_doc(**{key: ... if how == "absent" else None})
    result = compare_box(thor_exp, doc)
    said = [e for e in result.errors if e.where == key]
    assert len(said) == 1 and said[0].part is Part.GATEWAY_PROBE
    assert said[0].what.startswith("not in this observation (a snapshot without it): ")
    assert said[0].what.endswith(" not compared")
    assert report(result).exit_code == 1  # not "no drift", not only "drift"


@pytest.mark.parametrize("key", SECTIONS)
def test_no_report_calls_a_box_in_sync_without_them(thor_exp: Any, key: str) -> None:
    errors = compare_box(thor_exp, _snapshot_doc(**{key: ...})).errors
    result = BoxResult("thor", True, (), errors)
    for fmt in ("text", "markdown", "json"):
        shown = render(report(result), fmt)
        assert f"{key}: not in this observation" in shown, fmt
        assert "in sync" not in shown.lower().replace("exit 0 = in sync", ""), fmt
    html = render(report(result), "html")
    assert f'title="not observed: {key}: not in this observation' in html


def test_a_box_without_lanes_desired_needs_no_lane_probes(thor_exp: Any) -> None:
    bare = records.replace(thor_exp, lanes={})
    result = compare_box(bare, _snapshot_doc(lanes=...))
    assert not [e for e in result.errors if e.where == "lanes"]


def test_an_empty_lanes_section_was_observed(thor_exp: Any) -> None:
    # The collector writes `{}` when docker could not list containers: observed, not absent.
    doc = _snapshot_doc(lanes={})
    assert doc.lanes_observed and doc.gateway.observed
    assert not [e for e in compare_box(thor_exp, doc).errors if e.where == "lanes"]


@pytest.mark.parametrize("key", SECTIONS)
@pytest.mark.parametrize("how", ["absent", "null"])
def test_a_live_answer_without_lanes_or_gateway_is_malformed_naming_it(key: str, how: str) -> None:
    doc = answer()
    if how == "absent":
        del doc[key]
    else:
        doc[key] = None
    got = parse_answer(json.dumps(doc))
    assert isinstance(got, Fault), f"{key} {how} was read as an answer"
    assert got.kind is FaultKind.MALFORMED and got.path == key
    assert ("missing" if how == "absent" else "null") in got.message


@pytest.mark.parametrize("key", SECTIONS)
@pytest.mark.parametrize("how", ["absent", "null"])
def test_the_c_path_reads_a_snapshot_without_them_as_document_py(
    tmp_path: Path, key: str, how: str
) -> None:
    raw = capture()
    if how == "absent":
        del raw["collected"][key]
    else:
        raw["collected"][key] = None
    path = tmp_path / "thor.json"
    path.write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    typed, c_path, two_steps = _both(path)
    assert typed and c_path == two_steps
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    for in_c, kept in ((True, False), (False, True), (False, False)):
        doc = snapshot_observation("thor", path, digest, in_c=in_c, raw_kept=kept).document
        assert doc is not None
        assert doc.lanes_observed is (key != "lanes")
        assert doc.gateway.observed is (key != "gateway")
