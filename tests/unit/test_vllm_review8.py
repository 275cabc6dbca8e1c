"""Review 8 (vLLM's command line as vLLM reads it): the reviewer's t1-t4 and snapA-snapE.

1. `--api-key K1 K2`: vLLM's keys are a list (argparse nargs="+"); the box hashed K1 only and
   sent K2 in clear, and the controller's guards let an older snapshot's K2 through.
2. `--max_model_len` is `--max-model-len` to vLLM (`_` read as `-` up to the first `.`),
   `--model M` is the positional M, `-tp` is `--tensor-parallel-size`: the parse every compare
   reads a command line with (the dead-knob check, the gateway's lane windows, the memory
   share a lane holds, the argv diff) kept names verbatim.
3. A dotted flag (`--speculative-config.num_speculative_tokens=3`) replaces its JSON flag in
   vLLM; drift said nothing.
4. `{"enable_thinking": false}` and `{"enable_thinking": 0}` compared equal (json.loads then
   `==`: False == 0), which a chat template reads apart.
5. The dead-knob check wanted one occurrence of a flag: a compose file's earlier one made a
   knob vLLM honours (it takes the last) "dead", with the same value on both sides.
6. The lab's stand-in refused dotted flags vLLM accepts, and its error body was pre-0.10's.

Replays use examples/lab-incidents (spark: the primary lane's render and container edited as
the reviewer's snapshots have them).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.argv import diff_argv
from reconciler.compare.drift import Drift, SecretValue
from reconciler.compare.envfile import _held_share
from reconciler.compare.values import flags_of, parse_argv, same
from reconciler.history import masking
from reconciler.observe.document import Container
from reconciler.observe.remote import collector
from reconciler.scrub import flag_values
from tests.unit.example_replay import EXAMPLE, replay_edited
from tests.unit.test_standin import running

ROOT = Path(__file__).resolve().parents[2]
PRIMARY = "vllm-primary"
K1, K2 = "lab-key-one-0123456789", "lab-key-two"
DIGEST = {"secret": "hmac:" + "ab" * 32}


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _spark(tmp: Path, edit: Callable[[dict[str, Any]], None]) -> list[Drift]:
    """spark's drifts in the example replayed with its observation edited by `edit`."""
    _, run = replay_edited(tmp, "spark", edit, ["spark"])
    (box,) = run.report.boxes
    return list(box.drifts)


def _render(edit: Callable[[list[Any]], None]) -> Callable[[dict[str, Any]], None]:
    """An edit of the primary lane's command in both renders of the desired `.env` (a compose
    file that puts these words there)."""

    def edited(collected: dict[str, Any]) -> None:
        for name in ("render", "render_login"):
            edit(collected[name]["services"][PRIMARY]["command"])

    return edited


def _running(edit: Callable[[list[Any]], None]) -> Callable[[dict[str, Any]], None]:
    """An edit of the primary lane's running container's command."""

    def edited(collected: dict[str, Any]) -> None:
        (c,) = [c for c in collected["docker"]["containers"] if c["service"] == PRIMARY]
        edit(c["cmd"])

    return edited


def _dead(drifts: list[Drift], knob: str) -> list[Drift]:
    return [d for d in drifts if d.note and d.note.startswith(f".env {knob} is dead")]


def _example_lane(service: str) -> tuple[list[Any], list[Any]]:
    doc = json.loads((EXAMPLE / "snapshot" / "spark.json").read_text(encoding="utf-8"))
    (c,) = [c for c in doc["collected"]["docker"]["containers"] if c["service"] == service]
    return c["entrypoint"], c["cmd"]


def _run() -> Any:
    return collector.Run({"run_key": "k" * 40, "directory": "~/.lobes", "secret_patterns": []})


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


# -- 1. `--api-key K1 K2` -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["vllm", "serve", "M", "--api-key", K1, K2, "--port", "8000"],
        ["vllm", "serve", "M", "--api-key=" + K1, K2, "--port", "8000"],
        ["vllm", "serve", "M", "--api_key", K1, K2, "--port", "8000"],
    ],
)
def test_every_key_of_an_api_key_list_is_hashed_on_the_box(argv: list[str]) -> None:
    masked = _run().mask_argv(argv)
    shown = json.dumps(masked)
    assert K1 not in shown and K2 not in shown
    assert masked[:3] == ["vllm", "serve", "M"] and masked[-2:] == ["--port", "8000"]
    assert masked[5] != _run().mask_argv(["--api-key", "other-key"])[1]  # K2's own digest


def test_an_older_snapshots_clear_second_key_is_masked_by_the_controllers_guards() -> None:
    # The box's answer of a collector before the fix: K1 hashed, K2 in clear.
    old = ["vllm", "serve", "M", "--api-key", DIGEST, K2, "--port", "8000"]
    stored = masking.argv(list(old))
    assert K2 not in json.dumps(stored) and stored[-2:] == ["--port", "8000"]
    # The reports' guard (report/values.py) reads a command's words by scrub.flag_values.
    assert flag_values(("--api-key", SecretValue("hmac:" + "ab" * 32), K2, "--port", "8000")) == [2]
    assert flag_values(("--api-key=***", K2, "-tp", "2")) == [1]


def test_a_replay_of_an_older_snapshot_never_shows_the_second_key(tmp_path: Path) -> None:
    drifts = _spark(tmp_path, _running(lambda cmd: cmd.extend(["--api-key", DIGEST, K2])))
    lane = [d for d in drifts if d.subject == f"lane:{PRIMARY}" and d.kind.value == "argv"]
    assert any(d.path.startswith("argv[") for d in lane)  # K2, inserted in the command
    assert not [d for d in lane if K2 in _strings((d.desired, d.observed))]


# -- 2. names as vLLM reads them ------------------------------------------------------------------
def test_flag_names_read_as_vllm_reads_them() -> None:
    positionals, flags = parse_argv(
        [
            "vllm",
            "serve",
            "--max_model_len=8192",
            "--model",
            "org/m",
            "-tp",
            "2",
            "-q=fp8",
            "--hf_overrides.rope_scaling.factor",
            "2.0",
        ]
    )
    assert positionals == ["vllm", "serve", "org/m"]
    assert flags["--max-model-len"] == ["8192"]
    assert flags["--tensor-parallel-size"] == ["2"] and flags["--quantization"] == ["fp8"]
    # `_` is `-` up to the first `.` only: the JSON key keeps its own
    assert json.loads(str(flags["--hf-overrides"][-1])) == {"rope_scaling": {"factor": 2.0}}
    # a short option is a flag, never the value of a bare one before it
    assert flags_of(["vllm", "serve", "m", "--enforce-eager", "-tp", "2"])["--enforce-eager"] == (
        True,
    )


def test_an_underscore_spelling_is_the_same_command_line() -> None:
    entry, cmd = _example_lane("vllm-embed")
    model = cmd[2]
    cases = [
        [t.replace("--max-model-len", "--max_model_len") for t in cmd],
        ["vllm", "serve", *cmd[3:6], "--model", model, *cmd[6:]],  # vLLM moves M beside serve
        ["vllm", "serve", f"--model={model}", *cmd[3:]],
    ]
    for got in cases:
        assert diff_argv(entry, cmd, entry, got) == [], got
    tp = diff_argv(entry, [*cmd, "--tensor-parallel-size", "2"], entry, [*cmd, "-tp", "4"])
    assert [(d.path, d.desired, d.observed) for d in tp] == [("--tensor-parallel-size", "2", "4")]


def test_a_window_set_with_underscores_in_the_render_kills_the_knob(tmp_path: Path) -> None:
    """snapA: the render ends with `--max_model_len=131072`, which vLLM runs with."""

    def edit(cmd: list[Any]) -> None:
        cmd[cmd.index("--max-model-len=131072")] = "--max-model-len=262144"  # the knob's
        cmd.append("--max_model_len=131072")

    (dead,) = _dead(_spark(tmp_path, _render(edit)), "PRIMARY_MAX_MODEL_LEN")
    assert (dead.path, dead.desired, dead.observed) == ("--max-model-len", "262144", "131072")


def test_the_lane_window_and_memory_share_read_underscored_flags(tmp_path: Path) -> None:
    def edit(cmd: list[Any]) -> None:
        cmd[cmd.index("--max-model-len=131072")] = "--max_model_len=65536"

    drifts = _spark(tmp_path, _running(edit))
    (context,) = [d for d in drifts if d.path == "capabilities.cortex.context"]
    assert context.note and "serves 65536 (docker inspect)" in context.note
    entry, cmd = _example_lane(PRIMARY)
    lane = Container(
        name="model-gear-vllm-primary", id="x", service=PRIMARY, image_ref=None, image_id=None,
        cmd=tuple(t.replace("--gpu-memory-utilization", "--gpu_memory_utilization") for t in cmd),
        env={}, status="running", health=None, restart_count=0, exit_code=None, ports={},
        ips=(), entrypoint=tuple(entry),
    )  # fmt: skip
    assert _held_share(lane) == 0.58


# -- 3. dotted flags ------------------------------------------------------------------------------
def test_dotted_flags_fold_into_their_json_flag_as_vllm_folds_them() -> None:
    flags = flags_of(
        [
            "vllm",
            "serve",
            "m",
            "--speculative-config",
            '{"method": "ngram"}',
            "--speculative-config.num_speculative_tokens=3",
            "--compilation-config.level",
            "3",
            "--compilation-config.pass_config.x=true",
            "--hf-overrides.size",
            "80g",
            "--hf-overrides.list+",
            "a,b",
            "--hf-overrides.list+=c",
            "--port",
            "8000",
        ]
    )
    # vLLM passes the folded object last: it replaces the whole config given before it
    assert [json.loads(str(v)) for v in flags["--speculative-config"]] == [
        {"method": "ngram"},
        {"num_speculative_tokens": 3},
    ]
    assert json.loads(str(flags["--compilation-config"][-1])) == {
        "level": 3,
        "pass_config": {"x": True},
    }
    assert json.loads(str(flags["--hf-overrides"][-1])) == {
        "size": 80_000_000_000,
        "list": ["a", "b", "c"],
    }
    assert flags["--port"] == ("8000",)


def test_a_dotted_flag_in_the_render_kills_the_speculative_knob(tmp_path: Path) -> None:
    """snapD: `--speculative-config.num_speculative_tokens=3` after the knob's JSON."""
    edit = _render(lambda cmd: cmd.append("--speculative-config.num_speculative_tokens=3"))
    (dead,) = _dead(_spark(tmp_path, edit), "PRIMARY_SPECULATIVE_CONFIG")
    assert dead.path == "--speculative-config"
    assert json.loads(str(dead.observed)) == {"num_speculative_tokens": 3}


# -- 4. JSON values compare by their canonical text -----------------------------------------------
def test_json_values_compare_as_a_template_reads_them() -> None:
    assert not same('{"enable_thinking": false}', '{"enable_thinking": 0}')
    assert not same('{"preserve_thinking": true}', '{"preserve_thinking": 1}')
    assert not same('{"factor": 1}', '{"factor": 1.0}')  # the type is kept: decided, documented
    assert same('{"b": 1, "a": [true]}', '{"a":[true],"b":1}')
    entry, cmd = _example_lane(PRIMARY)
    at = cmd.index('{"preserve_thinking": true}')
    want, got = list(cmd), list(cmd)
    want[at], got[at] = '{"enable_thinking": false}', '{"enable_thinking": 0}'
    (found,) = diff_argv(entry, want, entry, got)
    assert found.path == "--default-chat-template-kwargs"


# -- 5. the last of a repeated flag ---------------------------------------------------------------
def test_a_knob_vllm_honours_last_is_not_dead(tmp_path: Path) -> None:
    """snapC: a compose file's `--max-model-len=4096` before the knob's 262144."""

    def edit(cmd: list[Any]) -> None:
        cmd[cmd.index("--max-model-len=131072")] = "--max-model-len=4096"
        cmd.append("--max-model-len=262144")

    assert _dead(_spark(tmp_path, _render(edit)), "PRIMARY_MAX_MODEL_LEN") == []

    def overridden(cmd: list[Any]) -> None:  # the knob's value first, another one last
        cmd[cmd.index("--max-model-len=131072")] = "--max-model-len=262144"
        cmd.append("--max-model-len=4096")

    (dead,) = _dead(_spark(tmp_path / "2", _render(overridden)), "PRIMARY_MAX_MODEL_LEN")
    assert (dead.desired, dead.observed) == ("262144", "4096")


# -- 6. the stand-in ------------------------------------------------------------------------------
def test_the_stand_in_takes_dotted_flags_as_vllm_does(tmp_path: Path) -> None:
    args = shlex.split(
        "--served-model-name chat --hf-overrides.rope_scaling.factor 2.0 "
        "--compilation-config.level 3 --speculative-config.num_speculative_tokens=3"
    )
    with running(tmp_path, "m", *args) as lane:  # before: exit 2, unrecognized arguments
        assert lane.get("/health")[0] == 200
        assert json.loads(lane.get("/standin/argv")[1])["served_model_name"] == ["chat"]


def test_the_stand_in_answers_an_unknown_model_as_vllm_does(tmp_path: Path) -> None:
    with running(tmp_path, "m", "--served-model-name", "chat") as lane:
        body = {"model": "org/other", "messages": [{"role": "user", "content": "hi"}]}
        answer = collector.http_post_json(lane.base + "/v1/chat/completions", body, 5)
        # the collector's reader (and the audit's: probes.py) takes the type of vLLM's envelope
        assert answer["status"] == 404 and answer["error_type"] == "NotFoundError"
        status, raw = lane.request("POST", "/v1/chat/completions", body)
        error = json.loads(raw)["error"]
        assert status == 404 and error["code"] == 404
        assert error["message"] == "The model `org/other` does not exist."


def test_import_pins_a_repeated_knob_by_the_value_vllm_serves() -> None:
    """The importer's `_live` (a knob is pinned only when the running command line carries
    it) wanted a flag given once: a repeated one, whose last value vLLM serves, was left
    unpinned."""
    from reconciler.importer.lanes import _live

    flags = {"--max-model-len": ["4096", "262144"]}
    assert _live("--max-model-len", "262144", flags)
    assert not _live("--max-model-len", "4096", flags)  # overridden by the later one
