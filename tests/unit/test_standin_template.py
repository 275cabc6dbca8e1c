"""The stand-in against the real lobes 0.91.0 fleet template and its lane wrapper.

The template's vLLM `command:` blocks are rendered here the way compose does it (`${VAR…}`
interpolation, then shell-lexing for the folded string commands), filtered the way
`mg-logwrap` filters them, and parsed by the stand-in's own parser. Flags are taken from the
template text, not from a hand list, so a lobes template that grows a flag the stand-in does
not know fails here first.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from lab import config
from lab.images import vllm_standin
from lab.images.wheels import MG_LOGWRAP_MEMBER, TEMPLATE_MEMBER, cached_wheels, read_member

STANDIN = Path(vllm_standin.__file__).resolve()


@pytest.fixture(scope="session")
def lobes_wheel() -> Path:
    """The lobes-cli 0.91.0 wheel: $LOBES_WHEEL, else the one the machine set-up fetched.

    Never downloaded here (a test run needs no package index); missing, the test fails and
    says which set-up fetches it."""
    given = os.environ.get("LOBES_WHEEL")
    if given:
        return Path(given)
    try:
        return cached_wheels(config.CACHE_DIR)[0]
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def services(lobes_wheel: Path) -> dict[str, Any]:
    return YAML(typ="safe").load(read_member(lobes_wheel, TEMPLATE_MEMBER))["services"]


@pytest.fixture(scope="session")
def vllm_lanes(services: dict[str, Any]) -> dict[str, Any]:
    lanes = {}
    for name, svc in services.items():
        cmd = svc.get("command")
        head = cmd.split()[:2] if isinstance(cmd, str) else (cmd or [])[:2]
        if list(head) == ["vllm", "serve"]:
            lanes[name] = cmd
    return lanes


# --- compose's interpolation and lexing, as far as the template uses them --------------------


def interpolate(text: str, env: dict[str, str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("${", i):
            j, depth = i + 2, 1
            while depth:
                if text.startswith("${", j):
                    depth, j = depth + 1, j + 2
                    continue
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            out.append(_expand(text[i + 2 : j - 1], env))
            i = j
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _expand(inner: str, env: dict[str, str]) -> str:
    match = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(:?[-+])?(.*)", inner, re.S)
    assert match, inner
    name, op, rest = match.groups()
    value = env.get(name)
    if op is None:
        return value or ""
    if op == ":-":
        return value if value else interpolate(rest, env)
    if op == "-":
        return value if value is not None else interpolate(rest, env)
    if op == ":+":
        return interpolate(rest, env) if value else ""
    return interpolate(rest, env) if value is not None else ""


def render(command: str | list[str], env: dict[str, str]) -> list[str]:
    """The argv compose hands the container: a string is lexed after substitution."""
    if isinstance(command, str):
        return shlex.split(interpolate(command, env))
    return [interpolate(item, env) for item in command]


def wrapped(argv: list[str]) -> list[str]:
    """mg-logwrap drops exactly the arguments its `--*=` case matches."""
    return [arg for arg in argv if not (arg.startswith("--") and arg.endswith("="))]


def parse(argv: list[str]) -> Any:
    assert argv[0] == "vllm"
    parser = vllm_standin.build_parser("test")
    return parser.parse_args(vllm_standin.normalise_argv(argv[1:], parser.error))


SPEC = '{"method": "mtp", "num_speculative_tokens": 2}'
YARN = '{"text_config": {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}}'
# Every optional knob the template reads, set the way env.example documents (values as they
# reach compose after .env parsing: a spec config keeps its inner single quotes).
ARMED = {
    "WORKER_KV_CACHE_DTYPE": "fp8",
    "WORKER_ATTENTION_BACKEND": "TRITON_ATTN",
    "WORKER_MOE_BACKEND": "triton",
    "WORKER_LOAD_FORMAT": "runai_streamer",
    "WORKER_MM_ENCODER_ATTN_BACKEND": "TORCH_SDPA",
    "WORKER_MAX_NUM_SEQS": "8",
    "WORKER_MAX_NUM_BATCHED_TOKENS": "16384",
    "WORKER_CHUNKED_PREFILL": "--enable-chunked-prefill",
    "WORKER_ASYNC_SCHEDULING": "--async-scheduling",
    "WORKER_PREFIX_CACHING": "--enable-prefix-caching",
    "WORKER_SPECULATIVE_CONFIG": f"'--speculative-config={SPEC}'",
    "ASSOCIATE_MAX_NUM_SEQS": "2",
    "ASSOCIATE_SPECULATIVE_CONFIG": f"'--speculative-config={SPEC}'",
    "PRIMARY_SPECULATIVE_CONFIG": "",  # the documented off-switch
    "PRIMARY_HF_OVERRIDES": YARN,
    "MULTIMODAL_SPECULATIVE_CONFIG": "",
    "RERANK_ENFORCE_EAGER": "--enforce-eager",
    "HAND_LORA_MODULES": "legal=/adapters/legal",
}
NEGATED = {
    "WORKER_CHUNKED_PREFILL": "--no-enable-chunked-prefill",
    "WORKER_ASYNC_SCHEDULING": "--no-async-scheduling",
    "WORKER_PREFIX_CACHING": "--no-enable-prefix-caching",
    "ASSOCIATE_PREFIX_CACHING": "--no-enable-prefix-caching",
    "ASSOCIATE_MAMBA_CACHE_STOCHASTIC_ROUNDING": "--no-enable-mamba-cache-stochastic-rounding",
    "RERANK_ENFORCE_EAGER": "--no-enforce-eager",
}
SCENARIOS = {"defaults": {}, "armed": ARMED, "negated": NEGATED}


def test_template_has_the_vllm_lanes(vllm_lanes: dict[str, Any]) -> None:
    expected = {"vllm-primary", "vllm-worker", "vllm-associate", "vllm-multimodal",
                "vllm-embed", "vllm-rerank", "vllm-hand"}  # fmt: skip
    assert expected <= set(vllm_lanes)


def test_every_flag_the_template_can_render_is_known(vllm_lanes: dict[str, Any]) -> None:
    # Raw text, so flags behind `${VAR:+--flag=…}` count even when no scenario renders them.
    text = "\n".join(c if isinstance(c, str) else "\n".join(c) for c in vllm_lanes.values())
    flags = set(re.findall(r"--[a-z][a-z0-9-]*", text))
    assert len(flags) > 25
    assert flags - vllm_standin.known_serve_flags() == set()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_lane_argv_parses(vllm_lanes: dict[str, Any], scenario: str) -> None:
    env = SCENARIOS[scenario]
    for lane, command in vllm_lanes.items():
        argv = wrapped(render(command, env))
        try:
            ns = parse(argv)
        except SystemExit as exc:  # argparse's exit: report which lane and argv
            raise AssertionError(f"{lane} ({scenario}) rejected: {argv}") from exc
        assert ns.port == 8000 and ns.host == "0.0.0.0", lane
        assert ns.max_model_len and ns.max_model_len > 0, lane
        for field in ("speculative_config", "hf_overrides", "attention_config"):
            value = getattr(ns, field)
            assert value is None or isinstance(value, dict), (lane, field, value)


def test_rendered_values_reach_the_parser(vllm_lanes: dict[str, Any]) -> None:
    primary = parse(wrapped(render(vllm_lanes["vllm-primary"], {})))
    assert primary.max_model_len == 131072
    assert primary.speculative_config == {"method": "mtp", "num_speculative_tokens": 2}
    assert primary.hf_overrides == {}
    assert primary.default_chat_template_kwargs == {"preserve_thinking": True}
    assert primary.enable_prefix_caching is True

    armed = parse(wrapped(render(vllm_lanes["vllm-primary"], ARMED)))
    assert armed.speculative_config is None
    assert armed.hf_overrides == json.loads(YARN)

    worker = parse(wrapped(render(vllm_lanes["vllm-worker"], ARMED)))
    assert worker.speculative_config == json.loads(SPEC)
    assert (worker.enable_chunked_prefill, worker.async_scheduling) == (True, True)
    assert worker.attention_config == {"backend": "TRITON_ATTN"}
    off = parse(wrapped(render(vllm_lanes["vllm-worker"], NEGATED)))
    assert (off.enable_chunked_prefill, off.async_scheduling) == (False, False)
    assert off.enable_prefix_caching is False

    hand = parse(wrapped(render(vllm_lanes["vllm-hand"], ARMED)))
    assert hand.lora_modules == [{"name": "legal", "path": "/adapters/legal"}]
    rerank = parse(wrapped(render(vllm_lanes["vllm-rerank"], {})))
    assert rerank.enforce_eager is False


def test_lobes_quoting_failures_crash_like_vllm(vllm_lanes: dict[str, Any]) -> None:
    # .env without the inner single quotes: compose's lexer splits the JSON into tokens.
    unquoted = {"WORKER_SPECULATIVE_CONFIG": f"--speculative-config={SPEC}"}
    with pytest.raises(SystemExit) as exc:
        parse(wrapped(render(vllm_lanes["vllm-worker"], unquoted)))
    assert exc.value.code == 2
    # A list command cannot drop an item: a variable rendered to "" stays an empty element.
    argv = [*wrapped(render(vllm_lanes["vllm-embed"], {})), ""]
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_mg_logwrap_starts_the_standin(
    lobes_wheel: Path, vllm_lanes: dict[str, Any], tmp_path: Path
) -> None:
    """The real wrapper, lab knobs (no boot hold, no start counter, no memory gate), the hand
    lane's default argv with its empty `--lora-modules=`: the lane must come up."""
    wrapper = tmp_path / "mg-logwrap"
    wrapper.write_text(read_member(lobes_wheel, MG_LOGWRAP_MEMBER))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "vllm").symlink_to(STANDIN)
    port = _free_port()
    argv = render(vllm_lanes["vllm-hand"], {})
    assert "--lora-modules=" in argv
    argv += [f"--port={port}", "--host=127.0.0.1"]  # argparse: the last one wins
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("STANDIN_", "VLLM_"))},
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "MG_LOG_DIR": str(tmp_path / "logs"),
        "MG_LOG_NAME": "hand",
        "LOBES_BOOT_DELAY_S": "0",
        "LOBES_START_MAX": "0",
        "LOBES_MEM_GATE": "0",
        "STANDIN_ARGV_FILE": str(tmp_path / "argv.json"),
    }
    proc = subprocess.Popen(["bash", str(wrapper), *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert proc.poll() is None, f"lane exited {proc.returncode}"
                assert time.monotonic() < deadline, "lane never came healthy"
                time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/standin/argv", timeout=2) as r:
            got = json.loads(r.read())["argv"]
        assert got == [a for a in argv[1:] if a != "--lora-modules="]
        assert list((tmp_path / "logs").glob("hand-*.log"))
    finally:
        proc.send_signal(signal.SIGTERM)  # the wrapper exec'd: this reaches the stand-in
        assert proc.wait(timeout=5) == 0
