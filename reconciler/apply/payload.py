"""What the controller sends the box-side converge program (pure: values in, a dict out).

Secrets: a box_file secret travels as its reference only (the box reads the value from its own
file); a controller_env secret is read from the controller's environment here and goes to the
box on stdin, never on a command line, never in a pyinfra operation argument.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from reconciler.compare.context import GATEWAY, BoxExpectation
from reconciler.desired.models import BoxFileSecret, BoxSpec, ControllerEnvSecret
from reconciler.desired.types import check_env_value
from reconciler.observe.document import Observed
from reconciler.plan import Plan, StepKind
from reconciler.scrub import remember

BOX_PROGRAM = Path(__file__).parent / "remote" / "converge.py"


class MissingControllerSecret(Exception):
    """A controller_env secret the converge needs is not set in this environment, or holds a
    value no `.env` line can (the message names the variable, never the value)."""


class BadPayload(Exception):
    """A payload value the box program would refuse; the message names the field, no value."""


@functools.cache
def box_rules() -> ModuleType:
    """The box program's own payload rules, run here before anything is sent: one set of rules
    on both sides, so what the controller lets through is what the box accepts (the box checks
    again, against its own home, before it takes its lock). Stdlib only, nothing runs on load."""
    spec = importlib.util.spec_from_file_location("fleet_box_converge_rules", BOX_PROGRAM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check(payload: Mapping[str, Any]) -> None:
    """Raise BadPayload unless the box program would accept `payload`."""
    rules = box_rules()
    try:
        rules.validate_payload(payload)
    except rules.Failed as exc:
        raise BadPayload(str(exc)) from None


def check_snapshot_id(snapshot: str) -> None:
    """Raise BadPayload unless `snapshot` has the shape of a snapshot id (YYYYMMDDTHHMMSSZ[-N])."""
    rules = box_rules()
    try:
        rules.check_snapshot_id("--to", snapshot)
    except rules.Failed as exc:
        raise BadPayload(str(exc)) from None


def base_payload(exp: BoxExpectation, box: BoxSpec, action: str, holder: str) -> dict[str, Any]:
    """What every action needs: where the deployment is, its lanes and gateway."""
    return {
        "action": action,
        "holder": holder,
        "directory": box.deployment.directory,
        "project": box.deployment.project,
        "compose_files": list(exp.compose_files),
        "lane_specs": [
            {
                "service": service,
                "timeout_s": lane.boot_timeout_s,
                "util": lane.gpu_memory_utilization,
            }
            for service, lane in exp.lanes.items()
        ],
        "gateway": {"timeout_s": exp.gateway.health_timeout_s},
        "memory": {
            "floor_gib": box.memory.mem_available_floor_gib,
            "drop_caches": box.memory.drop_caches_before_boot,
        },
    }


def managed_env(exp: BoxExpectation, box: BoxSpec, environ: Mapping[str, str]) -> dict[str, Any]:
    """Managed key -> value, or {"secret": name} (+ "value" for a controller_env secret)."""
    out: dict[str, Any] = {}
    for entry in exp.env:
        if entry.value is None or isinstance(entry.value, str):
            out[entry.key] = entry.value  # None: the box removes the key's line
            continue
        name = entry.value.secret
        source = box.secrets.get(name)
        if isinstance(source, ControllerEnvSecret):
            value = environ.get(source.variable)
            if not value:
                raise MissingControllerSecret(
                    f"secret {name}: ${source.variable} is not set on this controller"
                )
            remember(value)  # masked in any text this process scrubs
            try:
                # The loader's rule for a value written to `.env` (a CR, LF or NUL, both ' and
                # $, an odd run of trailing backslashes): the box's writer would refuse the
                # converge only once sent. Refused here, before the box is contacted, naming
                # the variable; the check's words never hold the value.
                check_env_value(value)
            except ValueError as exc:
                raise MissingControllerSecret(
                    f"secret {name}: ${source.variable} cannot be written to .env: {exc}"
                ) from None
            out[entry.key] = {"secret": name, "value": value}
        else:
            out[entry.key] = {"secret": name}
    return out


def fingerprint(observed: Observed | None) -> dict[str, Any]:
    """What the plan was made from: file digests and container ids, checked under the lock."""
    if observed is None:
        return {"files": {}, "containers": None}
    files = {name: fact.sha256 for name, fact in observed.files.items()}
    containers: dict[str, list[str]] | None = None
    if observed.docker.containers is not None:
        # Every container of each service, as a set (a sorted list): the box compares them
        # all (converge.py check_fingerprint). One id per service, the last listed, was a
        # `docker compose run` copy whenever it sorted after the lane, where the box's own pick
        # was the lane: every converge of that box was refused as changed.
        containers = {}
        for c in observed.docker.containers:
            if c.id:
                containers.setdefault(c.key, []).append(c.id)
        containers = {key: sorted(set(ids)) for key, ids in containers.items()}
    return {"files": files, "containers": containers}


def converge_payload(
    exp: BoxExpectation,
    box: BoxSpec,
    plan: Plan,
    observed: Observed | None,
    holder: str,
    keep: int = 10,
    environ: Mapping[str, str] | None = None,
    accept_interrupted: bool = False,
) -> dict[str, Any]:
    payload = base_payload(exp, box, "converge", holder)
    if accept_interrupted:
        # The operator chose to converge over a converge that was killed half way (converge.py
        # interrupted_converges); without it the box refuses, naming that snapshot.
        payload["accept_interrupted"] = True
    restore = [
        {"name": f.name, "sha256": f.sha256}
        for s in plan.steps
        if s.kind is StepKind.RESTORE_FILES
        for f in s.files
    ]
    images = {service: lane.image for service, lane in exp.lanes.items()}
    images[GATEWAY] = exp.gateway_image
    payload.update(
        {
            "titles": [s.title() for s in plan.steps],
            "fingerprint": fingerprint(observed),
            "managed_env": managed_env(exp, box, os.environ if environ is None else environ),
            "box_secrets": {
                name: {"path": src.path, "key": src.key}
                for name, src in box.secrets.items()
                if isinstance(src, BoxFileSecret)
            },
            # Every managed key, not only the ones the plan lists: the desired `.env` is the
            # box's file with each managed key replaced or appended (what the collector renders
            # drift from), and the box writes only those that differ in value or presence.
            "env_keys": [e.key for e in exp.env],
            "restore": restore,
            "pulls": [s.subject for s in plan.steps if s.kind is StepKind.PULL],
            "services": list(plan.services),
            "removes": [s.subject for s in plan.steps if s.kind is StepKind.REMOVE],
            "images": images,
            "verify": verify_spec(exp, observed),
            "keep": keep,
        }
    )
    return payload


def verify_spec(exp: BoxExpectation, observed: Observed | None = None) -> dict[str, Any]:
    """What the gateway must show after its recreate, checked on the box at `bind:port`:
    Docker publishes the port on the desired bind only, so a gateway bound to 10.77.0.12 or
    127.0.0.2 answers nothing on 127.0.0.1 (the box asks 127.0.0.1 for 0.0.0.0, converge.py
    gateway_host). A window only for a role the gateway is told (compare/gateway.py
    told_windows, from the observed render): lobes' compose passes no HAND_MAX_MODEL_LEN, so
    its gateway advertises the hand role's own window, and a check for the lane's failed every
    apply of a hand lane with another window, which then rolled back."""
    from reconciler.compare.gateway import told_windows

    told = told_windows(observed) if observed is not None else None
    windows = {
        lane.role: lane.max_model_len
        for lane in exp.lanes.values()
        if told is None or lane.role in told
    }
    infeasible = sorted(r for r, c in exp.contract.items() if not c.feasible)
    return {
        "bind": exp.gateway.bind,
        "port": exp.gateway.port,
        "version": exp.lobes_version,
        "auth": exp.gateway.auth,
        "windows": {r: w for r, w in sorted(windows.items()) if r not in infeasible},
        "infeasible": infeasible,
    }
