"""Review 6, item 2: a clear value the reports' guard masks (a `guard:` digest keyed by the
rendering process, report/values.py `_masked`) is compared only with another such digest. Against
the box's digest (keyed by the run's key) it says nothing: the same secret gave two different
digests, so the drift read `*** -> *** (changed)` / `changed: true` for an unchanged secret
(compare/drift.py `comparable` knew only the `clear:` kind). Now `(not comparable)` /
`changed: null`, as docs/drift-report.md says of a secret the run cannot compare; two clear
values (both guarded) still read `changed` or `unchanged`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.drift import (
    GUARD_DIGEST,
    LOCAL_DIGEST,
    Action,
    BoxResult,
    Drift,
    DriftReport,
    Kind,
    SecretValue,
    comparable,
    digest_kind,
)
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from reconciler.report import render
from reconciler.report.values import guarded, secret_changed, secret_tag

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"
FORMATS = ("text", "json", "markdown", "html")
CLEAR = "hf_c6SameOrNot4711xyz"

BOX = SecretValue("hmac:" + "ab" * 32)
BOX2 = SecretValue("hmac:" + "cd" * 32)
LOCAL = SecretValue(LOCAL_DIGEST + "01" * 32)
LOCAL2 = SecretValue(LOCAL_DIGEST + "02" * 32)
GUARD = SecretValue(GUARD_DIGEST + "03" * 32)
GUARD2 = SecretValue(GUARD_DIGEST + "04" * 32)


@pytest.mark.parametrize(
    ("desired", "observed", "expected"),
    [
        (BOX, BOX2, True),
        (LOCAL, LOCAL2, True),
        (GUARD, GUARD2, True),
        (GUARD, BOX, False),
        (BOX, GUARD, False),
        (GUARD, LOCAL, False),
        (LOCAL, BOX, False),
        (GUARD, None, True),  # a secret against its absence: it changed
        (GUARD, "plain", True),
    ],
)
def test_two_digests_compare_only_when_one_key_made_both(
    desired: Any, observed: Any, expected: bool
) -> None:
    assert comparable(desired, observed) is expected


def test_the_guard_names_its_digests_with_the_kind_drift_knows() -> None:
    drift = Drift("thor", Kind.ENV, "lane:vllm-embed", "HF_TOKEN", BOX, CLEAR, Action.RECREATE)
    report = DriftReport((BoxResult("thor", True, (drift,)),), "lab", "t", "r")
    [masked] = guarded(report).drifts
    assert isinstance(masked.observed, SecretValue)
    assert digest_kind(masked.observed.digest) == GUARD_DIGEST
    assert masked.secret_changed is None
    assert secret_changed(masked) is None and secret_tag(masked) == "not comparable"


def _embed_env_replayed(tmp_path: Path, value: str) -> DriftReport:
    """lab-incidents' thor replayed with its vllm-embed container's HF_TOKEN in clear (an old
    collector's snapshot, or an edited one); the render's is the box's digest."""
    snap = tmp_path / "snap"
    shutil.copytree(EXAMPLE / "snapshot", snap)
    thor = json.loads((snap / "thor.json").read_text("utf-8"))
    for c in thor["collected"]["docker"]["containers"]:
        if c["service"] == "vllm-embed":
            c["env"]["HF_TOKEN"] = value
    (snap / "thor.json").write_text(json.dumps(thor, indent=1, sort_keys=True), "utf-8")
    return run_drift(load_fleet(EXAMPLE, "lab"), ["thor"], from_snapshot=snap).report


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_clear_secret_against_the_boxs_digest_is_not_comparable_in_every_format(
    tmp_path: Path, fmt: str
) -> None:
    report = _embed_env_replayed(tmp_path, CLEAR)
    [drift] = [d for d in report.drifts if d.path == "HF_TOKEN" and "embed" in d.subject]
    shown = render(report, fmt)  # type: ignore[arg-type]
    assert CLEAR not in shown
    if fmt == "json":
        doc = json.loads(shown)
        [entry] = [
            d
            for d in doc["boxes"][0]["drifts"]
            if d["path"] == "HF_TOKEN" and "embed" in d["subject"]
        ]
        assert entry["secret"] is True and entry["changed"] is None
    else:
        line = next(x for x in shown.splitlines() if "HF_TOKEN" in x and "***" in x)
        assert "not comparable" in line and "(changed)" not in line, line
    assert drift.desired == SecretValue("hmac:" + _embed_digest())


def _embed_digest() -> str:
    thor = json.loads((EXAMPLE / "snapshot" / "thor.json").read_text("utf-8"))
    embed = thor["collected"]["render"]["services"]["vllm-embed"]["environment"]
    digest: str = embed["HF_TOKEN"]["secret"]
    return digest.removeprefix("hmac:")


def test_two_clear_values_still_read_changed_or_unchanged() -> None:
    """Both sides guarded (the same process's key): equal values are unchanged, others changed."""
    drifts = (
        Drift("thor", Kind.ENV, "lane:a", "HF_TOKEN", CLEAR, CLEAR, Action.RECREATE),
        Drift("thor", Kind.ENV, "lane:b", "HF_TOKEN", CLEAR, CLEAR + "x", Action.RECREATE),
    )
    report = DriftReport((BoxResult("thor", True, drifts),), "lab", "t", "r")
    same, other = guarded(report).drifts
    assert (secret_tag(same), secret_tag(other)) == ("unchanged", "changed")
    doc = json.loads(render(report, "json"))
    assert [d["changed"] for d in doc["boxes"][0]["drifts"]] == [False, True]
