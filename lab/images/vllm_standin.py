#!/usr/bin/env python3
"""A stand-in for vLLM's `vllm serve MODEL --flags…`, for the GPU-less fleet lab.

Installed as `/usr/local/bin/vllm` in the lab's lane images. It is one stdlib-only file so the
image needs nothing but Debian's python3. What it copies from vLLM, because the project tests
depend on it:

- the argv contract: argparse with vLLM's serve flags (`--flag=value` and `--flag value`,
  `--x/--no-x` booleans, JSON-typed configs that must parse, underscores accepted in names,
  `--model` moved to the positional), and argparse's own failure on anything else: exit 2 with
  "unrecognized arguments". lobes' quoting failure modes (an empty argv element, a JSON value
  split into several tokens) therefore crash the lane exactly like the real one;
- the HTTP surface the gateway and the reconciler read: `GET /health` (200, empty body, once
  ready), `GET /v1/models` (`data[].max_model_len`; as vLLM's ModelCard, each card's `created`
  is the time of the request and its one `permission` entry is made anew, with a fresh
  `modelperm-<hex>` id, for each request), `POST /v1/chat/completions`,
  `POST /v1/completions`, `POST /v1/embeddings`, `POST /v1/rerank` (the gateway's embed and
  rerank lanes call these two), `GET /metrics` (Prometheus `vllm:` series),
  `GET /version`;
- auth: `--api-key` (one or more keys) or, failing that, `VLLM_API_KEY` gates every `/v1/*`
  path with `Authorization: Bearer KEY` (401 `{"error": "Unauthorized"}`); `/health`,
  `/metrics` and `/version` stay open, as in vLLM.

What only the stand-in has, so tests can see and steer a lane:
- `GET /standin/argv` and the file `$STANDIN_ARGV_FILE` (default /tmp/vllm-standin-argv.json):
  the argv the process really got, written before parsing so a lane that dies on its argv
  still leaves the evidence.

Environment knobs:
- STANDIN_START_DELAY_S: seconds before the lane reads ready (a real lane takes minutes to
  load weights). Meanwhile the port answers, `/health` and `/v1/*` say 503, `/standin/argv`
  works.
- STANDIN_FAIL: `exit` exits 1 right after a successful parse (an engine that dies at boot);
  `never-healthy` keeps `/health` at 503 forever; `exit-after=S` exits 1 S seconds after it
  became ready (a lane that crashes once serving).
- Per lane: `STANDIN_FAIL_<LANE>` and `STANDIN_START_DELAY_S_<LANE>` win over the plain
  knobs, LANE being the lane's MG_LOG_NAME (which lobes' compose sets per service: PRIMARY,
  WORKER, MULTIMODAL, EMBED, RERANK, HAND, ...) upper-cased. Lanes share `.env` through
  `env_file`, so this is how one lane fails while its neighbours serve.
- A build may bake a default failure into the image (`"fail"` in its build info): the
  `vllm_nightly_broken` catalog image never comes healthy, for "new digest, lane down"
  rollbacks. Any STANDIN_FAIL knob (even empty) overrides it.
- STANDIN_DEFAULT_MAX_MODEL_LEN: the window when `--max-model-len` is absent or `auto`
  (vLLM reads it from the checkpoint; the stand-in has none). Default 32768.
- STANDIN_ARGV_FILE: where the argv record goes.
- STANDIN_BUILD_INFO: JSON file with `version` and `flavor` (default
  /etc/vllm-standin/build.json, written by the image build), reported by `/version`,
  `vllm --version` and `/standin/argv`, so a test can tell which image digest serves.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import math
import os
import re
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"  # vLLM's own default when no model is named
DEFAULT_BUILD_INFO = "/etc/vllm-standin/build.json"
DEFAULT_ARGV_FILE = "/tmp/vllm-standin-argv.json"
FALLBACK_VERSION = "0.0.0+standin"

# --- argv types, shaped like vLLM's (a bad value is an argparse error: exit 2) ---------------


def human_readable_int(value: str) -> int:
    """vLLM accepts 32k (decimal), 32K (binary) and plain integers for sizes."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
        if suffix in decimal:
            return int(float(number) * decimal[suffix])
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}."
            )
        return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    if value.strip() in ("-1", "auto"):
        return -1
    return human_readable_int(value)


def json_value(value: str) -> Any:
    """JSON-typed configs: a split or truncated JSON token must fail, as in vLLM."""
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"Invalid JSON {value!r}: {exc}") from exc


def json_object(value: str) -> dict[str, Any]:
    parsed = json_value(value)
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}")
    return parsed


class LoRAModules(argparse.Action):
    """vLLM's --lora-modules: empty items are skipped, `name=path` (no comma), else JSON."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        modules: list[dict[str, str]] = []
        for item in values or []:
            if not item:
                continue
            if "=" in item and "," not in item:
                name, _, path = item.partition("=")
                if "=" in path:
                    parser.error(f"Invalid format for --lora-modules: {item}")
                modules.append({"name": name, "path": path})
                continue
            try:
                parsed = json.loads(item)
            except json.JSONDecodeError:
                parser.error(f"Invalid JSON format for --lora-modules: {item}")
            if not isinstance(parsed, dict) or not {"name", "path"} <= set(parsed):
                parser.error(f"Invalid fields for --lora-modules: {item}")
            modules.append({"name": str(parsed["name"]), "path": str(parsed["path"])})
        setattr(namespace, self.dest, modules)


def compilation_config(value: str) -> Any:
    """`-O3` style levels or a JSON object, like vLLM's --compilation-config."""
    return int(value) if value.isdigit() else json_object(value)


# --- the serve flags --------------------------------------------------------------------------
# Every flag lobes 0.91.0's fleet template renders for a vLLM lane is here (tests prove it
# against the template itself), plus vLLM's common serve flags. Booleans are
# BooleanOptionalAction, as vLLM generates them from its config dataclasses: `--x` and `--no-x`.


def _flags(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_STR_FLAGS = _flags(
    """
--host --uds --uvicorn-log-level --root-path --chat-template --chat-template-content-format
--response-role --ssl-keyfile --ssl-certfile --ssl-ca-certs --tool-call-parser
--tool-parser-plugin --reasoning-parser --reasoning-parser-plugin --log-config-file
--tokenizer --tokenizer-mode --runner --convert --task --dtype --revision --code-revision
--tokenizer-revision --hf-config-path --allowed-local-media-path --kv-cache-dtype
--config-format --generation-config --model-impl --load-format --download-dir
--attention-backend --distributed-executor-backend --data-parallel-address
--data-parallel-backend --worker-cls --worker-extension-cls --prefix-caching-hash-algo
--mamba-cache-dtype --mamba-ssm-cache-dtype --mamba-backend --mamba-cache-mode
--mm-encoder-tp-mode --mm-encoder-attn-backend --moe-backend --lora-dtype --scheduling-policy
--scheduler-cls --otlp-traces-endpoint --collect-detailed-traces --logprobs-mode
--pt-load-map-location --override-attention-dtype --io-processor-plugin
--show-hidden-metrics-for-version --guided-decoding-backend --safetensors-load-strategy
--quantization --model
"""
)

_INT_FLAGS = _flags(
    """
--port --max-log-len --api-server-count --seed --max-logprobs --max-num-seqs --max-loras
--max-lora-rank --max-cpu-loras --pipeline-parallel-size --tensor-parallel-size
--data-parallel-size --data-parallel-rank --data-parallel-size-local --data-parallel-rpc-port
--max-parallel-loading-workers --block-size --num-gpu-blocks-override --mamba-block-size
--mamba-cache-philox-rounds --max-num-partial-prefills --max-long-partial-prefills
--long-prefill-token-threshold --max-seq-len-to-capture
--optimization-level
"""
)

_FLOAT_FLAGS = _flags(
    "--gpu-memory-utilization --swap-space --cpu-offload-gb --mm-processor-cache-gb"
)

_SIZE_FLAGS = _flags("--max-num-batched-tokens --kv-cache-memory-bytes")

_BOOL_FLAGS = _flags(
    """
--enforce-eager --enable-prefix-caching
--enable-chunked-prefill --async-scheduling --trust-remote-code --enable-auto-tool-choice
--enable-lora --enable-lora-bias --fully-sharded-loras --language-model-only
--enable-mamba-cache-stochastic-rounding --disable-log-stats --enable-log-requests
--disable-log-requests --disable-uvicorn-access-log --allow-credentials
--return-tokens-as-token-ids --disable-frontend-multiprocessing --enable-request-id-headers
--disable-fastapi-docs --enable-prompt-tokens-details --enable-server-load-tracking
--enable-force-include-usage --enable-tokenizer-info-endpoint --enable-log-outputs
--log-error-stack --headless --data-parallel-hybrid-lb --enable-expert-parallel --enable-eplb
--ray-workers-use-nsight --disable-custom-all-reduce --enable-multimodal-encoder-data-parallel
--calculate-kv-scales --kv-sharing-fast-prefill --disable-sliding-window
--disable-cascade-attn --skip-tokenizer-init --enable-prompt-embeds --enable-sleep-mode
--use-tqdm-on-load --disable-mm-preprocessor-cache --interleave-mm-strings --skip-mm-profiling
--disable-chunked-mm-input --disable-hybrid-kv-cache-manager
"""
)

_JSON_FLAGS = _flags(
    """
--speculative-config --hf-overrides --default-chat-template-kwargs --attention-config
--structured-outputs-config --limit-mm-per-prompt --media-io-kwargs --mm-processor-kwargs
--pooler-config --override-pooler-config --override-generation-config
--model-loader-extra-config --kv-transfer-config --kv-events-config --additional-config
--eplb-config --default-mm-loras --allowed-origins --allowed-methods --allowed-headers
"""
)

_LIST_FLAGS = _flags(
    "--served-model-name --api-key --middleware --logits-processors --ignore-patterns"
    " --cuda-graph-sizes"
)

_SHORT = {
    "--quantization": "-q",
    "--tensor-parallel-size": "-tp",
    "--pipeline-parallel-size": "-pp",
    "--data-parallel-size": "-dp",
}


def known_serve_flags() -> frozenset[str]:
    """Every long option `vllm serve` accepts here, `--no-` forms included (tests read this)."""
    flags = set(_STR_FLAGS + _INT_FLAGS + _FLOAT_FLAGS + _SIZE_FLAGS + _JSON_FLAGS + _LIST_FLAGS)
    flags |= {"--max-model-len", "--lora-modules", "--compilation-config", "--hf-token"}
    flags |= set(_BOOL_FLAGS) | {"--no-" + flag[2:] for flag in _BOOL_FLAGS}
    return frozenset(flags)


def _names(flag: str) -> list[str]:
    return [_SHORT[flag], flag] if flag in _SHORT else [flag]


def build_parser(version: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm", description="vLLM CLI (fleet-lab stand-in)")
    parser.add_argument("-v", "--version", action="version", version=version)
    sub = parser.add_subparsers(dest="subparser", required=True)
    serve = sub.add_parser(
        "serve",
        help="Start the vLLM OpenAI Compatible API server.",
        usage="vllm serve [model_tag] [options]",
    )
    serve.add_argument("model_tag", nargs="?", default=None, help="The model tag to serve")
    for flag in _STR_FLAGS:
        serve.add_argument(*_names(flag), type=str, default=None)
    for flag in _INT_FLAGS:
        serve.add_argument(*_names(flag), type=int, default=8000 if flag == "--port" else None)
    for flag in _FLOAT_FLAGS:
        serve.add_argument(flag, type=float, default=None)
    for flag in _SIZE_FLAGS:
        serve.add_argument(flag, type=human_readable_int, default=None)
    for flag in _BOOL_FLAGS:
        serve.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
    for flag in _JSON_FLAGS:
        serve.add_argument(flag, type=json_value, default=None)
    for flag in _LIST_FLAGS:
        serve.add_argument(flag, nargs="+", type=str, default=None)
    serve.add_argument("--max-model-len", type=human_readable_int_or_auto, default=None)
    serve.add_argument("--lora-modules", nargs="+", action=LoRAModules, default=None)
    serve.add_argument("-O", "--compilation-config", type=compilation_config, default=None)
    serve.add_argument("--hf-token", nargs="?", const=True, default=None)
    return parser


def normalise_argv(args: list[str], error: Any) -> list[str]:
    """vLLM's FlexibleArgumentParser pre-pass: `--model X` becomes the positional,
    underscores in a flag's name (before any `.` or `=`) read as dashes, and dotted flags
    (`--hf-overrides.rope_scaling.factor 2.0`) set keys of their JSON flag (`fold_dotted`)."""
    if args[:1] == ["serve"]:
        for index, arg in enumerate(args):
            if arg == "--model" or arg.startswith("--model="):
                if arg == "--model":
                    if index + 1 >= len(args) or args[index + 1].startswith("-"):
                        error("argument --model: expected one argument")
                    tag, rest = args[index + 1], index + 2
                else:
                    tag, rest = arg.removeprefix("--model="), index + 1
                args = ["serve", tag, *args[1:index], *args[rest:]]
                break
    out = []
    for arg in args:
        if arg.startswith("--"):
            key, sep, value = arg.partition("=")
            head, dot, tail = key[2:].partition(".")
            out.append("--" + head.replace("_", "-") + dot + tail + sep + value)
        else:
            out.append(arg)
    return fold_dotted(out)


def fold_dotted(args: list[str]) -> list[str]:
    """vLLM's dotted JSON flags: `--X.a.b=v` or `--X.a.b v` (the next word, whatever it is)
    sets key a.b of one object per X, the value JSON-typed (else a size such as `80g`, else
    the text; `--X.a+ v,w` appends to a list), and every X's object is passed last as
    `--X '{...}'`: it replaces an `--X` given whole (argparse keeps the last). vLLM's
    `parse_args` in vllm/utils/argparse_utils.py."""
    out: list[str] = []
    folded: dict[str, dict[str, Any]] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        key, eq, raw = arg.partition("=")
        if not arg.startswith("-") or "." not in key:
            out.append(arg)
            continue
        if not eq:
            if index >= len(args):
                out.append(arg)  # no value: argparse says so
                continue
            raw = args[index]
            index += 1
        flag, _, path = key.partition(".")
        value: Any
        if path.endswith("+"):
            path, value = path[:-1], raw.split(",")
        else:
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                try:
                    value = human_readable_int(raw)
                except (ValueError, argparse.ArgumentTypeError):
                    value = raw
        for name in reversed(path.split(".")):
            value = {name: value}
        _merge(folded.setdefault(flag, {}), value)
    for flag, merged in folded.items():
        out += [flag, json.dumps(merged)]
    return out


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    """vLLM's recursive_dict_update: objects merge, lists append, anything else replaces."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] += value
        else:
            into[key] = value


# --- lane state -------------------------------------------------------------------------------


def estimate_tokens(text: str) -> int:
    """Deterministic stand-in for a tokenizer: about four UTF-8 bytes per token."""
    return math.ceil(len(text.encode("utf-8")) / 4) if text else 0


def knob(name: str, default: str = "") -> str:
    """A STANDIN_* setting: the lane-specific variable first, then the plain one."""
    lane = re.sub(r"[^A-Za-z0-9]", "_", os.environ.get("MG_LOG_NAME", "")).upper()
    if lane and f"{name}_{lane}" in os.environ:
        return os.environ[f"{name}_{lane}"]
    return os.environ.get(name, default)


class Lane:
    """What one `vllm serve` process serves and how it is doing; shared by handler threads."""

    def __init__(self, ns: argparse.Namespace, record: dict[str, Any], build: dict[str, str]):
        self.model: str = ns.model_tag or ns.model or DEFAULT_MODEL
        self.served: list[str] = list(ns.served_model_name or [self.model])
        default_len = int(os.environ.get("STANDIN_DEFAULT_MAX_MODEL_LEN", "32768"))
        given = ns.max_model_len
        self.max_model_len: int = given if given is not None and given > 0 else default_len
        # vLLM: CLI keys win; VLLM_API_KEY only when no --api-key was given.
        keys = ns.api_key or [os.environ.get("VLLM_API_KEY", "")]
        self.api_keys: list[str] = [key for key in keys if key]
        self.loras: list[dict[str, str]] = list(ns.lora_modules or [])
        self.version = build.get("version", FALLBACK_VERSION)
        self.record = record
        delay = float(knob("STANDIN_START_DELAY_S") or 0)
        self.ready_at = time.monotonic() + max(delay, 0.0)
        fail = knob("STANDIN_FAIL", build.get("fail", ""))
        self.fail_at_start = fail == "exit"
        self.never_healthy = fail == "never-healthy"
        self.exit_after: float | None = (
            float(fail.split("=", 1)[1]) if fail.startswith("exit-after=") else None
        )
        self.lock = threading.Lock()
        self.counters = {"prompt": 0, "generation": 0, "success": 0, "running": 0}

    def ready(self) -> bool:
        return not self.never_healthy and time.monotonic() >= self.ready_at

    def authorised(self, header: str | None) -> bool:
        if not self.api_keys:
            return True
        offered = (header or "").encode()
        return any(hmac.compare_digest(offered, f"Bearer {k}".encode()) for k in self.api_keys)

    def models_payload(self) -> dict[str, Any]:
        # vLLM builds each card for the request (serving_models.show_available_models):
        # ModelCard's `created` and ModelPermission's `created` default to int(time.time()),
        # the permission's `id` to f"modelperm-{random_uuid()}" (uuid4().hex). So no two
        # answers are alike, which a diff of observations must take in its stride.
        data: list[dict[str, Any]] = [
            {
                "id": name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": self.model,
                "parent": None,
                "max_model_len": self.max_model_len,
                "permission": [model_permission()],
            }
            for name in self.served
        ]
        data += [
            {
                "id": lora["name"],
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": lora["path"],
                "parent": self.served[0],
                "max_model_len": None,
                "permission": [model_permission()],
            }
            for lora in self.loras
        ]
        return {"object": "list", "data": data}

    def metrics_text(self) -> str:
        with self.lock:
            counters = dict(self.counters)
        label = f'model_name="{self.served[0]}"'
        series = [
            (
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution.",
                counters["running"],
            ),
            ("vllm:num_requests_waiting", "gauge", "Number of requests waiting.", 0),
            ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent.", 0.0),
            (
                "vllm:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                counters["prompt"],
            ),
            (
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens.",
                counters["generation"],
            ),
            (
                "vllm:request_success_total",
                "counter",
                "Count of successfully processed requests.",
                counters["success"],
            ),
        ]
        lines = []
        for name, kind, help_text, value in series:
            lines += [
                f"# HELP {name} {help_text}",
                f"# TYPE {name} {kind}",
                f"{name}{{{label}}} {value}",
            ]
        info = f'{label},max_model_len="{self.max_model_len}",version="{self.version}"'
        lines += [
            "# HELP vllm:standin_info Stand-in build and window.",
            "# TYPE vllm:standin_info gauge",
            f"vllm:standin_info{{{info}}} 1",
        ]
        return "\n".join(lines) + "\n"


def model_permission() -> dict[str, Any]:
    """vLLM's ModelPermission() with its defaults (entrypoints/openai protocol), made anew."""
    return {
        "id": f"modelperm-{uuid.uuid4().hex}",
        "object": "model_permission",
        "created": int(time.time()),
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }


def _error(message: str, code: int, kind: str) -> dict[str, Any]:
    """vLLM's ErrorResponse (since 0.10; the flat `{"object": "error", ...}` before): the
    OpenAI envelope, `code` the HTTP status. The gateway relays it, the collector and the
    audit read its `error.type`."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _text_of(content: Any) -> str:
    """OpenAI message content is a string or a list of typed parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


# --- HTTP -------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"  # what vLLM's server header says
    sys_version = ""
    protocol_version = "HTTP/1.1"
    lane: Lane  # set on the subclass built in serve()

    def log_message(self, format: str, *args: Any) -> None:
        print(f"INFO:     {self.client_address[0]} - {format % args}", flush=True)

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode())

    def _gate(self) -> bool:
        """Auth for /v1/*, then readiness; True when the request may proceed."""
        if self.path.startswith("/v1") and not self.lane.authorised(
            self.headers.get("Authorization")
        ):
            self._json(401, {"error": "Unauthorized"})
            return False
        if not self.lane.ready():
            self._json(503, _error("The server is still starting.", 503, "ServiceUnavailable"))
            return False
        return True

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/ping"):
            self._send(200 if self.lane.ready() else 503, b"")
        elif path == "/version":
            self._json(200, {"version": self.lane.version})
        elif path == "/standin/argv":
            self._json(200, self.lane.record)
        elif path == "/metrics":
            self._send(200, self.lane.metrics_text().encode(), "text/plain; version=0.0.4")
        elif path == "/v1/models":
            if self._gate():
                self._json(200, self.lane.models_payload())
        elif path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/rerank"):
            self._json(405, {"detail": "Method Not Allowed"})
        else:
            self._json(404, {"detail": "Not Found"})

    do_HEAD = do_GET

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        routes = {
            "/v1/chat/completions": self._chat,
            "/v1/completions": self._completion,
            "/v1/embeddings": self._embeddings,
            "/v1/rerank": self._rerank,
            "/v2/rerank": self._rerank,
            "/rerank": self._rerank,
        }
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path not in routes:
            if path in ("/health", "/ping", "/version", "/metrics", "/v1/models"):
                self._json(405, {"detail": "Method Not Allowed"})
            else:
                self._json(404, {"detail": "Not Found"})
            return
        if not self._gate():
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("request body must be a JSON object")
        except ValueError as exc:
            self._json(400, _error(f"Invalid request body: {exc}", 400, "BadRequestError"))
            return
        model = body.get("model") or self.lane.served[0]
        known = set(self.lane.served) | {lora["name"] for lora in self.lane.loras}
        if model not in known:
            self._json(404, _error(f"The model `{model}` does not exist.", 404, "NotFoundError"))
            return
        with self.lane.lock:
            self.lane.counters["running"] += 1
        try:
            routes[path](body, str(model))
        finally:
            with self.lane.lock:
                self.lane.counters["running"] -= 1

    def _budget(self, prompt_tokens: int, body: dict[str, Any]) -> int | None:
        """vLLM's window checks; returns the completion budget, or None after a 400."""
        window = self.lane.max_model_len
        if prompt_tokens > window:
            self._json(
                400,
                _error(
                    f"This model's maximum context length is {window} tokens. However, your "
                    f"request has {prompt_tokens} input tokens. Please reduce the length of the "
                    "input messages.",
                    400,
                    "BadRequestError",
                ),
            )
            return None
        wanted = body.get("max_completion_tokens") or body.get("max_tokens")
        if wanted is not None and prompt_tokens + int(wanted) > window:
            self._json(
                400,
                _error(
                    f"'max_tokens' or 'max_completion_tokens' is too large: {wanted}. This model's "
                    f"maximum context length is {window} tokens and your request has "
                    f"{prompt_tokens} input tokens ({wanted} > {window} - {prompt_tokens}).",
                    400,
                    "BadRequestError",
                ),
            )
            return None
        return int(wanted) if wanted is not None else window - prompt_tokens

    def _reply(self, model: str, prompt: str, budget: int) -> tuple[str, int, str]:
        digest = hashlib.sha256(f"{model}\n{prompt}".encode()).hexdigest()[:12]
        text = f"[vllm stand-in {model}] {digest}: {prompt[-120:]}".strip()
        tokens = estimate_tokens(text)
        if tokens > budget:
            return text[: budget * 4], budget, "length"
        return text, tokens, "stop"

    def _account(self, prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
        with self.lane.lock:
            self.lane.counters["prompt"] += prompt_tokens
            self.lane.counters["generation"] += completion_tokens
            self.lane.counters["success"] += 1
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def _chat(self, body: dict[str, Any], model: str) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            self._json(400, _error("messages must be a non-empty list", 400, "BadRequestError"))
            return
        texts = [_text_of(m.get("content")) for m in messages if isinstance(m, dict)]
        prompt_tokens = sum(estimate_tokens(t) + 3 for t in texts)  # ~chat-template overhead
        budget = self._budget(prompt_tokens, body)
        if budget is None:
            return
        text, completion_tokens, finish = self._reply(model, texts[-1] if texts else "", budget)
        usage = self._account(prompt_tokens, completion_tokens)
        ident = (
            "chatcmpl-" + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]
        )
        created = int(time.time())
        if body.get("stream"):
            deltas = [{"role": "assistant", "content": ""}, {"content": text}]
            chunks = [
                {
                    "id": ident,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "delta": d, "finish_reason": None}],
                }
                for d in deltas
            ]
            chunks.append(
                {
                    "id": ident,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                    "usage": usage,
                }
            )
            self._stream(chunks)
            return
        self._json(
            200,
            {
                "id": ident,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": finish,
                        "logprobs": None,
                        "message": {
                            "role": "assistant",
                            "content": text,
                            "tool_calls": [],
                            "reasoning_content": None,
                        },
                    }
                ],
                "usage": usage,
            },
        )

    def _completion(self, body: dict[str, Any], model: str) -> None:
        prompt = body.get("prompt", "")
        prompt_text = " ".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)
        prompt_tokens = estimate_tokens(prompt_text)
        budget = self._budget(prompt_tokens, body)
        if budget is None:
            return
        text, completion_tokens, finish = self._reply(model, prompt_text, budget)
        usage = self._account(prompt_tokens, completion_tokens)
        ident = "cmpl-" + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        payload = {
            "id": ident,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": usage,
        }
        if body.get("stream"):
            self._stream([payload])
            return
        self._json(200, payload)

    def _embeddings(self, body: dict[str, Any], model: str) -> None:
        raw = body.get("input", "")
        inputs = raw if isinstance(raw, list) else [raw]
        dims = int(body.get("dimensions") or 8)
        data = []
        for index, item in enumerate(inputs):
            seed = hashlib.sha256(str(item).encode()).digest()
            vector = [round(seed[i % len(seed)] / 255.0 - 0.5, 6) for i in range(dims)]
            data.append({"object": "embedding", "index": index, "embedding": vector})
        prompt_tokens = sum(estimate_tokens(str(item)) for item in inputs)
        usage = self._account(prompt_tokens, 0)
        self._json(200, {"object": "list", "model": model, "data": data, "usage": usage})

    def _rerank(self, body: dict[str, Any], model: str) -> None:
        """vLLM's Jina/Cohere-style rerank: deterministic scores from a hash of the pair."""
        query = str(body.get("query", ""))
        documents = body.get("documents") or []
        if not isinstance(documents, list):
            self._json(400, _error("documents must be a list", 400, "BadRequestError"))
            return
        results: list[dict[str, Any]] = []
        for index, doc in enumerate(documents):
            text = str(doc.get("text", "")) if isinstance(doc, dict) else str(doc)
            seed = hashlib.sha256(f"{query}\0{text}".encode()).digest()
            score = round(int.from_bytes(seed[:4], "big") / 2**32, 6)
            results.append({"index": index, "document": {"text": text}, "relevance_score": score})
        results.sort(key=lambda item: -item["relevance_score"])
        top_n = body.get("top_n")
        if isinstance(top_n, int) and top_n > 0:
            results = results[:top_n]
        tokens = estimate_tokens(query) * max(len(documents), 1) + sum(
            estimate_tokens(r["document"]["text"]) for r in results
        )
        self._account(tokens, 0)
        ident = (
            "rerank-" + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]
        )
        self._json(
            200,
            {"id": ident, "model": model, "usage": {"total_tokens": tokens}, "results": results},
        )

    def _stream(self, chunks: list[dict[str, Any]]) -> None:
        """Server-sent events; the connection closes after `[DONE]` (no chunked encoding)."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


# --- process ----------------------------------------------------------------------------------


def _load_build_info() -> dict[str, str]:
    path = os.environ.get("STANDIN_BUILD_INFO", DEFAULT_BUILD_INFO)
    try:
        with open(path, encoding="utf-8") as handle:
            info = json.load(handle)
        return {str(k): str(v) for k, v in info.items()} if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def _record_argv(argv: list[str], build: dict[str, str]) -> dict[str, Any]:
    """Written before parsing: a lane that dies on its argv must still show what it got."""
    record: dict[str, Any] = {
        "argv": argv,
        "executable": sys.argv[0],
        "pid": os.getpid(),
        "build": build,
        "knobs": {k: v for k, v in os.environ.items() if k.startswith("STANDIN_")},
    }
    path = os.environ.get("STANDIN_ARGV_FILE", DEFAULT_ARGV_FILE)
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1)
    except OSError as exc:
        print(f"WARNING: cannot record argv in {path}: {exc}", file=sys.stderr, flush=True)
    return record


def serve(ns: argparse.Namespace, record: dict[str, Any], build: dict[str, str]) -> int:
    lane = Lane(ns, record, build)
    record["served_model_name"] = lane.served
    record["max_model_len"] = lane.max_model_len
    if lane.fail_at_start:
        print("ERROR: EngineCore failed to start (STANDIN_FAIL=exit)", file=sys.stderr, flush=True)
        return 1
    host = ns.host or "0.0.0.0"
    handler = type("LaneHandler", (Handler,), {"lane": lane})
    try:
        server = (_Server6 if ":" in host else _Server)((host, ns.port), handler)
    except OSError as exc:
        print(
            f"ERROR: [Errno {exc.errno}] cannot bind {host}:{ns.port}: {exc.strerror}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    stop = threading.Event()
    exit_code = [0]

    def on_signal(signum: int, _frame: Any) -> None:
        print(f"INFO:     Shutting down (signal {signum})", flush=True)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # A short poll interval: shutdown() waits for the loop, and `docker stop` should be quick.
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="http", daemon=True
    ).start()
    print(f"INFO: vLLM API server version {lane.version} (fleet-lab stand-in)", flush=True)
    print(f"INFO: args: {record['argv']}", flush=True)
    print(f"INFO: Starting vLLM API server 0 on http://{host}:{ns.port}", flush=True)
    # Readiness is announced once, like uvicorn's line; the wait is on the stop event so a
    # SIGTERM during the simulated boot still ends the process at once.
    if not lane.never_healthy and not stop.wait(max(lane.ready_at - time.monotonic(), 0)):
        print("INFO:     Application startup complete.", flush=True)
        if lane.exit_after is not None and not stop.wait(lane.exit_after):
            print("ERROR: EngineCore died (STANDIN_FAIL=exit-after)", file=sys.stderr, flush=True)
            exit_code[0] = 1
            stop.set()
    stop.wait()
    server.shutdown()
    server.server_close()
    return exit_code[0]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    build = _load_build_info()
    record = _record_argv(args, build)
    parser = build_parser(build.get("version", FALLBACK_VERSION))

    def fail(message: str) -> NoReturn:
        parser.error(message)

    ns = parser.parse_args(normalise_argv(args, fail))
    return serve(ns, record, build)


if __name__ == "__main__":
    sys.exit(main())
