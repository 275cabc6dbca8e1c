"""The `.env` keys the fleet pins on a box, derived from its desired state.

Only these keys are managed: lobes' own render (`lobes init`) writes ~100 more, and a converge
keeps every other line byte for byte. Each key remembers the YAML path that decided it, so a
drift report can say where a desired value came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from reconciler.desired import roles
from reconciler.desired.entries import EnvEntry, SecretName
from reconciler.desired.mesh_seeds import seeds_text
from reconciler.desired.models import BoxSpec, EnvValue, InventoryBox, SecretRef
from reconciler.desired.types import url_host
from reconciler.desired.yaml_scalars import as_text

if TYPE_CHECKING:
    from reconciler.desired.fleet import Fleet


# Derived keys an `env: {KEY: null}` may leave out of `.env` because compose's fallback then
# says the same: lobes' template reads `${HAND_IMAGE:-${VLLM_NIGHTLY_IMAGE...}}` (WORKER_IMAGE
# and ASSOCIATE_IMAGE alike), and `${CULTURE_VLLM_API_KEY:-}`. Any other derived key is refused
# (checks.py: "already set by"), a key the state does not derive may always be left out.
NIGHTLY_FALLBACK = ("HAND_IMAGE", "WORKER_IMAGE", "ASSOCIATE_IMAGE")
MAY_LEAVE_OUT = frozenset({*NIGHTLY_FALLBACK, "CULTURE_VLLM_API_KEY"})
NIGHTLY = "VLLM_NIGHTLY_IMAGE"


def env_text(value: EnvValue | None) -> str | SecretName | None:
    """How compose will see a YAML scalar: booleans as lobes writes them (true/false); None
    (a `null` pin) is a key that must be absent."""
    if value is None:
        return None
    if isinstance(value, SecretRef):
        return SecretName(value.secret)
    return as_text(value)  # the loader refuses an `env:` number written otherwise (load.py)


def gateway_origin(inv: InventoryBox, box: BoxSpec) -> str:
    return inv.gateway_origin or f"http://{url_host(inv.ssh_hostname)}:{box.gateway.port}"


@dataclass(frozen=True)
class MeshSeeds:
    """Every mesh member's gateway origin, derived and sorted once per fleet.

    A member's LOBES_MESH_SEEDS is all of them but its own, so one box's seeds are a slice of
    this, not a pass over the fleet: deriving them per box from the member list cost 2 million
    `gateway_origin` calls at 1,000 boxes (quadratic)."""

    origins: tuple[str, ...]  # sorted
    position: dict[str, int]  # member name -> the index of its own origin in `origins`

    @classmethod
    def of(cls, inventory: dict[str, InventoryBox], members: list[BoxSpec]) -> MeshSeeds:
        ordered = sorted(
            (gateway_origin(inventory[m.name], m), m.name) for m in members if m.mesh.enabled
        )
        return cls(tuple(o for o, _ in ordered), {n: i for i, (_, n) in enumerate(ordered)})

    def seeds(self, box: str) -> str:
        """The other members' origins, sorted, comma-separated."""
        return seeds_text(self.origins, self.position, box)


def desired_env(
    box: BoxSpec, inventory: dict[str, InventoryBox], mesh: MeshSeeds
) -> list[EnvEntry]:
    """Every managed `.env` key of `box`, in a stable order (derived keys, then pins)."""
    out: list[EnvEntry] = []
    left_out = {k for k, v in box.env.items() if v is None and k in MAY_LEAVE_OUT}

    def put(key: str, value: EnvValue | None, origin: str) -> None:
        out.append(EnvEntry(key, env_text(value), origin))

    put("MODEL_GEAR_VERSION", box.lobes.version, "lobes.version")
    put("LOBES_PROFILE", box.lobes.profile, "lobes.profile")
    put("LOBES_SHAPE", box.lobes.shape, "lobes.shape")
    # COMPOSE_FILE makes a plain `docker compose` in the directory resolve lobes' -f chain.
    put("COMPOSE_FILE", ":".join(box.deployment.compose_files), "deployment.compose_files")
    profiles = sorted({lane.profile for lane in box.lanes.values() if lane.profile})
    if profiles:
        put("COMPOSE_PROFILES", ",".join(profiles), "lanes.*.profile")

    image_vars: dict[str, tuple[str, str]] = {}
    for name, lane in sorted(box.lanes.items()):
        var = roles.IMAGE_VARIABLE.get(lane.role)
        if var and var not in image_vars and var not in left_out:
            image_vars[var] = (box.image_ref(lane.image), f"lanes.{name}.image")
    for var, (ref, origin) in sorted(image_vars.items()):
        put(var, ref, origin)
    put(roles.GATEWAY_IMAGE_VARIABLE, box.image_ref(box.gateway.image), "gateway.image")
    put("VLLM_PORT", box.gateway.port, "gateway.port")

    for name, lane in sorted(box.lanes.items()):
        prefix, at = lane.env_prefix, f"lanes.{name}"
        if lane.model is not None:
            put(f"{prefix}_MODEL", lane.model, f"{at}.model")
        if lane.served_name is not None:
            put(f"{prefix}_SERVED_NAME", lane.served_name, f"{at}.served_name")
        put(f"{prefix}_MAX_MODEL_LEN", lane.max_model_len, f"{at}.max_model_len")
        put(f"{prefix}_GPU_MEM_UTIL", lane.gpu_memory_utilization, f"{at}.gpu_memory_utilization")
        for key, value in lane.env.items():
            put(key, value, f"{at}.env.{key}")

    for role, contract in sorted(box.contract.items()):
        if not contract.feasible and role in roles.ENV_PREFIX:
            put(f"{roles.ENV_PREFIX[role]}_FEASIBLE", "false", f"contract.{role}.feasible")

    # Auth: both inbound key variables are decided by gateway.auth, never left to a shell.
    if box.gateway.auth == "keyed" and box.gateway.api_key is not None:
        put("GATEWAY_API_KEY", box.gateway.api_key, "gateway.api_key")
    else:
        put("GATEWAY_API_KEY", "", "gateway.auth")
    if "CULTURE_VLLM_API_KEY" not in left_out:
        put("CULTURE_VLLM_API_KEY", "", "gateway.auth")

    if box.mesh.enabled and box.mesh.key is not None:
        inv = inventory[box.name]
        put("LOBES_MESH_NAME", box.name, "inventory (box name)")
        put("LOBES_MESH_KEY", box.mesh.key, "mesh.key")
        put("LOBES_MESH_HEARTBEAT_S", box.mesh.heartbeat_s, "mesh.heartbeat_s")
        put("GATEWAY_SELF_ORIGIN", gateway_origin(inv, box), "inventory.gateway_origin")
        put("LOBES_MESH_SEEDS", mesh.seeds(box.name), "inventory (other mesh members)")
    else:
        put("LOBES_MESH_KEY", "", "mesh.enabled")

    for key, value in box.env.items():
        put(key, value, f"env.{key}")
    return out


def left_out_image_problems(box: BoxSpec) -> list[tuple[tuple[str | int, ...], str]]:
    """A lane whose own image variable is left out of `.env` runs VLLM_NIGHTLY_IMAGE's image:
    it must want the one another lane of the box pins there, else no converge delivers it."""
    nightly = next(
        (
            (name, box.image_ref(lane.image))
            for name, lane in sorted(box.lanes.items())
            if roles.IMAGE_VARIABLE.get(lane.role) == NIGHTLY
        ),
        None,
    )
    out: list[tuple[tuple[str | int, ...], str]] = []
    for name, lane in sorted(box.lanes.items()):
        var = roles.IMAGE_VARIABLE.get(lane.role)
        if var not in NIGHTLY_FALLBACK or var not in box.env or box.env[var] is not None:
            continue
        if nightly is None:
            why = f"no lane of the box pins {NIGHTLY}, so compose would run lobes' default"
        elif nightly[1] != box.image_ref(lane.image):
            why = f"compose then runs {NIGHTLY}, which lanes.{nightly[0]}.image decides"
        else:
            continue
        out.append(
            (("lanes", name, "image"), f"env.{var} is null (left out of .env): {why}; "
             f"pin {var} or want the same image")
        )  # fmt: skip
    return out


def mesh_seeds(fleet: Fleet) -> MeshSeeds:
    return MeshSeeds.of(fleet.inventory.boxes, fleet.mesh_members())


def box_env(fleet: Fleet, box: str) -> list[EnvEntry]:
    """The managed `.env` of one box of the fleet (for many boxes: `fleet_env`)."""
    return fleet_env(fleet, [box])[box]


def fleet_env(fleet: Fleet, boxes: list[str]) -> dict[str, list[EnvEntry]]:
    """The managed `.env` of each of `boxes`: as the loader derived it to check it when it
    did (each a new list: a caller may change its own), else with the mesh's seeds derived
    once for all."""
    derived = fleet.envs.of(fleet) if fleet.envs is not None else None
    if derived is not None:
        return {name: list(derived[name]) for name in boxes}
    mesh = mesh_seeds(fleet)
    return {name: desired_env(fleet.boxes[name], fleet.inventory.boxes, mesh) for name in boxes}
