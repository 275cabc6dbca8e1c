"""Review 2, item 3: the reports' secret guard masks a secret after a flag or `Bearer` inside
one command word, as the collector does since it hashes them there (a snapshot saved before,
or an edited one, still holds them in clear): `--api-key ***`, `--hf-token ***`,
`Authorization: Bearer ***`, in every report format.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from reconciler import scrub
from reconciler.compare.drift import Action, BoxResult, Drift, DriftReport, Kind
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from reconciler.report import render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"
SECRETS = ("sk4Zq9LIVEkey77", "hf_AbC123dEf456", "tok9XYZ123abc")
SCRIPT = (
    "exec vllm serve m --api-key sk4Zq9LIVEkey77 --hf-token hf_AbC123dEf456 --port 8000 "
    "Authorization: Bearer tok9XYZ123abc"
)
CMD = ["bash", "-c", SCRIPT]
FORMATS = ("text", "json", "markdown", "html")


def _report(desired: Any, observed: Any) -> DriftReport:
    drift = Drift(
        "thor", Kind.ARGV, "lane:vllm-worker", "command", desired, observed, Action.RECREATE
    )
    return DriftReport((BoxResult("thor", True, (drift,)),), "lab", "2026-12-01T00:00:00Z", "r1")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_secret_after_a_flag_or_bearer_in_a_word_is_masked(fmt: str) -> None:
    shown = render(_report(("vllm", "serve", "m"), tuple(CMD)), fmt)  # type: ignore[arg-type]
    for secret in SECRETS:
        assert secret not in shown, (fmt, secret)
    plain = shown.replace("\\u0027", "'").replace("&#x27;", "'").replace("&#39;", "'")
    for kept in ("--api-key ***", "--hf-token ***", "Bearer ***", "--port 8000"):
        assert kept in plain, (fmt, kept)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_single_value_holding_them_is_masked_too(fmt: str) -> None:
    shown = render(_report("--port 8000", SCRIPT), fmt)  # type: ignore[arg-type]
    assert not any(secret in shown for secret in SECRETS)


def test_the_masks_keep_what_holds_no_secret() -> None:
    for text in (
        "--max-num-batched-tokens 8192 --tokenizer hf/m",
        "--token -v",
        "basic setup",
        "Authorization: missing",
        "--api-key ***",
    ):
        assert scrub.mask_credentials(text) == text
    assert scrub.mask_credentials("curl -H 'Authorization: Bearer abc123'") == (
        "curl -H 'Authorization: Bearer ***'"
    )
    assert (
        scrub.mask_credentials("X-Api-Key: k1234 --hf-token=x") == "X-Api-Key: *** --hf-token=***"
    )


def worker_cmd_replayed(tmp_path: Path, cmd: Any) -> Any:
    """The drift report of lab-incidents' thor replayed with its vllm-worker's command `cmd`."""
    snap = tmp_path / "snap"
    shutil.copytree(EXAMPLE / "snapshot", snap)
    thor = json.loads((snap / "thor.json").read_text("utf-8"))
    for c in thor["collected"]["docker"]["containers"]:
        if c["service"] == "vllm-worker":
            c["cmd"] = cmd
    (snap / "thor.json").write_text(json.dumps(thor, indent=1, sort_keys=True), "utf-8")
    return run_drift(load_fleet(EXAMPLE, "lab"), ["thor"], from_snapshot=snap).report


def test_a_snapshot_with_them_in_clear_shows_none_in_any_report(tmp_path: Path) -> None:
    report = worker_cmd_replayed(tmp_path, CMD)
    assert report.boxes[0].reachable
    observed = json.dumps([str(d.observed) for d in report.drifts])
    assert SECRETS[0] in observed  # the drift itself holds the clear text: the reports mask it
    for fmt in FORMATS:
        shown = render(report, fmt)  # type: ignore[arg-type]
        for secret in SECRETS:
            assert secret not in shown, (fmt, secret)
