"""Review 6, for the lead to add with /tmp/r6-inline.patch (compare/inline.py `_secret_flag`
following scrub.secret_flag): a lane knob carrying `--token x` compares with the box's mask
of its words, as one carrying `--api-key x` does. Fails without the patch (the controller
asks no mask for the knob, the render holds `--token` hashed: a dead-knob drift that stays)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.compare.drift import SecretValue
from tests.unit.test_knob_inline_secrets import DESIRED, SPEC, dead_knobs, observe, thor, typed

KNOBS = {**DESIRED, "WORKER_SPECULATIVE_CONFIG": f"'{SPEC}' --token sk-live-123"}
OTHER = {**KNOBS, "WORKER_SPECULATIVE_CONFIG": f"'{SPEC}' --token sk-old-999"}


def test_a_knob_carrying_a_credential_flag_compares_with_the_boxs_mask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp, payload = thor(KNOBS)
    assert "WORKER_SPECULATIVE_CONFIG" in payload.get("knob_argv", {})
    raw = observe(tmp_path, monkeypatch, KNOBS, payload)
    assert "sk-live-123" not in str(raw)
    assert dead_knobs(exp, typed(raw)) == {}
    raw = observe(tmp_path, monkeypatch, OTHER, payload)
    [drift] = dead_knobs(exp, typed(raw)).values()
    assert drift.path == "--token" and drift.secret_changed is True
    assert isinstance(drift.desired, SecretValue) and isinstance(drift.observed, SecretValue)
