"""The gateway and the mesh: image and publication from `docker inspect`, auth from an
unauthenticated `GET /v1/models` on the box (401 keyed, 200 open; the controller's when the box's
gave no answer, else the key the gateway runs with; never open when any request without a key
was refused), the mesh from `.env`; each key in use becomes a reference to where its value was
found (secrets.py).

The gateway's key is resolved as lobes 0.91 resolves it (lobes/gateway/_config.py
`_gateway_api_key`): GATEWAY_API_KEY if not blank, else CULTURE_VLLM_API_KEY, else none (auth
off). A desired state holds the key in GATEWAY_API_KEY only (desired/envfile.py blanks
CULTURE_VLLM_API_KEY), which lobes reads first: a gateway keyed through the fallback is adopted
as keyed with that same key, referenced where a converge can read it (never `.env`'s
CULTURE_VLLM_API_KEY line, which that converge blanks)."""

from __future__ import annotations

from reconciler.importer.boxview import BoxView, is_secret
from reconciler.importer.images import running_digest
from reconciler.importer.secrets import (
    SECRET_KEYS,
    Candidate,
    source_for,
    traced,
    unfound,
    unfound_path,
)
from reconciler.importer.sourced import Sourced, Tree, put
from reconciler.observe.document import Binding, Container, ControllerProbes, SecretValue

# lobes 0.91's inbound key variables, in the order it reads them: the first not blank wins
# (whitespace only is blank). audit/evidence.py API_KEYS is the same rule for the audit.
API_KEYS = ("GATEWAY_API_KEY", "CULTURE_VLLM_API_KEY")
FALLBACK_KEY = API_KEYS[1]
KEYLESS = "GET /v1/models without key"


def whole_number(text: str) -> int | None:
    """`text` as a non-negative int, only if it is ASCII digits: str.isdigit() also takes `²`
    and `٣`, which int() refuses or reads as another digit than the box's file shows."""
    return int(text) if text.isascii() and text.isdigit() else None


def _publication(view: BoxView, tree: Tree, b: Binding, seen: str) -> None:
    bind = b.host_ip if b.host_ip not in ("", "::") else "0.0.0.0"
    put(tree, ("gateway", "bind"), Sourced(bind, seen))
    port = whole_number(b.host_port)
    if port is not None and 0 < port < 65536:
        put(tree, ("gateway", "port"), Sourced(port, seen))
    else:
        # Docker's HostPort may be "" (chosen at start) or a range: no one port to pin.
        view.note(
            f"the gateway publishes 8000/tcp on host port {b.host_port!r}, not one port: "
            "gateway.port is not adopted (lobes' 8000 applies)"
        )


def adopt_gateway(
    view: BoxView,
    tree: Tree,
    names: dict[str, str],
    deploy: str,
    found: list[Candidate],
    controller: ControllerProbes | None = None,
) -> None:
    """`controller`: the controller's own keyless probes of the box (BoxObservation.probes),
    asked when the box's loopback gave no answer."""
    gw = view.gateway
    if gw is None:
        view.note("no gateway container: gateway.image and auth are not adopted")
        return
    seen = f"docker inspect ({gw.name})"
    ref = running_digest(view.doc, gw)
    if ref is not None:
        put(tree, ("gateway", "image"), Sourced(names[ref], seen))
    bindings = gw.ports.get("8000/tcp") or ()
    if bindings:
        _publication(view, tree, bindings[0], seen)
    port = view.text("VLLM_PORT")
    if bindings and port is not None and port.value != bindings[0].host_port:
        view.note(
            f"VLLM_PORT: {port.origin} says {port.value}, the gateway publishes "
            f"{bindings[0].host_port}"
        )
    env_key, key = _gateway_key(view, gw)
    auth, origin = _auth(view, controller, env_key, key)
    put(tree, ("gateway", "auth"), Sourced(auth, origin))
    if auth == "keyed":
        if key is None:
            view.note(
                "the gateway refuses callers without a key, but neither .env nor the gateway "
                f"container holds a {' or a '.join(API_KEYS)} (lobes reads the first that is "
                "not blank): gateway.api_key is not adopted"
            )
            return
        if env_key == FALLBACK_KEY:
            view.note(
                f"the gateway is keyed by {FALLBACK_KEY} ({key.origin}), lobes' fallback "
                f"while {API_KEYS[0]} is blank: adopted as gateway.api_key, which a converge "
                f"writes as {API_KEYS[0]} (read first) and blanks {FALLBACK_KEY}, so the "
                "same key keeps the gateway keyed"
            )
        put(tree, ("gateway", "api_key"), Sourced({"secret": "gateway_api_key"}, key.origin))
        _reference(view, tree, "gateway_api_key", env_key, key, deploy, found)
    elif key is not None:
        # The key's name is never followed by a colon: the report's scrubber takes
        # `GATEWAY_API_KEY: <text>` for an assignment and masks the text.
        view.note(
            f"{key.origin} holds a {env_key}, yet the gateway serves callers "
            "without one; adopted auth: open"
        )


def _gateway_key(view: BoxView, gw: Container) -> tuple[str, Sourced | None]:
    """(the variable, its value) of the key the gateway runs with, resolved as lobes does
    (API_KEYS); (GATEWAY_API_KEY, None) when neither holds one. The fallback is read only when
    the first is blank, as lobes reads it: its notes are then about the key in use."""
    for env_key in API_KEYS:
        got = view.value(env_key, (gw,))
        if got is not None and is_secret(env_key, got.value):
            return env_key, got
    return API_KEYS[0], None


def _auth(
    view: BoxView, controller: ControllerProbes | None, env_key: str, key: Sourced | None
) -> tuple[str, str]:
    """(keyed or open, why): the box's own keyless request, else the controller's, else the
    key the gateway runs with. Never open while any keyless request was refused (401): the
    adopted state would open a gateway that is keyed today."""
    answers = _keyless_answers(view, controller)
    refused = next((why for status, why in answers if status == 401), None)
    if answers and answers[0][0] == 200 and refused is not None:
        view.note(
            f"the gateway answered callers without a key ({answers[0][1]}), yet refused "
            f"one ({refused}): adopted auth: keyed (a gateway found keyed is never adopted "
            "open)"
        )
    if refused is not None:
        return "keyed", refused
    if answers:
        return "open", answers[0][1]
    if key is not None:
        return "keyed", f"{key.origin} ({env_key} set; no keyless request answered)"
    return "open", f"no {' or '.join(API_KEYS)} anywhere; no keyless request answered"


def _keyless_answers(view: BoxView, controller: ControllerProbes | None) -> list[tuple[int, str]]:
    """(status, origin) of each request without a key that got 401 or 200: the box's loopback
    first, then the controller's (over the network), then the audit's chat requests."""
    asked = [(view.doc.gateway.models_noauth, KEYLESS)]
    if controller is not None:
        asked.append((controller.models_noauth, f"{KEYLESS} (controller)"))
    chat = "POST /v1/chat/completions without key"
    if view.doc.audit is not None:
        asked.append((view.doc.audit.chat_noauth, chat))
    if controller is not None and controller.audit is not None:
        asked.append((controller.audit.chat_noauth, f"{chat} (controller)"))
    out = []
    for probe, what in asked:
        status = probe.status if probe is not None else None
        if status == 401 or (status == 200 and what.startswith(KEYLESS)):
            # A chat's 200 is no posture (a 4xx names a model it lacks): only its 401 counts.
            out.append((status, f"{what}: {status}"))
    return out


def _reference(
    view: BoxView,
    tree: Tree,
    secret: str,
    env_key: str,
    key: Sourced,
    deploy: str,
    found: list[Candidate],
) -> None:
    """`secrets.<secret>`: where the value in use was found, else a placeholder, said.
    `.env`'s own line of `env_key` is a source only where a converge writes the secret back to
    it: a key in use under lobes' fallback (CULTURE_VLLM_API_KEY, a desired state writes it as
    GATEWAY_API_KEY and blanks the fallback) would be read from a line that converge empties,
    and every later converge would find no key (a secret file holding it still does)."""
    own = SECRET_KEYS.get(secret) == env_key
    if not isinstance(key.value, SecretValue):
        _clear_reference(view, tree, secret, env_key, key, deploy, own)
        return
    line = view.line(env_key)
    source = source_for(key.value, env_key, key.origin, deploy, found, line if own else None)
    if source is None:
        exported = traced(key.value, env_key, found)
        source = unfound(env_key, deploy, exported)
        env = "holds another value" if line is not None else "has no such line"
        if not own:
            env = f"is blanked by a converge, which writes the key as {SECRET_KEYS[secret]}"
        placeholder = (
            f"not adopted; secrets.{secret} points at {unfound_path(deploy)}, which is not on "
            "the box; put the key in use there (or point the reference at a file that holds "
            "it) before a converge, which refuses until then"
        )
        if exported is None:
            view.note(
                f"the {env_key} in use ({key.origin}) is held by no file the import can "
                f"point to (.env {env}, no secret file or login-shell export has it): "
                f"{placeholder}"
            )
        else:
            # A converge reads the rc file's last assignment of the key: bash may have run
            # another one (secrets.py), and the observation holds only the line it ran.
            path, _, number = exported.origin.rpartition(":")
            view.note(
                f"the {env_key} in use ({key.origin}) is exported by the login shell at "
                f"{exported.origin} (.env {env}), but a converge reads the last assignment "
                f"of {exported.key} in {path}, and the trace shows only the one bash ran: "
                f"{placeholder}; {path} will do only if line {number} is its one assignment "
                f"of {exported.key}"
            )
    put(tree, ("secrets", secret), source)


def _clear_reference(
    view: BoxView,
    tree: Tree,
    secret: str,
    env_key: str,
    key: Sourced,
    deploy: str,
    own: bool = True,
) -> None:
    """`secrets.<secret>` for a key in use that the snapshot holds in clear (saved before the
    box hashed it, or edited): a reference, never the value (group_vars would hold the
    secret). Its files are matched by the box's keyed digests (`source_for`), which a clear
    value has none of: the `.env` line is pointed at only where it holds that same value,
    else the placeholder, said (a converge refuses until the operator points it). `own`: a
    converge writes the secret back to `.env`'s `env_key` line (`_reference`); else that line
    is never pointed at."""
    line = view.line(env_key)
    if own and line is not None and line.value == key.value:
        where = f"{key.origin} (in clear in the snapshot; no other file can be matched)"
        source = Sourced({"source": "box_file", "path": f"{deploy}/.env", "key": env_key}, where)
        view.note(
            f"the {env_key} in use ({key.origin}) is held in clear by the snapshot: its "
            f"files cannot be matched by digest; secrets.{secret} points at .env:{line.line}, "
            "which holds the same value"
        )
    else:
        source = unfound(env_key, deploy, clear=True)
        env = "holds another value" if line is not None else "has no such line"
        if not own:
            env = f"is blanked by a converge, which writes the key as {SECRET_KEYS[secret]}"
        view.note(
            f"the {env_key} in use ({key.origin}) is held in clear by the snapshot: its "
            f"files cannot be matched by digest, and .env {env}: not "
            f"adopted; secrets.{secret} points at {unfound_path(deploy)}, which is not on "
            "the box; put the key in use there (or point the reference at a file that holds "
            "it) before a converge, which refuses until then"
        )
    put(tree, ("secrets", secret), source)


def adopt_mesh(view: BoxView, tree: Tree, deploy: str, found: list[Candidate]) -> None:
    key = view.value("LOBES_MESH_KEY", (view.gateway,) if view.gateway else ())
    if key is None or not is_secret("LOBES_MESH_KEY", key.value):
        put(tree, ("mesh", "enabled"), Sourced(False, key.origin if key else "no LOBES_MESH_KEY"))
        return
    seeds = view.text("LOBES_MESH_SEEDS")
    count = len([s for s in str(seeds.value).split(",") if s]) if seeds is not None else 0
    members = f", {count} other members in LOBES_MESH_SEEDS" if count else ""
    put(tree, ("mesh", "enabled"), Sourced(True, f"LOBES_MESH_KEY set in .env{members}"))
    put(tree, ("mesh", "key"), Sourced({"secret": "mesh_key"}, key.origin))
    _reference(view, tree, "mesh_key", "LOBES_MESH_KEY", key, deploy, found)
    _heartbeat(view, tree)
    name = view.text("LOBES_MESH_NAME")
    if name is not None and name.value != view.name:
        view.note(f"LOBES_MESH_NAME: {name.origin} says {name.value!r}, the box is {view.name!r}")


def _heartbeat(view: BoxView, tree: Tree) -> None:
    beat = view.text("LOBES_MESH_HEARTBEAT_S")
    seconds = whole_number(beat.value) if beat is not None else None
    if beat is not None and seconds is not None and seconds > 0:
        put(tree, ("mesh", "heartbeat_s"), Sourced(seconds, beat.origin))
    elif beat is None:
        view.note("LOBES_MESH_HEARTBEAT_S is not set in .env: lobes' default 60 is adopted")
    else:
        view.note(
            f"LOBES_MESH_HEARTBEAT_S in {beat.origin} is {beat.value!r}, not a whole number of "
            "seconds above 0: lobes' default 60 is adopted"
        )
