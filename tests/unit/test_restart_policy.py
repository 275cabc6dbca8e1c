"""A lane's restart policy against its render's (`restart: unless-stopped` in lobes' compose
file). `docker update --restart no` changes it on the container without a recreate and leaves
the compose config hash as it was, so no `docker compose up` puts it back: the lane then stays
down after the box reboots. Drift reports it, report-only, with the `docker update` that
restores it without reloading the model.

On the captured lab data (examples/lab-incidents, edited as plain JSON: the capture predates
these two fields, so it also shows an older snapshot compares as before).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.drift import Action, Kind
from reconciler.observe.document import Observed, parse_collected
from reconciler.observe.document_c import read_snapshot_file
from reconciler.observe.remote.collector import restart_policy
from tests.unit.test_compare_rules import captured, compare, find

__all__ = ["captured"]  # a fixture, used by name

HAND = "model-gear-vllm-hand"
SNAPSHOT = Path(__file__).resolve().parents[2] / "examples/lab-incidents/snapshot"


def _policies(render: str | None, container: str | None) -> Any:
    def edit(raw: dict[str, Any]) -> None:
        if render is not None:
            raw["render"]["services"]["vllm-hand"]["restart"] = render
        if container is not None:
            hand = next(c for c in raw["docker"]["containers"] if c["name"] == HAND)
            hand["restart_policy"] = container

    return edit


@pytest.mark.parametrize(
    ("engine", "written"),
    [
        ({"Name": "unless-stopped", "MaximumRetryCount": 0}, "unless-stopped"),
        ({"Name": "on-failure", "MaximumRetryCount": 3}, "on-failure:3"),
        ({"Name": "on-failure", "MaximumRetryCount": 0}, "on-failure"),
        ({"Name": "", "MaximumRetryCount": 0}, "no"),  # an engine's default, as compose's "no"
        ({"Name": "no", "MaximumRetryCount": 0}, "no"),
        (None, None),
        ({"Name": 5}, None),
        ("always", None),
    ],
)
def test_the_collector_writes_the_engines_policy_as_compose_writes_restart(
    engine: Any, written: str | None
) -> None:
    assert restart_policy(engine) == written


def test_a_policy_changed_by_hand_is_a_report_only_entry_with_its_fix(captured: Any) -> None:
    result = compare(captured, "thor", _policies("unless-stopped", "no"))
    d = find(result, Kind.STATE, "lane:vllm-hand", "restart")
    assert (d.desired, d.observed, d.action, d.source) == (
        "unless-stopped",
        "no",
        Action.REPORT,
        HAND,
    )
    assert d.note is not None
    assert f"`docker update --restart unless-stopped {HAND}`" in d.note


@pytest.mark.parametrize(
    ("render", "container"),
    [
        ("unless-stopped", "unless-stopped"),  # as deployed
        (None, "no"),  # the render names none: the engine's default, not compared
        ("unless-stopped", None),  # a container of an older collector: not recorded
        ("on-failure:3", "on-failure:3"),
    ],
)
def test_no_entry_where_the_policies_agree_or_one_is_not_known(
    captured: Any, render: str | None, container: str | None
) -> None:
    result = compare(captured, "thor", _policies(render, container))
    assert not [d for d in result.drifts if d.path == "restart"]


def test_the_fix_is_offered_only_for_a_policy_docker_takes(captured: Any) -> None:
    # The render's text is the box's: never made into a command to paste.
    result = compare(captured, "thor", _policies("always; touch /tmp/x", "always"))
    d = find(result, Kind.STATE, "lane:vllm-hand", "restart")
    assert d.note is not None and "docker update" not in d.note
    assert "not a policy docker takes" in d.note


def test_both_readers_read_the_two_fields_alike() -> None:
    """document.py (a live answer) and document_c.py (a large replay's snapshot file)."""
    raw = json.loads((SNAPSHOT / "thor.json").read_bytes())
    _policies("unless-stopped", "no")(raw["collected"])
    typed = read_snapshot_file(json.dumps(raw).encode())
    plain = parse_collected(raw["collected"], complete=False)
    assert typed is not None and isinstance(plain, Observed)
    for doc in (typed.document, plain):
        assert doc.render.services is not None and doc.docker.containers is not None
        assert doc.render.services["vllm-hand"].restart == "unless-stopped"
        hand = next(c for c in doc.docker.containers if c.name == HAND)
        assert hand.restart_policy == "no"
        others = [c.restart_policy for c in doc.docker.containers if c.name != HAND]
        assert others == [None] * len(others)  # not recorded in the capture
