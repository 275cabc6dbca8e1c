"""A drift run imports what it needs after the boxes' answers while the boxes still work
(history.hooks.preload): only what the run's outputs will use."""

from __future__ import annotations

import pytest

from tests.unit.conftest import fresh_python

AFTER_ANSWERS = ("reconciler.report.json_report", "reconciler.history.store", "sqlite3")


@pytest.mark.parametrize(
    ("history", "metrics", "expected"),
    [
        ("'/tmp/h.sqlite'", "None", set(AFTER_ANSWERS)),
        ("None", "'/tmp/m.prom'", {"reconciler.report.json_report"}),
        ("None", "None", set()),  # --no-history and no --metrics: nothing to record
    ],
)
def test_preload_imports_what_the_outputs_will_use(history, metrics, expected) -> None:
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from reconciler.history.hooks import RunOutputs, preload\n"
        "before = set(sys.modules)\n"
        f"h, m = {history}, {metrics}\n"
        "preload(RunOutputs(Path(h) if h else None, Path(m) if m else None))\n"
        f"print(sorted(n for n in {AFTER_ANSWERS!r} if n in set(sys.modules) - before))\n"
    )
    assert fresh_python(code).strip() == str(sorted(expected))
