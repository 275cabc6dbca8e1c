"""Review 4 of the drift report outputs, on captured data (examples/lab-incidents replayed from
its snapshot, edited as a box could make it; bench/scale_fleet.py for a 40-box fleet):

- a box's facts are masked as its drift is (the gateway's /health version is the box's words);
- the "(N more values)" row of a key whose value is each box's own never hides an observed
  absence, an empty value or a value of another shape;
- a value with leading or trailing blanks is shown quoted, in every format.
"""

from __future__ import annotations

import html
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.scale_fleet import build_fleet
from reconciler.compare.drift import Action, BoxResult, Drift, DriftReport, Kind
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from reconciler.report import render
from reconciler.report.grouped import FOLD_PAST, VALUES_LISTED, causes, rows
from reconciler.report.json_report import box_entry
from reconciler.report.values import display

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"
FORMATS = ("json", "markdown", "text", "html")
Mutate = Callable[[Path], None]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _edit(snapshot: Path, box: str, change: Callable[[dict[str, Any]], None]) -> None:
    path = snapshot / f"{box}.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    change(document)
    path.write_text(json.dumps(document), encoding="utf-8")


def _replay(root: Path) -> DriftReport:
    fleet = load_fleet(root, "lab")
    return run_drift(fleet, list(fleet.boxes), from_snapshot=root / "snapshot").report


def _incidents(tmp_path: Path, box: str, change: Callable[[dict[str, Any]], None]) -> DriftReport:
    root = tmp_path / "lab"
    shutil.copytree(EXAMPLE, root)
    _edit(root / "snapshot", box, change)
    return _replay(root)


# -- 1. facts are masked as drift values are --------------------------------------------------
VERSION = "0.91.0 Authorization: Bearer LEAKV --api-key LEAKW HF_TOKEN=LEAKX"
MASKED = "0.91.0 Authorization: Bearer *** --api-key *** HF_TOKEN=***"


def _hostile_version(document: dict[str, Any]) -> None:
    document["collected"]["gateway"]["health"]["body"]["version"] = VERSION


def test_a_box_controlled_fact_is_masked_in_every_format(tmp_path: Path) -> None:
    report = _incidents(tmp_path, "thor", _hostile_version)
    thor = next(b for b in report.boxes if b.box == "thor")
    assert thor.facts["gateway_version"] == VERSION  # the fact reached the report as the box said
    for fmt in FORMATS:
        out = render(report, fmt)
        for leak in ("LEAKV", "LEAKW", "LEAKX"):
            assert leak not in out, (fmt, leak)
    document = json.loads(render(report, "json"))
    facts = {b["box"]: b["facts"] for b in document["boxes"]}
    assert facts["thor"]["gateway_version"] == MASKED
    assert facts["spark"]["gateway_version"] == "0.91.0"  # a clean fact is kept as it is
    assert f"`gateway_version={MASKED}`" in render(report, "markdown")
    # One box's entry, as the parallel JSON writer (report/json_parts.py) and the history take it
    assert box_entry(thor, set())["facts"]["gateway_version"] == MASKED


def test_a_fact_named_like_a_secret_is_masked_whole() -> None:
    box = BoxResult("thor", True, facts={"HF_TOKEN": "LEAKY", "user": "fl-thor"})
    report = DriftReport(boxes=(box,), inventory="lab", generated_at="t", run_id="r")
    for fmt in FORMATS:
        out = render(report, fmt)
        assert "LEAKY" not in out, fmt
    facts = json.loads(render(report, "json"))["boxes"][0]["facts"]
    assert facts["HF_TOKEN"]["secret"] is True and facts["user"] == "fl-thor"


# -- 2. the folded row never hides a kind of difference ---------------------------------------
SEEDS = "LOBES_MESH_SEEDS"
FOREIGN = "http://203.0.113.66:8000"


def _drop_seeds(document: dict[str, Any]) -> None:
    lines = document["collected"]["envfile"]
    document["collected"]["envfile"] = [e for e in lines if e.get("key") != SEEDS]


def _foreign_seeds(document: dict[str, Any]) -> None:
    for entry in document["collected"]["envfile"]:
        if entry.get("key") == SEEDS:
            entry["value"] = FOREIGN


def _fleet(tmp_path: Path, edited: bool) -> DriftReport:
    root = tmp_path / "fleet"
    build_fleet(root, 40)
    if edited:
        _edit(root / "snapshot", "orin-7", _drop_seeds)
        _edit(root / "snapshot", "spark-9", _foreign_seeds)
    return _replay(root)


def _seed_rows(report: DriftReport) -> list[Any]:
    (cause,) = [c for c in causes(report) if c.id == f"envfile:{SEEDS}"]
    return rows(cause, fold=True)


def test_an_absent_or_foreign_value_keeps_its_own_row_beside_the_fold(tmp_path: Path) -> None:
    report = _fleet(tmp_path, edited=True)
    seed_rows = _seed_rows(report)
    alone = {r.first.box: r for r in seed_rows if not r.folded}
    assert alone["orin-7"].first.observed is None and len(alone["orin-7"].drifts) == 1
    assert alone["spark-9"].first.observed == FOREIGN
    (fold,) = [r for r in seed_rows if r.folded]
    held = {d.box for d in fold.drifts}
    assert "orin-7" not in held and "spark-9" not in held
    assert fold.folded == len(held) == 40 - VALUES_LISTED - 2  # how many it holds, truly
    text = render(report, "text")
    assert f"({fold.folded} more values)" in text
    seeds_text = text[text.index(f"envfile:{SEEDS}:") :]
    assert "observed  (absent)" in seeds_text and f"observed  {FOREIGN}" in seeds_text
    markdown = render(report, "markdown")
    seed_lines = [line for line in markdown.splitlines() if f"`{SEEDS}`" in line]
    assert any("| *absent* |" in line and "orin-7" in line for line in seed_lines)
    assert any(f"`{FOREIGN}`" in line and "spark-9" in line for line in seed_lines)
    page = html.unescape(render(report, "html"))
    assert f"observed <code>{FOREIGN}</code>" in page
    assert "observed <code>(absent)</code>" in page
    assert f"({fold.folded} more values)" in page


def test_the_normal_mesh_seeds_still_fold_into_one_row(tmp_path: Path) -> None:
    seed_rows = _seed_rows(_fleet(tmp_path, edited=False))
    assert [r.folded for r in seed_rows] == [0] * VALUES_LISTED + [40 - VALUES_LISTED]


def _seeds_report(observed: Callable[[int], str | None], count: int) -> DriftReport:
    names = [f"box-{i}" for i in range(count)]

    def seeds(i: int) -> Drift:
        others = ",".join(f"http://{n}:8000" for n in names if n != names[i])
        return Drift(
            names[i], Kind.ENVFILE, "file:.env", SEEDS, others, observed(i), Action.REWRITE_ENV
        )

    boxes = tuple(BoxResult(n, True, (seeds(i),)) for i, n in enumerate(names))
    return DriftReport(boxes=boxes, inventory="lab", generated_at="t", run_id="r")


def test_an_empty_observed_value_keeps_its_own_row() -> None:
    report = _seeds_report(lambda i: "" if i == 7 else f"http://box-{i + 1}:8000", FOLD_PAST + 8)
    (empty,) = [r for r in _seed_rows(report) if r.first.observed == ""]
    assert not empty.folded and empty.first.box == "box-7"
    assert 'observed  ""' in render(report, "text") and '`""`' in render(report, "markdown")


def test_many_absent_values_are_few_rows_that_say_absent() -> None:
    # A key missing on every box (a new one rolled out): its rows stay few, and say so.
    count = FOLD_PAST + 8
    report = _seeds_report(lambda i: None, count)
    seed_rows = _seed_rows(report)
    assert [r.folded for r in seed_rows] == [0] * FOLD_PAST + [count - FOLD_PAST]
    assert seed_rows[-1].observed == "(absent)"
    assert f"({count - FOLD_PAST} more values) -> (absent)" in render(report, "text")
    assert f"({count - FOLD_PAST} more values) -&gt; (absent)" in render(report, "html")
    folded_line = [
        line for line in render(report, "markdown").splitlines() if "more values" in line
    ]
    assert len(folded_line) == 1 and "| *absent* |" in folded_line[0]


# -- 3. blanks at a value's edge are shown ----------------------------------------------------
def _padded_len(document: dict[str, Any]) -> None:
    for container in document["collected"]["docker"]["containers"]:
        if container["name"].endswith("vllm-embed"):
            container["env"]["EMBED_MAX_MODEL_LEN"] = "8192 "


def test_a_value_edged_with_blanks_is_quoted_in_every_format(tmp_path: Path) -> None:
    report = _incidents(tmp_path, "orin", _padded_len)
    text = render(report, "text")
    assert 'EMBED_MAX_MODEL_LEN           8192 -> "8192 "' in text
    markdown = render(report, "markdown")
    assert '| `8192` | `"8192 "` |' in markdown
    page = html.unescape(render(report, "html"))
    assert 'desired <code>8192</code>, observed <code>"8192 "</code>' in page
    # JSON keeps the value as it is
    entries = [d for b in json.loads(render(report, "json"))["boxes"] for d in b["drifts"]]
    assert any(d["observed"] == "8192 " for d in entries if d["path"] == "EMBED_MAX_MODEL_LEN")


@pytest.mark.parametrize(
    ("value", "shown"),
    [(" none", '" none"'), ("a b", "a b"), ("x\t", '"x\\t"'), ("", '""'), ("8192", "8192")],
)
def test_display_quotes_only_a_blank_edged_value(value: str, shown: str) -> None:
    assert display(value) == shown


def test_a_url_password_in_a_box_value_is_masked_in_every_format(tmp_path: Path) -> None:
    """A URL's password (`https://user:pw@host`) in a box-controlled value: masked in the fact
    and in the drift's observed value, as scrub_text masks it in error texts."""

    def with_password(document: dict[str, Any]) -> None:
        document["collected"]["gateway"]["health"]["body"]["version"] = (
            "0.91.0 https://u:S3CRETURL@example.invalid/"
        )

    report = _incidents(tmp_path, "thor", with_password)
    for fmt in FORMATS:
        out = render(report, fmt)
        assert "S3CRETURL" not in out, fmt
    document = json.loads(render(report, "json"))
    facts = {b["box"]: b["facts"] for b in document["boxes"]}
    assert facts["thor"]["gateway_version"] == "0.91.0 https://u:***@example.invalid/"
