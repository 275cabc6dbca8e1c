"""Work that comparing and reporting share across boxes gives each caller what it gave before:
a remembered command-line parse is never changed through one caller's copy, the read-only
flags are parse_argv's, and the report guard rebuilds only what it masks."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.compare.drift import Action, BoxResult, Drift, DriftReport, Kind, SecretValue
from reconciler.compare.values import flags_of, parse_argv
from reconciler.report.values import guarded

DIGEST = "hmac:" + "ab" * 32
# A lane's command as the lab's vllm-worker runs it (tests/fixtures captures), with a secret.
LANE = (
    "vllm",
    "serve",
    "Qwen/Qwen3-0.6B",
    "--served-model-name=qwen",
    "--max-model-len",
    "131072",
    "--enable-auto-tool-choice",
    '--api-key={"secret": "' + DIGEST + '"}',
    "--max-model-len=262144",
)
TOKENS = st.one_of(
    st.sampled_from(["--port", "--port=8000", "--x=", "--", "8000", "serve", ""]),
    st.builds(SecretValue, st.just(DIGEST)),
    st.text(max_size=5).map(lambda t: "--" + t),
    st.text(max_size=5),
)


def test_a_callers_copy_of_a_remembered_parse_does_not_change_the_next_callers() -> None:
    positionals, flags = parse_argv(LANE)
    assert positionals == ["vllm", "serve", "Qwen/Qwen3-0.6B"]
    assert flags["--max-model-len"] == ["131072", "262144"]
    assert flags["--api-key"] == [SecretValue(DIGEST)]
    positionals.append("--changed")
    flags["--max-model-len"].append("1")
    flags["--new"] = [True]
    assert parse_argv(list(LANE)) == (
        ["vllm", "serve", "Qwen/Qwen3-0.6B"],
        {
            "--served-model-name": ["qwen"],
            "--max-model-len": ["131072", "262144"],
            "--enable-auto-tool-choice": [True],
            "--api-key": [SecretValue(DIGEST)],
        },
    )


def test_the_shared_flags_cannot_be_changed() -> None:
    flags = flags_of(LANE)
    with pytest.raises(TypeError):
        flags["--max-model-len"] = ("1",)  # type: ignore[index]
    assert flags["--max-model-len"] == ("131072", "262144")


@given(st.one_of(st.none(), st.lists(TOKENS, max_size=10)))
def test_flags_of_are_parse_argvs_flags(argv: Any) -> None:
    _, flags = parse_argv(argv)
    assert dict(flags_of(argv)) == {name: tuple(values) for name, values in flags.items()}


def test_a_token_that_cannot_be_remembered_is_still_parsed() -> None:
    odd: Any = ["serve", "--limits", ["not", "hashable"], "--port=1"]
    assert parse_argv(odd) == (["serve"], {"--limits": [["not", "hashable"]], "--port": ["1"]})
    assert flags_of(odd)["--port"] == ("1",)


def _report(*boxes: BoxResult) -> DriftReport:
    return DriftReport(boxes, "lab", "2026-12-01T00:00:00Z", "run-1")


def _drift(box: str, path: str, desired: Any, observed: Any) -> Drift:
    return Drift(box, Kind.ENV, "lane:vllm-worker", path, desired, observed, Action.RECREATE)


def test_the_guard_returns_a_report_with_nothing_to_mask_as_it_is() -> None:
    report = _report(
        BoxResult(
            "thor",
            True,
            drifts=(
                _drift("thor", "GATEWAY_API_KEY", SecretValue(DIGEST), ""),
                _drift("thor", "CULTURE_VLLM_API_KEY", "", None),
                _drift("thor", "--hf-token", (SecretValue(DIGEST),), None),
                _drift("thor", "WORKER_MAX_MODEL_LEN", "262144", "131072"),
            ),
        )
    )
    assert guarded(report) is report


def test_the_guard_rebuilds_only_the_drifts_it_masks() -> None:
    clear = _drift("spark", "HF_TOKEN", "hf_clear_value", "hf_clear_value")
    kept = _drift("spark", "WORKER_MAX_MODEL_LEN", "262144", "131072")
    quiet = BoxResult("thor", True, drifts=(_drift("thor", "HF_TOKEN", None, ""),))
    leaky = BoxResult("spark", True, drifts=(clear, kept))
    out = guarded(_report(quiet, leaky))
    assert out.boxes[0] is quiet
    masked, same = out.boxes[1].drifts
    assert same is kept
    assert isinstance(masked.desired, SecretValue) and masked.desired == masked.observed
    assert "hf_clear_value" not in repr(out)


def test_the_guard_remembers_short_values_only() -> None:
    """A value as long as a large fleet's mesh seeds (each box's own, naming every member) is
    masked as any value is but not remembered: 8,192 of them kept were what a 1,000-box replay's
    memory grew by as the square of the fleet (issue 12). A short one, shared by the boxes,
    is read once."""
    from reconciler.report import values

    seeds = ",".join(f"http://box-{i}.lab:8000" for i in range(1000))
    assert len(seeds) > 1024
    values._read.cache_clear()

    def drift(value: str) -> Drift:
        return Drift("b", Kind.ENVFILE, "file:.env", "LOBES_MESH_SEEDS", value, "x", Action.REPORT)

    leaked = seeds + ",HF_TOKEN=hf_clear-token"
    report = DriftReport(
        (BoxResult("b", True, drifts=(drift(seeds), drift(leaked))),), "i", "t", "r"
    )
    shown = [d.desired for d in guarded(report).boxes[0].drifts]
    assert shown[0] == seeds and shown[1] == seeds + ",HF_TOKEN=***"
    assert values._read.cache_info().currsize == 0, "a long value is not kept"
    guarded(DriftReport((BoxResult("b", True, drifts=(drift("K=v:1"),)),), "i", "t", "r"))
    assert values._read.cache_info().currsize == 1, "a short one is"
