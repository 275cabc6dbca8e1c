"""What a comparison of one box needs from the desired state, flattened once.

Built by the caller from a Fleet; compare/ never loads files or opens connections.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.desired import roles
from reconciler.desired.entries import EnvEntry, SecretName
from reconciler.records import field, record_class

if TYPE_CHECKING:
    from reconciler.compare.values import Flags
    from reconciler.desired.models import BoxSpec

# `.env` knobs that end up as a flag of their lane's command (lobes' template), by suffix.
KNOB_FLAGS: dict[str, str] = {
    "MAX_MODEL_LEN": "--max-model-len",
    "GPU_MEM_UTIL": "--gpu-memory-utilization",
    "SERVED_NAME": "--served-model-name",
    "MAX_NUM_SEQS": "--max-num-seqs",
    "KV_CACHE_DTYPE": "--kv-cache-dtype",
    "QUANTIZATION": "--quantization",
    "SPECULATIVE_CONFIG": "--speculative-config",
    "HF_OVERRIDES": "--hf-overrides",
}


@record_class()
class LaneExpectation:
    """What one lane should be: its service, image, model limits and the `.env` knobs it reads."""

    name: str  # the lane's key in group_vars (`worker`)
    service: str  # compose service (`vllm-worker`)
    role: str
    image: str  # resolved repo@sha256 reference
    max_model_len: int
    gpu_memory_utilization: float
    boot_timeout_s: int
    knobs: dict[str, tuple[str, str]]  # .env key -> (flag, desired value) for dead-knob checks
    # Each knob's flags as its command line would carry them (parse_argv of knob_tokens): the
    # desired side of the dead-knob check, lexed once when the inputs are derived and kept
    # with them (a warm replay reads them back instead of lexing them again for every box).
    knob_flags: dict[str, Flags] = field(init=False, repr=False, compare=False)
    # The knobs whose desired value may carry a secret inline (`--api-key x`, `Bearer x`): the
    # render holds it hashed with the run's key, so they compare with the box's mask of their
    # words (compare/composefiles.py) and never show their value in clear. Judged once here,
    # with the inputs, so a replay's common path is one set lookup per knob, no regex.
    knob_secrets: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Imported here: the early start (observe/early.py) reads remembered inputs, whose
        # unpickling runs no __post_init__, before it may import the comparison.
        from reconciler.compare.inline import knob_may_carry_secret
        from reconciler.compare.values import knob_tokens, parse_argv

        flags, secrets = {}, set()
        for key, (flag, knob) in self.knobs.items():
            words = knob_tokens(flag, knob)
            flags[key] = parse_argv(words)[1]
            if knob_may_carry_secret(knob, tuple(words)):
                secrets.add(key)
        object.__setattr__(self, "knob_flags", flags)
        object.__setattr__(self, "knob_secrets", frozenset(secrets))


@record_class()
class GatewayExpectation:
    """How the gateway should listen and answer: bind, port, auth mode, health timeout."""

    bind: str
    port: int
    auth: str  # keyed | open
    health_timeout_s: int


@record_class()
class ContractExpectation:
    """What the gateway must advertise for one role (desired/models.py RoleContract)."""

    context: int | None
    proxied_to: str | None
    feasible: bool


@record_class()
class BoxExpectation:
    """Plain values only (no validation models): compare needs nothing else, and a drift run
    reuses these between runs without importing pydantic (reconciler/drift_inputs.py)."""

    name: str
    lobes_version: str
    compose_files: tuple[str, ...]
    file_digests: dict[str, str]  # compose file -> sha256 the desired state pins
    gateway: GatewayExpectation
    contract: dict[str, ContractExpectation]  # by role
    forbidden_exports: tuple[str, ...]  # login_shell.forbidden
    mem_floor_gib: float
    env: tuple[EnvEntry, ...]
    lanes: dict[str, LaneExpectation]  # by service
    gateway_image: str
    mesh_members: dict[str, str] = field(default_factory=dict)  # role -> box expected to host it
    # Where the desired state deploys (`~/...`) and as whom, and each secret's source as the
    # collector is told it (observe/payload.py: `{"path", "key"}`, `{"variable"}`): a replayed
    # snapshot's answer may be for other ones (compare/box.py `Replayed`). None: not known.
    directory: str | None = None
    user: str | None = None
    secret_sources: dict[str, dict[str, str]] = field(default_factory=dict)


def expectation(
    box: BoxSpec, env: list[EnvEntry], hosts: dict[str, str], user: str | None = None
) -> BoxExpectation:
    """`hosts`: role -> the box whose contract serves it (for proxied-role checks). `user`:
    the inventory's ssh_user of the box."""
    plain = plain_env(env)
    lanes = {}
    for name, lane in box.lanes.items():
        knobs = lane_knobs(lane.env_prefix, plain)
        lanes[lane.service_name] = LaneExpectation(
            name=name,
            service=lane.service_name,
            role=lane.role,
            image=box.image_ref(lane.image),
            max_model_len=lane.max_model_len,
            gpu_memory_utilization=lane.gpu_memory_utilization,
            boot_timeout_s=lane.boot_timeout_s,
            knobs=knobs,
        )
    gw = box.gateway
    return BoxExpectation(
        name=box.name,
        lobes_version=box.lobes.version,
        compose_files=tuple(box.deployment.compose_files),
        file_digests=dict(box.deployment.file_digests),
        gateway=GatewayExpectation(gw.bind, gw.port, gw.auth, gw.health_timeout_s),
        contract={
            str(role): ContractExpectation(c.context, c.proxied_to, c.feasible)
            for role, c in box.contract.items()
        },
        forbidden_exports=tuple(box.login_shell.forbidden),
        mem_floor_gib=box.memory.mem_available_floor_gib,
        env=tuple(env),
        lanes=lanes,
        gateway_image=box.image_ref(gw.image),
        mesh_members=dict(hosts),
        directory=box.deployment.directory,
        user=user,
        secret_sources={
            name: {"path": src.path, "key": src.key}
            if src.source == "box_file"
            else {"variable": src.variable}
            for name, src in box.secrets.items()
        },
    )


def plain_env(env: list[EnvEntry]) -> dict[str, str]:
    """The managed `.env` keys whose desired value is a text (no secret name, not removed)."""
    return {e.key: e.value for e in env if isinstance(e.value, str)}


def lane_knobs(prefix: str, plain: dict[str, str]) -> dict[str, tuple[str, str]]:
    """A lane's knobs: `.env` key -> (its flag, desired value), for each one `.env` sets to a
    non-empty text (lobes' template leaves an empty one off the command line). The expectation
    and the collector's payload (observe/payload.py `knob_argv`) read them alike."""
    knobs = {}
    for suffix, flag in KNOB_FLAGS.items():
        key = f"{prefix}_{suffix}"
        if key in plain and plain[key] != "":
            knobs[key] = (flag, plain[key])
    return knobs


def secret_of(entry: EnvEntry) -> str | None:
    return entry.value.secret if isinstance(entry.value, SecretName) else None


GATEWAY = roles.GATEWAY_SERVICE
