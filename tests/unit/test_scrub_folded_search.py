"""scrub.holds_any_folded: the cheap look for a secret's name in a text, which decides whether
the masking expressions run at all. A miss here is a secret left in clear, so the fast path for
long ASCII texts must find every fragment the plain upper-cased reading finds."""

from __future__ import annotations

import random
import string

import pytest

from reconciler.scrub import holds_any_folded, mask_assignments, mask_credentials

FRAGMENTS = ("_KEY", "_TOKEN", "SECRET", "PASSWORD", "PASSWD", "_CREDENTIALS")
SEEDS = ",".join(f"http://10.77.{i}.{j}:8000" for i in range(300) for j in (11, 12, 13))


def plain(text: str, fragments: tuple[str, ...], dash: bool) -> bool:
    reading = text.upper().replace("-", "_") if dash else text.upper()
    return any(f in reading for f in fragments)


@pytest.mark.parametrize("dash", [False, True])
def test_same_answer_as_reading_the_whole_text(dash: bool) -> None:
    rnd = random.Random(20261206)
    alphabet = string.ascii_letters + "_-:/=.,0123456789 "
    for _ in range(20000):
        length = rnd.choice((5, 60, 130, 400))
        text = "".join(rnd.choice(alphabet) for _ in range(length))
        if rnd.random() < 0.5:
            word = rnd.choice(FRAGMENTS)
            word = "".join(c.lower() if rnd.random() < 0.5 else c for c in word)
            if dash:
                word = word.replace("_", "-")
            at = rnd.randrange(length)
            text = text[:at] + word + text[at:]
        assert holds_any_folded(text, FRAGMENTS, dash) is plain(text, FRAGMENTS, dash), text


def test_long_text_with_a_name_in_any_case_is_found() -> None:
    assert not holds_any_folded(SEEDS, FRAGMENTS)
    assert holds_any_folded(SEEDS + ",HF_Token=abc", FRAGMENTS)
    assert holds_any_folded(SEEDS + " --hf-token x", FRAGMENTS, dash_is_underscore=True)
    assert not holds_any_folded(SEEDS + " --hf-token x", FRAGMENTS)


def test_outside_ascii_both_case_readings_count() -> None:
    long = SEEDS[:200]
    # `ſ` upper-cases to S; the Kelvin sign lower-cases to k: either reading names the secret.
    assert holds_any_folded(long + " ſecret=1", ("SECRET",))
    assert holds_any_folded(long + " api-\u212aey", ("API-KEY",))


def test_masking_still_reaches_a_secret_in_a_long_value() -> None:
    value = SEEDS + ",DB_PASSWORD=hunter22"
    assert "hunter22" not in mask_assignments(value)
    header = SEEDS + " Authorization: Bearer abcdef123456"
    assert "abcdef123456" not in mask_credentials(header)
    assert mask_assignments(SEEDS) == SEEDS
