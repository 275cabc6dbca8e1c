"""How a row of one cause names its boxes (reconciler/report/grouped.py): each box once, in the
report's box order, subjects seen on the same boxes sharing one list, and a source or note
that is not the same on every box of the row naming the boxes it was seen on."""

from __future__ import annotations

from reconciler.compare.drift import Action, Drift, Kind
from reconciler.report.grouped import Row, per_box, where


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
