"""The box-side `.env` writer (reconciler/apply/remote/converge.py), run here on temp files:
only differing managed keys change, every other byte stays, values round-trip through the
drift engine's dotenv reader (the collector's, which reads like compose)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import load_box_program

ROOT = Path(__file__).resolve().parents[2]


converge = load_box_program("box_converge", "reconciler/apply/remote/converge.py")
collector = load_box_program("box_collector", "reconciler/observe/remote/collector.py")

LOBES_ENV = (
    "# lobes render: a comment line\n"
    "HF_TOKEN=\n"
    "WORKER_MAX_MODEL_LEN=262144   # the worker's window (seed 000)\n"
    "export MODEL_GEAR_VERSION=0.90.2\n"
    "# GATEWAY_API_KEY=commented-out-example\n"
    "WORKER_SPECULATIVE_CONFIG=\n"
    "QUOTED='keep me'   # quoted, with a comment\n"
    "WORKER_MAX_MODEL_LEN=131072\n"
    "TAIL=last-line-without-newline"
)
SPEC = '\'--speculative-config={"method": "dflash", "num_speculative_tokens": 12}\''


def write(tmp_path: Path, text: str, keys: dict[str, str]) -> tuple[str, list[str]]:
    env = tmp_path / ".env"
    env.write_text(text)
    os.chmod(env, 0o644)
    box = converge.Box({"directory": str(tmp_path), "project": "lobes", "compose_files": []})
    changed = converge.write_env(box, list(keys), keys)
    return env.read_text(), changed


def parsed(text: str) -> dict[str, Any]:
    return {e["key"]: e["value"] for e in collector.parse_dotenv(text)}


def test_only_differing_keys_change_and_every_other_line_stays(tmp_path):
    text, changed = write(
        tmp_path,
        LOBES_ENV,
        {"MODEL_GEAR_VERSION": "0.91.0", "HF_TOKEN": "", "QUOTED": "keep me", "NEW_KEY": "x"},
    )
    assert changed == ["MODEL_GEAR_VERSION", "NEW_KEY"]
    before, after = LOBES_ENV.splitlines(), text.splitlines()
    assert after[3] == "export MODEL_GEAR_VERSION=0.91.0"
    assert [a for i, a in enumerate(after[:-1]) if i != 3] == [
        b for i, b in enumerate(before) if i != 3
    ]
    assert after[-1] == "NEW_KEY=x"  # appended at the end, after the unterminated last line


def test_the_last_assignment_is_the_one_changed_and_its_comment_stays(tmp_path):
    text, changed = write(tmp_path, LOBES_ENV, {"WORKER_MAX_MODEL_LEN": "65536"})
    lines = text.splitlines()
    assert changed == ["WORKER_MAX_MODEL_LEN"]
    assert lines[2] == "WORKER_MAX_MODEL_LEN=262144   # the worker's window (seed 000)"
    assert lines[7] == "WORKER_MAX_MODEL_LEN=65536"
    assert parsed(text)["WORKER_MAX_MODEL_LEN"] == "65536"


def test_an_inline_comment_survives_a_changed_value(tmp_path):
    text, _ = write(tmp_path, "A=1   # why A is 1\nB='x'  # quoted\n", {"A": "2", "B": "y z"})
    assert text == "A=2   # why A is 1\nB='y z'  # quoted\n"


def test_a_commented_out_example_is_not_an_assignment(tmp_path):
    text, changed = write(tmp_path, LOBES_ENV, {"GATEWAY_API_KEY": ""})
    assert changed == ["GATEWAY_API_KEY"]
    assert "# GATEWAY_API_KEY=commented-out-example" in text
    assert text.endswith("\nGATEWAY_API_KEY=\n")


@pytest.mark.parametrize(
    "value",
    [
        SPEC,
        '{"text_config": {"rope_type": "yarn", "factor": 4.0}}',
        "plain-token_1.2:3@sha256:abc",
        "two words",
        "back\\slash and 'quote'",
        "",
    ],
)
def test_values_round_trip_through_the_dotenv_reader(tmp_path, value):
    text, _ = write(tmp_path, "OTHER=1\n", {"K": value})
    assert parsed(text)["K"] == value


def test_the_speculative_config_is_written_the_way_lobes_needs(tmp_path):
    text, _ = write(tmp_path, "", {"WORKER_SPECULATIVE_CONFIG": SPEC})
    assert text == (
        'WORKER_SPECULATIVE_CONFIG="\'--speculative-config={\\"method\\": \\"dflash\\", '
        '\\"num_speculative_tokens\\": 12}\'"\n'
    )


def test_unchanged_values_leave_the_file_untouched(tmp_path):
    env = tmp_path / ".env"
    env.write_text(LOBES_ENV)
    os.chmod(env, 0o600)
    inode = env.stat().st_ino
    box = converge.Box({"directory": str(tmp_path), "project": "lobes", "compose_files": []})
    assert (
        converge.write_env(box, ["HF_TOKEN", "QUOTED"], {"HF_TOKEN": "", "QUOTED": "keep me"}) == []
    )
    assert env.stat().st_ino == inode and env.read_text() == LOBES_ENV


def test_the_file_is_replaced_atomically_with_mode_0600(tmp_path):
    write(tmp_path, LOBES_ENV, {"HF_TOKEN": "new"})
    env = tmp_path / ".env"
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [".env"]  # no temp file left behind


def test_a_multiline_value_is_refused():
    with pytest.raises(converge.Failed):
        converge.quote("a\nb")
