"""The pyinfra view of the fleet: host names, groups and host.data, built from one Fleet.

`inventory.py` (the CLI) and the reconciler's API runs use the same function, so both see
identical data. host.data keeps JSON-able values only (debug-inventory JSON-encodes it); roles
re-validate `desired` into a BoxSpec.
"""

from __future__ import annotations

from typing import Any

from reconciler.desired.entries import SecretName
from reconciler.desired.envfile import box_env
from reconciler.desired.fleet import Fleet
from reconciler.desired.types import check_host, check_user_name


def host_data(fleet: Fleet, box: str) -> dict[str, Any]:
    conn = fleet.connection(box)
    data: dict[str, Any] = {
        # Checked again here, whatever built the Fleet (a model_construct skips validation):
        # pyinfra hands these to ssh, where `-o...` would be an option.
        "ssh_hostname": check_host(conn.ssh_hostname),
        "ssh_user": check_user_name(conn.ssh_user),
        "ssh_port": conn.ssh_port,
    }
    if conn.ssh_key:
        data["ssh_key"] = fleet.resolve_path(conn.ssh_key)
    if conn.ssh_known_hosts_file:
        data["ssh_known_hosts_file"] = fleet.resolve_path(conn.ssh_known_hosts_file)
        data["ssh_strict_host_key_checking"] = "yes"
    data["fleet_box"] = box
    data["fleet_inventory"] = fleet.inventory_file
    data["fleet_layers"] = list(fleet.layers[box])
    data["desired"] = fleet.boxes[box].model_dump(mode="json")
    # Managed .env keys; a secret is its reference ({"secret": name}), never a value.
    data["desired_env"] = {
        e.key: {"secret": e.value.secret} if isinstance(e.value, SecretName) else e.value
        for e in box_env(fleet, box)
    }
    return data


# Group names pyinfra's side already gives a meaning: `boxes` (every host with its data, below),
# `all` (pyinfra's own group of every host; the loader's group_vars/all.yaml), and the parameters
# of pyinfra's Inventory(names_data, override_data=None, **groups), which takes every other
# group as a keyword argument. The loader refuses a group_order entry named one of them.
BOXES = "boxes"
RESERVED_GROUPS = frozenset({BOXES, "all", "self", "names_data", "override_data"})


def pyinfra_groups(fleet: Fleet) -> dict[str, list[Any]]:
    """{group: hosts}; the `boxes` group carries every host with its data."""
    # `@openssh/thor`: the host is named `thor` and reached through the OpenSSH connector.
    groups: dict[str, list[Any]] = {
        BOXES: [(f"@openssh/{b}", host_data(fleet, b)) for b in fleet.boxes]
    }
    for group in fleet.inventory.group_order:
        if group in RESERVED_GROUPS or group in groups:  # the loader refuses both
            raise ValueError(f"group {group!r} would replace pyinfra's group of that name")
        groups[group] = [
            f"@openssh/{b}" for b, c in fleet.inventory.boxes.items() if group in c.groups
        ]
    return groups
