"""The collector as a pyinfra fact: one box's observation through pyinfra's own machinery.

`reconcile drift` runs the collector over the OpenSSH transport directly: importing pyinfra
alone would cost a drift run a large share of its budget (BENCHMARKS.md). Inside pyinfra (a
deploy's `host.get_fact(Collected)`, or `pyinfra inventory.py fact
reconciler.observe.fact.Collected` from a shell) the same program with the same payload runs
through the host's connector, `@openssh`, which is that same transport. Secrets are hashed on
the box with a key that lives only in this process: digests compare across the hosts of one
pyinfra run, never across runs. The payload goes on stdin, never in the command line; only
the `@openssh` connector sends it (another connector's run gets no payload and fails).
"""

from __future__ import annotations

import functools
import secrets
from typing import TYPE_CHECKING, Any

from pyinfra.api import FactBase

from reconciler.observe.collectors import collector_command, collector_stdin
from reconciler.observe.document import Fault, load_json, parse_collected
from reconciler.observe.transport import WithStdin

if TYPE_CHECKING:
    from pyinfra.api.host import Host
    from pyinfra.api.state import State

    from reconciler.drift_inputs import DriftInputs

RUN_KEY = secrets.token_hex(16)


class Collected(FactBase[dict[str, Any]]):
    """The collector's document for this host's box (what `drift --save-snapshot` keeps)."""

    _box = ""
    _root: str | None = None
    _inventory: str | None = None

    def check_preconditions(self, state: State, host: Host) -> str | None:
        # The one hook that sees the host before `command` runs: which box, which repository
        # (inventory.py's own, as the deploys read it: never FLEET_ROOT or the working
        # directory), which inventory.
        self._box = str(host.data.get("fleet_box") or host.name)
        root = host.data.get("fleet_root")
        self._root = str(root) if root else None
        self._inventory = host.data.get("fleet_inventory")
        return None

    def command(self) -> str:
        """The collector's command line, which holds nothing of the payload: the payload (the
        run key with it) rides along as `stdin`, which the `@openssh` connector sends on ssh's
        stdin (reconciler/observe/openssh_connector.py), as `reconcile drift` sends it. No
        controller_env secret is sent: those checks say "not-sent"."""
        inputs = _inputs(self._root, self._inventory)
        return WithStdin(collector_command(), collector_stdin(inputs.payload(self._box, RUN_KEY)))

    def process(self, output: list[str]) -> dict[str, Any]:
        """The collector's JSON, once it passed the same checks as `reconcile drift` reads it
        with (reconciler/observe/document.py); otherwise that host's fault, as data: a broken
        or hostile box never raises out of pyinfra's fact machinery."""
        raw = load_json("\n".join(output))
        checked = raw if isinstance(raw, Fault) else parse_collected(raw)
        if isinstance(checked, Fault) or not isinstance(raw, dict):
            fault = checked if isinstance(checked, Fault) else raw
            return {"fault": fault.kind.value, "error": str(fault)}
        return raw


@functools.lru_cache(maxsize=2)
def _inputs(root: str | None, inventory: str | None) -> DriftInputs:
    from pathlib import Path

    from reconciler.desired.cache import load_fleet_cached
    from reconciler.desired.locate import inventory_file
    from reconciler.drift_inputs import remembered_inputs

    fleet = load_fleet_cached(Path(root) if root else None, inventory)
    return remembered_inputs(fleet, inventory_file(fleet.root, inventory))
