"""A secret flag written as a shell word in quotes (`"--api-key" "x"`, `'--openai-org' 'x'`), or
holding a value that starts with a single `-` (`--openai-org -x`), is masked by every last guard
as the box masks it (the collector's `_inline_secrets` / `mask_argv`: a quote may close the
flag's word, and only `--` starts the next flag): the reports (json, text, markdown, html), the
history store and `reconcile diff --from-snapshot` (text and json). A snapshot saved by an older
collector, or edited, holds such values in clear in an environment's value, in a `sh -c` script
(one argv word holding a whole script), in a `.env` line's value and as the word after a flag;
before, the guards needed the flag's name to be followed directly by `=` or a blank, and took a
single leading `-` for the next flag, so a replay printed and stored those values. A flag that
names no secret keeps its value in sight (`--max-model-len 8192`, `--served-model-name "x"`),
and so does `--token -v` (a last word only the reports' list names: the box does not hash it).

The box side of the same forms: tests/unit/test_review4_collector_mask.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.desired import secret_names
from reconciler.history import masking
from reconciler.history.observed import comparable
from reconciler.report.values import _words
from reconciler.scrub import flag_values, mask_credentials, scrub_text
from tests.unit.history_helpers import store_text
from tests.unit.test_fleet_secret_patterns import EXAMPLE, _replay
from tests.unit.test_review3_masking import _reconcile, with_fleet_pattern

PATTERN = "*_ORG"  # matches no floor pattern: `--openai-org` is a secret's flag only under it
FLAGS = {"key": "--api-key", "org": "--openai-org"}
# Each form a flag and its value take; `{f}` the flag, `{v}` the clear value.
FORMS = {
    "dq-dq": '"{f}" "{v}"',
    "sq-sq": "'{f}' '{v}'",
    "dq-bare": '"{f}" {v}',
    "bare-dq": '{f} "{v}"',
    "dq-eq": '"{f}={v}"',
    "sq-eq": "'{f}={v}'",
    "dash": "{f} -{v}",
}
# Around each form: flags that name no secret, whose values must stay in sight.
KEPT = ("--max-model-len 8193", '--served-model-name "mg-served-4242"')
AROUND = "exec vllm serve m {} " + " ".join(KEPT)


def clear(place: str, form: str, flag: str) -> str:
    """The clear value of one flag in one form at one place (distinct: a leak names its place)."""
    return f"c4v-{place}-{form}-{flag}-77"


def written(place: str, form: str, flag: str) -> str:
    return FORMS[form].format(f=FLAGS[flag], v=clear(place, form, flag))


@pytest.fixture(autouse=True)
def _no_fleet_patterns() -> Iterator[None]:
    secret_names.adopt_fleet_patterns(())
    yield
    secret_names.adopt_fleet_patterns(())


# -- each guard, form by form ---------------------------------------------------------------------
@pytest.mark.parametrize("flag", sorted(FLAGS))
@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_guard_masks_the_form_and_keeps_the_flags_that_name_no_secret(
    form: str, flag: str
) -> None:
    secret_names.adopt_fleet_patterns([PATTERN])
    value = clear("unit", form, flag)
    text = AROUND.format(written("unit", form, flag))
    script = ["sh", "-c", text]
    doc = {
        "collected": {
            "docker": {"containers": [{"env": {"VLLM_EXTRA": text}, "entrypoint": script}]},
            "envfile": [{"key": "VLLM_EXTRA", "line": 3, "value": text}],
            "login_shell": {"exports": {"VLLM_EXTRA": {"value": text, "source": "~/.bashrc:9"}}},
        }
    }
    shown = {
        "reports' guard (a value)": _words(text),
        "reports' guard (a command)": _words(tuple(script)),
        "mask_credentials": mask_credentials(text),
        "the store": masking.stored(doc),
        "diff (comparable)": comparable(doc),
    }
    for guard, out in shown.items():
        out_text = json.dumps(out)
        assert value not in out_text, guard
        assert all(kept.replace('"', '\\"') in out_text for kept in KEPT), (guard, out_text)
    # Free text (an error quoting the command) too; there, as in the box's own scrubbers, a
    # single `-` still reads as the next flag (`usage: --token -v`).
    if form != "dash":
        assert value not in scrub_text(text)


def test_a_value_with_a_single_dash_is_the_value_of_a_flag_the_box_hashes() -> None:
    """As the next word (an argv) too: `--openai-org -x` and `--api-key -x` hold `-x` (the
    collector hashes it); `--token -v` (a flag the box does not hash) and `--api-key --port`
    (the next flag) are two flags."""
    secret_names.adopt_fleet_patterns([PATTERN])
    words = ("vllm", "--openai-org", "-org-9", "--api-key", "-key-9", "--token", "-v")
    assert flag_values(words) == [2, 4]
    assert _words(words) == ("vllm", "--openai-org", "***", "--api-key", "***", "--token", "-v")
    assert masking.argv(list(words)) == [
        "vllm", "--openai-org", "***", "--api-key", "***", "--token", "-v"
    ]  # fmt: skip
    # The next flag is no value: it stays in sight, and is itself read as a flag.
    assert masking.argv(["--api-key", "--port", "8000"]) == ["--api-key", "--port", "8000"]
    assert flag_values(("--api-key", "--port", "8000")) == []
    for text in ("--token -v", "usage: --token -v given twice", "--api-key --port 8000"):
        assert mask_credentials(text) == text
    assert mask_credentials("--token --hf-token x") == "--token --hf-token ***"


def test_a_digest_the_collector_wrote_inside_quotes_is_kept_by_the_store() -> None:
    """What the box writes for a quoted value (`--api-key "{"secret": "hmac:..."}"`) holds no
    clear secret: the store keeps it whole (a diff then still tells a changed secret), where
    before it took `"***"` for a clear value and dropped the digest."""
    digest = '{"secret": "hmac:' + "ab" * 32 + '"}'
    for word in (
        f'exec vllm --api-key "{digest}" --port 8000',
        f"exec vllm '--api-key' '{digest}' --port 8000",
        f'exec vllm "--hf-token" "{digest}"',
    ):
        doc = {"collected": {"docker": {"containers": [{"entrypoint": ["sh", "-c", word]}]}}}
        assert masking.stored(doc) is doc, word


def test_an_envfile_of_digests_and_values_seen_before_is_judged_without_a_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Store masking cost: a `.env` with a hashed line (a dict no set holds) sent every value
    of the file through `masked_value` one call at a time, every box (_masked_values' fallback
    for a value that is no string); values seen plain before are now found in one C call."""
    lines = [
        {"key": "HF_TOKEN", "line": 1, "value": {"secret": "hmac:" + "0" * 64}},
        *({"key": f"K{i}", "line": i + 2, "value": f"v-{i}"} for i in range(50)),
    ]
    assert masking._envfile(lines) is lines  # every value judged (and remembered) once
    calls: list[Any] = []
    real = masking.masked_value

    def counted(value: Any) -> Any:
        calls.append(value)
        return real(value)

    with monkeypatch.context() as patched:
        patched.setattr(masking, "masked_value", counted)
        assert masking._envfile(lines) is lines
    assert calls == []
    # ... and a value holding a secret is still masked, next to a digest.
    secret_names.adopt_fleet_patterns([PATTERN])
    lines.append({"key": "VLLM_EXTRA", "line": 99, "value": "'--openai-org' 'c4v-env-9'"})
    assert masking._envfile(lines)[-1]["value"] == "'--openai-org' ***"


# -- a replay of an edited snapshot, every output ------------------------------------------------
PLACES = ("env", "word", "envfile")  # + "argv": the word after a flag, the dash form only
SHOWN = ("env", "word", "argv")  # what the drift shows (a `.env` line's value: stored, diffed)


def _edited_fleet(root: Path, pattern: bool) -> Path:
    """examples/lab-incidents with thor's worker carrying every form of both flags, clear:
    each in an environment value, a `sh -c` script of its own and a `.env` line, and the dash
    form as the word after the flag; `*_ORG` added to the fleet's patterns when `pattern`."""
    shutil.copytree(EXAMPLE, root)
    box = root / "snapshot" / "thor.json"
    doc = json.loads(box.read_text("utf-8"))
    collected = doc["collected"]
    worker = next(
        c for c in collected["docker"]["containers"] if c["name"] == "model-gear-vllm-worker"
    )
    scripts = []
    for n, (form, flag) in enumerate((fo, fl) for fo in sorted(FORMS) for fl in sorted(FLAGS)):
        worker["env"][f"VLLM_C4_{n}"] = AROUND.format(written("env", form, flag))
        scripts.append(AROUND.format(written("word", form, flag)))
        line = AROUND.format(written("envfile", form, flag))
        collected["envfile"].append({"key": f"VLLM_C4_{n}", "line": 9000 + n, "value": line})
    worker["entrypoint"] = ["sh", "-c", *scripts]
    for flag in sorted(FLAGS):
        worker["cmd"] += [FLAGS[flag], "-" + clear("argv", "dash", flag)]
    box.write_text(json.dumps(doc), "utf-8")
    if pattern:
        with_fleet_pattern(root, PATTERN)
    return root


def _all_clear() -> dict[str, str]:
    out = {
        clear(place, form, flag): f"{place} {form} {flag}"
        for place in PLACES
        for form in FORMS
        for flag in FLAGS
    }
    out.update({clear("argv", "dash", flag): f"argv dash {flag}" for flag in FLAGS})
    return out


def _leaks(text: str) -> list[str]:
    return sorted(where for value, where in _all_clear().items() if value in text)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every output of one edited fleet (with the pattern), and of the control (without)."""
    tmp = tmp_path_factory.mktemp("review4")
    root = _edited_fleet(tmp / "fleet", pattern=True)
    out: dict[str, str] = {}

    def ran(name: str, done: subprocess.CompletedProcess[str], code: int) -> None:
        assert done.returncode == code, (name, done.stderr[-2000:])
        out[name] = done.stdout + done.stderr

    for fmt in ("json", "text", "markdown", "html"):
        db = tmp / f"history-{fmt}.sqlite3"
        ran(fmt, _replay(root, "--format", fmt, "--history", str(db)), 2)
        out[f"store ({fmt})"] = store_text(db)
    db = tmp / "history-json.sqlite3"
    ran("history", _reconcile(root, "history", "thor", "--format", "json", "--history", str(db)), 0)
    diff = ("diff", "--from-snapshot", str(EXAMPLE / "snapshot"), str(root / "snapshot"))
    ran("diff text", _reconcile(root, *diff), 2)
    ran("diff json", _reconcile(root, *diff, "--format", "json"), 2)
    control = _edited_fleet(tmp / "control", pattern=False)
    ran("control json", _replay(control, "--format", "json", "--no-history"), 2)
    cdiff = ("diff", "--from-snapshot", str(EXAMPLE / "snapshot"), str(control / "snapshot"))
    ran("control diff json", _reconcile(control, *cdiff, "--format", "json"), 2)
    return out


def test_without_the_pattern_the_fleet_flags_values_reach_the_report_and_the_diff(
    outputs: dict[str, str],
) -> None:
    """The control: the edit does reach the outputs (so the test below can fail): without
    `*_ORG`, `--openai-org` names no secret and its values are shown at every shown place."""
    org = [f"{place} {form} org" for place in SHOWN for form in FORMS if place != "argv"]
    org.append("argv dash org")
    assert set(org) <= set(_leaks(outputs["control json"]))
    diffed = [f"{place} {form} org" for place in ("env", "word", "envfile") for form in FORMS]
    assert set(diffed) <= set(_leaks(outputs["control diff json"]))


@pytest.mark.parametrize(
    "output",
    [
        "json", "text", "markdown", "html", "store (json)", "store (text)", "store (markdown)",
        "store (html)", "history", "diff text", "diff json",
    ],
)  # fmt: skip
def test_no_output_holds_a_value_of_either_flag_in_any_form(
    outputs: dict[str, str], output: str
) -> None:
    assert _leaks(outputs[output]) == []
    if output in ("json", "text", "markdown", "html", "diff text", "diff json"):
        assert "--openai-org" in outputs[output]  # the drift is reported, its values masked
        shown = outputs[output]
        assert "--max-model-len 8193" in shown, output  # a flag naming no secret: in sight
        if output != "diff text":  # (which cuts a value short before its last flags)
            assert "mg-served-4242" in shown, output  # `--served-model-name "..."`'s value
