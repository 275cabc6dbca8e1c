"""What no box can show: the policy a desired state adds on top of what runs (the names a login
shell must never export, secret-name patterns, memory headroom, the GPU budget). The project's
documented defaults (group_vars/all.yaml), each marked as such in its comment; the secret-name
patterns also take those the repository the import runs in already lists (`own_patterns`)."""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.box_shared.secret_floor import FLOOR_NAMES
from reconciler.desired import roles
from reconciler.desired.checks import literal_keys_problem, own_names_problem
from reconciler.desired.explain import explain
from reconciler.desired.models import BoxSpec, InventorySpec
from reconciler.desired.problems import DesiredStateError, Problem, dotted
from reconciler.desired.schema import layer_errors
from reconciler.desired.yaml_source import load_yaml
from reconciler.importer.sourced import Sourced, Tree, put

if TYPE_CHECKING:  # boxview judges secret names by SECRET_PATTERNS: no import cycle at run time
    from reconciler.importer.boxview import BoxView

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
    *FLOOR_NAMES,
    "*_KEY",
    "*_KEYS",
    "*_TOKEN",
    "*_SECRET",
    "*PASSWORD*",
]


@dataclass(frozen=True)
class OwnPatterns:
    """The `secret_patterns` the repository an import runs in lists beyond SECRET_PATTERNS,
    and where (`group_vars/all.yaml:44`, each layer listing one)."""

    patterns: tuple[str, ...] = ()
    where: tuple[str, ...] = ()


NO_PATTERNS = OwnPatterns()  # a repository with no group_vars, or none listing a pattern


def own_patterns(root: Path, inv: InventorySpec) -> OwnPatterns:
    """Every `secret_patterns` entry of the repository's layers (group_vars/all, each group of
    `group_order`, each box of the inventory; none when it has no group_vars yet): the fleet
    named those values secrets, so an import masks them as drift does (in what it prints, the
    payload it sends the boxes, what it writes) and the adopted policy keeps them. Only this
    key of each layer is judged (the rest is the desired state being replaced), as the loader
    judges it; a layer that cannot be read or a pattern the loader refuses raises
    DesiredStateError at its line: the import cannot tell what it would have to mask."""
    patterns: list[str] = []
    where: list[str] = []
    problems: list[Problem] = []
    for stem in dict.fromkeys(("all", *inv.group_order, *inv.boxes)):
        for ext in ("yaml", "yml"):
            path = root / "group_vars" / f"{stem}.{ext}"
            if not os.path.lexists(path):
                continue
            try:
                doc = load_yaml(path, os.path.relpath(path, root), within=root)
            except DesiredStateError as exc:
                problems += exc.problems
                continue
            raw = doc.data.get("secret_patterns") if isinstance(doc.data, dict) else None
            if raw is None:
                continue
            wrong = layer_errors({"secret_patterns": raw})
            if wrong is not None:
                problems += explain(wrong, BoxSpec, {"secret_patterns": raw}, doc.positions)
                continue
            added = False
            for index, pattern in enumerate(raw):
                problem = own_names_problem(pattern) or _literal_problem(pattern)
                if problem is not None:
                    at = ("secret_patterns", index)
                    location = doc.positions.get(at) or doc.positions[("secret_patterns",)]
                    problems.append(Problem(location, dotted(at), problem))
                elif pattern not in SECRET_PATTERNS and pattern not in patterns:
                    patterns.append(pattern)
                    added = True
            if added:
                line = doc.positions[("secret_patterns",)].line
                where.append(f"{doc.file}:{line}")
    if problems:
        raise DesiredStateError(problems)
    return OwnPatterns(tuple(patterns), tuple(where))


def _literal_problem(pattern: str) -> str | None:
    """`pattern` matches a `.env` key an adopted state sets to a plain value (the loader refuses
    that, desired/checks.py `_patterns`): said here, at the repository's own line, before any
    box is observed, rather than at the adopted file's line in a directory then removed. The
    keys as desired/envfile.py derives them from typed settings (lobes, the chain, images, the
    port, the mesh, each role's lane); the adopted state's validation still judges the rest."""
    from reconciler.importer.adopt import DERIVED  # adopt imports this module

    lane = ("MODEL", "SERVED_NAME", "MAX_MODEL_LEN", "GPU_MEM_UTIL", "FEASIBLE")
    keys = {*DERIVED, *(f"{p}_{s}" for p in roles.ENV_PREFIX.values() for s in lane)}
    hit = sorted(k for k in keys if fnmatch.fnmatchcase(k, pattern))
    if not hit:
        return None
    more = " and others" if len(hit) > 3 else ""
    return literal_keys_problem(pattern, ", ".join(hit[:3]) + more)


def adopt_policy(view: BoxView, tree: Tree, own: OwnPatterns = NO_PATTERNS) -> None:
    """`own`: the repository's own secret patterns, kept after the policy's."""
    origin = POLICY
    if own.patterns:
        origin = f"{POLICY}, and the repository's own ({', '.join(own.where)})"
    put(tree, ("secret_patterns",), Sourced([*SECRET_PATTERNS, *own.patterns], origin))
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
