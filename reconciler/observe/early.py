"""Start the boxes' collectors before anything heavy is imported, when nothing changed.

A drift run's two slow halves are independent: the boxes answering over SSH, and this process
importing what it compares and reports with. When the remembered drift inputs are still valid
(reconciler/drift_inputs.py: same desired-state files, same code), the collectors are sent at
once from them, the controller's own gateway probes start in a thread, and the run goes on to
import the comparison while the boxes work. On a miss nothing starts here: the desired state
is loaded and validated first, and then `launch` sends the boxes their work (it is how every
drift run starts its collectors and probes).
"""

from __future__ import annotations

from pathlib import Path

from reconciler.drift_inputs import DriftInputs, cached_inputs
from reconciler.observe.collectors import start_collectors
from reconciler.observe.fanout import box_timeout, cancel_all, limit
from reconciler.observe.probes import ProbeRun, probe_gateways
from reconciler.observe.transport import Running


class EarlyStart:
    """Collectors and gateway probes already running, and the inputs they were started from.
    (A plain class: no dataclass before the spawn, observe/transport.py says why.)"""

    def __init__(
        self, inputs: DriftInputs, running: dict[str, Running], run_key: str, probes: ProbeRun
    ) -> None:
        self.inputs = inputs
        self.running = running
        self.run_key = run_key
        self.probes = probes  # -> {box: {probe: answer}}

    def cancel(self) -> None:
        """Every box stopped (none in line starts); never raises: it runs in a `finally` that
        an interrupt may be passing through."""
        cancel_all(self.running.values())


def start(root: Path, inventory: Path, boxes: list[str] | None, run_key: str) -> EarlyStart | None:
    """Spawn the collectors from the remembered inputs, or None if anything may have changed."""
    inputs = cached_inputs(root, inventory)
    if inputs is None:
        return None
    wanted = boxes or list(inputs.boxes)
    if any(box not in inputs.boxes for box in wanted):
        return None  # an unknown box is reported by the normal path
    return launch(inputs, wanted, run_key)


def launch(
    inputs: DriftInputs, boxes: list[str], run_key: str, timeout: float | None = None
) -> EarlyStart:
    """The collectors of `boxes` and the controller's probes, started now, not waited for.
    `timeout`: what one box may take (default: the configured one, observe/fanout.py); the
    probes end within it."""
    if timeout is None:
        timeout = box_timeout()
    running = start_collectors(inputs.targets, {box: inputs.payload(box, run_key) for box in boxes})
    # The mesh-side probes need nothing but the URLs: start them too (their reader is imported
    # in their threads, while this one goes on to import the comparison). As many boxes' at
    # once as the collectors' (fanout.limit, whose FDS_PER_BOX counts their sockets), each in
    # its turn: never three sockets and threads for every box of the fleet at once.
    try:
        bases = {box: inputs.bases[box] for box in boxes}
        probes = ProbeRun(probe_gateways, bases, timeout, limit())
        return EarlyStart(inputs, running, run_key, probes)
    except BaseException:  # Ctrl-C before the caller holds the boxes: stopped here
        cancel_all(running.values())
        raise
