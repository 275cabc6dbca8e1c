"""A lane's restart policy changed by hand on a real engine (`docker update --restart no`, no
recreate, the compose config hash untouched) is one report-only drift entry, and the
`docker update` its note offers clears it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.lab.test_drift import by_path, observe

pytestmark = pytest.mark.lab

HAND = "model-gear-vllm-hand"


def _policy(on_box: Callable[..., Any]) -> str:
    shown = on_box(
        "thor", f"docker inspect {HAND} --format '{{{{json .HostConfig.RestartPolicy}}}}'"
    )
    return str(json.loads(shown.stdout)["Name"])


def test_a_restart_policy_changed_by_docker_update_is_reported_and_its_fix_clears_it(
    lab: Any, on_box: Callable[..., Any]
) -> None:
    assert _policy(on_box) == "unless-stopped"  # as lobes' compose file asks
    assert not [d for d in observe("thor").drifts if d.path == "restart"]
    try:
        on_box("thor", f"docker update --restart no {HAND}")
        assert _policy(on_box) == "no"
        d = by_path(observe("thor"), "state", "restart")
        assert (d.subject, d.desired, d.observed, d.action.value, d.source) == (
            "lane:vllm-hand",
            "unless-stopped",
            "no",
            "report-only",
            HAND,
        )
        assert d.note is not None
        fix = d.note.split("`")[1]  # the command the note offers, run as offered
        assert fix == f"docker update --restart unless-stopped {HAND}"
        on_box("thor", fix)
        assert not [d for d in observe("thor").drifts if d.path == "restart"]
    finally:
        on_box("thor", f"docker update --restart unless-stopped {HAND}", check=False)
