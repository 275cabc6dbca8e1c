"""`compose-file`: the box's compose files against what the desired state expects.

Two signals: a file of the `-f` chain is missing or its digest differs from the one the
desired state pins (a hand edit), and, stronger, a managed `.env` knob the rendered command
does not honour — a flag hard-coded in a compose file makes the knob dead (seed 000, lobes'
dspark-speculation lesson), which only a render from the desired `.env` can show. The image
variables are knobs too: a service whose render names another image than the desired one (an
override's hard-coded `image:`, a `build:` without one) runs that image whatever `.env` pins,
so pulling and recreating never converges; the file is the fault. A desired service that
render lacks altogether (a file dropped it, a profile left it out) is an entry too, never a
silent skip: nothing of its command or environment could be compared.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from reconciler.compare.causes import IMAGE_KNOB  # causes.py links `image` entries to it
from reconciler.compare.containers import normal_ref
from reconciler.compare.context import GATEWAY, BoxExpectation
from reconciler.compare.drift import Action, Drift, SecretValue
from reconciler.compare.inline import fits_argv, hashed_inline, shown_flag
from reconciler.compare.rules import rule
from reconciler.compare.values import flags_of, knob_tokens, same, value
from reconciler.desired import roles
from reconciler.observe.document import EnvValue, Observed


def compare_compose_files(exp: BoxExpectation, doc: Observed) -> Iterator[Drift]:
    r = rule("compose.file")
    pinned = exp.file_digests
    changed_files = []
    for name in exp.compose_files:
        fact = doc.files.get(name)
        if fact is None or not fact.exists:
            yield Drift(
                exp.name,
                r.kind,
                f"file:{name}",
                "(file)",
                "present",
                None,
                r.action,
                note="listed in deployment.compose_files",
            )
            continue
        want = pinned.get(name)
        if want is not None and fact.sha256 != want:
            changed_files.append(name)
            yield Drift(
                exp.name,
                r.kind,
                f"file:{name}",
                "sha256",
                _short(want),
                _short(fact.sha256),
                r.action,
                note="edited on the box (digest differs from deployment.file_digests)",
            )
    yield from _dead_knobs(exp, doc, changed_files)


def _short(digest: str | None) -> str | None:
    return None if digest is None else digest[:12]


def _dead_knobs(exp: BoxExpectation, doc: Observed, changed: list[str]) -> Iterator[Drift]:
    rendered = doc.render.services
    if rendered is None:
        return  # the render failed: a box error, reported by the caller
    r = rule("compose.dead-knob")
    where = ", ".join(changed) if changed else " / ".join(exp.compose_files)
    gateway = rendered.get(GATEWAY)
    if gateway is None:
        yield _not_rendered(exp, GATEWAY, changed, where)
    else:
        yield from _dead_image(exp, GATEWAY, gateway.image, where)
    for service, lane in sorted(exp.lanes.items()):
        spec = rendered.get(service)
        if spec is None:
            yield _not_rendered(exp, service, changed, where)
            continue
        yield from _dead_image(exp, service, spec.image, where)
        flags = flags_of(spec.command)
        for key in sorted(lane.knobs):
            carries = key in lane.knob_secrets
            want_flags: Mapping[str, Sequence[EnvValue | bool]] = lane.knob_flags[key]
            masked = doc.knobs_desired.get(key) if carries else None
            if masked is not None and fits_argv(masked, knob_tokens(*lane.knobs[key])):
                # The render holds the knob's secret hashed with the run's key: compared
                # with the box's mask of the desired words, never with them in clear.
                want_flags = flags_of(masked)
            else:
                masked = None
            for want_flag, want_values in want_flags.items():
                got = flags.get(want_flag)
                # vLLM (argparse) runs with the last of a repeated flag, on both sides: a
                # compose file's earlier `--max-model-len 4096` is overridden by the knob's.
                if got and same(got[-1], want_values[-1]):
                    continue
                desired, observed = value(want_values[-1]), value(got[-1]) if got else None
                note = f".env {key} is dead: the compose files render another value"
                if carries:
                    want, seen = want_values[-1], got[-1] if got else None
                    # A drift never carries the knob's secret in clear: `***`, and whether
                    # it changed where the box's mask of the desired value was at hand.
                    if masked is None and _hashed(seen):
                        note += (
                            "; the box hashed the secret in this flag, and this observation "
                            "has no digest of the desired value's to compare it with"
                        )
                    desired, observed = shown_flag(want_flag, want, seen)
                yield Drift(
                    exp.name,
                    r.kind,
                    f"lane:{service}",
                    want_flag,
                    desired,
                    observed,
                    r.action,
                    source=where,
                    note=note,
                )


def _dead_image(
    exp: BoxExpectation, service: str, rendered: str | None, where: str
) -> Iterator[Drift]:
    """The render of the desired `.env` names another image than the desired one (compared as
    the container comparison compares them, containers.py `normal_ref`), or none (a `build:`
    alone: compose runs `<project>-<service>`): the `.env`'s image variable is dead, and a
    pull and recreate would bring back the same image (the converge's verification fails)."""
    want = exp.gateway_image if service == GATEWAY else exp.lanes[service].image
    if rendered is not None and (rendered == want or normal_ref(rendered) == normal_ref(want)):
        return
    r = rule("compose.dead-knob")
    yield Drift(
        exp.name,
        r.kind,
        "gateway" if service == GATEWAY else f"lane:{service}",
        IMAGE_KNOB,
        want,
        rendered,
        r.action,
        source=where,
        note=f".env {_image_variable(exp, service)} is dead: the compose files render "
        + ("another image" if rendered is not None else "no image (a build: section)"),
    )


# lobes' fallback for a lane whose own image variable is left out of `.env` (desired/envfile.py
# NIGHTLY; not imported from there: that module loads the pydantic models, which a comparison
# never needs).
_NIGHTLY = "VLLM_NIGHTLY_IMAGE"


def _image_variable(exp: BoxExpectation, service: str) -> str:
    """The `.env` variable the desired state writes the service's image to: the gateway's, the
    lane's role's, or lobes' fallback for a role whose own variable is left out."""
    if service == GATEWAY:
        return roles.GATEWAY_IMAGE_VARIABLE
    var = roles.IMAGE_VARIABLE.get(exp.lanes[service].role, _NIGHTLY)
    written = any(e.key == var and isinstance(e.value, str) for e in exp.env)
    return var if written else _NIGHTLY


def _hashed(observed: EnvValue | bool | None) -> bool:
    """A rendered flag value holding a secret the box hashed (whole, or inline)."""
    return isinstance(observed, SecretValue) or hashed_inline(observed)


def _not_rendered(exp: BoxExpectation, service: str, changed: list[str], where: str) -> Drift:
    """A desired service compose's render of the desired `.env` does not have: its command,
    environment and runtime cannot be compared (containers.py compares the rest), and a
    converge could not create it. A compose file edited to drop it, or a profile of the
    service no longer among the active ones: put the files back, as for a dead knob (the
    files `where` names; plan.py), else a person decides (every file is as pinned, so the
    desired state's own profiles or chain leave the service out)."""
    r = rule("compose.service")
    restorable = changed or any(name not in exp.file_digests for name in exp.compose_files)
    return Drift(
        exp.name,
        r.kind,
        "gateway" if service == GATEWAY else f"lane:{service}",
        "(service)",
        "rendered",
        None,
        r.action if restorable else Action.REPORT,
        source=where,
        note="not in compose's render of the desired .env (a compose file dropped it, or no "
        "active profile enables it): its command and environment are not compared",
    )
