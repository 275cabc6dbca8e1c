"""A snapshot replayed after an inline secret was rotated in the desired state.

The box masks a desired value carrying a secret inline with the run's key; a snapshot holds
the masks of the values it was saved against, and compare can only check their text outside
the secret. So a replay trusts a mask only where this controller recorded, at the save, that
it was made from the current desired value (observe/snapshot_key.py): otherwise the secret is
"not comparable", never "no drift". The box is the lab's thor (test_envfile_inline_secrets,
test_knob_inline_secrets); the snapshot is saved and replayed through drift's own paths.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from reconciler import fast_json
from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import BoxResult, Drift, DriftReport, Kind
from reconciler.drift import run_drift_on
from reconciler.drift_inputs import DriftInputs
from reconciler.observe import snapshot_key
from reconciler.observe.observe import BoxObservation, save_snapshot
from reconciler.observe.snapshot_key import SnapshotKeyError
from reconciler.records import replace
from reconciler.report import FORMATS, render
from tests.unit import test_envfile_inline_secrets as env_case
from tests.unit import test_knob_inline_secrets as knob_case

INLINE_KEYS = sorted(env_case.INLINE)
KNOB_FLAGS = ["--api-key", "--hf-overrides", "--hf-token"]


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This controller's state directory (its snapshot key), apart from the user's."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


def save(directory: Path, raw: dict[str, Any], exp: BoxExpectation) -> Path:
    """What `drift --save-snapshot` does with a live answer for desired state `exp`."""
    obs = BoxObservation("thor", raw, None, complete=False)
    snapshot_key.record({"thor": obs}, {"thor": exp})
    save_snapshot(directory, {"thor": obs}, {"run_id": "r1", "inventory": "inventory/lab.yaml"})
    return directory


def replay(directory: Path, exp: BoxExpectation, in_parts: bool = False) -> BoxResult:
    """`drift --from-snapshot` against desired state `exp`: the run that keeps observations
    (load_snapshot), or the one that keeps only the report (the replayer, as a large replay
    reads it: msgspec straight into the document)."""
    # The answer is a collector's run over a deployment in tmp_path, not the lab thor's own
    # directory and user: not told apart here (compare/box.py `misplaced`).
    exp = replace(exp, directory=None, user=None)
    inputs = DriftInputs("inventory/lab.yaml", ("thor",), {"thor": exp}, {}, {}, {})
    run = run_drift_on(inputs, ["thor"], from_snapshot=directory, keep_observations=not in_parts)
    return run.report.boxes[0]


def env_drifts(result: BoxResult) -> dict[str, Drift]:
    return {
        d.path: d for d in result.drifts if d.kind == Kind.ENVFILE and d.path in env_case.INLINE
    }


def knob_drifts(result: BoxResult) -> dict[str, Drift]:
    return {
        d.path: d
        for d in result.drifts
        if d.subject == "lane:vllm-worker" and d.note and "is dead" in d.note
    }


def texts(result: BoxResult) -> dict[str, str]:
    report = DriftReport((result,), "inventory/lab.yaml", "2026-12-01T00:00:00Z", "r1")
    return {fmt: render(report, fmt) for fmt in FORMATS}


def assert_not_comparable(drifts: dict[str, Drift]) -> None:
    for drift in drifts.values():
        assert drift.is_secret and drift.secret_changed is None, drift
    out = texts(BoxResult("thor", reachable=True, drifts=tuple(drifts.values())))
    assert "(not comparable)" in out["text"]
    assert "not comparable" in out["markdown"] and "not comparable" in out["html"]
    entries = json.loads(out["json"])["boxes"][0]["drifts"]
    picked = [e for e in entries if e["path"] in drifts]
    assert len(picked) == len(drifts) and all(
        e["secret"] is True and e["changed"] is None for e in picked
    )
    for text in out.values():
        assert "(unchanged)" not in text and "(changed)" not in text


def assert_nothing_clear(
    snapshot: Path, state: Path, result: BoxResult, secrets: list[str]
) -> None:
    key = (state / "fleet-reconciler" / snapshot_key.KEY_FILE).read_bytes()
    shown = [p.read_bytes() for p in snapshot.rglob("*") if p.is_file()]
    shown += [t.encode() for t in texts(result).values()]
    for data in shown:
        assert key not in data and key.hex().encode() not in data
        for secret in secrets:
            assert secret.encode() not in data, secret


# -- .env values ---------------------------------------------------------------------------------
ENV_SECRETS = [*env_case.SECRETS, "sk-old-999", "hf_zzzzz", "old-bearer-1"]


def env_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Saved while the box and the desired state both held OTHER (the old secrets)."""
    raw = env_case.observe(tmp_path, monkeypatch, env_case.OTHER, env_case.OTHER)
    assert raw["envfile_desired"]
    return save(tmp_path / "snap", raw, env_case.expectation(env_case.OTHER))


@pytest.mark.parametrize("in_parts", [False, True])
def test_env_secret_rotated_since_the_save_is_drift_never_no_drift(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: Path, in_parts: bool
) -> None:
    monkeypatch.setattr(fast_json, "LARGE", 1)  # the replayer reads by msgspec
    snapshot = env_snapshot(tmp_path, monkeypatch)
    result = replay(snapshot, env_case.expectation(env_case.DESIRED), in_parts)
    drifts = env_drifts(result)
    assert sorted(drifts) == INLINE_KEYS
    assert_not_comparable(drifts)
    assert_nothing_clear(snapshot, state, result, ENV_SECRETS)


@pytest.mark.parametrize("in_parts", [False, True])
def test_env_secret_as_saved_is_no_drift_on_the_same_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_parts: bool
) -> None:
    monkeypatch.setattr(fast_json, "LARGE", 1)
    snapshot = env_snapshot(tmp_path, monkeypatch)
    assert env_drifts(replay(snapshot, env_case.expectation(env_case.OTHER), in_parts)) == {}


@pytest.mark.parametrize("other", ["no key", "another key", "no digests"])
def test_env_mask_not_vouched_for_here_is_not_comparable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: Path, other: str
) -> None:
    """Saved on another controller (or by older code): even against the very values it was
    saved with, the replay cannot know the secrets are the same, and says so."""
    snapshot = env_snapshot(tmp_path, monkeypatch)
    if other == "no digests":
        for path in [snapshot / "thor.json"]:
            data = json.loads(path.read_text(encoding="utf-8"))
            del data["controller"][snapshot_key.FIELD]
            path.write_text(json.dumps(data), encoding="utf-8")
        index = json.loads((snapshot / "index.json").read_text(encoding="utf-8"))
        del index["sha256"]
        (snapshot / "index.json").write_text(json.dumps(index), encoding="utf-8")
    else:
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "elsewhere"))
        if other == "another key":
            snapshot_key.load_key(create=True)
    result = replay(snapshot, env_case.expectation(env_case.OTHER))
    drifts = env_drifts(result)
    assert sorted(drifts) == INLINE_KEYS
    assert_not_comparable(drifts)


def test_a_snapshot_without_inline_secrets_is_saved_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: Path
) -> None:
    raw = env_case.observe(tmp_path, monkeypatch, {}, {})
    assert "envfile_desired" not in raw
    obs = BoxObservation("thor", raw, None, complete=False)
    before = json.dumps(obs.controller, sort_keys=True)
    snapshot_key.record({"thor": obs}, {"thor": env_case.expectation({})})
    assert json.dumps(obs.controller, sort_keys=True) == before
    assert not state.exists()  # no key made for a run that has no mask


# -- lane knobs ----------------------------------------------------------------------------------
def knob_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    exp, payload = knob_case.thor(knob_case.OTHER)
    raw = knob_case.observe(tmp_path, monkeypatch, knob_case.OTHER, payload)
    assert raw["knobs_desired"]
    return save(tmp_path / "snap", raw, exp)


@pytest.mark.parametrize("in_parts", [False, True])
def test_knob_secret_rotated_since_the_save_is_drift_never_no_drift(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: Path, in_parts: bool
) -> None:
    monkeypatch.setattr(fast_json, "LARGE", 1)
    snapshot = knob_snapshot(tmp_path, monkeypatch)
    result = replay(snapshot, knob_case.thor(knob_case.DESIRED)[0], in_parts)
    drifts = knob_drifts(result)
    assert sorted(drifts) == KNOB_FLAGS
    assert_not_comparable(drifts)
    assert_nothing_clear(snapshot, state, result, knob_case.SECRETS)


def test_knob_secret_as_saved_is_no_drift_on_the_same_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = knob_snapshot(tmp_path, monkeypatch)
    assert knob_drifts(replay(snapshot, knob_case.thor(knob_case.OTHER)[0])) == {}


def test_knob_mask_saved_on_another_controller_is_not_comparable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = knob_snapshot(tmp_path, monkeypatch)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "elsewhere"))
    snapshot_key.load_key(create=True)
    result = replay(snapshot, knob_case.thor(knob_case.OTHER)[0])
    drifts = knob_drifts(result)
    assert sorted(drifts) == KNOB_FLAGS
    assert_not_comparable(drifts)


# -- the key file --------------------------------------------------------------------------------
def test_the_key_is_made_private_once(state: Path) -> None:
    key = snapshot_key.load_key(create=True)
    path = state / "fleet-reconciler" / snapshot_key.KEY_FILE
    assert key is not None and len(key) == 32 and path.read_bytes() == key
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(path.parent).st_mode & 0o777 == 0o700
    assert snapshot_key.load_key(create=True) == key


@pytest.mark.parametrize("how", ["readable by others", "a symlink", "a directory"])
def test_a_key_file_that_is_not_private_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: Path, how: str
) -> None:
    snapshot = env_snapshot(tmp_path, monkeypatch)  # made the key, saved with digests
    path = state / "fleet-reconciler" / snapshot_key.KEY_FILE
    if how == "readable by others":
        path.chmod(0o644)
    else:
        real = tmp_path / "planted"
        path.rename(real)
        if how == "a symlink":
            path.symlink_to(real)
        else:
            path.mkdir()
    with pytest.raises(SnapshotKeyError, match=r"snapshot key .* refused"):
        replay(snapshot, env_case.expectation(env_case.OTHER))
    with pytest.raises(SnapshotKeyError, match="refused"):
        (tmp_path / "again").mkdir()
        env_snapshot(tmp_path / "again", monkeypatch)


def test_a_key_directory_others_may_write_is_refused(state: Path) -> None:
    snapshot_key.load_key(create=True)
    (state / "fleet-reconciler").chmod(0o770)
    with pytest.raises(SnapshotKeyError, match="readable or writable by others"):
        snapshot_key.load_key(create=False)


# -- no mask at all: the same secret is not "changed" ---------------------------------------------
def test_a_secret_without_a_mask_is_not_comparable_even_when_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The desired value's digest is this process's, the line's the box's: they differ
    whatever the secrets are, so neither `changed` (what the history used to keep) nor
    `unchanged` can be said."""
    raw = env_case.observe(tmp_path, monkeypatch, env_case.DESIRED, env_case.DESIRED)
    del raw["envfile_desired"]  # an answer with no mask of the (same) desired values
    drifts = env_case.envfile_drifts(env_case.typed(raw), env_case.DESIRED)
    assert sorted(drifts) == INLINE_KEYS
    assert_not_comparable(drifts)
