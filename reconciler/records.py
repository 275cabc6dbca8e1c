"""Frozen records for the modules a repeated `reconcile drift` imports: dataclasses' contract
as mypy checks it, without what `dataclasses` costs each run at import.

Python 3.11's `dataclasses` imports `inspect` (and with it ast, dis, tokenize: ~10 ms of CPU),
and builds each class by compiling five or six methods from source and checking every
annotation with a regex (~0.35 ms a class). The drift path defines sixty record classes:
with dataclasses, ~24 ms of the controller's ~165 ms of CPU on every repeated run (measured
A/B, 40 runs each), on a machine whose two cores the three boxes' collectors also need
(BENCHMARKS.md, issue 12). Here only `__init__` is compiled, one small function a class, on
the class's first instance (a run builds instances of about two thirds of them); equality,
hashing, ordering and `repr` are shared functions over an `operator.attrgetter` of the
class's fields (C).

What a class gets is what `@dataclass` gives it, for what this package uses:
- `__init__` with the fields in order, defaults, `field(default_factory=...)`,
  `field(init=False)` (set by `__post_init__`), `kw_only`, `InitVar[...]` (passed to
  `__post_init__`, not kept), and `__post_init__` called last;
- `eq=True` (the default): `__eq__` on the fields (`compare=False` ones left out), between
  two instances of the same class only; `frozen=True` (the default) with it: `__hash__` on the
  same fields; `frozen=False`: unhashable, as dataclasses makes it; `eq=False`: identity;
- `order=True`: `<`, `<=`, `>`, `>=` on the fields' tuple; `__repr__` on the `repr=True` fields
  (`repr=False`: object's own, which shows no field);
- `replace`, `fields`, `asdict` as dataclasses' functions of the same names.

Frozen is enforced by mypy (CI runs it on this package: the decorator is a
`dataclass_transform`, so assigning to a field of a record is a type error), not at run time:
a frozen dataclass's `__init__` sets each field through `object.__setattr__`, a call per field
on every record built (every drift entry and document part of a 1,000-box replay). Like
observe/document.py's classes before them, nothing here assigns to a record's field after
`__init__` (`__post_init__` sets its derived fields with object.__setattr__, as for a frozen
dataclass, so the code is the same either way).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

T = TypeVar("T")


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()  # no default given
_FACTORY: Any = _Missing()  # the parameter's default when the field has a default factory

# A default that every instance would share and mutate is refused, as dataclasses refuses it.
_MUTABLE_DEFAULTS = (list, dict, set)


class Field:
    """One field of a record, as `fields()` lists it (`name` set when its class is built)."""

    __slots__ = ("compare", "default", "default_factory", "init", "kw_only", "name", "repr")

    def __init__(
        self,
        default: Any,
        default_factory: Any,
        init: bool,
        repr: bool,
        compare: bool,
        kw_only: bool,
    ) -> None:
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.init = init
        self.repr = repr
        self.compare = compare
        self.kw_only = kw_only

    def __repr__(self) -> str:
        return f"Field({self.name!r})"


def field(
    *,
    default: Any = MISSING,
    default_factory: Callable[[], Any] | Any = MISSING,
    init: bool = True,
    repr: bool = True,
    compare: bool = True,
    kw_only: bool = False,
) -> Any:
    """A field's options, as dataclasses.field takes them."""
    if default is not MISSING and default_factory is not MISSING:
        raise ValueError("cannot specify both default and default_factory")
    return Field(default, default_factory, init, repr, compare, kw_only)


if TYPE_CHECKING:
    from typing_extensions import dataclass_transform

    @dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
    def record_class(
        *,
        eq: bool = True,
        order: bool = False,
        frozen: bool = True,
        kw_only: bool = False,
        repr: bool = True,
    ) -> Callable[[type[T]], type[T]]: ...

else:

    def record_class(*, eq=True, order=False, frozen=True, kw_only=False, repr=True):
        """A record class (the module says what it gets): `@record_class(kw_only=True)`."""

        def build(cls):
            return _built(cls, eq=eq, order=order, frozen=frozen, kw_only=kw_only, shown=repr)

        return build


# -- building a class --------------------------------------------------------------------------


def _built(
    klass: type[T], *, eq: bool, order: bool, frozen: bool, kw_only: bool, shown: bool
) -> type[T]:
    cls: Any = klass  # given the methods below, which its type does not declare
    inherited: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        for f in base.__dict__.get("__record_fields__", ()):
            inherited[f.name] = f
    own, initvars = _own_fields(cls, kw_only)
    every = {**inherited, **own}
    fields_ = tuple(every.values())
    cls.__record_fields__ = fields_
    cls.__init__ = _first_init(cls, *_init_source(cls, fields_, initvars))
    cls.__match_args__ = tuple(f.name for f in fields_ if f.init and not f.kw_only)  # type: ignore[misc]
    if shown and "__repr__" not in cls.__dict__:
        cls.__record_repr__ = tuple(f.name for f in fields_ if f.repr)
        cls.__repr__ = _repr
    compared = [f.name for f in fields_ if f.compare]
    cls.__record_key__ = staticmethod(attrgetter(*compared) if compared else _no_key)
    if eq and "__eq__" not in cls.__dict__:  # a class's own methods stay, as there
        cls.__eq__ = _eq
        if "__hash__" not in cls.__dict__:
            # As dataclasses: a frozen record hashes by its fields; a mutable one cannot.
            cls.__hash__ = _hash if frozen else None
    if order:
        cls.__lt__ = _lt
        cls.__le__ = _le
        cls.__gt__ = _gt
        cls.__ge__ = _ge
    return cls


def _own_fields(cls: type, kw_only: bool) -> tuple[dict[str, Field], list[tuple[str, Any]]]:
    """The class's own fields in order, and its InitVars (name, default). Annotations are
    strings here (every module has `from __future__ import annotations`): a ClassVar is left
    out and an InitVar told by its text, as dataclasses does for string annotations."""
    own: dict[str, Field] = {}
    initvars: list[tuple[str, Any]] = []
    # Not inspect.get_annotations: importing inspect is what this module exists to avoid.
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():  # noqa: RUF063
        text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
        if text.startswith(("ClassVar", "typing.ClassVar")):
            continue
        value = cls.__dict__.get(name, MISSING)
        if text.startswith(("InitVar", "dataclasses.InitVar")):
            initvars.append((name, value))  # its default stays a class attribute, as there
            continue
        if isinstance(value, Field):
            f = value
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)  # the class attribute is the default, as there
        else:
            f = Field(value, MISSING, True, True, True, False)
        if isinstance(f.default, _MUTABLE_DEFAULTS):
            raise ValueError(
                f"mutable default {type(f.default)} for field {name} is not allowed: "
                "use default_factory"
            )
        f.name = name
        f.kw_only = f.kw_only or kw_only
        own[name] = f
    return own, initvars


def _init_source(
    cls: type, fields_: tuple[Field, ...], initvars: list[tuple[str, Any]]
) -> tuple[str, dict[str, Any]]:
    """The source of the class's `__init__` and the names it reads (defaults, factories).
    Made with the class, so a definition dataclasses refuses is refused when it is defined."""
    scope: dict[str, Any] = {"_FACTORY": _FACTORY}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    seen_default = False
    for f in fields_:
        name = f.name
        if f.default is not MISSING:
            scope[f"_default_{name}"] = f.default
        if f.default_factory is not MISSING:
            scope[f"_factory_{name}"] = f.default_factory
        if f.init:
            if f.default_factory is not MISSING:
                param = f"{name}=_FACTORY"
                value = f"_factory_{name}() if {name} is _FACTORY else {name}"
            elif f.default is not MISSING:
                param, value = f"{name}=_default_{name}", name
            else:
                param, value = name, name
            if f.kw_only:
                keyword.append(param)
            else:
                if seen_default and "=" not in param:
                    raise TypeError(f"non-default argument {name!r} follows default argument")
                seen_default = seen_default or "=" in param
                positional.append(param)
        elif f.default_factory is not MISSING:
            value = f"_factory_{name}()"
        elif f.default is not MISSING:
            value = f"_default_{name}"
        else:
            continue  # set by __post_init__
        body.append(f"  __record_self__.{name} = {value}")
    for name, default in initvars:
        if default is MISSING:
            positional.append(name)
        else:
            scope[f"_default_{name}"] = default
            positional.append(f"{name}=_default_{name}")
    if hasattr(cls, "__post_init__"):
        body.append(f"  __record_self__.__post_init__({', '.join(n for n, _ in initvars)})")
    params = ["__record_self__", *positional, *(["*", *keyword] if keyword else [])]
    source = f"def __init__({', '.join(params)}):\n" + ("\n".join(body) or "  pass") + "\n"
    return source, scope


def _first_init(cls: Any, source: str, scope: dict[str, Any]) -> Callable[..., None]:
    """An `__init__` that compiles the class's own on its first call and puts it in its place:
    a run builds instances of about two thirds of the classes it defines (the rest come
    unpickled, or serve another command), and compiling is most of what a class costs."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        exec(compile(source, f"<record {cls.__qualname__}>", "exec"), scope)
        init = scope["__init__"]
        init.__qualname__ = f"{cls.__qualname__}.__init__"
        cls.__init__ = init
        init(self, *args, **kwargs)

    return __init__


# -- the shared methods ------------------------------------------------------------------------


def _no_key(_record: object) -> tuple[()]:
    return ()


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        key = self.__record_key__
        return key(self) == key(other)
    return NotImplemented


def _hash(self: Any) -> int:
    return hash(self.__record_key__(self))


def _ordered(compare: Callable[[Any, Any], bool]) -> Callable[[Any, Any], Any]:
    def method(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            key = self.__record_key__
            return compare(key(self), key(other))
        return NotImplemented

    return method


_lt = _ordered(lambda a, b: a < b)
_le = _ordered(lambda a, b: a <= b)
_gt = _ordered(lambda a, b: a > b)
_ge = _ordered(lambda a, b: a >= b)


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__record_repr__)
    return f"{self.__class__.__qualname__}({shown})"


# -- dataclasses' functions ----------------------------------------------------------------------


def is_record(value: object) -> bool:
    """A record class or instance."""
    return hasattr(value, "__record_fields__")


def fields(value: Any) -> tuple[Any, ...]:
    """A record's (or record class's) fields, in order; a dataclass's too (dataclasses.fields:
    the rest of the package, off the drift path, keeps dataclasses)."""
    if not is_record(value):
        import dataclasses

        return dataclasses.fields(value)
    found: tuple[Field, ...] = value.__record_fields__
    return found


def replace(value: T, **changes: Any) -> T:
    """A copy of the record `value` with `changes`, through its `__init__` (so
    `__post_init__` runs again, as with dataclasses.replace); a dataclass's by that."""
    if not is_record(value):
        import dataclasses

        return dataclasses.replace(value, **changes)  # type: ignore[type-var]
    for f in fields(value):
        if not f.init:
            if f.name in changes:
                raise ValueError(f"field {f.name} is declared with init=False")
        elif f.name not in changes:
            changes[f.name] = getattr(value, f.name)
    return value.__class__(**changes)


_ATOMS = frozenset({str, int, float, bool, type(None)})  # what deepcopy returns as it is


def asdict(value: Any) -> Any:
    """A record as dicts (records and dataclasses inside too, and the lists, tuples and dicts
    holding them), every other value deep-copied: dataclasses.asdict."""
    if not isinstance(value, type) and (is_record(value) or hasattr(value, "__dataclass_fields__")):
        return {f.name: asdict(getattr(value, f.name)) for f in fields(value)}
    if type(value) in _ATOMS:
        return value
    if isinstance(value, list | tuple):
        items = (asdict(v) for v in value)
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return type(value)((asdict(k), asdict(v)) for k, v in value.items())
    from copy import deepcopy

    return deepcopy(value)
