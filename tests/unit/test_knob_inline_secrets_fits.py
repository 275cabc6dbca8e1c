"""compare/inline.py's knob helpers, pure, on the lab's captured knobs: which knob values may
carry a secret (none of the lab's), whether the box's mask of a knob's words is the desired
words' (`fits_argv`), and what a dead-knob drift shows of a secret flag's value."""

from __future__ import annotations

import json

import pytest

from reconciler.compare.inline import fits_argv, knob_may_carry_secret, shown_flag
from reconciler.compare.values import knob_tokens
from reconciler.desired.facts import snapshot_facts
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import drift_inputs
from reconciler.observe.document import SecretValue, parse_collected
from tests.unit.test_envfile_inline_secrets import LAB_DESIRED, REPO, collector


def lab_knobs() -> list[tuple[str, str]]:
    """Every (flag, value) of a lane knob the lab's desired state sets, on every box."""
    fleet = load_fleet(REPO, "lab", facts=snapshot_facts(LAB_DESIRED))
    inputs = drift_inputs(fleet)
    return [
        knob
        for box in inputs.boxes
        for lane in inputs.expectations[box].lanes.values()
        for knob in lane.knobs.values()
    ]


KNOBS = lab_knobs()
# spark's speculative config and hf overrides, the lab's knobs with JSON in them.
WITH_JSON = [(flag, knob) for flag, knob in KNOBS if "{" in knob]


def masked(words: list[str]) -> tuple[object, ...]:
    """The box's mask of `words` (the collector's own), read back as the answer carries it."""
    run = collector.Run({"run_key": "k" * 32, "secret_patterns": [], "directory": "/nonexistent"})
    raw = {"collector": 1, "knobs_desired": {"K": run.mask_argv(words)}}
    doc = parse_collected(json.loads(json.dumps(raw)), complete=False)
    assert not isinstance(doc, Exception) and hasattr(doc, "knobs_desired"), doc
    return tuple(doc.knobs_desired["K"])


def test_no_knob_of_the_lab_may_carry_a_secret() -> None:
    assert len(WITH_JSON) >= 2  # the lab's JSON knobs are among those judged
    for flag, knob in KNOBS:
        assert not knob_may_carry_secret(knob, tuple(knob_tokens(flag, knob))), knob


@pytest.mark.parametrize(
    "secret", [" --api-key sk-1234", " --hf-token=hf_1234", " 'Authorization: Bearer ab12'"]
)
def test_a_lab_knob_with_a_secret_added_may_carry_one(secret: str) -> None:
    for flag, knob in WITH_JSON:
        value = knob + secret
        assert knob_may_carry_secret(value, tuple(knob_tokens(flag, value))), value


def test_the_boxs_mask_fits_the_words_it_was_made_of() -> None:
    for flag, knob in WITH_JSON:
        words = knob_tokens(flag, knob + " --api-key sk-1234 --hf-token=hf_1234")
        mask = masked(words)
        # A knob of its own words (the speculative config) has the value after `--api-key`
        # hidden whole; one word (`--hf-overrides=...`, its secrets inside) hashed in place.
        assert len(mask) == len(words) and mask != tuple(words)
        assert fits_argv(mask, words)
        # Another secret fits too (it cannot be told here: the digests compare it) ...
        assert fits_argv(mask, [w.replace("1234", "9999") for w in words])
        # ... but not the words edited beside it, nor more or fewer of them.
        assert not fits_argv(mask, [*words[:-1], "--hf-token=hf_1234 --port=9"])
        assert not fits_argv(mask, [*words, "--port=9"])
        assert not fits_argv(mask, words[:-1])


def test_a_hidden_word_never_stands_for_a_flag() -> None:
    flag, knob = next((f, k) for f, k in WITH_JSON if k.startswith("'--"))
    words = knob_tokens(flag, knob + " --api-key sk-1234")
    mask = masked(words)
    assert isinstance(mask[-1], SecretValue)
    assert not fits_argv(mask, [*words[:-1], "--sk-1234"])


def test_a_secret_flags_value_is_opaque_even_when_it_looks_like_none() -> None:
    desired, observed = shown_flag("--api-key", "sk-1234", SecretValue("hmac:" + "ab" * 32))
    assert isinstance(desired, SecretValue) and "sk-1234" not in repr(desired)
    assert observed == SecretValue("hmac:" + "ab" * 32)
    # A flag named like no secret keeps a value without one readable, and a bare flag as is.
    flag, knob = WITH_JSON[0]
    value = knob_tokens(flag, knob)[0].partition("=")[2]
    assert shown_flag(flag, value, None) == (value, None)
    assert shown_flag("--api-key", True, None) == (True, None)
