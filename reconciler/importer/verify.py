"""The round trip, before anything is moved into place: the written repository is loaded with
the project's own loader (an invalid result is never written) and compared exactly as
`reconcile drift` would compare it. What remains is what no desired state removes (a login
shell exporting a forbidden variable, a stale gateway contract, `.env` and the containers
disagreeing): "found while importing".

From a snapshot the saved observations are compared again, as `drift --from-snapshot` does:
against the same `Replayed` (drift.py `replay_checks`: the written deployment directory and user,
the secret sources, the address the controller probes, whether the box file is the one saved)
and with only the saved masks this controller vouches for (`trust_observation`). Compared
without them, an observation of another deployment, another source or an edited file was
judged as if it were the written repository's own, and import said "nothing found" where the
next drift reports errors. A live import runs drift itself against the written repository (a
second collector run per box): compose then renders the desired `.env` of the adopted state,
which only the boxes can do, so what import reports is what the next `reconcile drift`
reports.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path

from reconciler.compare.box import compare_box
from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import BoxResult
from reconciler.desired.load import load_fleet
from reconciler.desired.secret_names import adopt_fleet_patterns
from reconciler.drift import replay_checks, run_drift_on
from reconciler.drift_inputs import drift_inputs
from reconciler.observe.observe import BoxObservation
from reconciler.observe.snapshot_key import KeyOnce, trust_observation

Checked = tuple[list[BoxResult], dict[str, BoxExpectation]]


def replayed(root: Path, inventory: str, observations: Mapping[str, BoxObservation]) -> Checked:
    """Each saved observation compared with the written repository exactly as `drift
    --from-snapshot` compares it (drift.py `run_drift_on`). Raises DesiredStateError if the
    written repository does not validate."""
    inputs = drift_inputs(load_fleet(root, inventory))
    adopt_fleet_patterns(inputs.secret_patterns)  # as drift does: what its report masks
    key = KeyOnce()  # read only if a box has a saved mask to judge
    results = []
    for name, saved in observations.items():
        exp = inputs.expectations[name]
        # trust_observation replaces the typed document in place: a copy's, so the caller's
        # observation (adopted again by a --partial import) stays as the snapshot holds it.
        obs = copy.copy(saved)
        trust_observation(obs, exp, key)
        replay = replay_checks(inputs, name, obs)
        results.append(
            compare_box(exp, obs.document, obs.probes, obs.failure, obs.connection, replay)
        )
    return results, dict(inputs.expectations)


def observed_again(root: Path, inventory: str, boxes: list[str]) -> Checked:
    inputs = drift_inputs(load_fleet(root, inventory))
    run = run_drift_on(inputs, boxes, keep_observations=False)
    return list(run.report.boxes), dict(inputs.expectations)
