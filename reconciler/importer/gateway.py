"""The gateway and the mesh: image and publication from `docker inspect`, auth from an
unauthenticated `GET /v1/models` on the box (401 keyed, 200 open), the mesh from `.env`; each key
in use becomes a reference to where its value was found (secrets.py)."""

from __future__ import annotations

from reconciler.importer.boxview import BoxView
from reconciler.importer.images import running_digest
from reconciler.importer.secrets import Candidate, source_for
from reconciler.importer.sourced import Sourced, Tree, put
from reconciler.observe.document import SecretValue


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
        b = bindings[0]
        bind = b.host_ip if b.host_ip not in ("", "::") else "0.0.0.0"
        put(tree, ("gateway", "bind"), Sourced(bind, seen))
        put(tree, ("gateway", "port"), Sourced(int(b.host_port), seen))
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
        auth = "keyed" if key is not None and isinstance(key.value, SecretValue) else "open"
        origin = key.origin if key is not None else "no GATEWAY_API_KEY anywhere"
    put(tree, ("gateway", "auth"), Sourced(auth, origin))
    if auth == "keyed":
        if key is None or not isinstance(key.value, SecretValue):
            view.note(
                "the gateway refuses callers without a key, but neither .env nor the "
                "gateway container holds GATEWAY_API_KEY (a login shell export?)"
            )
            return
        put(tree, ("gateway", "api_key"), Sourced({"secret": "gateway_api_key"}, key.origin))
        put(
            tree,
            ("secrets", "gateway_api_key"),
            source_for(key.value, "GATEWAY_API_KEY", key.origin, deploy, found),
        )
    elif key is not None and isinstance(key.value, SecretValue):
        view.note(
            f"GATEWAY_API_KEY: {key.origin} holds a key, yet the gateway serves callers "
            "without one; adopted auth: open"
        )


def adopt_mesh(view: BoxView, tree: Tree, deploy: str, found: list[Candidate]) -> None:
    key = view.value("LOBES_MESH_KEY", (view.gateway,) if view.gateway else ())
    if key is None or not isinstance(key.value, SecretValue):
        put(tree, ("mesh", "enabled"), Sourced(False, key.origin if key else "no LOBES_MESH_KEY"))
        return
    seeds = view.text("LOBES_MESH_SEEDS")
    count = len([s for s in str(seeds.value).split(",") if s]) if seeds is not None else 0
    members = f", {count} other members in LOBES_MESH_SEEDS" if count else ""
    put(tree, ("mesh", "enabled"), Sourced(True, f"LOBES_MESH_KEY set in .env{members}"))
    put(tree, ("mesh", "key"), Sourced({"secret": "mesh_key"}, key.origin))
    put(
        tree,
        ("secrets", "mesh_key"),
        source_for(key.value, "LOBES_MESH_KEY", key.origin, deploy, found),
    )
    beat = view.text("LOBES_MESH_HEARTBEAT_S")
    if beat is not None and beat.value.isdigit() and int(beat.value) > 0:
        put(tree, ("mesh", "heartbeat_s"), Sourced(int(beat.value), beat.origin))
    else:
        view.note("LOBES_MESH_HEARTBEAT_S is not set in .env: lobes' default 60 is adopted")
    name = view.text("LOBES_MESH_NAME")
    if name is not None and name.value != view.name:
        view.note(f"LOBES_MESH_NAME: {name.origin} says {name.value!r}, the box is {view.name!r}")
