"""The JSON report's writer (report/json_report.indented) is json.dumps(indent=2,
ensure_ascii=False, allow_nan=False) byte for byte, on generated documents and a real report."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.report.json_report import indented

ROOT = Path(__file__).resolve().parents[2]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),  # quotes, backslashes, control characters, non-ASCII
)
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=4), inner, max_size=5)
    ),
    max_leaves=40,
)


def _dumps(document: Any) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False)


@given(DOCUMENTS)
def test_the_same_text_as_json_dumps(document: Any) -> None:
    assert indented(document) == _dumps(document)


def test_a_real_report_and_the_schema() -> None:
    for path in (
        ROOT / "schema" / "drift-report.schema.json",
        *sorted(ROOT.glob("tests/fixtures/**/*.json"))[:20],
    ):
        document = json.loads(path.read_text(encoding="utf-8"))
        assert indented(document) == _dumps(document), path


def test_what_json_dumps_refuses_or_converts_is_left_to_it() -> None:
    assert indented({"a": (1, 2), 3: {"b": [None]}}) == _dumps({"a": (1, 2), 3: {"b": [None]}})
    with pytest.raises(ValueError):
        indented({"a": [math.nan]})
    with pytest.raises(TypeError):
        indented({"a": [object()]})


def test_a_drift_report_of_the_incidents_example() -> None:
    from reconciler.desired.load import load_fleet
    from reconciler.drift import run_drift_on
    from reconciler.drift_inputs import drift_inputs
    from reconciler.report.json_report import render_json, to_document

    example = ROOT / "examples" / "lab-incidents"
    inputs = drift_inputs(load_fleet(example, "lab"))
    run = run_drift_on(inputs, list(inputs.boxes), from_snapshot=example / "snapshot")
    text = render_json(run.report)
    assert text == _dumps(to_document(run.report)) + "\n"
    assert text.count("\n") > 500  # a report with drift in it, indented
