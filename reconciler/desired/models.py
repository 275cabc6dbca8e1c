"""The desired state of one box and of the mesh, as strict, frozen pydantic models.

A model here only checks what one value can tell about itself (a digest, a range, a known
role). Checks that need two places at once (a lane against the box budget, a proxied role
against the box that hosts it, a secret reference against the declared sources) live in
`checks.py`, so each error can point at the YAML line that causes it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

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
    url_host,
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


# The lengths are the box program's own limits (apply/remote/converge.py SECRET_NAME, ENV_KEY,
# SERVICE): a longer name passed validation and `apply --dry`, then the box refused the payload.
Name = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_\-]*$", max_length=128)]
EnvKey = Annotated[str, StringConstraints(pattern=r"^[A-Z_][A-Z0-9_]*$", max_length=256)]


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


def _refused(model: type[BaseModel], errors: list[tuple[tuple[str, ...], str]]) -> ValidationError:
    """A model's own refusals, each at the key it blames (`("boxes", "orin", "ssh_hostname")`),
    so the loader reports each at that key's line, not at the model's."""
    return ValidationError.from_exception_data(
        model.__name__,
        [
            # As a validator's ValueError is reported (its message in ctx), so that the error
            # can be rebuilt from .errors() as the loader's layer checks do.
            InitErrorDetails(
                type="value_error", loc=loc, input=None, ctx={"error": ValueError(message)}
            )
            for loc, message in errors
        ],
    )


def compose_project_name(directory: str) -> str:
    """The project name compose derives from a directory (no -p, no COMPOSE_PROJECT_NAME): its
    last part lowercased, every character but a-z, 0-9, _ and - dropped, then any leading _
    and - (compose-go's NormalizeProjectName; `~/.lobes` -> `lobes`, `~/My.Lobes` -> `mylobes`,
    checked against `docker compose config`). Empty: compose refuses the directory."""
    kept = re.sub(r"[^a-z0-9_-]", "", directory.rstrip("/").rsplit("/", 1)[-1].lower())
    return kept.lstrip("_-")


class DeploymentSpec(Strict):
    directory: InsideHome = Field(
        default="~/.lobes", description="the compose project directory, inside the home (~/...)"
    )
    # The name compose derives from the directory: checks.py `_compose_project`.
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


def _not_the_gateway(service: str) -> str:
    # The gateway is lobes' own service in the same compose project: a lane named so was
    # planned as a lane (memory-gated, recreated twice) and the real lane it replaced removed.
    if service == roles.GATEWAY_SERVICE:
        raise ValueError(f"a lane cannot be the {service!r} service: it is the gateway's")
    return service


LaneService = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z0-9][a-z0-9\-]*$", max_length=128),
    AfterValidator(_not_the_gateway),
]


class LaneSpec(Strict):
    """One vLLM lane (a compose service) this box must run."""

    role: Role
    service: LaneService | None = None
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


# A container name (Docker's [a-zA-Z0-9][a-zA-Z0-9_.-]*) or an fnmatch pattern of one (`*`,
# `?`, `[...]`, `[!...]`): nothing else, so no space, quote, `;` or `/` ever reaches a report.
def _names_something(pattern: str) -> str:
    if not re.search(r"[A-Za-z0-9]", re.sub(r"\[[^\]]*\]?", "", pattern)):
        raise ValueError(
            f"{pattern!r} names no container (a pattern of wildcards only would expect every one)"
        )
    return pattern


ContainerPattern = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9*?\[][A-Za-z0-9_.*?\[\]!-]{0,127}$"),
    AfterValidator(_names_something),
]
HostPort = Annotated[int, Field(ge=1, le=65535)]


class ExpectedContainer(Strict):
    """A container outside the compose project that may run on the box (an exporter)."""

    name: ContainerPattern = Field(
        description="its container name, or an fnmatch pattern of one (*, ?, [...])"
    )
    ports: tuple[HostPort, ...] | None = Field(
        default=None,
        description="the host ports it may publish (any other is a stray); omitted: any; []: none",
    )


class AuditPolicy(Strict):
    """What `reconcile audit` accepts beside the compose project. An expected container's
    port that answers GET /v1/models without a key (2xx) fails whatever is declared."""

    expected_containers: tuple[ExpectedContainer, ...] = Field(
        default=(),
        description="containers outside the compose project that may run (host network "
        "included) and publish their declared ports: listed as expected, not as strays",
    )


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
    audit: AuditPolicy = Field(default_factory=AuditPolicy)

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

    @field_validator("boxes")
    @classmethod
    def _some_box(cls, boxes: dict[str, InventoryBox]) -> dict[str, InventoryBox]:
        # Without one, every check passed, and a drift, audit or apply gate pointed at an
        # emptied or template inventory reported green having judged nothing.
        if not boxes:
            raise ValueError("no boxes: an inventory names at least one box")
        return boxes

    @model_validator(mode="after")
    def _one_box_per_machine(self) -> Self:
        """Two boxes reached at one (ssh host, port) are one machine: `apply orin` would
        converge thor's host with orin's state. Two boxes declaring one gateway origin are one
        gateway to the mesh. Each box of a clash is refused at its own line, naming the others."""
        ssh: dict[tuple[str, int], list[str]] = {}
        origins: dict[tuple[str, int], list[str]] = {}
        for name, box in self.boxes.items():
            ssh.setdefault((same_host(box.ssh_hostname), box.ssh_port), []).append(name)
            if box.gateway_origin is not None:
                origins.setdefault(origin_endpoint(box.gateway_origin), []).append(name)
        clash = {
            "ssh_hostname": (
                ssh,
                "two boxes cannot be one machine (an apply of one would converge the other's host)",
            ),
            "gateway_origin": (origins, "two boxes cannot be one gateway of the mesh"),
        }
        errors: list[tuple[tuple[str, ...], str]] = []
        for key, (seen, why) in clash.items():
            for (host, port), names in seen.items():
                for name in names if len(names) > 1 else ():
                    others = ", ".join(f"boxes.{n}.{key}" for n in names if n != name)
                    what = "" if key == "ssh_hostname" else "the gateway at "
                    sep = " port " if key == "ssh_hostname" else ":"
                    errors.append(
                        (
                            ("boxes", name, key),
                            f"{what}{url_host(host)}{sep}{port} is also {others}: {why}",
                        )
                    )
        if errors:
            raise _refused(InventorySpec, errors)
        return self


def same_host(host: str) -> str:
    """A host as a machine is told apart: a name case-insensitively and without its trailing
    dot, an address in its one canonical form (`::1` and `0:0::1` are one)."""
    bare = host.removeprefix("[").removesuffix("]")
    try:
        return ipaddress.ip_address(bare).compressed
    except ValueError:
        return bare.rstrip(".").lower()


def origin_endpoint(origin: str) -> tuple[str, int]:
    """Where an origin (checked by types.check_origin) is served: its host (`same_host`) and
    port, the scheme's default if none is written (80, 443)."""
    scheme, _, rest = origin.partition("://")
    host, port = rest, "443" if scheme == "https" else "80"
    if rest.startswith("["):
        host, _, tail = rest.partition("]")
        host += "]"
        port = tail.removeprefix(":") or port
    elif ":" in rest:
        host, port = rest.rsplit(":", 1)
    return same_host(host), int(port)
