"""The collector's secret masking: what it hashes on the box before an answer leaves it.

An entrypoint and a command are one argv to Docker, so they are masked as one line; secret
names are matched by one compiled pattern per list, which must say exactly what fnmatch says.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import pytest

from reconciler.observe.document import SecretValue, parse_collected
from tests.unit.test_secret_boundaries import _collector

KEY = "hunter2-real-key-7Qx9"


def _run(patterns: list[str] | None = None) -> Any:
    collector = _collector()
    return collector.Run(
        {"directory": "/nonexistent", "secret_patterns": patterns or [], "run_key": "k" * 64}
    )


@pytest.mark.parametrize(
    ("entrypoint", "command", "hidden_in"),
    [
        (["vllm", "--api-key"], [KEY, "serve"], "command"),  # the flag ends the entrypoint
        (["vllm", f"--api-key={KEY}"], ["serve"], "entrypoint"),
        (["bash", "-c"], ["vllm", "--hf-token", KEY], "command"),
        ([f"--db-password={KEY}"], None, "entrypoint"),
    ],
)
def test_entrypoint_and_command_are_masked_as_one_line(
    entrypoint: list[str], command: list[str] | None, hidden_in: str
) -> None:
    masked_entry, masked_cmd = _run().mask_command(entrypoint, command)
    assert KEY not in repr((masked_entry, masked_cmd))
    assert len(masked_entry) == len(entrypoint)  # the cut stays where Docker has it
    assert (masked_cmd is None) == (command is None)
    assert "hmac:" in repr(masked_entry if hidden_in == "entrypoint" else masked_cmd)


def test_non_secret_lines_pass_unchanged() -> None:
    run = _run()
    assert run.mask_command(["bash"], ["-c", "vllm serve x"]) == (["bash"], ["-c", "vllm serve x"])
    assert run.mask_command(None, ["serve", "--port", "8000"]) == (
        None,
        ["serve", "--port", "8000"],
    )


def test_a_masked_entrypoint_parses_as_a_secret_in_the_document() -> None:
    run = _run()
    entrypoint, command = run.mask_command(["vllm", "--api-key"], [KEY])
    container = {
        "name": "lobes-x-1",
        "id": "0123456789ab",
        "service": "x",
        "entrypoint": entrypoint,
        "cmd": command,
    }
    doc = parse_collected({"collector": 1, "docker": {"containers": [container]}}, complete=False)
    assert not hasattr(doc, "kind"), doc  # not a Fault
    (parsed,) = doc.containers
    assert parsed.entrypoint == ("vllm", "--api-key")
    assert parsed.cmd is not None and isinstance(parsed.cmd[0], SecretValue)
    assert str(parsed.cmd[0]) == "***"


NAMES = [
    "GATEWAY_API_KEY", "gateway_api_key", "HF_TOKEN", "MY_KEYS", "KEY", "_KEY", "A_KEY_B",
    "DB_PASSWORD", "passwd", "X_CREDENTIALS", "SECRETS_DIR", "PATH", "HOME", "MODEL",
    "VLLM_API_KEY", "TOKEN_LIMIT", "LOBES_MESH_KEY", "weird[name]", "a\nb_KEY", "",
]  # fmt: skip


@pytest.mark.parametrize("patterns", [[], ["HF_*"], ["*_MODEL", "PATH", "[A-C]*"], ["*"]])
def test_compiled_patterns_say_what_fnmatch_says(patterns: list[str]) -> None:
    collector = _collector()
    run = _run(patterns)
    for name in NAMES:
        by_floor = any(fnmatch.fnmatchcase(name.upper(), p) for p in collector.FLOOR)
        by_list = any(fnmatch.fnmatchcase(name, p) for p in patterns)
        assert collector.floor_secret(name) is by_floor, name
        assert run.is_secret(name) is (by_floor or by_list), (name, patterns)
        assert run.is_secret(name) is (by_floor or by_list), name  # remembered, same answer


def test_a_word_seen_again_in_a_run_is_not_read_again_and_masks_alike() -> None:
    """A box's containers inherit one environment and its renders repeat it: each distinct
    word is read once a run. The second answer is the first, for a word with secrets inline
    and for a plain one; another run (another key) reads it anew."""
    run = _run()
    reads: list[str] = []
    read = run._mask_words

    def counted(word: str) -> str:
        reads.append(word)
        return read(word)

    run._mask_words = counted
    carrying, plain = f"vllm serve m --api-key {KEY}", "/usr/local/cuda/bin:/usr/bin"
    first = [run.mask_words(carrying), run.mask_words(plain)]
    again = [run.masked_value("VLLM_ARGS", carrying), run.mask_words(plain)]
    assert first == again
    assert KEY not in first[0] and first[1] == plain
    assert reads == [carrying, plain]
    other = _collector().Run({"directory": "/nonexistent", "run_key": "j" * 64})
    assert other.mask_words(carrying) != first[0]  # another key, another digest
