"""A flag the fleet's own `secret_patterns` name (`--openai-org` under `*_ORG`, which no floor
pattern matches) is masked by every last guard, as the collector masks it on the box
(collector.py `Run.secret_flag`: `--openai-org` -> `OPENAI_ORG`): the reports' guard (text,
markdown, html, json), the free-text scrub and the history store. A snapshot saved before the
pattern was added, or edited, holds the flag's value in clear: inside an environment's value
(`VLLM_EXTRA='--openai-org x'`), inside a command word (`sh -c '... --openai-org x'`), as the
word after the flag, in a `.env` line's value and a login export's. Before, only the fixed list
of flag words (`--api-key`, `*-token`, `*-secret`, ...) was masked there, so a replay printed
and stored those values."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.desired import secret_names
from reconciler.history import masking
from reconciler.report.values import _words
from reconciler.scrub import flag_values, mask_credentials, scrub_text
from tests.unit.history_helpers import store_text
from tests.unit.test_fleet_secret_patterns import EXAMPLE, _replay

ROOT = Path(__file__).resolve().parents[2]

PATTERN = "*_ORG"  # matches no floor pattern
FLAG = "--openai-org"
# One clear value per place a snapshot can hold it (each distinct, so a leak names its place).
IN_ENV = "orgclear-env-7731"  # a container's VLLM_EXTRA='--openai-org ...'
IN_WORD = "orgclear-word-7732"  # entrypoint word: sh -c 'exec ... --openai-org ...'
AFTER_FLAG = "orgclear-next-7733"  # entrypoint: '--openai-org', '...'
IN_ENVFILE = "orgclear-envfile-7734"  # `.env`: VLLM_EXTRA=--openai-org ...
IN_EXPORT = "orgclear-export-7735"  # login shell: export VLLM_EXTRA='--openai-org ...'
CLEAR = (IN_ENV, IN_WORD, AFTER_FLAG, IN_ENVFILE, IN_EXPORT)
SHOWN = (IN_ENV, IN_WORD, AFTER_FLAG)  # what the replay's drift shows (the rest: stored only)


@pytest.fixture(autouse=True)
def _no_fleet_patterns() -> Iterator[None]:
    secret_names.adopt_fleet_patterns(())
    yield
    secret_names.adopt_fleet_patterns(())


def _edited_fleet(tmp_path: Path, pattern: bool) -> Path:
    """examples/lab-incidents with thor's worker edited to carry the clear values, and with
    `*_ORG` added to the fleet's secret_patterns when `pattern`."""
    root = tmp_path / "fleet"
    shutil.copytree(EXAMPLE, root)
    box = root / "snapshot" / "thor.json"
    doc = json.loads(box.read_text("utf-8"))
    collected = doc["collected"]
    worker = next(
        c for c in collected["docker"]["containers"] if c["name"] == "model-gear-vllm-worker"
    )
    worker["env"]["VLLM_EXTRA"] = f"{FLAG} {IN_ENV}"
    worker["entrypoint"] = ["sh", "-c", f"exec mg-logwrap {FLAG} {IN_WORD}", FLAG, AFTER_FLAG]
    collected["envfile"].append(
        {"key": "VLLM_EXTRA", "line": 9001, "value": f"{FLAG} {IN_ENVFILE}"}
    )
    collected["login_shell"]["exports"]["VLLM_EXTRA"] = {
        "value": f"{FLAG} {IN_EXPORT}",
        "source": "~/.bashrc:9",
    }
    box.write_text(json.dumps(doc), "utf-8")
    if pattern:
        with_fleet_pattern(root, PATTERN)
    return root


def _leaks(out: subprocess.CompletedProcess[str]) -> list[str]:
    return [value for value in CLEAR if value in out.stdout + out.stderr]


def test_without_the_pattern_the_edited_values_reach_the_report(tmp_path: Path) -> None:
    """The control: the edit does reach the replayed report (so the test below can fail)."""
    root = _edited_fleet(tmp_path, pattern=False)
    out = _replay(root, "--format", "json", "--no-history")
    assert out.returncode == 2, out.stderr
    assert sorted(_leaks(out)) == sorted(SHOWN)


@pytest.mark.parametrize("fmt", ["json", "text", "markdown", "html"])
def test_a_replay_masks_a_flag_the_fleets_pattern_names_in_every_format_and_the_store(
    tmp_path: Path, fmt: str
) -> None:
    root = _edited_fleet(tmp_path, pattern=True)
    db = tmp_path / "history.sqlite3"
    out = _replay(root, "--format", fmt, "--history", str(db))
    assert out.returncode == 2, out.stderr
    assert "openai-org" in out.stdout  # the drift is reported ...
    assert _leaks(out) == []  # ... no value of the flag shown
    assert db.exists() and _stored(db) == []
    # What `reconcile history` reads back from the store.
    shown = _reconcile(root, "history", "thor", "--format", "json", "--history", str(db))
    assert shown.returncode == 0 and '"command": "drift"' in shown.stdout, shown.stderr
    assert _leaks(shown) == []


def _stored(db: Path) -> list[str]:
    """The clear values any cell of the store holds (its packed observations unpacked)."""
    text = store_text(db)
    return sorted(v for v in CLEAR if v in text)


def _reconcile(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FLEET_INVENTORY", None)
    return subprocess.run(
        [sys.executable, "-m", "reconciler", "--root", str(root), "-i", "lab", *argv],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


# -- the guards, one by one ----------------------------------------------------------------------
def test_the_reports_guard_masks_the_flag_only_once_the_fleet_names_it() -> None:
    words = ("sh", "-c", f"exec vllm {FLAG} {IN_WORD}", FLAG, AFTER_FLAG, f"{FLAG}={IN_ENV}")
    assert _words(words) is words  # no pattern: nothing to mask
    secret_names.adopt_fleet_patterns([PATTERN])
    assert _words(words) == (
        "sh", "-c", f"exec vllm {FLAG} ***", FLAG, "***", f"{FLAG}=***"
    )  # fmt: skip
    assert _words(f"{FLAG} {IN_ENV} --port 8000") == f"{FLAG} *** --port 8000"
    secret_names.adopt_fleet_patterns(())  # forgotten with the pattern
    assert _words(words) is words


def test_the_scrub_masks_the_flag_in_every_form_the_fixed_list_masks() -> None:
    texts = [
        f"vllm serve m {FLAG} {IN_ENV} --port 8000",
        f"vllm serve m {FLAG}={IN_ENV} --port 8000",
        f"Command '['vllm', '{FLAG}', '{IN_ENV}', '--port', '8000']' failed",
        # A flag that is a quoted shell word of its own (review 4): the quote closing it came
        # between the name and the value, and the value was kept.
        f'sh -c \'vllm serve m "{FLAG}" "{IN_ENV}" --port 8000\'',
        f"vllm serve m '{FLAG}' '{IN_ENV}' --port 8000",
        f'vllm serve m "{FLAG}" {IN_ENV} --port 8000',
    ]
    assert all(IN_ENV in scrub_text(t) for t in texts)
    secret_names.adopt_fleet_patterns([PATTERN])
    for text in texts:
        assert IN_ENV not in scrub_text(text) and "8000" in scrub_text(text), scrub_text(text)
        assert IN_ENV not in mask_credentials(text)
        assert IN_ENV not in masking.scrubbed(text)
    assert flag_values(("vllm", FLAG, IN_ENV, "--port", "8000")) == [2]
    # A value starting with a single `-` is the value (the collector hashes it: only `--` is
    # the next flag), in a command's words; the next flag is no value.
    assert flag_values(("vllm", FLAG, f"-{IN_ENV}", "--port", "8000")) == [2]
    assert mask_credentials(f"{FLAG} -{IN_ENV} --port 8000") == f"{FLAG} *** --port 8000"
    assert mask_credentials(f"{FLAG} --port 8000") == f"{FLAG} --port 8000"
    # Judged as the collector judges a flag: dashes as underscores, upper case, `--` only.
    from reconciler.scrub import named_flag

    assert named_flag("--openai_org") and not named_flag("-openai-org")
    assert not named_flag("--openai-organization") and not named_flag("--port")


def test_the_store_masks_the_flag_inside_values_and_words() -> None:
    doc = {
        "collected": {
            "docker": {
                "containers": [
                    {
                        "env": {"VLLM_EXTRA": f"{FLAG} {IN_ENV}", "MODE": "fast"},
                        "entrypoint": ["sh", "-c", f"exec vllm {FLAG} {IN_WORD}"],
                        "cmd": ["vllm", FLAG, AFTER_FLAG],
                    }
                ]
            },
            "envfile": [
                {"key": "VLLM_EXTRA", "line": 3, "value": f"{FLAG} {IN_ENVFILE}"},
                {"key": "MODE", "line": 4, "value": "fast"},
            ],
            "login_shell": {"exports": {"VLLM_EXTRA": {"value": f"{FLAG} {IN_EXPORT}"}}},
        }
    }
    secret_names.adopt_fleet_patterns([PATTERN])
    stored = masking.stored(doc)
    text = json.dumps(stored)
    assert [value for value in CLEAR if value in text] == []
    container = stored["collected"]["docker"]["containers"][0]
    assert container["env"] == {"VLLM_EXTRA": f"{FLAG} ***", "MODE": "fast"}
    assert container["entrypoint"] == ["sh", "-c", f"exec vllm {FLAG} ***"]
    assert container["cmd"] == ["vllm", FLAG, "***"]
    assert stored["collected"]["envfile"][1] is doc["collected"]["envfile"][1]  # kept as it was
    assert json.dumps(doc).count("orgclear") == len(CLEAR)  # the caller's document untouched


def test_the_store_masks_a_floor_credential_inside_a_value_or_a_word() -> None:
    """The same rule with no fleet pattern: a `--api-key` inside a value or a `sh -c` word was
    stored in clear too (the reports' guard masked it, the store did not)."""
    doc = {
        "collected": {
            "docker": {
                "containers": [
                    {
                        "env": {"VLLM_ARGS": f"--api-key {IN_ENV}"},
                        "cmd": ["sh", "-c", f"vllm serve --api-key {IN_WORD}"],
                    }
                ]
            }
        }
    }
    text = json.dumps(masking.stored(doc))
    assert IN_ENV not in text and IN_WORD not in text


def test_the_store_keeps_a_clean_observation_as_the_same_object() -> None:
    secret_names.adopt_fleet_patterns([PATTERN])
    doc = json.loads((EXAMPLE / "snapshot" / "thor.json").read_text("utf-8"))
    assert masking.stored(doc) is doc
    assert masking.stored(doc) is doc  # and again, from what it remembered


def test_diff_masks_a_secret_inside_a_plain_value_of_an_unstored_snapshot() -> None:
    """`reconcile diff --from-snapshot A B` compares snapshots that were never stored (so never
    masked by the store): a flag's value inside an env value under a plain name is masked
    there too, the fixed list's and the fleet's own."""
    from reconciler.history.observed import comparable

    secret_names.adopt_fleet_patterns(("*_ORG",))
    try:
        doc = {"env": {"VLLM_EXTRA": "--api-key s3cr3t-one --openai-org s3cr3t-two -tp 2"}}
        shown = json.dumps(comparable(doc))
    finally:
        secret_names.adopt_fleet_patterns(())
    assert "s3cr3t" not in shown
    assert "-tp 2" in shown  # the rest of the value stays comparable


def with_fleet_pattern(root: Path, pattern: str) -> None:
    """The fleet's own secret pattern added to group_vars/all.yaml's `secret_patterns`."""
    all_yaml = root / "group_vars" / "all.yaml"
    text = all_yaml.read_text("utf-8")
    assert '"*PASSWORD*"]' in text
    all_yaml.write_text(text.replace('"*PASSWORD*"]', f'"*PASSWORD*", "{pattern}"]'), "utf-8")
