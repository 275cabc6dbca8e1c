"""The desired state of one box and of the mesh, as strict, frozen pydantic models.

A model here only checks what one value can tell about itself (a digest, a range, a known
role). Checks that need two places at once (a lane against the box budget, a proxied role
against the box that hosts it, a secret reference against the declared sources) live in
`checks.py`, so each error can point at the YAML line that causes it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
)

from reconciler.desired import roles, secret_names
from reconciler.desired.refs import is_digest_ref
from reconciler.desired.types import (
    ComposeFile,
    ControllerFile,
    Host,
    HttpOrigin,
    ImageChoice,
    ImageRef,
    InsideHome,
    IPv4,
    ModelId,
    SshFile,
    Text,
    UserName,
    VarGlob,
    Version,
    check_env_value,
)

# The box's own bounds (reconciler/apply/remote/converge.py `_timeout`, `validate_payload`): the
# loader refuses what a converge would, at the line that set it, not at apply time.
MAX_TIMEOUT_S = 7 * 24 * 3600
MAX_FLOOR_GIB = 1 << 20
TimeoutS = Annotated[int, Field(gt=0, le=MAX_TIMEOUT_S)]


def _require_digest(ref: str) -> str:
    if not is_digest_ref(ref):
        raise ValueError(f"{ref!r} is not pinned by digest (want repo@sha256:<64 hex>)")
    return ref


class Strict(BaseModel):
    """Every desired-state model: no coercion, no unknown keys, immutable once loaded."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, defer_build=True)


Name = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_\-]*$")]
EnvKey = Annotated[str, StringConstraints(pattern=r"^[A-Z_][A-Z0-9_]*$")]


def _not_index(name: str) -> str:
    # A snapshot keeps each box as BOX.json beside its own index.json (observe.save_snapshot):
    # a box named `index` would be overwritten by the index, so it is refused before anything.
    if name == "index":
        raise ValueError("a box cannot be named 'index': a snapshot keeps its index as index.json")
    return name


BoxName = Annotated[Name, AfterValidator(_not_index)]
DigestRef = Annotated[str, AfterValidator(_require_digest)]
Role = Literal[
    "cortex",
    "senses",
    "muse",
    "worker",
    "associate",
    "hand",
    "decider",
    "embedder",
    "reranker",
    "stt",
    "tts",
    "innereye",
]
assert set(Role.__args__) == set(roles.ROLES)  # type: ignore[attr-defined]


class TaggedImage(Strict):
    """An image that cannot be pinned by digest; the reason is required and shown in reports."""

    ref: ImageRef
    tag_allowed_because: Annotated[Text, StringConstraints(min_length=10)]


# A mapping is a TaggedImage, anything else a digest reference: each input is checked by one
# member only, so a bad reference gets one message, not one per member of the union.
ImageEntry = Annotated[
    Annotated[DigestRef, Tag("ref")] | Annotated[TaggedImage, Tag("tagged")],
    Discriminator(lambda v: "tagged" if isinstance(v, dict | TaggedImage) else "ref"),
]


class SecretRef(Strict):
    """Where an `.env` value is a secret, YAML names its source instead of holding the value."""

    secret: Name


# A string value is one line of text (checked after the union: its message, not five).
EnvValue = Annotated[str | int | float | bool | SecretRef, AfterValidator(check_env_value)]
# An `env:` pin of `null` means "leave this key out of `.env`": a converge removes its line
# (lobes' own render leaves some keys out, and compose's `${KEY:-default}` then decides).
EnvPin = EnvValue | None


class BoxFileSecret(Strict):
    """A secret that lives on the box in a KEY=value file and never leaves it."""

    source: Literal["box_file"]
    path: InsideHome = Field(description="file on the box, inside the deploy user's home (~/...)")
    key: EnvKey


class ControllerEnvSecret(Strict):
    """A secret read from a variable of the controller's environment at apply time."""

    source: Literal["controller_env"]
    variable: EnvKey


SecretSource = Annotated[BoxFileSecret | ControllerEnvSecret, Field(discriminator="source")]


class LobesSpec(Strict):
    version: Version = Field(description="MODEL_GEAR_VERSION: the lobes-cli the gateway image runs")
    profile: Name = Field(description="`lobes init --profile`")
    shape: Name = Field(description="`lobes init --shape`")


class DeploymentSpec(Strict):
    directory: InsideHome = Field(
        default="~/.lobes", description="the compose project directory, inside the home (~/...)"
    )
    project: Name = Field(default="lobes", description="compose project name (= directory name)")
    compose_files: tuple[ComposeFile, ...] = Field(
        min_length=1, description="the -f chain, in order; written to COMPOSE_FILE"
    )
    file_digests: dict[
        ComposeFile, Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    ] = Field(
        default_factory=dict,
        description="sha256 each compose file must have (lobes' render, the fleet override); "
        "a file without a digest is only checked to exist",
    )


class LaneSpec(Strict):
    """One vLLM lane (a compose service) this box must run."""

    role: Role
    service: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9\-]*$")] | None = None
    image: ImageChoice = Field(description="a name from `images:` or a repo@sha256 reference")
    model: ModelId | None = None
    served_name: ModelId | None = None
    max_model_len: Annotated[int, Field(gt=0)]
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)]
    profile: Name | None = Field(default=None, description="COMPOSE_PROFILES entry it needs")
    boot_timeout_s: TimeoutS = 900
    env: dict[EnvKey, EnvPin] = Field(
        default_factory=dict, description="extra .env pins of this lane; null: leave the key out"
    )

    @property
    def service_name(self) -> str:
        return self.service or roles.SERVICE[self.role]

    @property
    def env_prefix(self) -> str:
        return roles.ENV_PREFIX[self.role]


class GatewaySpec(Strict):
    image: ImageChoice = Field(description="a name from `images:` or a repo@sha256 reference")
    bind: IPv4 = "0.0.0.0"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    auth: Literal["keyed", "open"]
    api_key: SecretRef | None = Field(default=None, description="required when auth is keyed")
    health_timeout_s: TimeoutS = 120


class MeshSpec(Strict):
    """lobes' gateway mesh. A member's LOBES_MESH_NAME is its own name (the box name)."""

    enabled: bool
    key: SecretRef | None = None
    heartbeat_s: Annotated[int, Field(gt=0)] = 60


class RoleContract(Strict):
    """What the gateway must advertise for one role: served here (`context`), proxied to a
    member (`proxied_to`), or declared infeasible on this box (`feasible: false`)."""

    context: Annotated[int, Field(gt=0)] | None = None
    proxied_to: Name | None = None
    feasible: bool = True


class LoginShellPolicy(Strict):
    forbidden: tuple[VarGlob, ...] = Field(
        description="variable names (globs allowed) that must never come from a login shell"
    )


class MemoryPolicy(Strict):
    drop_caches_before_boot: bool
    mem_available_floor_gib: Annotated[float, Field(ge=0, le=MAX_FLOOR_GIB)]


class BoxSpec(Strict):
    """The merged desired state of one box: group_vars all -> groups -> box."""

    name: Name
    lobes: LobesSpec
    deployment: DeploymentSpec
    images: dict[Name, ImageEntry]
    secrets: dict[Name, SecretSource] = Field(default_factory=dict)
    # The built-in floor is always added: no layer can stop a mesh key from being hashed.
    secret_patterns: Annotated[tuple[VarGlob, ...], AfterValidator(secret_names.effective)] = Field(
        description="globs of variable names whose values are secrets; each layer adds to the "
        "ones below, and a built-in floor (*_KEY, *_TOKEN, *SECRET*, ...) is always included"
    )
    login_shell: LoginShellPolicy
    memory: MemoryPolicy
    gpu_memory_budget: Annotated[float, Field(gt=0, le=1)]
    gateway: GatewaySpec
    mesh: MeshSpec
    env: dict[EnvKey, EnvPin] = Field(
        default_factory=dict,
        description="extra .env pins; null: leave the key out of .env (a converge removes its "
        "line). A null may also drop a key the state derives where compose falls back the same: "
        "a lane's own image variable (HAND_IMAGE, WORKER_IMAGE, ASSOCIATE_IMAGE: compose then "
        "runs VLLM_NIGHTLY_IMAGE) or CULTURE_VLLM_API_KEY",
    )
    lanes: dict[Name, LaneSpec] = Field(default_factory=dict)
    contract: dict[Role, RoleContract] = Field(default_factory=dict)

    def image_ref(self, image: str) -> str:
        """Resolve a catalog name (or pass a literal reference through)."""
        entry = self.images.get(image)
        if entry is None:
            return image
        return entry if isinstance(entry, str) else entry.ref


class InventoryBox(Strict):
    """Connection data of one box: all that differs between the real mesh and the lab."""

    groups: tuple[Name, ...] = ()
    ssh_hostname: Host
    ssh_user: UserName
    ssh_port: Annotated[int, Field(ge=1, le=65535)] = 22
    ssh_key: SshFile | None = None
    ssh_known_hosts_file: SshFile | None = None
    gateway_origin: HttpOrigin | None = Field(
        default=None, description="how mesh members reach this gateway; default http://host:port"
    )


class InventorySpec(Strict):
    group_order: tuple[Name, ...] = ()
    image_overlay: ControllerFile | None = Field(
        default=None,
        description="YAML map image name -> ref that replaces the catalog's",
    )
    box_overlay: ControllerFile | None = Field(
        default=None,
        description="a last group_vars layer per box, `{box}` in the path (the lab's facts)",
    )
    boxes: dict[BoxName, InventoryBox]
