"""compare/inline.py against the collector's own masks: which desired value a box's mask is of
(`fits`), and which clear values may carry a secret (`may_carry_secret`, judged on every value
the lab's captured answers hold, none of which carries one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.compare.inline import fits, may_carry_secret, shown
from reconciler.observe.document import Fault, SecretValue, parse_collected
from tests.unit.conftest import load_box_program
from tests.unit.cpu_bound import cpu_bound

REPO = Path(__file__).resolve().parents[2]
CAPTURES = sorted((REPO / "tests/fixtures").rglob("*.json"))

collector = load_box_program("box_collector_inline_fits", "reconciler/observe/remote/collector.py")
RUN = collector.Run({"run_key": "k" * 32, "secret_patterns": [], "directory": "/nonexistent"})


@pytest.mark.parametrize(
    "value",
    [
        "--api-key sk-live-123",
        "--hf-token=hf_abc",
        '--hf-token="hf abc"',  # the inside of quotes
        "Authorization: Bearer xyz",
        "curl -H 'Authorization: Bearer xyz' http://a:8000/v1",
        'env HF_TOKEN="a b" vllm serve m --api-key k1 --port 8000',  # an assignment, quoted
        "--api-key k1,--db-password=k2;done",
    ],
)
def test_the_mask_of_a_value_fits_it_and_no_edit_of_it(value: str) -> None:
    masked = RUN.mask_words(value)
    assert masked != value  # the collector hashed something in it
    assert fits(masked, value)
    assert not fits(masked, value + " --port 9")
    assert not fits(masked, "x" + value)


def test_a_value_without_a_secret_fits_only_itself() -> None:
    assert fits("--port 8000", "--port 8000") and not fits("--port 8000", "--port 8001")


def test_a_hostile_mask_is_judged_quickly() -> None:
    """A box chooses its answer: a mask of many secrets separated by one letter, against a
    long run of that letter, must not backtrack through every way to split it."""
    digest = json.dumps({"secret": "hmac:" + "0" * 64})
    masked = "a".join([digest] * 8)
    with cpu_bound(1.0):
        assert not fits(masked, "a" * 5000 + " ")


def test_two_hashed_texts_differing_beside_their_secrets_stay_readable() -> None:
    before = RUN.mask_words("--api-key k1 --port 1")
    after = RUN.mask_words("--api-key k1 --port 2")
    assert shown(before, after) == (before, after)
    changed = shown(RUN.mask_words("--api-key k1"), RUN.mask_words("--api-key k2"))
    assert all(isinstance(v, SecretValue) for v in changed) and changed[0] != changed[1]


def _values(node: object) -> list[str]:
    if isinstance(node, dict):
        return [v for item in node.values() for v in _values(item)]
    if isinstance(node, list):
        return [v for item in node for v in _values(item)]
    return [node] if isinstance(node, str) else []


def test_no_captured_value_is_taken_for_a_secret() -> None:
    """The lab's `.env` lines, environments and commands, as the boxes sent them: the import
    adopts such values, and a value taken for a secret would be left out."""
    values = {v for path in CAPTURES for v in _values(json.loads(path.read_text()))}
    plain = [v for v in values if "hmac:" not in v and "Bearer" not in v]
    assert len(plain) > 500  # the captures were read
    assert [v for v in plain if may_carry_secret(v)] == []


@pytest.mark.parametrize(
    "value",
    [
        "--api-key sk-1",
        "x --hf-token=hf_1",
        "Authorization: Basic Zm9v",
        "bearer tok",
        "HF_TOKEN=x",
    ],
)
def test_a_clear_secret_is_taken_for_one(value: str) -> None:
    assert may_carry_secret(value)


def test_the_document_refuses_a_desired_mask_that_is_not_text() -> None:
    found = parse_collected({"collector": 1, "envfile_desired": {"A": 1}}, complete=False)
    assert isinstance(found, Fault) and "envfile_desired.A" in str(found)
