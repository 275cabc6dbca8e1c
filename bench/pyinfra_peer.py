"""The peer in bench/drift_bench.py: pyinfra's API connecting to the lab boxes and running
the floor's `docker inspect` through its own SSH connector, in a fresh process."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pyinfra.api import Config, Inventory, State  # noqa: E402
from pyinfra.api.connect import connect_all  # noqa: E402
from pyinfra.api.facts import get_facts  # noqa: E402
from pyinfra.facts.server import Command  # noqa: E402

from reconciler.desired.load import load_fleet  # noqa: E402
from reconciler.desired.pyinfra_data import host_data  # noqa: E402

INSPECT = "docker inspect $(docker ps -aq --filter label=com.docker.compose.project=lobes)"


def main() -> int:
    fleet = load_fleet(ROOT, "lab")
    names = list(fleet.boxes)
    inventory = Inventory(([(b, host_data(fleet, b)) for b in names], {}))
    state = State(inventory, Config())
    connect_all(state)
    results = get_facts(state, Command, args=(INSPECT,))
    return 0 if len(results) == len(names) and all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
