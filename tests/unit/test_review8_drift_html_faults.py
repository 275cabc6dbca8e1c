"""A fault in one part of a box hid what the run did see there (review 7): with thor's
loopback /health timing out, the HTML matrix greyed its gateway cell ("not observed") over the
controller's own probes finding the gateway answering without a key, the badge counted fewer
entries than the text and JSON reports, and the metrics left them out. Compare makes no entry
where it could not look, so every entry is drift found: the cell keeps its colour and its hover
says what was not observed."""

from __future__ import annotations

import html as html_lib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from reconciler.history.parts import column
from tests.unit.history_helpers import edited_snapshot, reconcile, unvouched

CELL = re.compile(r'<td class="cell ([a-z ]+)" data-lane="([^"]*)" title="([^"]*)">([^<]*)</td>')


def health_timed_out(docs: dict[str, Any]) -> None:
    docs["thor"]["collected"]["gateway"]["health"] = {"error": "timed out", "ms": 5000}


def login_shell_hung(docs: dict[str, Any]) -> None:
    docs["thor"]["collected"]["login_shell"] = {"error": "bash -lc timed out after 10 s"}


def thor_cells(page: str) -> dict[str, tuple[str, str, str]]:
    row = page[page.index('<tr data-box="thor">') :]
    row = row[: row.index("</tr>")]
    return {
        lane: (cls, html_lib.unescape(title), text) for cls, lane, title, text in CELL.findall(row)
    }


@pytest.mark.parametrize(
    ("edit", "col", "why"),
    [
        (health_timed_out, "gateway", "gateway health (loopback): timed out"),
        (login_shell_hung, "box-wide", "login_shell: bash -lc timed out after 10 s"),
    ],
)
def test_a_part_with_a_fault_still_shows_the_drift_seen_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any, col: str, why: str
) -> None:
    snapshot = edited_snapshot(tmp_path, "snap", edit)
    unvouched(snapshot)
    code, out, _ = reconcile(capsys, "drift", "--from-snapshot", str(snapshot), "--format", "json")
    assert code == 1  # a box error
    thor = next(b for b in json.loads(out)["boxes"] if b["box"] == "thor")
    here = [d for d in thor["drifts"] if column(d["subject"]) == col]
    assert here, thor["drifts"]  # seen in the faulted part all the same

    page_path = tmp_path / "page.html"
    code, _, _ = reconcile(
        capsys, "drift", "--from-snapshot", str(snapshot), "--format", "html", "--no-history",
        "-o", str(page_path),
    )  # fmt: skip
    page = page_path.read_text()
    cls, title, text = thor_cells(page)[col]
    assert "drift" in cls.split() and "unobserved" not in cls.split(), (cls, title)
    assert text == str(len(here))
    assert title.endswith(f"; not all observed: {why}"), title
    badge = re.search(
        r'<div class="card" data-box="thor">\s*<h3>thor <span class="badge [a-z]+">([^<]*)<', page
    )
    assert badge is not None
    assert badge.group(1) == f"{len(thor['drifts'])} entries, not all observed"

    prom = tmp_path / "m.prom"
    reconcile(
        capsys, "drift", "--from-snapshot", str(snapshot), "--metrics", str(prom), "--no-history"
    )
    counted = sum(
        float(line.rsplit(" ", 1)[1])
        for line in prom.read_text().splitlines()
        if line.startswith('fleet_drift_entries{box="thor"')
    )
    assert counted == len(thor["drifts"])
