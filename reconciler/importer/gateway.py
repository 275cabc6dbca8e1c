"""The gateway and the mesh: image and publication from `docker inspect`, auth from an
unauthenticated `GET /v1/models` on the box (401 keyed, 200 open), the mesh from `.env`; each key
in use becomes a reference to where its value was found (secrets.py)."""

from __future__ import annotations

from reconciler.importer.boxview import BoxView, is_secret
from reconciler.importer.images import running_digest
from reconciler.importer.secrets import Candidate, source_for, traced, unfound, unfound_path
from reconciler.importer.sourced import Sourced, Tree, put
from reconciler.observe.document import Binding, SecretValue


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
    view: BoxView, tree: Tree, names: dict[str, str], deploy: str, found: list[Candidate]
) -> None:
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
    probe = view.doc.gateway.models_noauth
    status = probe.status if probe is not None else None
    key = view.value("GATEWAY_API_KEY", (gw,))
    if status in (401, 200):
        auth = "keyed" if status == 401 else "open"
        origin = f"GET /v1/models without key: {status}"
    else:
        auth = "keyed" if key is not None and is_secret("GATEWAY_API_KEY", key.value) else "open"
        origin = key.origin if key is not None else "no GATEWAY_API_KEY anywhere"
    put(tree, ("gateway", "auth"), Sourced(auth, origin))
    if auth == "keyed":
        if key is None or not is_secret("GATEWAY_API_KEY", key.value):
            view.note(
                "the gateway refuses callers without a key, but neither .env nor the "
                "gateway container holds GATEWAY_API_KEY (a login shell export?)"
            )
            return
        put(tree, ("gateway", "api_key"), Sourced({"secret": "gateway_api_key"}, key.origin))
        _reference(view, tree, "gateway_api_key", "GATEWAY_API_KEY", key, deploy, found)
    elif key is not None and is_secret("GATEWAY_API_KEY", key.value):
        # The key's name is never followed by a colon: the report's scrubber takes
        # `GATEWAY_API_KEY: <text>` for an assignment and masks the text.
        view.note(
            f"{key.origin} holds a GATEWAY_API_KEY, yet the gateway serves callers "
            "without one; adopted auth: open"
        )


def _reference(
    view: BoxView,
    tree: Tree,
    secret: str,
    env_key: str,
    key: Sourced,
    deploy: str,
    found: list[Candidate],
) -> None:
    """`secrets.<secret>`: where the value in use was found, else a placeholder, said."""
    if not isinstance(key.value, SecretValue):
        _clear_reference(view, tree, secret, env_key, key, deploy)
        return
    source = source_for(key.value, env_key, key.origin, deploy, found, view.line(env_key))
    if source is None:
        exported = traced(key.value, env_key, found)
        source = unfound(env_key, deploy, exported)
        line = view.line(env_key)
        env = "holds another value" if line is not None else "has no such line"
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
    view: BoxView, tree: Tree, secret: str, env_key: str, key: Sourced, deploy: str
) -> None:
    """`secrets.<secret>` for a key in use that the snapshot holds in clear (saved before the
    box hashed it, or edited): a reference, never the value (group_vars would hold the
    secret). Its files are matched by the box's keyed digests (`source_for`), which a clear
    value has none of: the `.env` line is pointed at only where it holds that same value,
    else the placeholder, said (a converge refuses until the operator points it)."""
    line = view.line(env_key)
    if line is not None and line.value == key.value:
        where = f"{key.origin} (in clear in the snapshot; no other file can be matched)"
        source = Sourced({"source": "box_file", "path": f"{deploy}/.env", "key": env_key}, where)
        view.note(
            f"the {env_key} in use ({key.origin}) is held in clear by the snapshot: its "
            f"files cannot be matched by digest; secrets.{secret} points at .env:{line.line}, "
            "which holds the same value"
        )
    else:
        source = unfound(env_key, deploy, clear=True)
        view.note(
            f"the {env_key} in use ({key.origin}) is held in clear by the snapshot: its "
            "files cannot be matched by digest, and .env "
            f"{'holds another value' if line is not None else 'has no such line'}: not "
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
