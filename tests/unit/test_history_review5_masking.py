"""A secret inside a string of a free-form part of an observation (a probe's body on the box or
from the controller, a record field no walker knows) is masked by the history store as
`reconcile diff` masks it (observed.comparable passes every string through `masked_value`).
Before, the store scrubbed only `error` and `source` texts there: a replay of a snapshot whose
gateway body quoted a URL with a password, a `--api-key` word in a health detail or a `Bearer`
credential in a controller's record stored each one in clear, though a diff masked it. The
collector's own digests stay as they are (a replay compares them)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler.history import masking
from reconciler.history.observed import comparable
from reconciler.history.store import observations_of, opened
from tests.unit.history_helpers import (
    edited_snapshot,
    replay,
    store_text,
    unvouched,
)

CANARY = "PW4Zq9tokenvalue"
DIGEST = "hmac:" + "ab" * 32
WIRE = '{"secret": "' + DIGEST + '"}'


def secrets_in_free_text(docs: dict[str, Any]) -> None:
    """thor's gateway body, health detail, a lane body and the controller's records quote a
    secret in a string under a plain name; next to them, the collector's digests."""
    gateway = docs["thor"]["collected"]["gateway"]
    gateway["capabilities"]["body"]["cortex"]["hosted_by"] = f"http://mesh:{CANARY}@10.77.0.12:8000"
    gateway.setdefault("health", {}).setdefault("body", {})["detail"] = (
        f"started with --api-key {CANARY}-health"
    )
    gateway["capabilities"]["body"]["cortex"]["seen_digest"] = DIGEST
    gateway["capabilities"]["body"]["cortex"]["wire"] = f"--api-key={WIRE}"
    controller = docs["thor"]["controller"]
    controller["probe_record"] = {"status": 401, "sent": f"Authorization: Bearer {CANARY}-ctl"}
    docs["thor"]["collected"]["newer_section"] = {"note": f"HF_TOKEN={CANARY}-new"}


def _thor(tmp_path: Path) -> dict[str, Any]:
    snapshot = edited_snapshot(tmp_path, "edited", secrets_in_free_text)
    doc: dict[str, Any] = json.loads((snapshot / "thor.json").read_text())
    return doc


def test_the_store_masks_a_secret_in_a_free_form_string_as_the_diff_does(tmp_path: Path) -> None:
    doc = _thor(tmp_path)
    assert CANARY in json.dumps(doc)
    assert CANARY not in json.dumps(comparable(doc))  # the diff's view masked it already
    kept = masking.stored(doc)
    assert CANARY not in json.dumps(kept)
    cortex = kept["collected"]["gateway"]["capabilities"]["body"]["cortex"]
    assert cortex["hosted_by"] == "http://mesh:***@10.77.0.12:8000"  # the rest kept in sight
    assert kept["collected"]["gateway"]["health"]["body"]["detail"] == (
        "started with --api-key ***"
    )
    assert kept["controller"]["probe_record"] == {
        "status": 401,
        "sent": "Authorization: Bearer ***",
    }
    assert kept["collected"]["newer_section"] == {"note": "HF_TOKEN=***"}
    # the collector's digests are kept as they are: a replay compares them
    assert cortex["seen_digest"] == DIGEST and cortex["wire"] == f"--api-key={WIRE}"
    assert doc["collected"]["gateway"]["capabilities"]["body"]["cortex"]["hosted_by"].count(CANARY)


def test_a_clean_observation_is_still_kept_as_the_same_object(tmp_path: Path) -> None:
    doc = json.loads(
        (
            Path(__file__).resolve().parents[2] / "examples/lab-incidents/snapshot/spark.json"
        ).read_text()
    )
    assert masking.stored(doc) is doc


def test_a_recorded_replay_stores_no_secret_of_a_free_form_string(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = edited_snapshot(tmp_path, "edited", secrets_in_free_text)
    unvouched(snapshot)
    db = tmp_path / "h.sqlite3"
    replay(capsys, db, snapshot)
    held = store_text(db)
    assert CANARY not in held
    with opened(db, create=False) as conn:
        thor = observations_of(conn, 1)["thor"]  # recorded, masked
    assert thor["controller"]["probe_record"]["sent"] == "Authorization: Bearer ***"
    assert "http://mesh:***@10.77.0.12:8000" in held and DIGEST in held


def test_a_clear_value_in_the_collectors_hashed_form_is_masked_in_a_free_form_part() -> None:
    """`{"secret": ...}` holding no keyed digest (an edited snapshot: the readers check the
    digests of the parts they know, not a probe body's): the diff masks it, so must the
    store; a real digest in that form is kept."""
    doc = {
        "collected": {"gateway": {"body": {"auth": {"secret": CANARY}, "ok": {"secret": DIGEST}}}},
        "controller": {"records": {"HF_TOKEN": {"secret": f"{CANARY}-named"}}},
    }
    assert CANARY not in json.dumps(comparable(doc))
    kept = masking.stored(doc)
    assert CANARY not in json.dumps(kept)
    assert kept["collected"]["gateway"]["body"] == {
        "auth": {"secret": "***"},
        "ok": {"secret": DIGEST},
    }


def test_the_store_masks_alike_with_or_without_msgspec_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """masking._encode keys the clean parts it remembers by msgspec's JSON once a run has
    msgspec loaded (a large replay), else by json's (a live drift no longer imports msgspec for
    it): the parts masked are the same either way, and each way still masks a secret in a part
    whose JSON it remembered clean from another box."""
    doc = _thor(tmp_path)
    clean = json.loads(json.dumps(doc))
    clean["collected"]["gateway"]["capabilities"]["body"]["cortex"]["hosted_by"] = "http://mesh"
    import msgspec.json  # noqa: F401  (loaded: the first way)

    masking._forget_judged()
    with_msgspec = [masking.stored(clean), masking.stored(doc)]
    monkeypatch.delitem(sys.modules, "msgspec.json")
    masking._forget_judged()
    with_json = [masking.stored(clean), masking.stored(doc)]
    assert with_json == with_msgspec
    assert CANARY not in json.dumps(with_json[1]) and CANARY in json.dumps(doc)
