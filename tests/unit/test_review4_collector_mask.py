"""The box side of tests/unit/test_review4_masking.py: the collector hashes a secret flag written
as a shell word in quotes (`sh -c 'vllm "--api-key" "x"'`, `'--openai-org' 'x'`, `"--hf-token"
x`) in an environment's value, in a `sh -c` script and in a `.env` line's value, as it hashed
`--api-key x` and `"--api-key=x"` already: its `_inline_secrets` needed the flag's name to be
followed directly by `=` or a blank, so the quote closing the flag's word left the value in
clear in the answer. A value starting with a single `-` is a value (`--openai-org -x`), only `--`
starts the next flag. The reconciler's guards (reconciler/scrub.py) judge every form as the box
does, checked here side by side, and keep what the box hashed (its digests) as it wrote it.

Added with /tmp/review/collector_mask.diff (the collector's part of the fix): these fail on the
collector without it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.desired import secret_names
from reconciler.history import masking
from reconciler.report.values import _words
from reconciler.scrub import mask_credentials
from tests.unit.conftest import packed_program
from tests.unit.test_review4_masking import AROUND, FLAGS, FORMS, KEPT, PATTERN, clear
from tests.unit.test_secret_boundaries import _collector

collector = _collector()
HASHED = '{"secret": "hmac:'
FLAGS_ON_THE_BOX = {**FLAGS, "hf": "--hf-token"}  # a floor name, by its last word too


def _run(directory: str = "/nonexistent") -> Any:
    return collector.Run(
        {"directory": directory, "secret_patterns": [PATTERN], "run_key": "k" * 64}
    )


@pytest.fixture(autouse=True)
def _no_fleet_patterns() -> Iterator[None]:
    secret_names.adopt_fleet_patterns(())
    yield
    secret_names.adopt_fleet_patterns(())


def _form(place: str, form: str, flag: str) -> tuple[str, str]:
    """(the clear value, the text holding it in `form` among flags that name no secret)."""
    value = clear(place, form, flag) if flag in FLAGS else f"c4v-{place}-{form}-hf-77"
    text = FORMS[form].format(f=FLAGS_ON_THE_BOX[flag], v=value)
    return value, AROUND.format(text)


@pytest.mark.parametrize("flag", sorted(FLAGS_ON_THE_BOX))
@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_box_hashes_each_form_in_a_value_a_script_and_a_dotenv_line(
    tmp_path: Path, form: str, flag: str
) -> None:
    value, text = _form("box", form, flag)
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    # `.env` as an operator writes it: the value in double quotes, `"` and `\` escaped.
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    (deploy / ".env").write_text(f'VLLM_EXTRA="{quoted}"\nPLAIN=1\n', encoding="utf-8")
    run = _run(str(deploy))
    envfile, values = collector.envfile_fact(run)
    assert values["VLLM_EXTRA"] == text  # compose reads the form as written
    answers = {
        "env": run.mask_env_map({"VLLM_EXTRA": text}),
        "script": run.mask_argv(["sh", "-c", text]),
        ".env": envfile,
    }
    for place, answer in answers.items():
        shown = json.dumps(answer)
        assert value not in shown, place
        assert "hmac:" in shown, place
        assert all(kept.replace('"', '\\"') in shown for kept in KEPT), (place, shown)


def test_the_box_keeps_what_names_no_secret() -> None:
    run = _run()
    for word in (
        AROUND.format("--port 8000"),
        'vllm "--served-model-name" "mg-served-4242" --max-model-len 8192',
        "usage: --token -v",  # `--token` alone names no secret on the box
        'echo "use --api-key" and more',  # a quote that opens a phrase closes no flag
        "--api-key --port 8000",  # the next flag is no value
    ):
        assert run.mask_words(word) == word, word


STEP = {
    **{
        f"{form}-{flag}": _form("step", form, flag)[1]
        for form in FORMS
        for flag in FLAGS_ON_THE_BOX
    },
    "no-secret": AROUND.format("--port 8000"),
    "quoted-no-secret": 'vllm "--served-model-name" "x" "--token" -v',
    "next-flag": "--api-key --port 8000",
    "a-phrase": 'echo "use --api-key" and more',
    "three": '--hf-token="x y" \'--openai-org\' "z"',
}


@pytest.mark.parametrize("text", list(STEP.values()), ids=list(STEP))
def test_the_box_and_the_reports_mask_the_same_forms(text: str) -> None:
    """Kept in step: a text the box leaves alone the reports leave alone, and a value the box
    hashes the reports mask (`***` where the box wrote its digest)."""
    secret_names.adopt_fleet_patterns([PATTERN])
    on_the_box = _run().mask_words(text)
    masked = mask_credentials(text)
    assert (on_the_box == text) == (masked == text), (on_the_box, masked)
    assert masked.count("***") == on_the_box.count(HASHED), (on_the_box, masked)
    assert "c4v-" not in on_the_box + masked


def test_what_the_box_hashed_is_kept_by_the_store_and_masked_by_the_reports() -> None:
    """The answer of a box holding every form: no clear value, and the store keeps it as it
    is (its digests say whether a secret changed); the reports show `***`."""
    secret_names.adopt_fleet_patterns([PATTERN])
    run = _run()
    texts = [_form("kept", form, flag) for form in sorted(FORMS) for flag in FLAGS_ON_THE_BOX]
    env = run.mask_env_map({f"VLLM_C4_{n}": text for n, (_, text) in enumerate(texts)})
    script = run.mask_argv(["sh", "-c", *(text for _, text in texts)])
    doc = {"collected": {"docker": {"containers": [{"env": env, "entrypoint": script}]}}}
    shown = json.dumps(doc)
    assert [value for value, _ in texts if value in shown] == []
    assert masking.stored(doc) is doc
    guarded = json.dumps([_words(v) for v in env.values()] + [_words(tuple(script))])
    assert HASHED not in guarded and "hmac:" not in guarded


def test_the_quoted_forms_are_read_without_importing_re() -> None:
    """The collector runs as `python3 -I -S` on every box each drift: reading a quoted flag
    costs it no import (tests/unit/test_collector_cpu.py)."""
    program = packed_program("reconciler/observe/remote/collector.py")
    words = [AROUND.format(FORMS[form].format(f="--api-key", v="c4v-x")) for form in FORMS]
    code = (  # no json here: it imports re
        "import sys; g = {'__name__': 'collector'}; "
        "exec(compile(open(sys.argv[1]).read(), 'collector', 'exec'), g); "
        "run = g['Run']({'directory': '/nonexistent', 'secret_patterns': [], "
        "'run_key': 'k' * 64}); "
        "out = [run.mask_words(w) for w in sys.argv[2:]]; "
        "print(sum('c4v-x' in o for o in out), sum('hmac:' in o for o in out), "
        "'re' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(program), *words],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.split() == ["0", str(len(words)), "False"]
