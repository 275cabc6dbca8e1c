"""How a row of one cause names its boxes (reconciler/report/grouped.py): each box once, in the
report's box order, subjects seen on the same boxes sharing one list, and a source or note
that is not the same on every box of the row naming the boxes it was seen on; past FOLD_PAST
values of one key in one cause, VALUES_LISTED of them listed and the rest folded into one row."""

from __future__ import annotations

import json

from reconciler.compare.drift import Action, BoxResult, Drift, DriftReport, Kind
from reconciler.report import render
from reconciler.report.grouped import FOLD_PAST, VALUES_LISTED, Row, causes, per_box, rows, where


def _drift(box: str, subject: str, source: str | None = None) -> Drift:
    return Drift(box, Kind.ENV, subject, "VLLM_PORT", "8000", "8001", Action.RECREATE, source)


ORDER = ("thor", "spark", "orin", "thor-1")


def test_each_box_is_named_once_in_the_reports_order() -> None:
    row = Row(
        False,
        (
            _drift("orin", "lane:a"),
            _drift("thor", "lane:a"),
            _drift("orin", "lane:a"),  # the same subject on the same box again
            _drift("spark", "lane:b"),
        ),
    )
    assert where(row, ORDER) == "lane:a on thor, orin; lane:b on spark"


def test_subjects_seen_on_the_same_boxes_share_their_list() -> None:
    drifts = [_drift(box, s) for s in ("lane:b", "lane:a") for box in ("thor-1", "spark")]
    drifts.append(_drift("thor", "gateway"))
    row = Row(False, tuple(drifts))
    assert where(row, ORDER) == "lane:a, lane:b on spark, thor-1; gateway on thor"
    assert where(row, ORDER, limit=1) == "lane:a, lane:b on spark and 1 more; gateway on thor"


def test_a_box_outside_the_order_comes_last() -> None:
    row = Row(False, (_drift("zeta", "gateway"), _drift("orin", "gateway")))
    assert where(row, ORDER) == "gateway on orin, zeta"


def test_a_source_names_its_boxes_only_when_not_seen_on_every_box_of_the_row() -> None:
    same = Row(False, tuple(_drift(b, "gateway", ".env:3") for b in ("thor", "spark", "thor")))
    assert per_box(same, "source") == [(".env:3", "")]
    mixed = Row(
        False,
        (
            _drift("thor", "gateway", ".env:3"),
            _drift("spark", "gateway", "~/.bashrc:6"),
            _drift("thor", "gateway", ".env:3"),
            _drift("orin", "gateway", ".env:3"),
        ),
    )
    assert per_box(mixed, "source") == [(".env:3", "thor, orin"), ("~/.bashrc:6", "spark")]
    assert per_box(mixed, "source", limit=1) == [
        (".env:3", "thor and 1 more"),
        ("~/.bashrc:6", "spark"),
    ]
    assert per_box(mixed, "note") == []  # no drift has a note


# -- rows of one key whose values differ box by box (a mesh member's seeds name every other) --
def _seeds_report(boxes: int) -> DriftReport:
    names = [f"box-{i}" for i in range(boxes)]

    def seeds(box: str) -> Drift:
        others = ",".join(f"http://{n}:8000" for n in names if n != box)
        return Drift(
            box,
            Kind.ENVFILE,
            "file:.env",
            "LOBES_MESH_SEEDS",
            others,
            "http://box-0:8000",
            Action.REWRITE_ENV,
            ".env:7",
            "from inventory (other mesh members)",
        )

    port = Drift(
        "box-3", Kind.ENVFILE, "file:.env", "VLLM_PORT", "8000", "8001", Action.REWRITE_ENV
    )
    results = [BoxResult(n, True, (seeds(n), *[port] * (n == "box-3"))) for n in names]
    return DriftReport(boxes=tuple(results), inventory="lab", generated_at="t", run_id="r")


MANY = FOLD_PAST + 8  # boxes, each with its own value of the key


def test_past_fold_past_values_of_one_key_three_are_rows_and_one_row_holds_the_rest() -> None:
    order = tuple(f"box-{i}" for i in range(MANY))
    (cause,) = [c for c in causes(_seeds_report(MANY)) if c.id == "envfile:LOBES_MESH_SEEDS"]
    folded = rows(cause, fold=True)
    assert [r.folded for r in folded] == [0] * VALUES_LISTED + [MANY - VALUES_LISTED]
    # The listed values are those of the boxes first in the report; the fold holds the rest,
    # in the report's order, each entry once.
    assert sorted(r.first.box for r in folded[:-1]) == list(order[:VALUES_LISTED])
    assert [d.box for d in folded[-1].drifts] == list(order[VALUES_LISTED:])
    assert where(folded[-1], order) == "file:.env on " + ", ".join(order[VALUES_LISTED:])
    # Unfolded (and in JSON) every value is its own row.
    assert [r.folded for r in rows(cause)] == [0] * MANY


def test_up_to_fold_past_values_each_value_is_a_row() -> None:
    (cause,) = [c for c in causes(_seeds_report(FOLD_PAST)) if c.id.endswith("MESH_SEEDS")]
    assert [r.folded for r in rows(cause, fold=True)] == [0] * FOLD_PAST


def test_each_report_format_says_how_many_values_a_folded_row_holds() -> None:
    report = _seeds_report(MANY)
    more = f"({MANY - VALUES_LISTED} more values)"
    text = render(report, "text")
    assert text.count("LOBES_MESH_SEEDS") == 1 + VALUES_LISTED + 1  # header, rows, the fold
    assert more in text
    assert "on: file:.env on box-3, box-4" in text
    # The port's own cause on box-3 is untouched: one value, one row.
    assert "VLLM_PORT" in text and "8000 -> 8001" in text
    markdown = render(report, "markdown")
    assert more.strip("()") in markdown
    assert markdown.count(f"http://box-{MANY - 1}:8000") == VALUES_LISTED
    assert more in render(report, "html")
    # JSON keeps every entry and every value.
    entries = [
        e
        for box in json.loads(render(report, "json"))["boxes"]
        for e in box["drifts"]
        if e["path"] == "LOBES_MESH_SEEDS"
    ]
    assert len(entries) == MANY and len({e["desired"] for e in entries}) == MANY
