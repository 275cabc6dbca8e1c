"""Review 3, item 2: the reports' secret guard misses no form of a credential an old or edited
snapshot may hold in clear: a quoted value after a scheme (`Authorization: Bearer 'x'`, where
the scheme word was taken as the value and the quoted token stayed), a value holding `;` or `,`
(`Bearer x;y` showed `;y`), and a secret flag's value given as the next word of an argv
(`'--api-key', 'x'`: two words, each masked alone, so neither was). In every report format.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler import scrub
from reconciler.report import render
from reconciler.report.values import _words
from tests.unit.test_observe_review2_guard import FORMATS, _report, worker_cmd_replayed

# Each secret, and the part of it that must not be shown (a tail after `;` included).
SECRETS = ("sk-Quoted4711", "sk-Dquoted4712", "sk-secret123456", "tailXYZ987", "sk-Flag4713")
CMD = (
    "vllm",
    "serve",
    "m",
    "--api-key",
    "sk-secret123456",
    "--port",
    "8000",
    "--hf-token",
    "sk-Flag4713",
    "-H",
    "Authorization: Bearer 'sk-Quoted4711'",
    '-H=X-Api-Key: "sk-Dquoted4712"',
    "--note=Bearer sk-abc;tailXYZ987",
)


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("Authorization: Bearer 'sk-abc'", "Authorization: Bearer ***"),
        ('Authorization: Bearer "sk abc" next', "Authorization: Bearer *** next"),
        ("Bearer sk-abc;def", "Bearer ***"),
        ("X-Api-Key: 'k 1234'", "X-Api-Key: ***"),
        ("curl -H 'Authorization: Bearer abc123'", "curl -H 'Authorization: Bearer ***'"),
        ("(Bearer abc123), more", "(Bearer ***), more"),
    ],
)
def test_a_credential_quoted_or_holding_punctuation_is_masked_whole(text: str, masked: str) -> None:
    assert _words(text) == masked


def test_the_scheme_word_is_never_taken_for_the_value() -> None:
    for text in (
        "Authorization: Bearer",
        "Authorization: Basic",
        "Authorization: Bearer ***",
        '-H "Authorization: Bearer"',
    ):
        assert scrub.mask_credentials(text) == text
    # A token that only starts like a scheme word is a value.
    assert scrub.mask_credentials("X-Api-Key: basic-k1234") == "X-Api-Key: ***"


def test_a_secret_flags_value_as_the_next_word_is_masked() -> None:
    argv = ("vllm", "serve", "--api-key", "sk-secret123456")
    assert _words(argv) == ("vllm", "serve", "--api-key", "***")
    assert _words(("x", "--hf_token", "'q'", "--client-secret", "s3")) == (
        "x",
        "--hf_token",
        "***",
        "--client-secret",
        "***",
    )


def test_an_argv_without_one_is_the_same_object() -> None:
    for argv in (
        ("vllm", "serve", "--max-num-batched-tokens", "8192", "--tokenizer", "hf/m"),
        ("a", "--token", "-v"),  # a flag without a value
        ("a", "--api-key", "***"),
        ("a", "--api-key"),
        ("a", 1, None),
    ):
        assert _words(argv) is argv


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_masks_them(fmt: str) -> None:
    shown = render(_report(("vllm", "serve", "m"), CMD), fmt)  # type: ignore[arg-type]
    for secret in SECRETS:
        assert secret not in shown, (fmt, secret)
    assert "8000" in shown and "--port" in shown


def test_a_snapshot_with_them_in_clear_shows_none_in_any_report(tmp_path: Path) -> None:
    report = worker_cmd_replayed(tmp_path, list(CMD))
    assert report.boxes[0].reachable
    observed = json.dumps([str(d.observed) for d in report.drifts])
    assert all(secret in observed for secret in SECRETS)  # the drift holds them: reports mask
    for fmt in FORMATS:
        shown = render(report, fmt)  # type: ignore[arg-type]
        for secret in SECRETS:
            assert secret not in shown, (fmt, secret)
