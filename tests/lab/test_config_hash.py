"""A pending recreate on real engines: compose's config hash of the files on each box, as the
collector takes it, is the label `docker compose up` wrote on every container it made from
them (compose's own `config --hash` is not, for a service with an `env_file:`: compose
#14001); and a container made from other files (here one more compose file, a label no rule
compares) is said once, as what the next `docker compose up` would recreate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from reconciler.compare.drift import Kind
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from tests.lab.test_drift import ROOT, by_path, observe

pytestmark = pytest.mark.lab

EXTRA = "$HOME/fleet-test-extra-label.yml"


def test_the_collectors_hash_is_the_label_up_wrote_on_every_container(lab: Any) -> None:
    run = run_drift(load_fleet(ROOT, "lab"), ["thor", "spark", "orin"])
    compared = 0
    for box, seen in run.observations.items():
        doc = seen.document
        assert doc is not None and doc.config_hashes is not None, box
        hashes = doc.config_hashes.services
        assert hashes is not None, (box, doc.config_hashes.error)
        for c in doc.containers:
            assert c.service is not None and c.config_hash is not None
            assert hashes[c.service] == c.config_hash, (box, c.service)
            compared += 1
    assert compared >= 15  # every lane and gateway of the three boxes
    assert not [d for r in run.report.boxes for d in r.drifts if d.path == "config-hash"]


def test_a_gateway_up_from_one_more_compose_file_is_a_pending_recreate(
    lab: Any, on_box: Callable[..., Any], pristine: Callable[[str], None]
) -> None:
    before = observe("spark")
    assert not [d for d in before.drifts if d.path == "config-hash"]
    pristine("spark")  # the gateway is recreated below: put back as the lab made it afterwards
    try:
        on_box(
            "spark",
            f"printf 'services:\\n  gateway:\\n    labels:\\n      fleet.test: \"1\"\\n' > {EXTRA}"
            " && cd ~/.lobes && COMPOSE_FILE=\"$(sed -n 's/^COMPOSE_FILE=//p' .env):"
            f'{EXTRA}" docker compose up -d --no-deps gateway',
        )
        after = observe("spark")
        d = by_path(after, "state", "config-hash")
        assert (d.subject, d.action.value, d.source) == (
            "gateway",
            "report-only",
            "model-gear-gateway",
        )
        assert d.desired != d.observed and len(str(d.desired)) == 64
        assert d.note is not None and "the next `docker compose up` recreates it" in d.note
        # Nothing else of the gateway's container differs in a field a rule compares (its
        # status may still be `starting`; its probes are not its config).
        fields = {Kind.STATE, Kind.ENV, Kind.ARGV, Kind.PORT, Kind.IMAGE}
        others = {x.path for x in after.drifts if x.subject == "gateway" and x.kind in fields}
        assert others - {"status"} == {"config-hash"}, others
    finally:
        on_box("spark", f"rm -f {EXTRA}", check=False)
