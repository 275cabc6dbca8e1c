"""The HTML page of a live drift of the whole lab, in a real headless Chromium: it loads with no
console message, error or request; every box and every desired lane is in the DOM; the lanes
the run recorded drift on (read back from its history store) carry the drift class and the
others do not; each box's sparkline ends with this run's count. No incident: the lab as it is
(the pristine lab drifts where the desired state asks for more), so nothing is reset (~10 s).
The page's other properties (escaping, audit, phone width) are unit tests on captured data
(tests/unit/test_html_report.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from reconciler.desired.load import load_fleet
from tests.chromium import artifacts_dir, chromium
from tests.lab.lab_cli import REPO, reconcile

pytestmark = pytest.mark.lab


def test_live_drift_page_in_chromium(lab: Any, tmp_path: Path) -> None:
    store, page = tmp_path / "history.sqlite3", tmp_path / "drift.html"
    first = reconcile("drift", "--format", "json", "--history", str(store))
    assert first.returncode in (0, 2), first.stderr
    done = reconcile("drift", "--format", "html", "-o", str(page), "--history", str(store))
    assert done.returncode in (0, 2), done.stderr
    with sqlite3.connect(store) as conn:
        last = conn.execute("SELECT max(id) FROM runs").fetchone()[0]
        drifted = set(
            conn.execute(
                "SELECT box, substr(subject, 6) FROM entries WHERE run = ? AND subject LIKE"
                " 'lane:%'",
                (last,),
            ).fetchall()
        )
        counts = dict(conn.execute("SELECT box, entries FROM boxes WHERE run = ?", (last,)))
    conn.close()
    lanes = {
        name: [ln.service_name for ln in box.lanes.values()]
        for name, box in load_fleet(REPO, "lab").boxes.items()
    }
    with chromium() as b:
        loaded = b.load(page)
        assert (loaded.console, loaded.errors, loaded.requests) == ([], [], [])
        for box, names in lanes.items():
            for lane in [*names, "gateway"]:
                cls = b.value(
                    f'document.querySelector(\'tr[data-box="{box}"] td[data-lane="{lane}"]\')'
                    "?.className"
                )
                assert cls is not None, (box, lane)
                if lane != "gateway":
                    assert ("drift" in cls.split()) == ((box, lane) in drifted), (box, lane, cls)
        ends = b.value(
            "Object.fromEntries([...document.querySelectorAll('[data-box] svg.spark')]"
            ".map(s => [s.closest('[data-box]').dataset.box, s.dataset.counts.split(',').at(-1)]))"
        )
        assert ends == {box: str(n) for box, n in counts.items()}
        shot = b.screenshot(artifacts_dir(tmp_path) / "lab-drift.png")
    print(f"screenshot: {shot}")
