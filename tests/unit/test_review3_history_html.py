"""The drift page after the third review (/tmp/review/hist_defects.md, 2 and 4): a box not
observed in full never wears a green "0 entries" badge nor adds a 0 to its sparkline, and the
sparkline is the page's fleet's only. On captured lab data (examples/lab-incidents)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.unit.history_helpers import (
    INCIDENTS,
    SNAPSHOT,
    edited_snapshot,
    reconcile,
    unreachable,
    unvouched,
)


def docker_down(docs: dict[str, Any]) -> None:
    docs["thor"]["collected"]["docker"] = {"error": "docker engine not reachable"}


def page(capsys: Any, db: Path, snapshot: Path, out: Path, root: Path = INCIDENTS) -> str:
    argv = ["drift", "--from-snapshot", str(snapshot), "--history", str(db)]
    code, _, err = reconcile(capsys, *argv, "--format", "html", "-o", str(out), root=root)
    assert code in (1, 2) and "warning" not in err, err
    return out.read_text()


def badges(html: str) -> dict[str, tuple[str, str]]:
    found = re.findall(r'<h3>(\w+) <span class="badge (\w+)">([^<]*)</span></h3>', html)
    return {box: (state, text) for box, state, text in found}


def counts(html: str) -> dict[str, str]:
    """Each card's sparkline counts (a card without a sparkline: not there)."""
    out = {}
    for card in html.split('<div class="card" data-box="')[1:]:
        found = re.search(r'data-counts="([0-9,]*)"', card)
        if found:
            out[card.split('"', 1)[0]] = found.group(1)
    return out


def test_a_box_not_observed_in_full_has_no_green_badge_and_no_zero_in_its_trend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    first = page(capsys, db, SNAPSHOT, tmp_path / "1.html")
    full = {box: int(text.split()[0]) for box, (_, text) in badges(first).items()}
    gone = edited_snapshot(tmp_path, "gone", unreachable("spark"))
    unvouched(gone)
    html = page(capsys, db, gone, tmp_path / "2.html")
    assert badges(html)["spark"] == ("unobserved", "not observed")
    assert counts(html)["thor"] == f"{full['thor']},{full['thor']}"
    assert "spark" not in counts(html)  # one count: no line (a gap is not 0)
    down = edited_snapshot(tmp_path, "down", docker_down)
    unvouched(down)
    html = page(capsys, db, down, tmp_path / "3.html")
    state, text = badges(html)["thor"]
    assert state == "fail" and text.endswith("entries, not all observed")
    assert counts(html)["thor"] == f"{full['thor']},{full['thor']}"  # not this run's part
    assert counts(html)["orin"] == ",".join([str(full["orin"])] * 3)


def test_the_sparkline_is_the_pages_fleets_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "h.sqlite3"
    other = tmp_path / "other-fleet"
    shutil.copytree(INCIDENTS, other, ignore=shutil.ignore_patterns("snapshot"))
    for n in range(2):
        page(capsys, db, SNAPSHOT, tmp_path / f"{n}.html")
    html = page(capsys, db, SNAPSHOT, tmp_path / "other.html", root=other)
    assert counts(html) == {}  # the other fleet's first run: no trend yet
    html = page(capsys, db, SNAPSHOT, tmp_path / "mine.html")
    assert all(len(c.split(",")) == 3 for c in counts(html).values()), counts(html)
