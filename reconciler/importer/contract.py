"""The contract, as the live `GET /capabilities` advertises it: the windows this box serves,
the roles it proxies to another member, and the roles it declares infeasible.

A served role's context must equal its lane's window (checks.py), so a gateway still
advertising a start-time window after a lane-only recreate (incident #208) cannot be adopted:
the lane's window is written and the stale advertisement is reported. A gateway that gave no
answer (a 503 while it starts, a timeout) says nothing, but its lanes still serve their roles
and the other members proxy to them: each served role gets its lane's window, the one value
the loader accepts, so one silent gateway blocks no import.

A role proxied to a member whose adopted state serves no such role (it declares the role
infeasible, runs no lane of it) is refused by the loader for the whole mesh: `unhosted` drops
it, said, once every box is adopted."""

from __future__ import annotations

from reconciler.importer.boxview import BoxView
from reconciler.importer.sourced import Finding, Sourced, Tree, put

CAPS = "GET /capabilities"
NO_ANSWER = "the lane's window; GET /capabilities gave no answer"


def adopt_contract(view: BoxView, windows: dict[str, int], members: set[str]) -> Tree:
    probe = view.doc.gateway.capabilities
    roles = probe.roles if probe is not None and probe.status == 200 else None
    contract: Tree = {}
    if roles is None:
        for role, window in sorted(windows.items()):
            put(contract, (role, "context"), Sourced(window, NO_ANSWER))
        why = "not probed" if probe is None else probe.error or f"status {probe.status}"
        served = ", ".join(sorted(windows)) or "none"
        view.note(
            f"GET /capabilities gave no answer ({why}): the served roles ({served}) are "
            "adopted with their lanes' windows; the roles it proxies to other members or "
            "declares infeasible are not known, none is adopted"
        )
        return contract
    for role, entry in sorted(roles.items()):
        if role in windows:
            if entry.feasible is False:
                put(contract, (role, "feasible"), Sourced(False, f"{CAPS} (feasible: false)"))
                continue
            window = windows[role]
            if entry.context != window:
                view.note(
                    f"contract {role}: the gateway advertises {entry.context}, its lane runs "
                    f"{window} (a stale contract, recreate the gateway)"
                )
                put(contract, (role, "context"), Sourced(window, "the lane's window"))
            else:
                put(contract, (role, "context"), Sourced(window, CAPS))
        elif entry.proxied and entry.member:
            if entry.member in members:
                put(contract, (role, "proxied_to"), Sourced(entry.member, CAPS))
            else:
                view.note(f"contract {role}: proxied to {entry.member}, not a box adopted here")
    return contract


def unhosted(trees: dict[str, Tree]) -> list[Finding]:
    """Drop each `proxied_to` naming a member whose adopted contract has no context for the
    role (the loader's check_fleet refuses it: `thor does not host 'worker'`), and say so.
    Its gateway still proxies the role: the box keeps that, a converge does not change it."""
    notes = []
    for box, tree in trees.items():
        contract = tree.get("contract", {})
        for role in sorted(contract):
            leaf = contract[role].get("proxied_to")
            if not isinstance(leaf, Sourced):
                continue
            hosted = trees.get(leaf.value, {}).get("contract", {}).get(role, {})
            if isinstance(hosted.get("context"), Sourced):
                continue
            del contract[role]["proxied_to"]
            if not contract[role]:
                del contract[role]
            notes.append(
                Finding(
                    box,
                    f"contract {role}: proxied to {leaf.value}, whose adopted state serves no "
                    f"{role} (no contract.{role}.context): not adopted",
                )
            )
        if "contract" in tree and not contract:
            del tree["contract"]
    return notes
