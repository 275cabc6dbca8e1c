"""Why a difference survives adoption: each one the round trip leaves is a fact about the box
that no desired state of this project can express, named here in one sentence.

The desired state pins some `.env` keys whatever a box has (GATEWAY_API_KEY, the mesh's keys,
a lane's own image variable when the lane runs another image than VLLM_NIGHTLY_IMAGE's): a box
that lacks them keeps them to compose's defaults or to whoever's shell starts compose next, and
a converge writes them (and, since lanes read `.env` through `env_file`, recreates the lanes
that then carry them). Keys lobes' render leaves out where compose's fallback says the same are
adopted as `env: {KEY: null}` and leave nothing (adopt.py `_left_out`).
"""

from __future__ import annotations

from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import Drift, Kind
from reconciler.compare.values import same
from reconciler.desired import roles

IMAGE_VARIABLES = frozenset(roles.IMAGE_VARIABLE.values())
MESH_DERIVED = frozenset({"LOBES_MESH_SEEDS"})
ALWAYS_PINNED = frozenset({"CULTURE_VLLM_API_KEY", "GATEWAY_API_KEY", "LOBES_MESH_KEY"})


def _stale_render(d: Drift, exp: BoxExpectation) -> bool:
    """A snapshot holds compose's config of the `.env` of the desired state it was taken
    against, and (saved by `drift --save-snapshot` since renders have a basis) of the box's own
    `.env`; compare reads the one the adopted `.env` gives (compare/render_basis.py). Without
    one (an older snapshot, or an adopted `.env` that differs from the box's own: what runs
    was adopted), an env or argv difference where the container already runs the adopted
    value is that other render's, and a live drift (which renders the adopted `.env` on the
    box) does not show it."""
    adopted = {e.key: e.value for e in exp.env if isinstance(e.value, str)}
    if d.kind == Kind.ENV:
        if d.path not in adopted:
            return d.observed is None  # the old state pinned it; the adopted one does not
        return same(adopted[d.path], d.observed)
    if d.kind in (Kind.ARGV, Kind.COMPOSE_FILE):
        service = d.subject.removeprefix("lane:")
        lane = exp.lanes.get(service)
        knobs = lane.knobs.values() if lane is not None else ()
        return any(
            flag == d.path and same(want, d.observed if d.kind == Kind.ARGV else d.desired)
            for flag, want in knobs
        )
    return False


def reason(d: Drift, exp: BoxExpectation | None = None, snapshot: bool = False) -> str:
    """One line: why this difference is not adopted away."""
    if snapshot and exp is not None and _stale_render(d, exp):
        return (
            "the snapshot holds no compose render of the adopted .env; the container runs "
            "the adopted value (a live drift renders the adopted .env: no difference)"
        )
    if d.kind == Kind.SHELL_LEAK:
        return "a login shell export: no desired state removes it (the shell file must change)"
    if d.kind == Kind.CONTRACT:
        return "the gateway advertises what it read at its start (recreate the gateway)"
    if d.kind == Kind.STATE:
        return "a container not running healthy: a state, not a setting"
    if d.path in MESH_DERIVED:
        return (
            f"{d.path} is derived from the adopted mesh members: adopt every member of the "
            "mesh together"
        )
    if d.kind == Kind.ENVFILE and d.observed is None and d.path in IMAGE_VARIABLES:
        return (
            f"{d.path} is not in .env and its lane runs another image than VLLM_NIGHTLY_IMAGE "
            "gives it: the desired state pins the lane's own image variable"
        )
    if d.kind == Kind.ENVFILE and d.path in ALWAYS_PINNED:
        return f"{d.path} is always decided by gateway.auth / mesh, never left as the box has it"
    if d.kind == Kind.ENV and d.path in IMAGE_VARIABLES | ALWAYS_PINNED:
        return f"lanes read .env through env_file: the pinned {d.path} reaches them on recreate"
    if d.kind == Kind.ENVFILE:
        return ".env and the running containers disagree: what runs was adopted (rewrite-env)"
    if d.kind in (Kind.ENV, Kind.ARGV, Kind.IMAGE):
        return ".env and the running containers disagree: what runs was adopted"
    if d.kind == Kind.COMPOSE_FILE:
        return "a compose file hard-codes what .env sets (a dead knob)"
    return "not expressible in the desired state"
