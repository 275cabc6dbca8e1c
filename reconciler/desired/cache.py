"""The validated desired state, remembered while no input and no loader code changed.

Loading the desired state is most of a drift run's own CPU: ruamel.yaml parsing every layer
with line numbers, merging, pydantic validating each box, the fleet-wide checks. The result is
a pure function of the input files, of this package's code (the loader, and what its checks
import from elsewhere in it: compare/shell.py judges an `env:` name, for one) and of the
libraries that parse and validate (ruamel.yaml, its C parser, pydantic), so a valid state is
pickled in the controller user's cache directory (0700, files 0600) with the fingerprint of
all of them, and a run whose inputs are byte-identical unpickles it in a millisecond (the
models are `defer_build`, so unpickling builds no validator either).

Any change misses: a layer edited, added or removed, another inventory (or another name of
the same file: it names the state's inventory), another version of this package, of
ruamel.yaml, of pydantic or of Python. An invalid state is never stored, so its problems are
always reported from the files. A cache file owned by another user is ignored.

`audit` keeps the state it loads. A drift reads it (when its own remembered inputs, derived
from it, are gone) but does not keep it: what a drift reads back is its inputs, and a valid
inputs entry means the state it came from is unchanged, so the state would be pickled for
another command.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.desired.fingerprint import code_version, library_stamps, remember, remembered
from reconciler.desired.locate import inventory_file

if TYPE_CHECKING:
    from reconciler.desired.fleet import Fleet

CACHE_VERSION = 2  # 2: the whole package's code and the parsing libraries
# The whole package, not reconciler/desired/ alone: validation runs code from elsewhere in it
# (compare/shell.py's redirecting variables), and an upgrade that would refuse the state must
# not be served the state it accepted before.
PACKAGE = Path(__file__).parents[1]
# What parses and validates the files besides this package (their versions shape the state).
LIBRARIES = ("pydantic", "pydantic_core", "ruamel.yaml", "_ruamel_yaml")
KIND = "fleet"


def _code_version() -> str:
    """This package's code, pydantic's version (it shapes a pickled model) and the installed
    parsing and validating libraries."""
    import pydantic  # already imported by the models a hit unpickles

    salt = f"{CACHE_VERSION}/{pydantic.VERSION}/{library_stamps(*LIBRARIES)}"
    return code_version(PACKAGE, salt)


def cached_fleet(root: Path, inventory: Path) -> Fleet | None:
    """The remembered state if nothing that decided it changed, else None."""
    fleet = remembered(KIND, root, inventory, _code_version())
    return fleet if type(fleet).__name__ == "Fleet" else None


def load_fleet_cached(
    root: Path | None = None, inventory: str | None = None, *, keep: bool = True
) -> Fleet:
    """`load_fleet`, skipped when the same inputs were already loaded and found valid. `keep`:
    remember a state loaded from the files for the next run (a drift does not: see cli.py)."""
    from reconciler.desired.locate import root_or_none

    found = root or root_or_none()
    if found is not None:
        inv_path = inventory_file(found, inventory)
        hit = cached_fleet(found, inv_path)
        if hit is not None:
            return hit
    from reconciler.desired.load import load_fleet

    fleet = load_fleet(root, inventory)
    if not keep:
        return fleet
    inv_path = inventory_file(fleet.root, inventory)
    remember(KIND, fleet.root, inv_path, _code_version(), fleet.inputs, fleet, fleet.seen)
    return fleet
