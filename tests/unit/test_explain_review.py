"""`reconcile validate` on the captured lab example (examples/lab-incidents, -i lab) with one
layer edited (review: reconciler/desired/explain.py).

1. A refused value never echoes a secret: any value under `secrets:` (a key pasted where its
   variable's name goes), and any other value some text of which may carry one inline (a list
   `[--api-key, sk-...]`, which `show` prints as `--api-key ***`). An ordinary bad value is
   still shown, and a validator's reason is kept with the value cut out of it.
2. A key a layer kept beside another layer's secret `source:` is said as such, with both
   places and what to do, not as `unknown key; did you mean 'path'?` about `path` itself.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"
# Made-up values shaped like the keys an operator pastes (never real ones).
SK = "sk-live-SECRET1zz"
HF = "hf_AbCdEfSECRET12"
VAR = "hf_live_SECRET3"


# orin.yaml's lines that a test replaces (it has a `lanes:` already: a second one is refused).
MODEL = "    model: unsloth/gemma-4-12B-it-qat-w4a16\n"
LEN = "    max_model_len: 262144\n"


def _example(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, orin: str, old: str = "", secrets: str = ""
) -> Path:
    """The example with `orin` appended to orin.yaml (or put in place of its line `old`), and
    `secrets` added first under all.yaml's `secrets:`."""
    root = tmp_path / "fleet"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("snapshot"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    layer = root / "group_vars" / "orin.yaml"
    text = layer.read_text()
    assert not old or text.count(old) == 1
    layer.write_text(text.replace(old, orin) if old else text + orin)
    layer = root / "group_vars" / "all.yaml"
    text = layer.read_text()
    assert text.count("\nsecrets:\n") == 1
    layer.write_text(text.replace("\nsecrets:\n", f"\nsecrets:\n{secrets}"))
    return root


def _problems(root: Path) -> list[str]:
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(root, "lab")
    return [str(p) for p in caught.value.problems]


# -- 1. no secret in a message -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("orin", "old", "secret", "expected"),
    [
        (
            f'env: {{VLLM_ARGS: ["--api-key", "{SK}"]}}\n',
            "",
            SK,
            "group_vars/orin.yaml:31:7: env.VLLM_ARGS: expected a bool, a number, an integer, "
            "a {secret: NAME} or a string, got list (not shown: it may carry a secret)",
        ),
        (
            f"secrets: {{newsec: {{source: box_file, path: ~/x, key: {HF}}}}}\n",
            "",
            HF,
            "group_vars/orin.yaml:31:49: secrets.newsec.key: the value (not shown: under "
            "secrets:, 17 characters) does not match the pattern ^[A-Z_][A-Z0-9_]*$ (the name "
            "of the variable that holds the secret goes here, never its value)",
        ),
        (
            f'secrets: {{newsec: {{source: controller_env, variable: "{VAR}"}}}}\n',
            "",
            VAR,
            "group_vars/orin.yaml:31:44: secrets.newsec.variable: the value (not shown: under "
            "secrets:, 15 characters) does not match the pattern ^[A-Z_][A-Z0-9_]*$ (the name "
            "of the variable that holds the secret goes here, never its value)",
        ),
        (  # a bare string for the whole spec
            f"secrets: {{newsec: {HF}}}\n",
            "",
            HF,
            "group_vars/orin.yaml:31:11: secrets.newsec: expected a mapping, got str (not "
            "shown: under secrets:, 17 characters)",
        ),
        (  # a source that is the key itself
            f"secrets: {{newsec: {{source: {HF}, path: ~/x, key: K}}}}\n",
            "",
            HF,
            "group_vars/orin.yaml:31:11: secrets.newsec: source (not shown: under secrets:, 17 "
            "characters) is not one of 'box_file', 'controller_env'",
        ),
        (  # a validator's reason stays, the value cut out of it
            f"secrets: {{newsec: {{source: box_file, path: /{HF}, key: K}}}}\n",
            "",
            HF,
            "group_vars/orin.yaml:31:38: secrets.newsec.path: the value (not shown: under "
            "secrets:, 18 characters) is absolute: write it inside the deploy user's home as "
            "~/...",
        ),
        (  # an assignment to a secret name inside a value of another key
            f'    model: "m HF_TOKEN={HF}"\n',
            MODEL,
            HF,
            "group_vars/orin.yaml:21:5: lanes.senses.model: the value (not shown: it may carry "
            "a secret, 28 characters) is not a model id (name or namespace/name: letters, "
            "digits, . _ -, no -- or ..)",
        ),
        (  # a mapping whose key is a secret name
            f"    max_model_len: {{HF_TOKEN: {HF}}}\n",
            LEN,
            HF,
            "group_vars/orin.yaml:23:5: lanes.senses.max_model_len: expected an integer, got "
            "mapping (not shown: it may carry a secret)",
        ),
    ],
    ids=[
        "argv_list",
        "box_file_key",
        "controller_variable",
        "bare_spec",
        "source",
        "path",
        "model_assignment",
        "mapping_key",
    ],
)
def test_a_refused_value_that_may_be_a_secret_is_never_echoed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, orin: str, old: str, secret: str, expected: str
) -> None:
    problems = _problems(_example(tmp_path, monkeypatch, orin, old))
    assert problems == [expected]
    assert not any(secret in p for p in problems)


@pytest.mark.parametrize(
    ("orin", "old", "expected"),
    [
        (
            'env: {VLLM_ARGS: ["--tokenizer", "org/tok"]}\n',
            "",
            "group_vars/orin.yaml:31:7: env.VLLM_ARGS: expected a bool, a number, an integer, "
            "a {secret: NAME} or a string, got list ['--tokenizer', 'org/tok']",
        ),
        (
            '    model: "org/a b"\n',
            MODEL,
            "group_vars/orin.yaml:21:5: lanes.senses.model: 'org/a b' is not a model id (name "
            "or namespace/name: letters, digits, . _ -, no -- or ..)",
        ),
        (
            "    max_model_len: lots\n",
            LEN,
            "group_vars/orin.yaml:23:5: lanes.senses.max_model_len: expected an integer, got "
            "str 'lots'",
        ),
    ],
    ids=["argv_list", "model", "integer"],
)
def test_an_ordinary_bad_value_is_still_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, orin: str, old: str, expected: str
) -> None:
    assert _problems(_example(tmp_path, monkeypatch, orin, old)) == [expected]


def test_validate_exits_1_and_prints_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _example(tmp_path, monkeypatch, f'env: {{VLLM_ARGS: ["--api-key", "{SK}"]}}\n')
    assert main(["--root", str(root), "-i", "lab", "validate"]) == 1
    out = capsys.readouterr()
    assert "env.VLLM_ARGS" in out.err
    assert SK not in out.out + out.err


# -- 2. a key of another secret source kept by the merge -----------------------------------------
def _switch(source: str) -> str:
    return (
        "layers deep-merge, so a secret's source cannot be switched in place, and a null does "
        f"not remove a key (it is a value too): declare a new secret name with source {source} "
        "instead and point its references ({secret: NAME}) at it"
    )


def test_a_source_changed_by_a_later_layer_names_both_layers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    orin = "secrets: {gateway_api_key: {source: controller_env, variable: ORIN_KEY}}\n"
    problems = _problems(_example(tmp_path, monkeypatch, orin))
    assert problems == [
        f"group_vars/all.yaml:{line}:5: secrets.gateway_api_key.{key}: a box_file secret's key, "
        "kept from this layer, but a later one changed source to controller_env "
        f"(group_vars/orin.yaml:31:29), which has no {key}: {_switch('controller_env')} (box orin)"
        for line, key in ((31, "path"), (32, "key"))
    ]


def test_a_null_in_the_same_layer_is_said_not_to_remove_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    orin = "secrets: {gateway_api_key: {source: controller_env, variable: ORIN_KEY, path: null}}\n"
    problems = _problems(_example(tmp_path, monkeypatch, orin))
    assert (
        "group_vars/orin.yaml:31:73: secrets.gateway_api_key.path: a box_file secret's key, "
        f"not a controller_env secret's (valid keys: source, variable); {_switch('controller_env')}"
    ) in problems


def test_a_key_added_by_a_later_layer_to_another_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _example(
        tmp_path,
        monkeypatch,
        "secrets: {other: {path: ~/.other}}\n",
        secrets="  other: {source: controller_env, variable: OTHER_KEY}\n",
    )
    assert _problems(root) == [
        "group_vars/orin.yaml:31:19: secrets.other.path: a box_file secret's key, set by this "
        "layer, but an earlier one made this secret's source controller_env "
        f"(group_vars/all.yaml:29:11), which has no path: {_switch('box_file')}"
    ]


def test_a_typo_still_gets_the_chosen_source_s_nearest_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    orin = "secrets: {newsec: {source: controller_env, varable: NEW_KEY}}\n"
    assert _problems(_example(tmp_path, monkeypatch, orin)) == [
        "group_vars/orin.yaml:31:44: secrets.newsec.varable: unknown key; did you mean 'variable'?"
    ]
