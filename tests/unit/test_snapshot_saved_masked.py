"""A snapshot never holds a secret a box sent in clear (an older, broken or hostile collector:
every secret is hashed on the box): `--save-snapshot` writes it as `***`, as the history store
keeps it, while a box that sent only digests is saved as it answered."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from reconciler.observe.observe import BoxObservation, load_snapshot, save_snapshot
from tests.unit.test_audit_snapshots import FIXTURES

CANARY = "sk-canary-5d1e0b7f3a"


def test_a_clear_secret_is_saved_masked_and_a_hashed_one_as_it_was(tmp_path: Path) -> None:
    index, found = load_snapshot(FIXTURES / "weakest_link_proven_live")
    spark = found["spark"]
    collected = copy.deepcopy(spark.collected)
    assert collected is not None
    (gateway,) = [c for c in collected["docker"]["containers"] if c["service"] == "gateway"]
    hashed = gateway["env"]["GATEWAY_API_KEY"]
    assert isinstance(hashed, dict) and "secret" in hashed  # the collector's digest
    gateway["env"]["GATEWAY_API_KEY"] = CANARY
    gateway["env"]["HF_TOKEN"] = CANARY + "-hf"
    found["spark"] = BoxObservation("spark", collected, None, spark.controller, complete=False)
    save_snapshot(tmp_path / "saved", found, {"run_id": index["run_id"]})
    text = (tmp_path / "saved" / "spark.json").read_text()
    assert CANARY not in text
    saved = json.loads(text)
    (env,) = [
        c["env"] for c in saved["collected"]["docker"]["containers"] if c["service"] == "gateway"
    ]
    assert env["GATEWAY_API_KEY"] == env["HF_TOKEN"] == "***"
    # thor sent digests only: its file holds them, as it answered
    thor = json.loads((tmp_path / "saved" / "thor.json").read_text())
    assert thor["collected"] == found["thor"].collected


DIGEST = '{"secret": "hmac:' + "ab" * 32 + '"}'


def test_a_clear_secret_beside_a_digest_is_masked_and_a_box_error_masks_nothing_else(
    tmp_path: Path,
) -> None:
    """A word holding the collector's digest and a clear value (a collector hashing a
    narrower list) is masked; a box whose only change is a scrubbed error text keeps its
    inline digests, which a replay compares."""
    index, found = load_snapshot(FIXTURES / "weakest_link_proven_live")
    spark = found["spark"]
    collected = copy.deepcopy(spark.collected)
    assert collected is not None
    (gateway,) = [c for c in collected["docker"]["containers"] if c["service"] == "gateway"]
    gateway["env"]["VLLM_EXTRA_ARGS"] = f"--api-key {DIGEST} --hf-token {CANARY}"
    thor = copy.deepcopy(found["thor"].collected)
    assert thor is not None
    (worker,) = [c for c in thor["docker"]["containers"] if c["service"] == "gateway"]
    worker["cmd"] = [*(worker.get("cmd") or []), f"--api-key={DIGEST}"]
    thor["docker"]["error"] = "No such container: " + "0123456789abcdef" * 4
    found["spark"] = BoxObservation("spark", collected, None, spark.controller, complete=False)
    found["thor"] = BoxObservation("thor", thor, None, found["thor"].controller, complete=False)
    save_snapshot(tmp_path / "saved", found, {"run_id": index["run_id"]})
    assert CANARY not in (tmp_path / "saved" / "spark.json").read_text()
    saved = json.loads((tmp_path / "saved" / "thor.json").read_text())
    (kept,) = [c for c in saved["collected"]["docker"]["containers"] if c["service"] == "gateway"]
    assert kept["cmd"][-1] == f"--api-key={DIGEST}"
