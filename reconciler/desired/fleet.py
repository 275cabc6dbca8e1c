"""The validated desired state of the whole mesh, as every command receives it.

Its own module (stdlib at import) so a cached state can be unpickled without the loader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reconciler.desired.entries import EnvEntry
    from reconciler.desired.fingerprint import InputsRead
    from reconciler.desired.models import BoxSpec, InventoryBox, InventorySpec
    from reconciler.desired.problems import Location, PathKey


@dataclass(frozen=True)
class DerivedEnvs:
    """Each box's managed `.env`, and the boxes and inventory it was derived from: a Fleet
    copied with other boxes (dataclasses.replace) carries this along, and must not use it."""

    boxes: dict[str, BoxSpec]
    inventory: InventorySpec
    envs: dict[str, list[EnvEntry]]

    def of(self, fleet: Fleet) -> dict[str, list[EnvEntry]] | None:
        """The envs if derived from `fleet`'s own boxes and inventory, else None."""
        same = self.boxes is fleet.boxes and self.inventory is fleet.inventory
        return self.envs if same else None


@dataclass(frozen=True)
class Fleet:
    """The validated desired state of the whole mesh."""

    root: Path
    inventory_file: str
    inventory: InventorySpec
    boxes: dict[str, BoxSpec]
    layers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    positions: dict[str, dict[PathKey, Location]] = field(default_factory=dict, repr=False)
    inputs: tuple[Path, ...] = ()  # every file that decided this state (inventory, layers)
    # What the loader saw of those files as it parsed them: the caches' fingerprint of this
    # state (desired/fingerprint.py). None for a state not loaded from files.
    seen: InputsRead | None = field(default=None, repr=False, compare=False)
    # Each box's managed `.env` as the loader derived it to check it (envfile.fleet_env hands
    # it on rather than deriving it again). Not pickled: a 1,000-box mesh's seeds make it
    # ~30 MB, which a remembered state would carry for nothing; None once unpickled.
    envs: DerivedEnvs | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("envs", None)  # the class's default (None) stands in for it when unpickled
        return state

    def connection(self, box: str) -> InventoryBox:
        return self.inventory.boxes[box]

    def mesh_members(self) -> list[BoxSpec]:
        return [b for b in self.boxes.values() if b.mesh.enabled]

    def resolve_path(self, value: str) -> str:
        """Inventory paths (keys, known_hosts) are relative to the repository root."""
        return resolve_inventory_path(self.root, value)


def resolve_inventory_path(root: Path, value: str) -> str:
    """An inventory path (a key, a known_hosts) as ssh is given it: `~` expanded, a relative
    one from the repository root `root` (the loader checks the file there: load.py)."""
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else root / path)
