"""A mesh member's LOBES_MESH_SEEDS from the mesh's sorted gateway origins. Imports nothing:
the desired state derives it (envfile.MeshSeeds) and a remembered drift entry builds it again
from the origins it keeps once (drift_inputs._Seeds), before pydantic is ever imported."""

from __future__ import annotations

from collections.abc import Mapping


def seeds_text(origins: tuple[str, ...], position: Mapping[str, int], box: str) -> str:
    """The other members' origins, sorted, comma-separated (every origin for a non-member)."""
    at = position.get(box)
    if at is None:
        return ",".join(origins)
    return ",".join(origins[:at] + origins[at + 1 :])
