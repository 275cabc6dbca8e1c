"""report/order.ordered_drifts sorts by its first fields, then only ties by the whole key: the
same order as one sort by the whole key (`_full_key`), ties and duplicates included."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.compare.drift import Action, Drift, Kind, SecretValue
from reconciler.report.order import _full_key, ordered_drifts

# Few distinct values, so that entries tie on box, kind, subject, path and action often.
SMALL = st.sampled_from(["a", "b", ""])
VALUES = st.one_of(
    st.none(),
    SMALL,
    st.integers(0, 2),
    st.tuples(SMALL, SMALL),
    st.builds(SecretValue, SMALL),
)
DRIFTS = st.builds(
    Drift,
    st.sampled_from(["thor", "orin"]),
    st.sampled_from([Kind.ENV, Kind.ARGV, Kind.ENVFILE]),
    SMALL,
    SMALL,
    VALUES,
    VALUES,
    st.sampled_from([Action.RECREATE, Action.REWRITE_ENV]),
    source=st.one_of(st.none(), SMALL),
    note=st.one_of(st.none(), SMALL),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(DRIFTS, max_size=30))
def test_the_order_is_one_sort_by_the_full_key(drifts: list[Drift]) -> None:
    got = ordered_drifts(drifts)
    want = sorted(drifts, key=_full_key)
    assert [id(d) for d in got] == [id(d) for d in want]  # the same objects, ties in place
