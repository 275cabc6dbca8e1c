"""`--format html` on captured lab data: the page's source (self-contained, escaped), then the
page as a real headless Chromium (Debian's package) loads it: no console message, no error, no
request but the page's own; every box and lane in the DOM; drifted lanes in the drift class; a
`<script>` planted in an observed value is text and never runs; readable at a phone's width;
the weakest-link proof; sparklines from the history. Screenshots are saved as test artifacts.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler.desired.load import load_fleet
from tests.chromium import Browser, artifacts_dir, chromium
from tests.unit.history_helpers import AUDIT_FIXTURES, INCIDENTS, ROOT, SNAPSHOT, edited_snapshot
from tests.unit.history_helpers import reconcile as run_cli

# Would set the title and log an error if it ever ran: the tests assert neither happened.
PLANTED = '<script>document.title="pwned";console.error("pwned")</script><b>bold?</b>'
PHONE = {"width": 390, "height": 844, "mobile": True}


def plant(docs: dict[str, Any]) -> None:
    """The hostile value in thor's .env (an observed value the drift shows, WORKER_MAX_MODEL_LEN)
    and in a lane's container environment."""
    thor = docs["thor"]["collected"]
    line = next(e for e in thor["envfile"] if e.get("key") == "WORKER_MAX_MODEL_LEN")
    line["value"] = PLANTED
    lane = next(c for c in thor["docker"]["containers"] if c["service"] == "vllm-embed")
    lane["env"]["PRIMARY_MAX_MODEL_LEN"] = PLANTED


def write(capsys: Any, tmp_path: Path, name: str, *args: str, root: Path = INCIDENTS) -> Path:
    page = tmp_path / f"{name}.html"
    code, _, err = run_cli(capsys, *args, "--format", "html", "-o", str(page), root=root)
    assert code in (0, 2), err
    return page


def drift_json(capsys: Any, snapshot: Path) -> dict[str, Any]:
    code, out, err = run_cli(
        capsys, "drift", "--from-snapshot", str(snapshot), "--format", "json", "--no-history"
    )
    assert code == 2, err
    return dict(json.loads(out))


def lanes_of_inventory() -> dict[str, list[str]]:
    fleet = load_fleet(INCIDENTS, "lab")
    return {
        name: [ln.service_name for ln in box.lanes.values()] for name, box in fleet.boxes.items()
    }


@pytest.fixture(scope="module")
def browser() -> Any:
    with chromium() as b:
        yield b


def shot(b: Browser, tmp_path: Path, name: str, capsys: Any) -> None:
    path = b.screenshot(artifacts_dir(tmp_path) / f"{name}.png")
    assert path.stat().st_size > 10_000  # a rendered page, not an empty canvas
    with capsys.disabled():  # the CLI runs read capsys: say it past the capture
        print(f"\nscreenshot: {path}")


def loads_clean(b: Browser, page: Path, **size: Any) -> None:
    loaded = b.load(page, **size)
    assert loaded.console == []
    assert loaded.errors == []
    assert loaded.requests == []


def test_the_page_is_one_self_contained_file_with_every_value_escaped(capsys, tmp_path):
    hostile = edited_snapshot(tmp_path, "hostile", plant)
    html = write(capsys, tmp_path, "drift", "drift", "--from-snapshot", str(hostile)).read_text()
    assert "default-src 'none'" in html and 'name="viewport"' in html
    assert "<script" not in html.lower()  # none of ours, and the planted one escaped
    assert "&lt;script&gt;document.title=" in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html, re.I)
    assert "@import" not in html and "url(" not in html


def test_text_and_json_drift_never_import_jinja2():
    probe = (
        "import sys; from reconciler.cli import main; "
        f"main(['--root', {str(INCIDENTS)!r}, '-i', 'lab', 'drift', '--from-snapshot', "
        f"{str(SNAPSHOT)!r}, '--format', sys.argv[1], '-o', '/dev/null']); "
        "print('jinja2' in sys.modules, 'reconciler.report.html' in sys.modules)"
    )
    for fmt, expect in (("text", "False False"), ("json", "False False"), ("html", "True True")):
        out = subprocess.run([sys.executable, "-c", probe, fmt], capture_output=True, text=True)
        assert out.stdout.split("\n")[-2] == expect, (fmt, out.stdout, out.stderr)


def test_drift_page_in_chromium(capsys, tmp_path, browser):
    hostile = edited_snapshot(tmp_path, "hostile", plant)
    doc = drift_json(capsys, hostile)
    page = write(capsys, tmp_path, "drift", "drift", "--from-snapshot", str(hostile))
    loads_clean(browser, page)
    b = browser
    assert b.value("document.title") == "drift: inventory/lab.yaml"  # the planted script: no
    body = b.value("document.body.innerText")
    assert PLANTED in body  # shown as text, tags and all
    assert b.value("document.querySelectorAll('script, b').length") == 0
    for box, lanes in lanes_of_inventory().items():
        for lane in [*lanes, "gateway"]:
            cell = f'tr[data-box="{box}"] td[data-lane="{lane}"]'
            assert b.value(f"!!document.querySelector('{cell}')"), cell
    drifted = {
        (bx["box"], d["subject"].removeprefix("lane:"))
        for bx in doc["boxes"]
        for d in bx["drifts"]
        if d["subject"].startswith("lane:")
    }
    assert drifted
    for box, lane in drifted:
        cls = b.value(
            f'document.querySelector(\'tr[data-box="{box}"] td[data-lane="{lane}"]\').className'
        )
        assert "drift" in cls.split(), (box, lane, cls)
    causes = b.value("[...document.querySelectorAll('[data-cause]')].map(e => e.dataset.cause)")
    every = {d["cause"] for bx in doc["boxes"] for d in bx["drifts"]}
    assert set(causes) == every and len(causes) == doc["summary"]["causes"]
    shot(b, tmp_path, "drift-desktop", capsys)
    loads_clean(b, page, **PHONE)
    # Readable on a phone: the page itself never scrolls sideways (the matrix scrolls in its box).
    assert b.value("document.documentElement.scrollWidth <= window.innerWidth")
    shot(b, tmp_path, "drift-phone", capsys)


def test_audit_page_shows_the_weakest_link_proof_and_published_lanes(capsys, tmp_path, browser):
    weakest = AUDIT_FIXTURES / "weakest_link_proven_live"
    _, out, _ = run_cli(
        capsys, "audit", "--from-snapshot", str(weakest), "--format", "json", root=ROOT
    )
    mesh = json.loads(out)["mesh"]
    page = write(capsys, tmp_path, "audit", "audit", "--from-snapshot", str(weakest), root=ROOT)
    loads_clean(browser, page, **PHONE)
    b = browser
    assert b.value("document.querySelectorAll('#proofs tbody tr').length") == len(mesh["proofs"])
    finding = b.value(
        "document.querySelector('#mesh [data-finding=\"mesh.weakest-link\"]').innerText"
    )
    assert mesh["findings"][0]["message"] in finding
    assert b.value("document.documentElement.scrollWidth <= window.innerWidth")
    shot(b, tmp_path, "audit-weakest-link", capsys)
    published = AUDIT_FIXTURES / "lane_port_published"
    page = write(capsys, tmp_path, "lanes", "audit", "--from-snapshot", str(published), root=ROOT)
    loads_clean(b, page)
    cell = 'document.querySelector(\'tr[data-box="orin"] td[data-lane="{}"]\').className'
    assert "fail" in b.value(cell.format("vllm-embed")).split()
    assert "ok" in b.value(cell.format("vllm-rerank")).split()


def test_a_sparkline_per_box_when_the_history_has_runs(capsys, tmp_path, browser):
    store = tmp_path / "history.sqlite3"
    first = write(
        capsys,
        tmp_path,
        "first",
        "drift",
        "--from-snapshot",
        str(SNAPSHOT),
        "--history",
        str(store),
    )
    assert "<svg" not in first.read_text()  # no history yet: no sparkline, no error
    # The next run: thor's .env carries the desired context again (fewer entries on thor).
    fixed = edited_snapshot(tmp_path, "fixed", fix_context)
    before = {b["box"]: len(b["drifts"]) for b in drift_json(capsys, SNAPSHOT)["boxes"]}
    after = {b["box"]: len(b["drifts"]) for b in drift_json(capsys, fixed)["boxes"]}
    assert after["thor"] < before["thor"]
    page = write(
        capsys, tmp_path, "second", "drift", "--from-snapshot", str(fixed), "--history", str(store)
    )
    loads_clean(browser, page)
    series = browser.value(
        "Object.fromEntries([...document.querySelectorAll('[data-box] svg.spark')]"
        ".map(s => [s.closest('[data-box]').dataset.box, s.dataset.counts]))"
    )
    assert series == {box: f"{before[box]},{after[box]}" for box in before}
    shot(browser, tmp_path, "drift-sparklines", capsys)


def fix_context(docs: dict[str, Any]) -> None:
    line = next(
        e for e in docs["thor"]["collected"]["envfile"] if e.get("key") == "WORKER_MAX_MODEL_LEN"
    )
    line["value"] = "262144"
