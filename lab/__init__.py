"""The fleet lab: three real boxes (thor, spark, orin) on this one machine.

API for other code and tests (all need root except status/facts):
    lab.up() -> dict            build or restore the lab, wait until ready, return .lab/lab.json
    lab.down(purge=False)       remove everything up created
    lab.status() -> dict        print the status table, return {box: BoxHealth}
    lab.facts() -> dict         the parsed .lab/lab.json
    lab.incidents.<name>(box, ...)   reproduce a field incident by hand (see incidents.py)
See docs/lab.md.
"""

from __future__ import annotations

from typing import Any


def up(**kw: Any) -> dict[str, Any]:
    from .lifecycle import up as _up

    return _up(**kw)


def down(**kw: Any) -> None:
    from .lifecycle import down as _down

    _down(**kw)


def status() -> dict[str, Any]:
    from .statustable import status as _status

    return _status()


def facts() -> dict[str, Any]:
    from .labfacts import load

    return load()


def __getattr__(name: str) -> Any:
    # `lab.incidents` without importing everything at `import lab`.
    if name == "incidents":
        import importlib

        return importlib.import_module(".incidents", __name__)
    raise AttributeError(name)
