"""One box's observation -> its adopted desired state (a tree of `Sourced` values).

What each part is read from: lobes' version, profile and shape, the compose `-f` chain, the
mesh and the knobs from `.env` (checked against the running containers, boxview.py); images,
lanes and the gateway's publication from `docker inspect`; auth from an unauthenticated
`GET /v1/models` (401 keyed, 200 open); the contract from `GET /capabilities`. What no box
can show (policy: forbidden login-shell names, memory headroom, boot timeouts) is the
project's documented default, marked as such.
"""

from __future__ import annotations

import os

from reconciler.desired import roles, secret_names
from reconciler.importer.boxview import BoxView
from reconciler.importer.contract import adopt_contract
from reconciler.importer.images import running_digest
from reconciler.importer.lanes import adopt_lanes
from reconciler.importer.secrets import Candidate, candidates, source_for
from reconciler.importer.sourced import Sourced, Tree, put
from reconciler.observe.document import Observed, SecretValue

POLICY = "policy default (not observed)"
# group_vars/all.yaml's policy: what a box cannot tell us about what it must never do.
FORBIDDEN_EXPORTS = [
    "GATEWAY_API_KEY",
    "CULTURE_VLLM_API_KEY",
    "LOBES_MESH_KEY",
    "LOBES_MESH_NAME",
    "GATEWAY_SELF_ORIGIN",
    "HF_TOKEN",
    "COMPOSE_FILE",
    "COMPOSE_PROFILES",
    "HOME_CACHE",
    "*_MAX_MODEL_LEN",
    "*_IMAGE",
    "*_SERVED_NAME",
    "*_GPU_MEM_UTIL",
    "MODEL_GEAR_VERSION",
]
SECRET_PATTERNS = [
    *secret_names.FLOOR_NAMES,
    "*_KEY",
    "*_KEYS",
    "*_TOKEN",
    "*_SECRET",
    "*PASSWORD*",
]
# `.env` keys a desired state derives from typed fields: never pinned under `env:` too.
DERIVED = {
    "MODEL_GEAR_VERSION",
    "LOBES_PROFILE",
    "LOBES_SHAPE",
    "COMPOSE_FILE",
    "COMPOSE_PROFILES",
    "VLLM_PORT",
    "GATEWAY_IMAGE",
    "LOBES_MESH_NAME",
    "LOBES_MESH_HEARTBEAT_S",
    "GATEWAY_SELF_ORIGIN",
    "LOBES_MESH_SEEDS",
    *roles.IMAGE_VARIABLE.values(),
}


def home_path(doc: Observed, path: str | None) -> str:
    """`/home/u/.lobes` -> `~/.lobes` (desired paths live inside the deploy user's home)."""
    home = doc.home or ""
    if path and home and (path == home or path.startswith(home.rstrip("/") + "/")):
        rest = os.path.relpath(path, home)
        return "~" if rest == "." else f"~/{rest}"
    return "~/.lobes"


def adopt_box(
    name: str, doc: Observed, names: dict[str, str], members: set[str]
) -> tuple[Tree, BoxView]:
    """`names`: the catalog (digest -> name); `members`: every box adopted in this run."""
    view = BoxView(name, doc)
    tree: Tree = {}
    _lobes(view, tree)
    deploy = _deployment(view, tree)
    for ref, image in names.items():
        put(tree, ("images", image), Sourced(ref, "docker inspect"))
    lanes, windows = adopt_lanes(view, names)
    if lanes:
        tree["lanes"] = lanes
    found = candidates(doc)
    _gateway(view, tree, names, deploy, found)
    _mesh(view, tree, deploy, found)
    contract = adopt_contract(view, windows, members)
    if contract:
        tree["contract"] = contract
    _env_pins(view, tree)
    _policy(view, tree)
    return tree, view


def _lobes(view: BoxView, tree: Tree) -> None:
    version = view.text("MODEL_GEAR_VERSION")
    health = view.doc.gateway.health
    if version is None and health is not None and health.version:
        version = Sourced(health.version, "GET /health")
    if version is not None:
        put(tree, ("lobes", "version"), version)
    if health is not None and health.version and version and health.version != version.value:
        view.note(f"lobes: {version.origin} says {version.value}, /health {health.version}")
    for field, key in (("profile", "LOBES_PROFILE"), ("shape", "LOBES_SHAPE")):
        got = view.text(key)
        if got is not None:
            put(tree, ("lobes", field), got)
        else:
            view.note(f"{key} is not in .env: lobes.{field} must be filled in by hand")


def _deployment(view: BoxView, tree: Tree) -> str:
    doc = view.doc
    directory = home_path(doc, doc.deploy_dir)
    put(tree, ("deployment", "directory"), Sourced(directory, "the collector's deploy dir"))
    project = os.path.basename(directory).lstrip(".") or "lobes"
    put(tree, ("deployment", "project"), Sourced(project, "the directory's name"))
    chain = view.text("COMPOSE_FILE")
    files: list[str] = []
    if chain is not None:
        files = [f for f in str(chain.value).split(":") if f]
        put(tree, ("deployment", "compose_files"), Sourced(files, chain.origin))
    running = {c.config_files for c in doc.containers if c.config_files}
    for value in sorted(running):
        ran = [os.path.basename(p) for p in value.split(",")]
        if files and ran != files:
            view.note(
                f"containers were created with -f {':'.join(ran)}, .env has {':'.join(files)}"
            )
        if not files:
            files = ran
            put(tree, ("deployment", "compose_files"), Sourced(files, "docker inspect (labels)"))
    for name in files:
        fact = doc.files.get(name)
        if fact is not None and fact.exists and fact.sha256:
            where = f"sha256 of {directory}/{name}"
            put(tree, ("deployment", "file_digests", name), Sourced(fact.sha256, where))
        else:
            view.note(f"{name}: in the -f chain but not on the box")
    return directory


def _gateway(
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


def _mesh(view: BoxView, tree: Tree, deploy: str, found: list[Candidate]) -> None:
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


def summary(name: str, tree: Tree) -> str:
    """One line per adopted box: its lanes, the gateway's posture and the mesh."""
    lanes = tree.get("lanes", {})
    roles_run = ", ".join(f"{n} ({lane['role'].value})" for n, lane in sorted(lanes.items()))
    auth = tree.get("gateway", {}).get("auth")
    mesh = tree.get("mesh", {}).get("enabled")
    posture = auth.value if isinstance(auth, Sourced) else "?"
    on = "on" if isinstance(mesh, Sourced) and mesh.value else "off"
    return f"{name}: lanes {roles_run or 'none'}; gateway {posture}; mesh {on}"


def _env_pins(view: BoxView, tree: Tree) -> None:
    """`.env` keys compose does not interpolate reach the lanes only through `env_file`:
    lobes' own render does not set them, so they are the box's own pins (thor's
    VLLM_GDN_DECODE_KERNEL). Secrets and the keys a desired state derives are left out."""
    names = view.doc.variables.names
    if view.doc.variables.error or not names:
        return
    lanes = tuple(c for s, c in sorted(view.by_service.items()) if s != roles.GATEWAY_SERVICE)
    for key, line in sorted(view.env.items()):
        if key in names or key in DERIVED or not isinstance(line.value, str):
            continue
        if secret_names.is_secret_name(key, SECRET_PATTERNS) or key.endswith("_FEASIBLE"):
            continue
        if any(key.startswith(f"{p}_") for p in _lane_prefixes(tree)):
            continue
        got = view.text(key, lanes)  # the lanes carry it through env_file
        if got is not None:
            put(tree, ("env", key), got)


def _lane_prefixes(tree: Tree) -> set[str]:
    lanes = tree.get("lanes", {})
    return {roles.ENV_PREFIX[lane["role"].value] for lane in lanes.values()}


def _policy(view: BoxView, tree: Tree) -> None:
    put(tree, ("secret_patterns",), Sourced(SECRET_PATTERNS, POLICY))
    put(tree, ("login_shell", "forbidden"), Sourced(FORBIDDEN_EXPORTS, POLICY))
    put(tree, ("memory", "drop_caches_before_boot"), Sourced(True, POLICY))
    put(tree, ("memory", "mem_available_floor_gib"), Sourced(2, POLICY))
    shares = [
        lane["gpu_memory_utilization"].value
        for lane in tree.get("lanes", {}).values()
        if "gpu_memory_utilization" in lane
    ]
    total = round(sum(shares), 4)
    budget = 0.9 if total <= 0.9 else min(1.0, total)
    origin = POLICY if budget == 0.9 else "the lanes' shares (docker inspect / .env)"
    put(tree, ("gpu_memory_budget",), Sourced(budget, origin))
    if total > 1:
        view.note(f"the lanes use {total:g} of GPU memory, more than the whole GPU")
