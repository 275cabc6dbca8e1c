"""reconciler/records.py gives the drift path's classes what `@dataclass` gave them: each
behaviour here is checked against a dataclass of the same definition, so a difference is a
failure, not a constant. And the repeated drift path imports neither dataclasses nor inspect."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import InitVar
from typing import Any, ClassVar

import pytest

from reconciler.observe.document import MemInfo, SecretValue
from reconciler.observe.observe import BoxObservation
from reconciler.records import asdict, field, fields, is_record, record_class, replace
from tests.unit.conftest import fresh_python


@record_class(order=True)
class Point:
    """x, y; a label that takes no part in comparing."""

    x: int
    y: int = 0
    label: str = field(default="", compare=False)
    tags: list[str] = field(default_factory=list)
    kind: ClassVar[str] = "point"


@dataclasses.dataclass(frozen=True, order=True)
class DPoint:
    x: int
    y: int = 0
    label: str = dataclasses.field(default="", compare=False)
    tags: list[str] = dataclasses.field(default_factory=list)
    kind: ClassVar[str] = "point"


@record_class()
class Base:
    """A base with a positional field."""

    name: str
    size: int = 1


@record_class(kw_only=True)
class Child(Base):
    """Its own fields keyword-only, the base's as they were."""

    colour: str = "red"
    scale: float


@record_class(frozen=False)
class Mutable:
    """Derived fields from an InitVar, as BoxObservation has them."""

    raw: str
    extra: dict[str, Any] = field(default_factory=dict)
    doubled: str = field(init=False, repr=False, compare=False)
    factor: InitVar[int] = 2

    def __post_init__(self, factor: int) -> None:
        object.__setattr__(self, "doubled", self.raw * factor)


@dataclasses.dataclass
class DMutable:
    raw: str
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    doubled: str = dataclasses.field(init=False, repr=False, compare=False)
    factor: InitVar[int] = 2

    def __post_init__(self, factor: int) -> None:
        self.doubled = self.raw * factor


def test_init_defaults_factories_and_repr_as_a_dataclass() -> None:
    assert repr(Point(1)) == repr(DPoint(1)).replace("DPoint", "Point")
    assert repr(Point(1, 2, "a", ["t"])) == repr(DPoint(1, 2, "a", ["t"])).replace(
        "DPoint", "Point"
    )
    assert Point(1).tags is not Point(1).tags  # a factory per instance, never shared
    assert [f.name for f in fields(Point)] == [f.name for f in dataclasses.fields(DPoint)]
    assert Point.__match_args__ == DPoint.__match_args__
    with pytest.raises(TypeError):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Point(1, 2, "a", [], "extra")  # type: ignore[call-arg]


def test_equality_hash_and_order_as_a_dataclass() -> None:
    pairs = [((1, 2, "a"), (1, 2, "b")), ((1, 2), (1, 3)), ((2, 0), (1, 9)), ((1,), (1, 0))]
    for a, b in pairs:
        ra, rb, da, db = Point(*a), Point(*b), DPoint(*a), DPoint(*b)  # type: ignore[arg-type]
        assert (ra == rb, ra < rb, ra <= rb, ra > rb, ra >= rb) == (
            da == db,
            da < db,
            da <= db,
            da > db,
            da >= db,
        )
    for make in (Point, DPoint):
        with pytest.raises(TypeError):
            hash(make(1))  # a list among the fields: unhashable, for both
    assert {Base("n", 2), Base("n", 2), Base("n", 3)} == {Base("n", 2), Base("n", 3)}
    assert Point(1, 2) != DPoint(1, 2)  # another class: not equal, as between dataclasses
    with pytest.raises(TypeError):
        _ = Point(1) < Base("x")  # type: ignore[operator]
    assert Mutable("a") == Mutable("a") and DMutable("a") == DMutable("a")
    with pytest.raises(TypeError):
        hash(Mutable("a"))  # a mutable record with eq is unhashable, as a dataclass is
    a, b = MemInfo(1, 2), MemInfo(1, 2)
    assert a != b and a == a  # documents compare by identity (eq=False)
    assert "total_kib" not in repr(a) and repr(a).startswith("<")  # and show no field (repr=False)
    assert len({SecretValue("hmac:" + "0" * 64), SecretValue("hmac:" + "0" * 64)}) == 1


def test_inheritance_kw_only_and_initvars() -> None:
    child = Child("n", scale=2.0)
    assert (child.name, child.size, child.colour, child.scale) == ("n", 1, "red", 2.0)
    with pytest.raises(TypeError):
        Child("n", 1, "blue", 2.0)  # type: ignore[misc]
    assert [f.name for f in fields(child)] == ["name", "size", "colour", "scale"]
    m, d = Mutable("ab", factor=3), DMutable("ab", factor=3)
    assert (m.doubled, m.raw) == (d.doubled, d.raw) == ("ababab", "ab")
    assert not hasattr(m, "factor") or m.factor == 2  # an InitVar is not kept per instance
    assert repr(m) == repr(d).replace("DMutable", "Mutable")


def test_replace_asdict_and_pickle_as_dataclasses_do() -> None:
    p = Point(1, 2, "a", ["t"])
    assert replace(p, y=5) == Point(1, 5, "a", ["t"])
    assert replace(Mutable("ab"), raw="c").doubled == "cc"  # __post_init__ runs again
    with pytest.raises(ValueError, match="init=False"):
        replace(Mutable("ab"), doubled="x")
    nested = Mutable("r", extra={"p": [Point(1)], "t": (Point(2),)})
    dnested = DMutable("r", extra={"p": [DPoint(1)], "t": (DPoint(2),)})
    assert asdict(nested) == dataclasses.asdict(dnested)
    assert asdict(nested)["extra"]["p"] is not nested.extra["p"]  # copied, as there
    again = pickle.loads(pickle.dumps(p))
    assert again == p and again.tags == ["t"] and type(again) is Point
    assert is_record(p) and is_record(Point) and not is_record(DPoint(1))
    assert [f.name for f in fields(DPoint(1))] == ["x", "y", "label", "tags"]  # dataclasses'
    assert replace(DPoint(1), y=3) == DPoint(1, 3)
    with pytest.raises(TypeError):
        fields(object())


def test_definitions_a_dataclass_refuses_are_refused() -> None:
    with pytest.raises(ValueError, match="mutable default"):

        @record_class()
        class Shared:
            """A list default every instance would share."""

            items: list[int] = []  # noqa: RUF012

    with pytest.raises(TypeError, match="follows default"):

        @record_class()
        class Ordered:
            """A field without a default after one with it."""

            a: int = 0
            b: int  # type: ignore[misc]

    with pytest.raises(ValueError, match="both default and default_factory"):
        field(default=1, default_factory=list)


def test_a_box_observation_keeps_its_contract() -> None:
    obs = BoxObservation("thor", None, "unreachable: ssh: connect refused", elapsed_s=1.5)
    assert obs.reachable is False and obs.altered is None
    assert asdict(obs) == {
        "box": "thor",
        "collected": None,
        "error": "unreachable: ssh: connect refused",
        "controller": {},
        "elapsed_s": 1.5,
        "connection": None,
    }


# What a repeated drift imports, start to end (cli, the early start, the comparison, the JSON
# report, the history): none may bring dataclasses or inspect back (~30 ms of CPU a run).
REPEATED_DRIFT_PATH = (
    "reconciler.cli",
    "reconciler.observe.early",
    "reconciler.drift",
    "reconciler.report.json_report",
    "reconciler.history.hooks",
    "reconciler.history.record",
    "reconciler.history.store",
    "reconciler.history.masking",
)


def test_the_repeated_drift_path_imports_neither_dataclasses_nor_inspect() -> None:
    code = (
        "import sys\n"
        f"for name in {REPEATED_DRIFT_PATH!r}:\n"
        "    __import__(name)\n"
        "print(sorted(m for m in ('dataclasses', 'inspect') if m in sys.modules))\n"
    )
    assert fresh_python(code).strip() == "[]"
