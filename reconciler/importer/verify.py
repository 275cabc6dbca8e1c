"""The round trip, before anything is moved into place: the written repository is loaded with
the project's own loader (an invalid result is never written) and compared exactly as
`reconcile drift` would compare it. What remains is what no desired state removes (a login
shell exporting a forbidden variable, a stale gateway contract, `.env` and the containers
disagreeing): "found while importing".

From a snapshot the saved observations are compared again, as `drift --from-snapshot` does. A
live import runs drift itself against the written repository (a second collector run per
box): compose then renders the desired `.env` of the adopted state, which only the boxes can
do, so what import reports is what the next `reconcile drift` reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from reconciler.compare.box import compare_box
from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import BoxResult
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift_on
from reconciler.drift_inputs import drift_inputs
from reconciler.observe.observe import BoxObservation

Checked = tuple[list[BoxResult], dict[str, BoxExpectation]]


def replayed(root: Path, inventory: str, observations: Mapping[str, BoxObservation]) -> Checked:
    """Raises DesiredStateError if the written repository does not validate."""
    inputs = drift_inputs(load_fleet(root, inventory))
    return [
        compare_box(
            inputs.expectations[name], obs.document, obs.probes, obs.failure, obs.connection
        )
        for name, obs in observations.items()
    ], dict(inputs.expectations)


def observed_again(root: Path, inventory: str, boxes: list[str]) -> Checked:
    inputs = drift_inputs(load_fleet(root, inventory))
    run = run_drift_on(inputs, boxes, keep_observations=False)
    return list(run.report.boxes), dict(inputs.expectations)
