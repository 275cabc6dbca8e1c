"""Every dataclass a repeated drift imports has a docstring of its own: without one,
dataclasses builds `__doc__` from inspect.signature() when the class is created, a cost every
run pays at import (about 0.3 ms a class; the observation document alone has 31 classes)."""

from __future__ import annotations

from tests.unit.conftest import fresh_python

REPEATED_DRIFT_PATH = (
    "reconciler.cli",
    "reconciler.observe.early",
    "reconciler.drift",
    "reconciler.report.json_report",
    "reconciler.history.hooks",
    "reconciler.history.record",
    "reconciler.history.store",
)


def test_no_dataclass_on_the_repeated_drift_path_lacks_a_docstring() -> None:
    code = (
        "import dataclasses, inspect, sys\n"
        f"for name in {REPEATED_DRIFT_PATH!r}:\n"
        "    __import__(name)\n"
        "missing = sorted(\n"
        "    f'{module}.{name}'\n"
        "    for module, loaded in list(sys.modules.items()) if module.startswith('reconciler')\n"
        "    for name, value in vars(loaded).items()\n"
        "    if inspect.isclass(value) and dataclasses.is_dataclass(value)\n"
        "    and value.__module__ == module\n"
        "    and (value.__doc__ or '').startswith(value.__name__ + '(')\n"
        ")\n"
        "print(missing)\n"
    )
    assert fresh_python(code).strip() == "[]"
