"""Lanes: each running vLLM service with its role, model, served name, window, memory share,
compose profile and the `.env` knobs lobes turns into flags (the extra pins)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from reconciler.compare.context import KNOB_FLAGS
from reconciler.compare.render_basis import current_render
from reconciler.compare.values import knob_tokens, parse_argv, same
from reconciler.desired import roles
from reconciler.importer.boxview import BoxView, carries_secret, shown
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
        if got is None:
            continue
        if _live(KNOB_FLAGS[suffix], got.value, flags):
            if view.writable(knob, got):
                put(lanes, (lane, "env", knob), got)
            continue
        adopted = _against_command(view, c, lane, knob, KNOB_FLAGS[suffix], got, flags)
        if adopted is not None:
            put(lanes, (lane, "env", knob), adopted)
    return window.value if window is not None else None


def _against_command(
    view: BoxView,
    c: Container,
    lane: str,
    knob: str,
    flag: str,
    got: Sourced,
    flags: Mapping[str, Sequence[EnvValue | bool]],
) -> Sourced | None:
    """A knob whose value (`.env`'s, or the lane's environment's where they differ) is not
    what the lane's command line runs: said, never dropped without a word.

    - The command line carries the knob's flag with another value (a compose file that
      hard-codes the flag, a lane recreated from another `.env`): what runs wins, as for the
      window and the memory share (`_number`), adopted in the knob's own form (`'--flag=v'`
      where `.env` writes the flag, `v` where it writes the value) when that form puts exactly
      what runs back on the command line and a converge could write it; else nothing is
      adopted. The finding names both sources and what was adopted.
    - The command line lacks the flag but compose's render of the box's own `.env` puts the
      knob there: the lane was created from another configuration; nothing is adopted (no pin
      can say "run without the flag"), and said.
    - Neither carries it: compose puts this knob on no command line of this lane (lobes reads
      `EMBED_QUANTIZATION=none` in the gateway's environment only): nothing disagrees, nothing
      is said, and nothing is pinned (a pin compose does not honour is a dead knob)."""
    if got.value == "":
        return None  # compose's empty knob puts no flag: nothing to compare
    wanted = parse_argv(knob_tokens(flag, got.value))[1]
    running = {f: flags[f] for f in wanted if f in flags}
    said = f"lane {lane}: {knob}: {_knob_source(view, knob, got, c)} says {shown(got.value, knob)}"
    unset = f" (the adopted state does not set lanes.{lane}.env.{knob}: the operator must set it)"
    if not running:
        spec = (current_render(view.doc).services or {}).get(c.key)
        rendered = parse_argv(spec.command)[1] if spec is not None and spec.command else {}
        if _live(flag, got.value, rendered):
            view.note(
                f"{said} and compose's render of it puts {', '.join(wanted)} on the command "
                f"line, but {c.name} runs without it; nothing adopted{unset}"
            )
        return None
    ran = " ".join(_word(f, v) for f, values in running.items() for v in values)
    candidate = _as_knob(got.value, running, wanted)
    if candidate is not None and _live(flag, candidate, flags) and _writable(candidate):
        view.note(f"{said}, {c.name} runs {ran}; adopted what runs")
        return Sourced(candidate, f"docker inspect ({c.name} command; {got.origin} differs)")
    view.note(f"{said}, {c.name} runs {ran}; neither is adopted{unset}")
    return None


def _knob_source(view: BoxView, knob: str, got: Sourced, c: Container) -> str:
    """Where the knob's value was read: its `.env` line, or the lane's environment (a lane
    created from another `.env`: BoxView.value has said so)."""
    line = view.line(knob)
    if line is not None and line.value == got.value:
        return f".env:{line.line}"
    return f"{c.name}'s environment"


def _word(flag: str, value: EnvValue | bool) -> str:
    """A running flag as a finding quotes it: a secret never (boxview.shown)."""
    if value is True:
        return flag
    if isinstance(value, str) and not carries_secret(value):
        text = f"{flag}={value}"
        return repr(text) if len(text) <= 80 else repr(text[:77] + "...")
    return f"{flag}=***"


def _as_knob(
    env_value: str, running: Mapping[str, Sequence[EnvValue | bool]], wanted: Mapping[str, object]
) -> str | None:
    """The running flag's value written as the knob writes it: the value alone where `.env`
    writes one (`WORKER_MAX_NUM_SEQS=1`), the whole flag in the same quotes where `.env` writes
    the flag (`'--speculative-config={...}'`); None when that is not one plain value."""
    if len(wanted) != 1 or len(running) != 1:
        return None
    ((flag, values),) = running.items()
    value = values[0] if len(values) == 1 else None
    if not isinstance(value, str) or carries_secret(value):
        return None  # a bare flag, a repeated one, a secret: no knob value says it
    text = env_value.strip()
    if text.startswith("--"):
        return f"{flag}={value}"
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        quote = text[0]
        return None if quote in value else f"{quote}{flag}={value}{quote}"
    return value


def _writable(value: str) -> bool:
    """Whether a converge could write `value` as a `.env` line (the loader's rule)."""
    from reconciler.desired.types import check_env_value

    try:
        check_env_value(value)
    except ValueError:
        return False
    return True


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
        # vLLM serves a repeated flag's last value, as the dead-knob check judges it.
        if not got or not same(got[-1], want_values[-1]):
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
