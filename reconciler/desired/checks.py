"""Cross-field checks: what no single value can tell about itself.

Each check returns (yaml path, message) pairs; the loader turns paths into file:line:col.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Iterator

from reconciler.compare.shell import redirecting_variable
from reconciler.desired import roles
from reconciler.desired.entries import EnvEntry
from reconciler.desired.envfile import left_out_image_problems
from reconciler.desired.models import (
    BoxSpec,
    EnvValue,
    SecretRef,
    TaggedImage,
    compose_project_name,
)
from reconciler.desired.near import nearest
from reconciler.desired.problems import PathKey
from reconciler.desired.refs import is_digest_ref, looks_like_image_ref
from reconciler.desired.secret_names import is_secret_name

Finding = tuple[PathKey, str]


def check_box(box: BoxSpec, env: list[EnvEntry]) -> list[Finding]:
    """`env`: the box's managed `.env` (envfile.desired_env), derived once by the loader."""
    findings: list[Finding] = []
    findings += _images(box)
    findings += _gpu_budget(box)
    findings += _lanes(box)
    findings += _secrets(box)
    findings += _auth(box)
    findings += _contract_local(box)
    findings += _compose_chain(box)
    findings += _compose_project(box)
    findings += _control_pins(box)
    findings += _env_keys(env)
    findings += _patterns(box, env)
    findings += left_out_image_problems(box)
    return findings


def check_fleet(boxes: dict[str, BoxSpec]) -> list[Finding]:
    """Checks across boxes; paths are prefixed with the box name (`thor`, ...)."""
    findings: list[Finding] = []
    for box in boxes.values():
        for role, contract in box.contract.items():
            host = contract.proxied_to
            if host is None:
                continue
            at: PathKey = (box.name, "contract", role, "proxied_to")
            if host == box.name:
                findings.append((at, f"{role!r} cannot be proxied to the box itself"))
            elif host not in boxes:
                findings.append((at, f"unknown box {host!r}{_hint(host, list(boxes))}"))
            elif (boxes[host].contract.get(role) or _NO_CONTRACT).context is None:
                findings.append((at, f"{host} does not host {role!r} (no contract.{role}.context)"))
            elif not (box.mesh.enabled and boxes[host].mesh.enabled):
                findings.append((at, f"proxying {role!r} to {host} needs the mesh on both boxes"))
    keys = {b.mesh.key.secret for b in boxes.values() if b.mesh.enabled and b.mesh.key}
    for box in boxes.values():
        if box.mesh.enabled and len(keys) > 1:
            findings.append(((box.name, "mesh", "key"), f"mesh key secrets differ: {sorted(keys)}"))
    return findings


class _NoContract:
    context = None


_NO_CONTRACT = _NoContract()


def _hint(word: str, options: list[str]) -> str:
    near = nearest(word, options)
    return f"; did you mean {near!r}?" if near else ""


def _image_problem(box: BoxSpec, image: str) -> str | None:
    if looks_like_image_ref(image):
        if not is_digest_ref(image):
            return f"{image!r} is not pinned by digest (want repo@sha256:<64 hex>)"
        return None
    if image not in box.images:
        return f"unknown image {image!r}{_hint(image, list(box.images))}"
    return None


def _images(box: BoxSpec) -> Iterator[Finding]:
    for name, lane in box.lanes.items():
        problem = _image_problem(box, lane.image)
        if problem:
            yield ("lanes", name, "image"), problem
    problem = _image_problem(box, box.gateway.image)
    if problem:
        yield ("gateway", "image"), problem
    for name, entry in box.images.items():
        if isinstance(entry, TaggedImage) and is_digest_ref(entry.ref):
            yield ("images", name, "ref"), "is pinned by digest; drop tag_allowed_because"


def _gpu_budget(box: BoxSpec) -> Iterator[Finding]:
    total = round(sum(lane.gpu_memory_utilization for lane in box.lanes.values()), 4)
    if total > box.gpu_memory_budget:
        parts = ", ".join(
            f"{n} {lane.gpu_memory_utilization:g}" for n, lane in sorted(box.lanes.items())
        )
        yield (
            ("gpu_memory_budget",),
            f"lanes use {total:g} of GPU memory ({parts}), "
            f"over the budget {box.gpu_memory_budget:g}",
        )


def _lanes(box: BoxSpec) -> Iterator[Finding]:
    seen_service: dict[str, str] = {}
    seen_role: dict[str, str] = {}
    image_of_var: dict[str, tuple[str, str]] = {}
    for name, lane in box.lanes.items():
        if lane.service_name in seen_service:
            yield (
                ("lanes", name, "service"),
                f"service {lane.service_name!r} is already "
                f"lane {seen_service[lane.service_name]!r}",
            )
        seen_service[lane.service_name] = name
        if lane.role in seen_role:
            yield (
                ("lanes", name, "role"),
                f"role {lane.role!r} is already lane {seen_role[lane.role]!r}",
            )
        seen_role[lane.role] = name
        if lane.role not in roles.ENV_PREFIX:
            yield (("lanes", name, "role"), f"role {lane.role!r} is not served by a vLLM lane")
        var = roles.IMAGE_VARIABLE.get(lane.role)
        if var:
            ref = box.image_ref(lane.image)
            if var in image_of_var and image_of_var[var][0] != ref:
                yield (
                    ("lanes", name, "image"),
                    f"lanes {image_of_var[var][1]!r} and {name!r} share {var} "
                    "but want different images",
                )
            image_of_var.setdefault(var, (ref, name))


def _secret_refs(box: BoxSpec) -> Iterator[tuple[PathKey, SecretRef]]:
    for key, value in box.env.items():
        if isinstance(value, SecretRef):
            yield ("env", key, "secret"), value
    for name, lane in box.lanes.items():
        for key, value in lane.env.items():
            if isinstance(value, SecretRef):
                yield ("lanes", name, "env", key, "secret"), value
    if box.gateway.api_key:
        yield ("gateway", "api_key", "secret"), box.gateway.api_key
    if box.mesh.key:
        yield ("mesh", "key", "secret"), box.mesh.key


def _env_maps(box: BoxSpec) -> Iterator[tuple[PathKey, str, EnvValue | None]]:
    for key, value in box.env.items():
        yield ("env", key), key, value
    for name, lane in box.lanes.items():
        for key, value in lane.env.items():
            yield ("lanes", name, "env", key), key, value


def _secrets(box: BoxSpec) -> Iterator[Finding]:
    for path, ref in _secret_refs(box):
        if ref.secret not in box.secrets:
            yield (
                path,
                f"secret {ref.secret!r} is not declared in secrets:"
                f"{_hint(ref.secret, list(box.secrets))}",
            )
    for path, key, value in _env_maps(box):
        secret_name = is_secret_name(key, box.secret_patterns)
        if secret_name and not isinstance(value, SecretRef) and value not in ("", None):
            yield path, f"{key} is a secret name: use {{secret: <name>}}, never a literal value"
        if isinstance(value, SecretRef) and not secret_name:
            yield path, f"{key} takes a secret but matches no secret_patterns; add a pattern"
    # A box_file secret's path is an InsideHome (types.py): inside the home, checked on load.


# A few of the tool's own names, quoted when a pattern matches one (else another name it does).
# The tool's own field names: the keys of a box's answer, a saved snapshot and a probe that are
# no variable's (tests/unit/test_patterns_review8.py holds every such key of the captured box
# files to this list). A secret name masks whatever it holds wherever one is masked, so a
# pattern matching one (`*`, `status`, `*s`) made `box: ***` of a saved box file.
_OWN_NAMES = (
    "box",
    "version",
    "status",
    "error",
    "name",
    "names",
    "key",
    "value",
    "env",
    "line",
    "source",
    "path",
    "id",
    "mode",
    "digest",
    "sha256",
    "size",
    "time",
    "ms",
    "elapsed_s",
    "collected",
    "collector",
    "controller",
    "docker",
    "containers",
    "container",
    "container_name",
    "images",
    "image",
    "image_id",
    "image_ref",
    "repo_digests",
    "repo_tags",
    "service",
    "services",
    "cmd",
    "command",
    "entrypoint",
    "environment",
    "health",
    "state",
    "running",
    "ports",
    "host_ip",
    "host_network",
    "ips",
    "runtime",
    "restart_count",
    "exit_code",
    "started_at",
    "created",
    "config_hash",
    "config_files",
    "labels",
    "deploy_dir",
    "deploy_dir_exists",
    "current_env_keys",
    "envfile",
    "envfile_keys",
    "files",
    "exists",
    "gateway",
    "render",
    "render_login",
    "lanes",
    "login_shell",
    "exports",
    "variables",
    "secret_sources",
    "secret",
    "timings_ms",
    "meminfo",
    "home",
    "user",
    "host",
    "base",
    "body",
    "headers",
    "url",
    "endpoint",
    "reason",
    "error_type",
    "origin",
    "target",
    "via",
    "probes",
    "published",
    "audit",
    "mesh",
    "mesh_detect",
    "member",
    "member_lanes",
    "lane_ports",
    "capabilities",
    "capacity",
    "context",
    "models_key",
    "models_noauth",
    "models_mesh_key",
    "chat_noauth",
    "proxied",
    "hosted_by",
    "owned_by",
    "object",
    "data",
    "model",
    "role",
    "responsibilities",
    "forbidden_responsibilities",
    "ready",
    "loaded",
    "busy",
    "waiting",
    "total",
    "skipped",
    "weight",
    "parent",
    "root",
    "permission",
    "protocol",
    "inventory",
    "snapshot",
    "run_id",
    "taken_at",
    "schema_version",
    "boxes",
    "fingerprint",
    "key_from",
    "served_id",
    "profiles",
    "replicas",
    "local",
    "login",
)
# Keys one pattern's finding names before "and others".
_SHOWN_KEYS = 3


def _patterns(box: BoxSpec, env: list[EnvEntry]) -> Iterator[Finding]:
    """What a `secret_patterns` entry must not match, blamed at its line (secret_names.py
    keeps each layer's FILE:LINE):
    - a `.env` key the fleet derives with a literal value (LOBES_MESH_NAME, the box's name
      when the mesh is on; a lane's `*_MODEL`): the collector hashes the value of a
      secret-named key on the box and the controller holds only the clear desired value, so
      drift reports it on every run as not comparable, a converge rewrites it, and the
      render basis (the desired `.env` hashed) never matches a saved render. A pin (`env:`,
      `lanes.*.env`) is said at its own line (`_secrets`). An empty value is no secret (the
      box reads it as empty);
    - one of the tool's own field names (a box file's `box`, `version`, a probe's `status`,
      `_OWN_NAMES`): a secret name masks whatever it holds wherever one is masked (a saved
      snapshot, the history store, the reports), so `box: ***` could not be read back."""
    derived = [
        e for e in env if isinstance(e.value, str) and e.value != "" and not _is_pin(e.origin)
    ]
    keys = tuple(e.key for e in derived)
    for index, pattern in enumerate(box.secret_patterns):
        at: PathKey = ("secret_patterns", index)
        problem = own_names_problem(pattern)
        if problem is not None:
            yield at, problem
        matched = set(_matched(pattern, keys))
        hit = [e for e in derived if e.key in matched]
        if hit:
            named = ", ".join(f"{e.key} (from {e.origin})" for e in hit[:_SHOWN_KEYS])
            # No count: boxes whose lanes add keys then say the same, one line for them all.
            more = " and others" if len(hit) > _SHOWN_KEYS else ""
            yield at, literal_keys_problem(pattern, f"{named}{more}")


@functools.lru_cache(maxsize=4096)
def _matched(pattern: str, keys: tuple[str, ...]) -> tuple[str, ...]:
    """The `keys` the glob matches. Remembered: every box of a fleet derives the same key
    names and lists the same patterns (at 1,000 boxes, ~0.5 s of a cold load matched anew)."""
    return tuple(k for k in keys if fnmatch.fnmatchcase(k, pattern))


def literal_keys_problem(pattern: str, named: str) -> str:
    """Why `pattern` cannot be a secret pattern: it matches `named`, `.env` keys the fleet
    sets to a literal value. Also the importer's (importer/policy.py)."""
    return (
        f"{pattern!r} matches {named}: .env keys the fleet sets to a literal value, which the "
        "box would hash while the controller holds it in clear (a difference drift can never "
        "compare, on every run, and a rewrite each converge); narrow the pattern (a secret's "
        "value comes through `secrets:`, as {secret: NAME})"
    )


@functools.lru_cache(maxsize=1024)
def own_names_problem(pattern: str) -> str | None:
    """Why a `secret_patterns` entry cannot be one (it matches the tool's own names), or None.
    Also the importer's rule for the patterns it adopts (importer/policy.py)."""
    own = own_name_matched(pattern)
    if own is None:
        return None
    return (
        f"{pattern!r} matches {own!r}, one of the tool's own field names (a box file's `box` "
        "and `version`, a probe's `status`): saved snapshots and reports would hide them as "
        "*** and could not be read back; narrow the pattern to the variables it means"
    )


def own_name_matched(pattern: str) -> str | None:
    """The first of the tool's own field names (`_OWN_NAMES`) the glob `pattern` matches, or
    None. Only those: a lower-case variable's pattern (`*_pw`) names no field of the tool's
    and stays a fleet's to protect."""
    return next((name for name in _OWN_NAMES if fnmatch.fnmatchcase(name, pattern)), None)


def _auth(box: BoxSpec) -> Iterator[Finding]:
    gw = box.gateway
    if gw.auth == "keyed" and gw.api_key is None:
        yield ("gateway", "auth"), "auth is keyed but gateway.api_key names no secret"
    if gw.auth == "open" and gw.api_key is not None:
        yield ("gateway", "api_key"), "auth is open: remove api_key or set auth: keyed"
    mesh = box.mesh
    if mesh.enabled and mesh.key is None:
        yield ("mesh", "enabled"), "the mesh is enabled but mesh.key names no secret"


def _contract_local(box: BoxSpec) -> Iterator[Finding]:
    lane_of_role = {lane.role: (name, lane) for name, lane in box.lanes.items()}
    for role, contract in box.contract.items():
        at: PathKey = ("contract", role)
        if not contract.feasible:
            if contract.context is not None or contract.proxied_to is not None:
                yield (*at, "feasible"), "an infeasible role has no context and no proxied_to"
            continue
        if (contract.context is None) == (contract.proxied_to is None):
            yield at, "set exactly one of context (served here) or proxied_to (another box)"
            continue
        if contract.context is not None:
            if role not in lane_of_role:
                yield (*at, "context"), f"no lane serves {role!r} on this box"
                continue
            name, lane = lane_of_role[role]
            if contract.context != lane.max_model_len:
                yield (
                    (*at, "context"),
                    f"advertises {contract.context} but lane {name!r} serves "
                    f"max_model_len {lane.max_model_len}",
                )
        elif role in lane_of_role:
            yield (*at, "proxied_to"), f"lane {lane_of_role[role][0]!r} serves {role!r} here"


def _compose_chain(box: BoxSpec) -> Iterator[Finding]:
    chain = box.deployment.compose_files
    if chain[0] != "docker-compose.yml":
        yield ("deployment", "compose_files", 0), "the chain must start with docker-compose.yml"
    if "docker-compose.override.yml" in chain[:-1]:
        index = chain.index("docker-compose.override.yml")
        yield (
            ("deployment", "compose_files", index),
            "lobes always puts docker-compose.override.yml last",
        )
    for index, name in enumerate(chain):
        if chain.index(name) != index:
            yield ("deployment", "compose_files", index), f"{name} is listed twice"


def _compose_project(box: BoxSpec) -> Iterator[Finding]:
    """The converge and the observer find the containers by deployment.project; a `docker
    compose` run by hand in the directory (lobes' own commands, an operator's) names the project
    after the directory. Two names would be two projects on one set of files. Checked on the
    merged state (a layer may set the directory and another the project)."""
    deployment = box.deployment
    derived = compose_project_name(deployment.directory)
    if derived == deployment.project:
        return
    # Blame the key the YAML set: the project if given, else the directory that moved.
    at = "project" if "project" in deployment.model_fields_set else "directory"
    if not derived:
        why = f"compose derives no project name from {deployment.directory} (it refuses it)"
    else:
        why = (
            f"compose derives the project {derived!r} from {deployment.directory}, so a "
            "`docker compose` run there would manage another project than the converge's"
        )
    yield (
        ("deployment", at),
        f"project {deployment.project!r} is not the directory's: {why} (its last part, "
        "lowercase, only a-z 0-9 _ -, no leading _ or -); make them agree",
    )


def _control_pins(box: BoxSpec) -> Iterator[Finding]:
    """No `env:` pin sets a variable that moves compose off the deployment (compare/shell.py
    REDIRECTING: the project, its files and profiles, the engine, orphans removed): in `.env` it
    would move every `docker compose` in the directory. What the fleet needs of them it derives
    (COMPOSE_FILE, COMPOSE_PROFILES). A tuning knob (COMPOSE_PARALLEL_LIMIT) may be pinned. A
    null pin writes nothing and removes a stray line."""
    for path, key, value in _env_maps(box):
        if value is not None and redirecting_variable(key):
            yield (
                path,
                f"{key} is read by compose or docker itself: in .env it would move compose to "
                "another project, other files or another engine, or remove containers (the "
                "fleet derives COMPOSE_FILE and COMPOSE_PROFILES; null leaves the key out)",
            )


def _env_keys(entries: list[EnvEntry]) -> Iterator[Finding]:
    """A key set twice is blamed on the `env:` pin, not on the typed field it shadows."""
    by_key: dict[str, list[EnvEntry]] = {}
    for entry in entries:
        by_key.setdefault(entry.key, []).append(entry)
    for key, group in by_key.items():
        if len(group) < 2:
            continue
        pins = [e for e in group if _is_pin(e.origin)]
        blamed = pins or group[1:]
        keeper = next((e for e in group if e not in blamed), group[0])
        for entry in blamed:
            if entry.value is not None and _is_pin(entry.origin) and redirecting_variable(key):
                continue  # _control_pins says why, at the same line
            if entry is not keeper:
                yield _origin_path(entry.origin), f"{key} is already set by {keeper.origin}"


def _is_pin(origin: str) -> bool:
    return origin.startswith("env.") or ".env." in origin


def _origin_path(origin: str) -> PathKey:
    return tuple(origin.split("."))
