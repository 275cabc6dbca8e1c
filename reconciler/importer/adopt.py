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

from reconciler.desired import roles
from reconciler.desired.envfile import MAY_LEAVE_OUT, NIGHTLY
from reconciler.importer.boxview import BoxView, secret_name
from reconciler.importer.contract import adopt_contract
from reconciler.importer.gateway import adopt_gateway, adopt_mesh
from reconciler.importer.lanes import adopt_lanes
from reconciler.importer.policy import NO_PATTERNS, OwnPatterns, adopt_policy
from reconciler.importer.secrets import UNFOUND, candidates
from reconciler.importer.sourced import Sourced, Tree, put
from reconciler.observe.document import ControllerProbes, Observed

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
    name: str,
    doc: Observed,
    names: dict[str, str],
    members: set[str],
    own: OwnPatterns = NO_PATTERNS,
    controller: ControllerProbes | None = None,
) -> tuple[Tree, BoxView]:
    """`names`: the catalog (digest -> name); `members`: every box adopted in this run; `own`:
    the secret patterns the repository imported in already lists (policy.own_patterns);
    `controller`: the controller's own keyless probes of the box (BoxObservation.probes), the
    gateway's auth when its loopback gave no answer."""
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
    adopt_gateway(view, tree, names, deploy, found, controller)
    adopt_mesh(view, tree, deploy, found)
    contract = adopt_contract(view, windows, members)
    if contract:
        tree["contract"] = contract
    _env_pins(view, tree)
    _left_out(view, tree)
    adopt_policy(view, tree, own)
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
            view.note(f"the -f chain names {name}, which is not on the box")
    return directory


def summary(name: str, tree: Tree) -> str:
    """One line per adopted box: its lanes, the gateway's posture and the mesh."""
    lanes = tree.get("lanes", {})
    roles_run = ", ".join(f"{n} ({lane['role'].value})" for n, lane in sorted(lanes.items()))
    auth = tree.get("gateway", {}).get("auth")
    mesh = tree.get("mesh", {}).get("enabled")
    posture = auth.value if isinstance(auth, Sourced) else "?"
    on = "on" if isinstance(mesh, Sourced) and mesh.value else "off"
    line = f"{name}: lanes {roles_run or 'none'}; gateway {posture}; mesh {on}"
    unfound = _placeholders(tree)
    return f"{line}; not adopted, a placeholder: {', '.join(unfound)}" if unfound else line


def _placeholders(tree: Tree) -> list[str]:
    """The secrets whose key in use no file holds (secrets.unfound): the line must not read
    as if what runs was adopted."""
    return sorted(
        f"secrets.{name}"
        for name, leaf in tree.get("secrets", {}).items()
        if isinstance(leaf, Sourced) and leaf.origin.startswith(UNFOUND)
    )


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
        # A secret's name: left out, in clear (an older or edited snapshot) as hashed.
        if secret_name(key) or key.endswith("_FEASIBLE"):
            continue
        if any(key.startswith(f"{p}_") for p in _lane_prefixes(tree)):
            continue
        if not view.env_key(key):  # `no_proxy`: compose reads it, the loader refuses the key
            continue
        got = view.text(key, lanes)  # the lanes carry it through env_file
        if got is not None and view.writable(key, got):
            put(tree, ("env", key), got)


def _lane_prefixes(tree: Tree) -> set[str]:
    lanes = tree.get("lanes", {})
    return {roles.ENV_PREFIX[lane["role"].value] for lane in lanes.values()}


def _left_out(view: BoxView, tree: Tree) -> None:
    """Keys a desired state derives that lobes' own render leaves out of `.env`, where
    compose's fallback says the same (envfile.MAY_LEAVE_OUT): adopted as `env: {KEY: null}`,
    so a converge keeps them out. A lane's own image variable only when the lane runs the
    image VLLM_NIGHTLY_IMAGE gives it; else the variable stays pinned (and drift shows it)."""
    lanes = tree.get("lanes", {})
    nightly = sorted(
        lane["image"].value
        for lane in lanes.values()
        if roles.IMAGE_VARIABLE.get(lane["role"].value) == NIGHTLY
    )
    for key in sorted(MAY_LEAVE_OUT):
        if view.line(key) is not None:
            continue
        users = sorted(
            name
            for name, lane in lanes.items()
            if roles.IMAGE_VARIABLE.get(lane["role"].value) == key
        )
        if key == "CULTURE_VLLM_API_KEY":
            put(tree, ("env", key), Sourced(None, f"not in .env (compose: ${{{key}:-}})"))
        elif not users:
            continue
        elif nightly and all(lanes[n]["image"].value == nightly[0] for n in users):
            put(tree, ("env", key), Sourced(None, f"not in .env (compose runs {NIGHTLY})"))
        else:
            view.note(
                f"{key} is not in .env and lanes {', '.join(users)} run another image than "
                f"{NIGHTLY}: pinned (a converge writes it)"
            )
