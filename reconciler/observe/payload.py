"""What the controller tells a box's collector: where to look and what the desired state pins.

Secret values are never put here: a box_file secret travels as its source (the collector reads
it on the box), a controller_env secret as its name and variable; its value is read from this
controller's environment when the collectors start and sent on stdin
(observe/controller_secrets.py). The run key makes the box-side digests comparable within one
run. A payload is remembered on disk between drift runs (drift_inputs.py), so it must stay
free of values.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from reconciler.desired.secret_names import effective

if TYPE_CHECKING:  # values arrive validated; nothing here needs the models at run time
    from reconciler.desired.entries import EnvEntry
    from reconciler.desired.models import BoxSpec


def new_run_key() -> str:
    # secrets.token_hex(16) is exactly this; importing `secrets` (random, hmac, base64) cost
    # every drift run ~2 ms of CPU before any box was sent its work.
    return os.urandom(16).hex()


def collector_payload(
    box: BoxSpec, env: list[EnvEntry], run_key: str, audit: bool = False
) -> dict[str, Any]:
    managed: dict[str, Any] = {}
    for entry in env:
        # None (JSON null): the key must be absent; the collector renders without its line.
        managed[entry.key] = (
            entry.value
            if entry.value is None or isinstance(entry.value, str)
            else {"secret": entry.value.secret}
        )
    box_secrets = {
        name: {"path": src.path, "key": src.key}
        for name, src in box.secrets.items()
        if src.source == "box_file"
    }
    return {
        "run_key": run_key,
        "directory": box.deployment.directory,
        "project": box.deployment.project,
        "compose_files": list(box.deployment.compose_files),
        "managed_env": managed,
        "box_secrets": box_secrets,
        "controller_secrets": controller_secrets(box, env),
        # The floor again, whatever the model holds: the collector unions it too.
        "secret_patterns": list(effective(box.secret_patterns)),
        "gateway_port": box.gateway.port,
        # Where the box asks its own gateway (the audit's loopback and keyed probes): Docker
        # publishes only on this address; the collector asks 127.0.0.1 for 0.0.0.0.
        "gateway_bind": box.gateway.bind,
        "timeout_s": 20,
        "probe_timeout_s": 3,
        **({"audit": audit_request(box)} if audit else {}),
        **knob_request(box, env),
    }


def knob_request(box: BoxSpec, env: list[EnvEntry]) -> dict[str, Any]:
    """`{"knob_argv": {key: words}}` for each lane knob whose desired value may carry a secret
    inline (`--api-key x`, `Bearer x`), its words as the render's command carries them
    (compare/values.py knob_tokens, lexed here: the collector reads no shell syntax). The box
    sends their mask back (`knobs_desired`), which is what the render's command, masked with
    the run's key, compares with. Nothing when none does (nearly always): the payload is as
    before. The words hold nothing `managed_env` does not already hold."""
    from reconciler.compare.context import lane_knobs, plain_env
    from reconciler.compare.inline import knob_may_carry_secret
    from reconciler.compare.values import knob_tokens

    plain = plain_env(env)
    out: dict[str, list[str]] = {}
    for lane in box.lanes.values():
        for key, (flag, knob) in lane_knobs(lane.env_prefix, plain).items():
            words = knob_tokens(flag, knob)
            if knob_may_carry_secret(knob, tuple(words)):
                out[key] = words
    return {"knob_argv": out} if out else {}


def controller_secrets(box: BoxSpec, env: list[EnvEntry]) -> dict[str, str]:
    """secret name -> variable, for each controller_env secret drift or audit checks: the ones
    `.env` pins and the gateway's and mesh's keys (a defined but unused one is not required)."""
    from reconciler.desired.entries import SecretName  # a miss only: not before the spawn

    used = [e.value.secret for e in env if isinstance(e.value, SecretName)]
    used += [box.gateway.api_key.secret] if box.gateway.api_key else []
    used += [box.mesh.key.secret] if box.mesh.enabled and box.mesh.key else []
    out = {}
    for name in sorted(set(used)):
        src = box.secrets.get(name)
        if src is not None and src.source == "controller_env":
            out[name] = src.variable
    return out


# -- `reconcile audit`: the collector's audit section (doc["audit"]) -------------------------------
# The inbound-auth and mesh variables whose raw `.env` line state the audit reports.
AUDIT_ENV_KEYS = ("GATEWAY_API_KEY", "CULTURE_VLLM_API_KEY", "LOBES_MESH_KEY")
# Roles the loopback `POST /v1/chat/completions` may name: they answer chat (embedder and
# reranker do not), so a 200 means the gate let an unauthenticated caller reach a model.
CHAT_ROLES = ("hand", "worker", "senses", "cortex", "muse", "associate")


def audit_request(box: BoxSpec) -> dict[str, Any]:
    """What the collector's audit section needs: secret *names* (their values are read on the
    box and never leave it) and the model its unauthenticated chat probe asks for."""
    return {
        "env_keys": list(AUDIT_ENV_KEYS),
        "api_key_secret": box.gateway.api_key.secret if box.gateway.api_key else None,
        "mesh_key_secret": box.mesh.key.secret if box.mesh.enabled and box.mesh.key else None,
        "chat_model": local_chat_role(box),
    }


def local_chat_role(box: BoxSpec) -> str | None:
    """A chat role this box serves itself, the smallest window first: the cheapest model to ask
    for one token, and one that stays on this gateway instead of crossing the mesh."""
    served = [
        (contract.context, CHAT_ROLES.index(role), role)
        for role, contract in box.contract.items()
        if contract.context is not None and contract.feasible and role in CHAT_ROLES
    ]
    return min(served)[2] if served else None
