"""What no box can show: the policy a desired state adds on top of what runs (the names a login
shell must never export, secret-name patterns, memory headroom, the GPU budget). The project's
documented defaults (group_vars/all.yaml), each marked as such in its comment."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.desired import secret_names
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
    *secret_names.FLOOR_NAMES,
    "*_KEY",
    "*_KEYS",
    "*_TOKEN",
    "*_SECRET",
    "*PASSWORD*",
]


def adopt_policy(view: BoxView, tree: Tree) -> None:
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
