"""A secret under a quoted mapping key of any case, as a JSON or Python mapping in a value
writes it (`--hf-overrides '{"api_key": "x"}'`, `{'hf_token': 'x'}`): the box hashes it in a
container's environment, a command line and a `.env` line, and the reports, the store's guard
and error texts mask it. Before, only an upper-case name was read before a colon (`label: x` is
prose), so the value left the box in clear and was shown so.

A key is told from a name by its quotes and its quoted text value: a list or a number is no
secret, so a real reranker's `"classifier_from_token": ["no", "yes"]` (a `*_TOKEN` name) stays
as it is, on the box and in the reports (its captured answer below)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.desired import secret_names
from reconciler.report.values import _words
from reconciler.scrub import mask_assignments, scrub_text
from tests.unit.conftest import ROOT
from tests.unit.test_secret_boundaries import _collector

collector = _collector()
HASHED = '{"secret": "hmac:'
CLEAR = "sk-c5-9f8e7d6c5b4a"

HELD = {
    "json": '--hf-overrides={"api_key": "%s", "n": 2}',
    "python": "{'hf_token': '%s'}",
    "mixed-case": '{"Api_Key" : "%s"}',
    "in-a-script": 'vllm serve m --kv-transfer-config \'{"client_secret": "%s"}\'',
}
KEPT = {
    "a-list": '{"classifier_from_token": ["no", "yes"]}',
    "a-number": '{"api_key": 12345678}',
    "no-secret-name": '{"served_model_name": "qwen-abcdefgh"}',
    "a-label": "api_key: sk-not-a-key-in-prose",
    "unquoted-key": "{api_key: 'value-of-a-label'}",
}


def _run(directory: str = "/nonexistent") -> object:
    return collector.Run({"directory": directory, "secret_patterns": [], "run_key": "k" * 64})


@pytest.fixture(autouse=True)
def _floor_only() -> Iterator[None]:
    secret_names.adopt_fleet_patterns(())
    yield
    secret_names.adopt_fleet_patterns(())


@pytest.mark.parametrize("form", sorted(HELD))
def test_the_box_hashes_a_quoted_keys_text_in_env_argv_and_dotenv(
    tmp_path: Path, form: str
) -> None:
    text = HELD[form] % CLEAR
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    (deploy / ".env").write_text(f'VLLM_EXTRA="{quoted}"\n', encoding="utf-8")
    run = _run(str(deploy))
    envfile, values = collector.envfile_fact(run)
    assert values["VLLM_EXTRA"] == text
    answers = {
        "env": run.mask_env_map({"VLLM_EXTRA": text}),
        "argv": run.mask_argv(["vllm", "serve", text]),
        ".env": envfile,
    }
    for place, answer in answers.items():
        shown = json.dumps(answer)
        assert CLEAR not in shown and "hmac:" in shown, (place, shown)


@pytest.mark.parametrize("form", sorted(HELD))
def test_the_reports_and_error_texts_mask_it(form: str) -> None:
    text = HELD[form] % CLEAR
    assert CLEAR not in mask_assignments(text)
    assert CLEAR not in str(_words(text)) and "***" in str(_words(text))
    assert CLEAR not in scrub_text(f"failed: {text}")
    assert CLEAR not in collector.scrub_text(f"failed: {text}")


@pytest.mark.parametrize("text", list(KEPT.values()), ids=list(KEPT))
def test_what_is_no_secret_under_a_key_is_kept_on_the_box_and_in_the_reports(text: str) -> None:
    assert _run().mask_words(text) == text
    assert mask_assignments(text) == text
    assert _words(text) == text


@pytest.mark.parametrize("text", [HELD[f] % CLEAR for f in sorted(HELD)] + list(KEPT.values()))
def test_the_box_and_the_reports_agree(text: str) -> None:
    on_the_box = _run().mask_words(text)
    masked = mask_assignments(text)
    assert (on_the_box == text) == (masked == text), (on_the_box, masked)
    assert masked.count("***") == on_the_box.count(HASHED)


def test_a_real_rerankers_overrides_are_kept_as_captured() -> None:
    """spark's reranker, as captured: `--hf-overrides={..., "classifier_from_token": ["no",
    "yes"], ...}` names `*_TOKEN` and holds a list, no secret."""
    answer = json.loads((ROOT / "tests/fixtures/import/pristine/spark.json").read_text())
    words = {
        w
        for c in answer["collected"]["docker"]["containers"]
        for w in c.get("cmd") or []
        if isinstance(w, str) and "classifier_from_token" in w
    }
    assert words
    for word in words:
        assert _run().mask_words(word) == word
        assert _words(word) == word and mask_assignments(word) == word
