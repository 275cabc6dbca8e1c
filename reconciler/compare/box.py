"""Compare one box: run every comparator over one observation; faults become errors.

Pure: takes the expectation and the box's typed observation (reconciler/observe/document.py),
returns a BoxResult. A box whose answer could not be read has no document, only its fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.compare.composefiles import compare_compose_files
from reconciler.compare.containers import STOPPED, compare_containers, service_containers
from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import BoxError, BoxResult, Drift, Kind, Part, sorted_drifts
from reconciler.compare.envfile import (
    compare_envfile,
    compare_host,
    envfile_source,
    secret_source_errors,
    stale_sources,
    under_home,
)
from reconciler.compare.gateway import compare_auth, compare_contract
from reconciler.compare.partial import partial_result
from reconciler.compare.render_basis import for_desired, stale_without_basis
from reconciler.compare.shell import compare_shell
from reconciler.observe.document import (
    NO_PROBES,
    Container,
    ControllerProbes,
    ConvergeHolder,
    Fault,
    Observed,
    SourceSpec,
)
from reconciler.records import field, record_class, replace
from reconciler.scrub import scrub_text


@record_class()
class Replayed:
    """What a saved observation (a snapshot's box) is replayed against beyond the expectation:
    the desired state's deployment directory (`~/...`, as it gives it) and ssh_user, each
    secret's desired source, and why the box's file is not the one saved (None: it is, or the
    index recorded no digest). A live answer was made for the desired state itself (the run's
    payload named all of it); a snapshot's may have been made for another one."""

    directory: str | None  # None: not known (an expectation built by hand), not checked
    user: str | None
    sources: Mapping[str, SourceSpec] = field(default_factory=dict)
    altered: str | None = None
    # Where the controller reaches the box's gateway in the desired state (None: not checked).
    base: str | None = None


def replayed(
    directory: str | None,
    user: str | None,
    secrets: Mapping[str, Mapping[str, str]],
    altered: str | None = None,
    base: str | None = None,
) -> Replayed:
    """`Replayed` from plain values: each secret's source as the collector is told it
    (observe/payload.py: a box_file's `{"path", "key"}`, a controller_env's `{"variable"}`)."""
    sources = {
        name: SourceSpec(path=src.get("path"), key=src.get("key"), variable=src.get("variable"))
        for name, src in secrets.items()
    }
    return Replayed(directory, user, sources, altered, base)


def _probed_at(
    controller: ControllerProbes, replay: Replayed
) -> tuple[ControllerProbes, list[BoxError]]:
    """The controller's probes of a snapshot's box, if they were made where the desired state
    reaches its gateway. Made at another address or port (`gateway.port` or the box's address
    changed since the save), their answers are another gateway's: not compared, and said, as a
    live run would probe the desired one."""
    made, wanted = controller.base, replay.base
    if made is None or wanted is None or made == wanted:
        return controller, []
    said = f"made at {made}; desired {wanted}: not compared (the auth posture from the network)"
    return ControllerProbes(base=made), [BoxError(Part.GATEWAY_PROBE, "controller probes", said)]


def compare_box(
    exp: BoxExpectation,
    doc: Observed | None,
    controller: ControllerProbes = NO_PROBES,
    fault: Fault | str | None = None,
    connection: str | None = None,
    replay: Replayed | None = None,
) -> BoxResult:
    """`connection`: why the box was reached only through an existing SSH connection
    (observe.BoxObservation.connection), an error of the box however complete its answer.
    `replay`: `doc` is a snapshot's, replayed against this desired state (`Replayed`)."""
    altered = [] if replay is None or not replay.altered else [_altered(replay.altered)]
    if replay is not None:
        controller, probed_elsewhere = _probed_at(controller, replay)
        altered += probed_elsewhere
    if doc is None:
        why = BoxError(Part.OBSERVATION, str(fault) if fault is not None else "not observed")
        result = partial_result(exp, controller, why)
        return replace(result, errors=(*result.errors, *altered)) if altered else result
    stale: dict[str, str] = {}
    if replay is not None:
        elsewhere = misplaced(doc, replay)
        if elsewhere is not None:
            # Everything it holds is another deployment's (or another user's): compared with
            # this one, it would report that one's drift, and none of this one's.
            said = [BoxError(Part.CONNECTION, "ssh", connection)] if connection else []
            return BoxResult(
                exp.name,
                reachable=True,
                errors=(*said, elsewhere, *altered),
                facts=facts(doc, controller),
            )
        doc, stale = replayed_sources(doc, replay)
        doc = stale_without_basis(doc, exp.env)  # an older snapshot's render of another .env
    doc = for_desired(doc, exp.env)  # a snapshot's render of this state's .env, if it has one
    envfile = doc.envfile_by_key()  # read by two comparators: built once
    drifts: list[Drift] = []
    drifts += compare_envfile(exp, doc, envfile)
    drifts += compare_compose_files(exp, doc)
    files_as_desired = not any(d.kind in (Kind.ENVFILE, Kind.COMPOSE_FILE) for d in drifts)
    drifts += compare_containers(exp, doc, files_as_desired)
    drifts += compare_shell(exp, doc, envfile)
    drifts += compare_contract(exp, doc)
    drifts += compare_auth(exp, doc, controller)
    drifts += compare_host(exp, doc, drifts)  # judges only the lanes a converge would boot
    errors = observation_errors(exp, doc, connection, stale)
    errors += unhashed(doc, files_as_desired)
    if _gateway_down(drifts):  # its own entry says why nothing answers on the loopback
        errors = [e for e in errors if e.part is not Part.GATEWAY_PROBE]
    errors += unanswered_controller(doc, controller, drifts)
    return BoxResult(
        exp.name,
        reachable=True,
        drifts=sorted_drifts(drifts),
        errors=(*errors, *altered),
        facts=facts(doc, controller),
    )


def unanswered_controller(
    doc: Observed, controller: ControllerProbes, drifts: list[Drift]
) -> list[BoxError]:
    """The controller's requests to the gateway that got no answer (a firewall, a gateway that
    accepts and never answers the mesh, the controller out of open files): what they would
    tell, the auth posture from the mesh side, was not compared. An error of the box, worded
    as partial.py words a partial box's, when the box's own answer shows its gateway there for
    the mesh: its container running and published on more than loopback, with no `state` or
    `port` entry of the gateway (one stopped, or published elsewhere, has its entry already,
    and a second error would say it twice). Not when docker could not be read: the gateway is
    not observed then, an error already."""
    if doc.docker.error is not None or doc.docker.containers is None:
        return []
    group = service_containers(doc).get("gateway") or []
    if not group or group[0].status != "running" or not _published_beyond_loopback(group[0]):
        return []
    if any(d.subject == "gateway" and _about_serving(d) for d in drifts):
        return []
    return [
        BoxError(Part.GATEWAY_PROBE, f"gateway {name} (from the controller)", scrub_text(error))
        for name, probe in (
            ("health", controller.health),
            ("capabilities", controller.capabilities),
            ("models_noauth", controller.models_noauth),
        )
        if probe is not None and probe.status is None and (error := probe.error)
    ]


def _about_serving(d: Drift) -> bool:
    """An entry about whether, or where, a container serves: its status, its absence, its
    ports. Not one about how it was made (mounts, runtime, restart policy, config hash)."""
    return d.kind is Kind.PORT or (d.kind is Kind.STATE and d.path in ("status", "container"))


# A container's status in which it answers nothing: stopped, never started, or paused.
_NOT_SERVING = STOPPED | {"paused"}


def _gateway_down(drifts: list[Drift]) -> bool:
    """Whether the box's own answer shows its gateway not serving at all: no container, or one
    stopped or paused (its `state` entry). Its loopback probes then fail for the reason that
    entry gives, and an error of the box for each would say it again."""
    return any(
        d.subject == "gateway"
        and d.kind is Kind.STATE
        and (d.path == "container" or (d.path == "status" and d.observed in _NOT_SERVING))
        for d in drifts
    )


def _published_beyond_loopback(container: Container) -> bool:
    """Whether a port of `container` is published on an address other hosts can reach ("" is
    every interface)."""
    return any(
        not (b.host_ip.startswith("127.") or b.host_ip in ("::1", "localhost"))
        for bindings in container.ports.values()
        for b in bindings
    )


def replayed_sources(doc: Observed, replay: Replayed) -> tuple[Observed, dict[str, str]]:
    """`doc` with only the secret sources it read as `replay` names them, and what each other
    one read (envfile.stale_sources): one read elsewhere is not observed, as in an answer
    without it (its .env line not compared, compare_envfile; said, secret_source_errors). A
    source that is the deployment's own `.env` is read from the answer's `envfile`, as live."""
    stale = stale_sources(doc, replay.sources, doc.home)
    sources = {k: v for k, v in doc.secret_sources.items() if k not in stale}
    changed = bool(stale)
    for name, want in replay.sources.items():
        found = None if name in sources else envfile_source(doc, want, doc.home)
        if found is not None:
            sources[name], changed = found, True
            stale.pop(name, None)
    return (replace(doc, secret_sources=sources) if changed else doc), stale


def misplaced(doc: Observed, replay: Replayed) -> BoxError | None:
    """The error of a snapshot's box observed in another deployment directory, or as another
    user, than the desired state names (either changed since it was saved): None where it is
    the same one, or where the answer does not say (an older or cut-down snapshot). The
    directory is expanded under the box's home as the collector expands it (its
    `os.path.expanduser`), so an answer for the desired directory always matches."""
    user_differs = None not in (doc.user, replay.user) and doc.user != replay.user
    want = None if user_differs else under_home(replay.directory, doc.home)
    dir_differs = want is not None and doc.deploy_dir is not None and doc.deploy_dir != want
    if not (user_differs or dir_differs):
        return None
    seen = f"observed {scrub_text(doc.deploy_dir or '?')} as {scrub_text(doc.user or '?')}"
    desired = f"desired {want or replay.directory} as {replay.user or doc.user}"
    return BoxError(Part.DEPLOYMENT, "snapshot", f"{seen}; {desired}: not compared")


def _altered(why: str) -> BoxError:
    # The box's file is not the one saved: what it holds may be anything, whatever else it says.
    return BoxError(Part.OBSERVATION, "snapshot", why)


def observation_errors(
    exp: BoxExpectation,
    doc: Observed,
    connection: str | None = None,
    stale: Mapping[str, str] | None = None,
) -> list[BoxError]:
    """Parts of the box that could not be observed: each one is a fault, not drift. `stale`:
    the secrets a replayed snapshot read from another source (envfile.stale_sources)."""
    errors = [BoxError(Part.CONNECTION, "ssh", connection)] if connection else []
    if not doc.deploy_dir_exists:
        where = f"deployment directory {doc.deploy_dir} does not exist"
        errors.append(BoxError(Part.DEPLOYMENT, where))
    sections = (
        (Part.DOCKER, "docker", doc.docker.error),
        (Part.RENDER, "render", doc.render.error),
        (Part.VARIABLES, "variables", doc.variables.error),
        (Part.LOGIN_SHELL, "login_shell", doc.login_shell.error),
        (Part.GATEWAY_PROBE, "gateway (loopback)", doc.gateway.error),
    )
    errors += [BoxError(part, name, error) for part, name, error in sections if error]
    if doc.converge is not None:
        errors.append(BoxError(Part.DEPLOYMENT, "converge", converging(doc.converge)))
    errors += not_in_observation(doc, bool(exp.lanes))
    # A file the collector found but could not read (a FIFO `.env`, a directory, a symlink to
    # /dev/zero, not UTF-8): the parts that read it are missing or partial, and a converge
    # would meet the same file.
    errors += [
        BoxError(Part.BOX_FILE, f"file {name}", why) for name, why in doc.file_errors.items()
    ]
    gateway = doc.gateway
    for name, probe in (
        ("health", gateway.health),
        ("capabilities", gateway.capabilities),
        ("models_noauth", gateway.models_noauth),
    ):
        # No answer, or one lobes never sends (an answer whose body the probe could not read,
        # observe/document.py `_answered`): either way what it would tell was not compared.
        if probe is not None and probe.error:
            errors.append(BoxError(Part.GATEWAY_PROBE, f"gateway {name} (loopback)", probe.error))
    errors += secret_source_errors(exp, doc, stale)
    return errors


def unhashed(doc: Observed, files_as_desired: bool) -> list[BoxError]:
    """compose's config hashes, asked for and not given (a compose without `config --hash`, a
    timeout): every pending recreate left unjudged (compare/containers.py), said as a fault of
    the box rather than as none pending. Not when the render failed: the hash's own `config`
    fails with it, and the render's error says why. Nor when the box's `.env` or a compose
    file is not the desired one (their entries say so): the hash is of files a converge
    replaces, and compose refusing them (a `.env` without a key a compose file requires, as
    before any first converge) is theirs to say, not a fault of observing the box."""
    hashes = doc.config_hashes
    if hashes is None or not hashes.error or doc.render.error or not files_as_desired:
        return []
    what = f"{hashes.error}: no container's pending recreate judged"
    return [BoxError(Part.CONFIG_HASH, "config hashes", what)]


def converging(held: ConvergeHolder) -> str:
    """A converge held the box's lock while it was observed: everything seen may be between
    two states (files written, lanes not yet recreated), so nothing of it is the box's steady
    state. An error of the deployment (every column not observed, a plan refused: the converge
    under way would refuse another one anyway)."""
    who = [
        f"pid {held.pid}" if held.pid is not None else None,
        f"by {scrub_text(held.holder)}" if held.holder else None,
        f"since {scrub_text(held.since)}" if held.since else None,
    ]
    said = ", ".join(w for w in who if w)
    return (
        f"a converge of this box was running while it was observed{f' ({said})' if said else ''}"
        ": what was seen may be half-converged, not its steady state; observe again when it"
        " is done"
    )


# A section a snapshot does not hold (one saved by an older collector, or cut down to what one
# command reads: document.py reads it as not observed, no error; a live answer without it is
# malformed). Its checks could not be made: an error of the box, never "in sync".
NOT_IN_OBSERVATION = "not in this observation (a snapshot without it): {} not compared"


def not_in_observation(doc: Observed, lanes: bool = True) -> list[BoxError]:
    """The sections of `doc` that were not observed at all, each with the checks it decides.
    `lanes`: the box has lanes desired (without any, no lane probe decides anything)."""
    errors = []
    if doc.docker.containers is None and doc.docker.error is None:
        what = "containers, their images, ports and state"
        errors.append(BoxError(Part.DOCKER, "docker", NOT_IN_OBSERVATION.format(what)))
    if doc.render.services is None and doc.render.error is None:
        what = "the lanes' command lines, environments and runtimes"
        errors.append(BoxError(Part.RENDER, "render", NOT_IN_OBSERVATION.format(what)))
    if not doc.variables.observed:
        what = "the login shell's exports of interpolated variables"
        errors.append(BoxError(Part.VARIABLES, "variables", NOT_IN_OBSERVATION.format(what)))
    if not doc.login_shell.observed:
        what = "the login shell's exports"
        errors.append(BoxError(Part.LOGIN_SHELL, "login_shell", NOT_IN_OBSERVATION.format(what)))
    if not doc.gateway.observed:
        what = "the gateway's health, contract and unauthenticated models from the box"
        errors.append(BoxError(Part.GATEWAY_PROBE, "gateway", NOT_IN_OBSERVATION.format(what)))
    if lanes and not doc.lanes_observed:
        what = "the lanes' served windows against the contract"
        errors.append(BoxError(Part.GATEWAY_PROBE, "lanes", NOT_IN_OBSERVATION.format(what)))
    return errors


def facts(doc: Observed, controller: ControllerProbes) -> dict[str, Any]:
    health = doc.gateway.health
    available = doc.meminfo.available_kib or 0
    return {
        "user": doc.user,
        "gateway_version": health.version if health is not None else None,
        "containers": len(doc.containers),
        "mem_available_gib": round(available / 1048576, 1),
        "controller_health": controller.health.status if controller.health else None,
    }
