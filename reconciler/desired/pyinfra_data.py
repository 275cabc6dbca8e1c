"""The pyinfra view of the fleet: host names, groups and host.data, built from one Fleet.

`inventory.py` (the CLI) and the reconciler's API runs use the same function, so both see
identical data. host.data keeps JSON-able values only (debug-inventory JSON-encodes it).

The deploys load the desired state from `fleet_root` and `fleet_inventory`
(reconciler/apply/session.py); host.data's `desired` and `desired_env` are for people reading
`pyinfra inventory.py debug-inventory`, which prints host.data as it is: they are what
`reconcile show --format json` prints, masked as it masks.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from reconciler.desired.fleet import Fleet
from reconciler.desired.problems import DesiredStateError, printable
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
    # The merged desired state and the managed .env keys as `reconcile show` prints them: a
    # value whose key is no secret may still carry one inline (`--api-key sk-...`, a URL's
    # password, `Authorization: Bearer ...`), and debug-inventory prints host.data unmasked.
    # show_doc judges secret names under the fleet's own `secret_patterns` too, as drift does.
    from reconciler.desired.show import show_doc  # ruamel and the maskers: only when asked

    shown = show_doc(fleet, box)  # JSON-able already (model_dump(mode="json"))
    data["desired"] = shown["desired"]
    # A secret is its reference ({"secret": name}), never a value.
    data["desired_env"] = {
        key: {"secret": entry["secret"]} if "secret" in entry else entry["value"]
        for key, entry in shown["env"].items()
    }
    return data


# Group names pyinfra's side already gives a meaning: `boxes` (every host with its data, below),
# `all` (pyinfra's own group of every host; the loader's group_vars/all.yaml), and the parameters
# of pyinfra's Inventory(names_data, override_data=None, **groups), which takes every other
# group as a keyword argument. The loader refuses a group_order entry named one of them.
BOXES = "boxes"
RESERVED_GROUPS = frozenset({BOXES, "all", "self", "names_data", "override_data"})


def pyinfra_groups(fleet: Fleet, only: Collection[str] | None = None) -> dict[str, list[Any]]:
    """{group: hosts}; the `boxes` group carries every host with its data. `only`: these boxes
    alone are hosts (None: every box), in every group."""
    boxes = [b for b in fleet.boxes if only is None or b in only]
    # `@openssh/thor`: the host is named `thor` and reached through the OpenSSH connector.
    groups: dict[str, list[Any]] = {BOXES: [(f"@openssh/{b}", host_data(fleet, b)) for b in boxes]}
    for group in fleet.inventory.group_order:
        if group in RESERVED_GROUPS or group in groups:  # the loader refuses both
            raise ValueError(f"group {group!r} would replace pyinfra's group of that name")
        groups[group] = [
            f"@openssh/{b}"
            for b, c in fleet.inventory.boxes.items()
            if group in c.groups and (only is None or b in only)
        ]
    return groups


# deploys/mesh.py converges every box; any other deploys/<name>.py converges the box <name>.
MESH_DEPLOY = "mesh"


class NoSuchBox(ValueError):
    """A per-box deploy file (deploys/thor.py) of a box the chosen inventory does not hold:
    `deploys/thor.py: no box 'thor' in inventory/lab.yaml`."""


def deploy_boxes(
    operations: Iterable[str], root: Path, boxes: Collection[str], inventory: str = "the inventory"
) -> list[str] | None:
    """The boxes a pyinfra run acts on when every operation it was given is a per-box deploy
    file of `root` (`deploys/thor.py`: thor), in the order first named; None (every box)
    for anything else: deploys/mesh.py, another file, debug-inventory, exec, a fact.

    pyinfra connects to every host of the inventory (less --limit/--exclude) before it loads a
    deploy file, and a host that cannot be connected fails the run (without -y it asks whether
    to go on). deploys/thor.py acts on thor alone, so one unreachable box elsewhere in the mesh
    must not stop it: inventory.py makes only the boxes named here hosts. Paths are taken as
    pyinfra takes them, from the working directory (after --chdir).

    Raises NoSuchBox for a deploy file of a box of this repository (one an inventory file of
    `root` names) that `boxes` lacks: deploys/thor.py acts on thor alone, so run where there
    is no thor it connected to every other box, converged nothing and succeeded."""
    deploys = (root / "deploys").resolve()
    named: list[str] = []
    every = False  # an operation of every box; still, each file is checked for NoSuchBox
    for operation in operations:
        path = Path(operation)
        if path.suffix != ".py" or not path.is_file():
            every = True
            continue
        path = path.resolve()
        if path.parent != deploys or path.stem == MESH_DEPLOY:
            every = True
        elif path.stem in boxes:
            named.append(path.stem)
        elif path.stem in _repository_boxes(root):
            raise NoSuchBox(f"{printable(operation)}: no box {path.stem!r} in {inventory}")
        else:
            every = True  # deploys/other.py, of a box no inventory names: every box, as ever
    return None if every else list(dict.fromkeys(named)) or None


def _repository_boxes(root: Path) -> set[str]:
    """The boxes any inventory file of `root` names (inventory/hosts.yaml, lab.yaml, ...): a
    file that does not parse names none. Read only for a deploy file of a box `boxes` lacks."""
    from reconciler.desired.yaml_source import load_yaml  # the loader's own safe reader

    found: set[str] = set()
    folder = root / "inventory"
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        try:
            data = load_yaml(path, str(path), within=root, inventory=True).data
        except DesiredStateError:
            continue
        if isinstance(data.get("boxes"), dict):
            found.update(str(name) for name in data["boxes"])
    return found
