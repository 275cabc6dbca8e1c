"""Lanes: each running vLLM service with its role, model, served name, window, memory share,
compose profile and the `.env` knobs lobes turns into flags (the extra pins)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from reconciler.compare.context import KNOB_FLAGS
from reconciler.compare.render_basis import current_render
from reconciler.compare.values import knob_tokens, parse_argv, same
from reconciler.desired import roles
from reconciler.importer.boxview import BoxView
from reconciler.importer.images import running_digest
from reconciler.importer.sourced import Sourced, Tree, put
from reconciler.observe.document import Container, EnvValue

ROLE_OF_SERVICE = {service: role for role, service in roles.SERVICE.items()}
# Knobs the typed lane fields already derive: never pinned twice (checks.py refuses that).
TYPED_SUFFIXES = ("MODEL", "SERVED_NAME", "MAX_MODEL_LEN", "GPU_MEM_UTIL")
PIN_SUFFIXES = tuple(s for s in KNOB_FLAGS if s not in TYPED_SUFFIXES)


def lane_name(service: str) -> str:
    return service.removeprefix("vllm-")


def adopt_lanes(view: BoxView, names: dict[str, str]) -> tuple[Tree, dict[str, int]]:
    """lanes: tree, and role -> the window each lane runs with (for the contract)."""
    lanes: Tree = {}
    windows: dict[str, int] = {}
    profiles = _active_profiles(view)
    for service, c in sorted(view.by_service.items()):
        if service == roles.GATEWAY_SERVICE:
            continue
        role = ROLE_OF_SERVICE.get(service)
        if role is None or role not in roles.ENV_PREFIX:
            view.note(
                f"container {c.name} (service {service!r}) is no vLLM lane lobes knows; not adopted"
            )
            continue
        ref = running_digest(view.doc, c)
        if ref is None:
            view.note(f"container {c.name} runs an image with no digest; not adopted")
            continue
        lane = lane_name(service)
        seen = f"docker inspect ({c.name})"
        put(lanes, (lane, "role"), Sourced(role, seen))
        put(lanes, (lane, "image"), Sourced(names[ref], seen))
        window = _lane(view, c, roles.ENV_PREFIX[role], lanes, lane)
        if window is not None:
            windows[role] = window
        profile = _profile(view, service, profiles)
        if profile is not None:
            put(lanes, (lane, "profile"), profile)
    _one_image_per_variable(view, lanes, names)
    return lanes, windows


def _one_image_per_variable(view: BoxView, lanes: Tree, names: dict[str, str]) -> None:
    """Lanes that share an image variable (VLLM_NIGHTLY_IMAGE) can want only one image: when
    they run different ones (one recreated alone), the `.env` value wins if a lane runs it,
    else the image most of them run; the others are reported (and stay image drift)."""
    by_var: dict[str, list[str]] = {}
    for lane, tree in lanes.items():
        var = roles.IMAGE_VARIABLE.get(tree["role"].value)
        if var is not None:
            by_var.setdefault(var, []).append(lane)
    refs = {name: ref for ref, name in names.items()}
    for var, group in sorted(by_var.items()):
        images = [lanes[lane]["image"].value for lane in group]
        if len(set(images)) < 2:
            continue
        line = view.line(var)
        in_env = next((n for n, r in refs.items() if line and r == line.value), None)
        chosen: str = max(sorted(set(images)), key=images.count)
        if in_env is not None and in_env in images:
            chosen = in_env  # the `.env` value, where a lane runs it
        origin = f".env:{line.line}" if in_env == chosen and line else "docker inspect (most lanes)"
        for lane in group:
            if lanes[lane]["image"].value != chosen:
                # References, not catalog names: the scrubber masks a name with a digest.
                view.note(
                    f"lanes share {var} but {lane} runs {refs[lanes[lane]['image'].value]}; "
                    f"adopted {refs[chosen]} for all"
                )
            lanes[lane]["image"] = Sourced(chosen, f"{origin} ({var})")


def _lane(view: BoxView, c: Container, prefix: str, lanes: Tree, lane: str) -> int | None:
    carriers = (c,)
    for field, suffix in (("model", "MODEL"), ("served_name", "SERVED_NAME")):
        got = view.text(f"{prefix}_{suffix}", carriers, f"lanes.{lane}.{field}")
        if got is not None and got.value:
            put(lanes, (lane, field), got)
    flags = parse_argv(c.cmd)[1]
    window = _number(view, c, f"{prefix}_MAX_MODEL_LEN", flags.get("--max-model-len"), int)
    share = _number(view, c, f"{prefix}_GPU_MEM_UTIL", flags.get("--gpu-memory-utilization"), float)
    if window is not None:
        put(lanes, (lane, "max_model_len"), window)
    if share is not None:
        put(lanes, (lane, "gpu_memory_utilization"), share)
    for suffix in PIN_SUFFIXES:
        knob = f"{prefix}_{suffix}"
        # Named with its path: a knob whose value carries a secret is left out (boxview.py),
        # and the finding must say which lane then runs with what the state does not set.
        got = view.text(knob, carriers, f"lanes.{lane}.env.{knob}")
        if (
            got is not None
            and _live(KNOB_FLAGS[suffix], got.value, flags)
            and view.writable(knob, got)
        ):
            put(lanes, (lane, "env", knob), got)
    return window.value if window is not None else None


def _parsed(raw: object, kind: type) -> int | float | None:
    if not isinstance(raw, str):
        return None
    try:
        number = kind(raw)
    except ValueError:
        return None
    return number if isinstance(number, int | float) else None


def _live(flag: str, knob: str, flags: Mapping[str, Sequence[EnvValue | bool]]) -> bool:
    """A knob is pinned only when the running command line carries it: lobes' template drops
    some values (`QUANTIZATION=none` renders no flag), and a pin compose does not honour
    would be reported as a dead knob (compare/composefiles.py)."""
    if knob == "":
        return False
    wanted = parse_argv(knob_tokens(flag, knob))[1]
    for want_flag, want_values in wanted.items():
        got = flags.get(want_flag)
        if got is None or len(got) != 1 or not same(got[0], want_values[0]):
            return False
    return bool(wanted)


def _number(
    view: BoxView, c: Container, key: str, flag: Sequence[EnvValue | bool] | None, kind: type
) -> Sourced | None:
    got = view.text(key, (c,))
    raw = flag[-1] if flag else None
    running = _parsed(raw, kind)
    if got is not None:
        number = _parsed(got.value, kind)
        if number is None:
            view.note(f"{key}: {got.origin} is not a number; not adopted")
            return None
        if running is not None and running != number:
            # A compose file that hard-codes the flag, or a lane recreated alone: what runs wins.
            view.note(
                f"{key}: {got.origin} says {got.value}, {c.name} runs {raw}; adopted what runs"
            )
            return Sourced(running, f"docker inspect ({c.name} command; {got.origin} differs)")
        if str(number) != got.value:
            view.note(f"{key}: {got.origin} writes {got.value!r}, the desired state {number}")
        return Sourced(number, got.origin)
    if running is not None:
        view.note(f"{key}: not in .env; adopted {raw} from {c.name}'s command line")
        return Sourced(running, f"docker inspect ({c.name} command)")
    view.note(f"{key}: neither .env nor {c.name} says; lane left without it")
    return None


def _active_profiles(view: BoxView) -> Sourced | None:
    return view.text("COMPOSE_PROFILES")


def _profile(view: BoxView, service: str, active: Sourced | None) -> Sourced | None:
    """The compose profile that switches this service on: one the render gives the service
    and COMPOSE_PROFILES lists."""
    spec = (current_render(view.doc).services or {}).get(service)
    if spec is None or not spec.profiles or active is None:
        return None
    listed = [p for p in str(active.value).split(",") if p]
    for profile in spec.profiles:
        if profile in listed:
            return Sourced(profile, f"{active.origin} (COMPOSE_PROFILES)")
    return None
