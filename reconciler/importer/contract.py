"""The contract, as the live `GET /capabilities` advertises it: the windows this box serves,
the roles it proxies to another member, and the roles it declares infeasible.

A served role's context must equal its lane's window (checks.py), so a gateway still
advertising a start-time window after a lane-only recreate (incident #208) cannot be adopted:
the lane's window is written and the stale advertisement is reported."""

from __future__ import annotations

from reconciler.importer.boxview import BoxView
from reconciler.importer.sourced import Sourced, Tree, put

CAPS = "GET /capabilities"


def adopt_contract(view: BoxView, windows: dict[str, int], members: set[str]) -> Tree:
    probe = view.doc.gateway.capabilities
    roles = probe.roles if probe is not None and probe.status == 200 else None
    contract: Tree = {}
    if roles is None:
        view.note("GET /capabilities gave no answer: no contract adopted")
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
