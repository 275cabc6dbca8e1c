"""The peer in bench/drift_bench.py: pyinfra's API connecting to the lab boxes and running
the floor's `docker inspect` through its own SSH connector, in a fresh process.

The hosts come as one JSON argument, `[[name, {ssh_hostname, ssh_user, ssh_port, ssh_key,
ssh_known_hosts_file, ...}], ...]`: pyinfra's host data as inventory.py gives it, computed by
the benchmark before its timing (drift_bench.peer_hosts). So this process imports pyinfra and
nothing of the tool's: what it is timed for is Python's start, pyinfra's import, connecting
and the command.

    python bench/pyinfra_peer.py '[["thor", {"ssh_hostname": "10.77.0.11", ...}], ...]'
"""

from __future__ import annotations

import json
import sys

from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.facts import get_facts
from pyinfra.facts.server import Command

INSPECT = "docker inspect $(docker ps -aq --filter label=com.docker.compose.project=lobes)"


def main(argv: list[str]) -> int:
    hosts = [(name, data) for name, data in json.loads(argv[1])]
    inventory = Inventory((hosts, {}))
    state = State(inventory, Config())
    connect_all(state)
    results = get_facts(state, Command, args=(INSPECT,))
    return 0 if len(results) == len(hosts) and all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
