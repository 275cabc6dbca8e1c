"""Compare one box: run every comparator over one observation; faults become errors.

Pure: takes the expectation and the observation's JSON, returns a BoxResult.
"""

from __future__ import annotations

from typing import Any

from reconciler.compare.composefiles import compare_compose_files
from reconciler.compare.containers import compare_containers
from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import BoxResult, Drift, sorted_drifts
from reconciler.compare.envfile import compare_envfile, compare_host, secret_source_errors
from reconciler.compare.gateway import compare_auth, compare_contract
from reconciler.compare.shell import compare_shell


def compare_box(
    exp: BoxExpectation,
    collected: dict[str, Any] | None,
    controller: dict[str, Any],
    error: str | None = None,
) -> BoxResult:
    if collected is None:
        return BoxResult(exp.name, reachable=False, errors=(error or "not observed",))
    drifts: list[Drift] = []
    drifts += compare_envfile(exp, collected)
    drifts += compare_compose_files(exp, collected)
    drifts += compare_containers(exp, collected)
    drifts += compare_shell(exp, collected)
    drifts += compare_contract(exp, collected)
    drifts += compare_auth(exp, collected, controller)
    drifts += compare_host(exp, collected)
    return BoxResult(
        exp.name,
        reachable=True,
        drifts=sorted_drifts(drifts),
        errors=tuple(observation_errors(exp, collected)),
        facts=facts(collected, controller),
    )


def observation_errors(exp: BoxExpectation, doc: dict[str, Any]) -> list[str]:
    """Parts of the box that could not be observed: each one is a fault, not drift."""
    errors = []
    if not doc.get("deploy_dir_exists"):
        errors.append(f"deployment directory {doc.get('deploy_dir')} does not exist")
    for part in ("docker", "render", "variables", "login_shell"):
        section = doc.get(part)
        if isinstance(section, dict) and section.get("error"):
            errors.append(f"{part}: {section['error']}")
    for probe in ("health", "capabilities", "models_noauth"):
        result = (doc.get("gateway") or {}).get(probe) or {}
        if result.get("status") is None and result.get("error"):
            errors.append(f"gateway {probe} (loopback): {result['error']}")
    errors += secret_source_errors(exp, doc)
    return errors


def facts(doc: dict[str, Any], controller: dict[str, Any]) -> dict[str, Any]:
    health = ((doc.get("gateway") or {}).get("health") or {}).get("body") or {}
    mem = doc.get("meminfo") or {}
    containers = ((doc.get("docker") or {}).get("containers")) or []
    return {
        "user": doc.get("user"),
        "gateway_version": health.get("version") if isinstance(health, dict) else None,
        "containers": len(containers),
        "mem_available_gib": round(mem.get("MemAvailable_kib", 0) / 1048576, 1),
        "controller_health": (controller.get("health") or {}).get("status"),
    }
