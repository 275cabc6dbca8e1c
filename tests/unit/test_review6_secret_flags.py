"""Review 6, item 1: a flag whose last word names a credential (`--token`, `--key`,
`--credentials`: the scrubber's rule) is a secret's flag everywhere, by ONE rule
(reconciler/scrub.py `secret_flag`, the collector's `Run.secret_flag` a copy of it):

- the box hashes its value (`--token x` as two argv words, `--token=x`, inside a `sh -c`
  word), where before only the floor's and the fleet's patterns named a flag there, so `x`
  left the box in clear, into saved snapshots and the history;
- the reports' guard masks a drift under it (`cause argv --token (absent) -> x` printed `x` in
  text, JSON, markdown and html: `secret_path` knew only the patterns), and so does the store;
- a desired `--token x` still compares in sync with the box's hashed form (the render's line
  and the container's are masked alike), and a changed one reads `changed`;
- none of vLLM's own flags that hold no secret is taken for one (`--tokenizer`,
  `--max-num-batched-tokens`, `--ssl-keyfile`, ... and `--allow-credentials`, a switch the
  floor's `*_CREDENTIALS` named, so the box hashed the model written after it).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.images.vllm_standin import known_serve_flags
from reconciler import scrub
from reconciler.compare.drift import SecretValue
from reconciler.desired import secret_names
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from reconciler.history import masking
from reconciler.history.observed import comparable
from reconciler.report import render
from reconciler.report.values import guarded, secret_path
from tests.unit.conftest import load_box_program

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"
FORMATS = ("text", "json", "markdown", "html")


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


CLEAR = ("c6-token-4711", "c6-key-4712", "c6-creds-4713", "c6-eq-4714", "c6-dbcred-4715")

# vLLM's serve flags as its sources declare them (vllm/engine/arg_utils.py EngineArgs and
# add_cli_args, vllm/entrypoints/openai/cli_args.py FrontendArgs and make_arg_parser), older
# releases' included (`--max-prompt-adapter-token`, `--tokenizer-pool-*`, `--speculative-*`),
# beside the lab stand-in's list. Only `--api-key` and `--hf-token` hold a secret.
VLLM_FLAGS = _words(
    """
--model --served-model-name --tokenizer --hf-config-path --runner --convert --task
--skip-tokenizer-init --enable-prompt-embeds --tokenizer-mode --trust-remote-code
--allowed-local-media-path --allowed-media-domains --download-dir --safetensors-load-strategy
--load-format --config-format --dtype --kv-cache-dtype --seed --max-model-len --cuda-graph-sizes
--cudagraph-capture-sizes --max-cudagraph-capture-size --distributed-executor-backend
--pipeline-parallel-size --tensor-parallel-size --decode-context-parallel-size
--data-parallel-size --data-parallel-rank --data-parallel-start-rank --data-parallel-size-local
--data-parallel-address --data-parallel-rpc-port --data-parallel-hybrid-lb
--data-parallel-backend --enable-expert-parallel --all2all-backend --enable-dbo
--dbo-decode-token-threshold --dbo-prefill-token-threshold --disable-nccl-for-dp-synchronization
--eplb-config --enable-eplb --expert-placement-strategy --num-redundant-experts
--eplb-window-size --eplb-step-interval --eplb-log-balancedness --max-parallel-loading-workers
--block-size --enable-prefix-caching --prefix-caching-hash-algo --disable-sliding-window
--disable-cascade-attn --swap-space --cpu-offload-gb --gpu-memory-utilization
--kv-cache-memory-bytes --max-num-batched-tokens --max-num-partial-prefills
--max-long-partial-prefills --long-prefill-token-threshold --max-num-seqs --max-logprobs
--logprobs-mode --disable-log-stats --aggregate-engine-logging --revision --code-revision
--rope-scaling --rope-theta --hf-token --hf-overrides --tokenizer-revision --quantization
--enforce-eager --disable-custom-all-reduce --limit-mm-per-prompt --enable-mm-embeds
--interleave-mm-strings --media-io-kwargs --mm-processor-kwargs --disable-mm-preprocessor-cache
--mm-processor-cache-gb --mm-processor-cache-type --mm-shm-cache-max-object-size-mb
--mm-encoder-tp-mode --mm-encoder-attn-backend --io-processor-plugin --skip-mm-profiling
--video-pruning-rate --enable-lora --max-loras --max-lora-rank --default-mm-loras
--fully-sharded-loras --max-cpu-loras --lora-dtype --lora-extra-vocab-size
--ray-workers-use-nsight --num-gpu-blocks-override --num-lookahead-slots
--model-loader-extra-config --ignore-patterns --enable-chunked-prefill --disable-chunked-mm-input
--disable-hybrid-kv-cache-manager --structured-outputs-config --reasoning-parser
--guided-decoding-backend --guided-decoding-disable-fallback
--guided-decoding-disable-any-whitespace --guided-decoding-disable-additional-properties
--logits-processor-pattern --speculative-config --show-hidden-metrics-for-version
--otlp-traces-endpoint --collect-detailed-traces --scheduling-policy --scheduler-cls
--pooler-config --override-pooler-config --compilation-config --worker-cls
--worker-extension-cls --kv-transfer-config --kv-events-config --generation-config
--enable-sleep-mode --override-generation-config --model-impl --override-attention-dtype
--calculate-kv-scales --mamba-cache-dtype --mamba-ssm-cache-dtype --mamba-block-size
--additional-config --use-tqdm-on-load --pt-load-map-location
--enable-multimodal-encoder-data-parallel --logits-processors --async-scheduling
--kv-sharing-fast-prefill
--lora-modules --chat-template --chat-template-content-format --trust-request-chat-template
--default-chat-template-kwargs --response-role --return-tokens-as-token-ids
--enable-auto-tool-choice --exclude-tools-when-tool-choice-none --tool-call-parser
--tool-parser-plugin --tool-server --log-config-file --max-log-len --enable-prompt-tokens-details
--enable-per-request-metrics --enable-server-load-tracking --enable-force-include-usage
--enable-tokenizer-info-endpoint --enable-log-outputs --enable-log-deltas --log-error-stack
--tokens-only --fingerprint-mode --fingerprint-value --host --port --uds --uvicorn-log-level
--disable-uvicorn-access-log --disable-access-log-for-endpoints --allow-credentials
--allowed-origins --allowed-methods --allowed-headers --api-key --ssl-keyfile --ssl-certfile
--ssl-ca-certs --enable-ssl-refresh --ssl-cert-reqs --ssl-ciphers --root-path --middleware
--enable-request-id-headers --disable-fastapi-docs --h11-max-incomplete-event-size
--h11-max-header-count --enable-offline-docs --headless --api-server-count --config --grpc
--max-prompt-adapter-token --enable-prompt-adapter --max-prompt-adapters --prompt-adapters
--tokenizer-pool-size --tokenizer-pool-type --tokenizer-pool-extra-config
--num-speculative-tokens --speculative-model --speculative-max-model-len
--speculative-disable-by-batch-size --spec-decoding-acceptance-method --disable-log-requests
--enable-log-requests --intial-incremental-detokenization-offset --max-seq-len-to-capture
--disable-frontend-multiprocessing --prompt-adapters
"""
)
SECRET_FLAGS = {"--api-key", "--hf-token"}
# The stand-in's list holds the `--no-` form of each switch (vLLM's BooleanOptionalAction).
ALL_VLLM = {*VLLM_FLAGS, *known_serve_flags()}


@pytest.fixture(autouse=True)
def _no_fleet_patterns() -> Iterator[None]:
    secret_names.adopt_fleet_patterns(())
    yield
    secret_names.adopt_fleet_patterns(())


def _collector() -> Any:
    return load_box_program("fleet_collector_review6", "reconciler/observe/remote/collector.py")


def _run(patterns: list[str] | None = None, key: str = "k" * 32) -> Any:
    return _collector().Run(
        {"run_key": key, "secret_patterns": patterns or [], "directory": "/nonexistent"}
    )


# -- the box --------------------------------------------------------------------------------------
def test_the_box_hashes_a_credential_flags_value_in_argv_and_inside_a_word() -> None:
    run = _run()
    argv = ["vllm", "serve", "org/model", "--token", CLEAR[0], "--key", CLEAR[1]]
    argv += ["--credentials", CLEAR[2], f"--token={CLEAR[3]}", "--db-credential", CLEAR[4]]
    argv += ["--port", "8000", "--token", "-v", "--max-num-batched-tokens", "8192"]
    masked = run.mask_argv(argv)
    shown = json.dumps(masked)
    assert not any(clear in shown for clear in CLEAR), shown
    for at in (4, 6, 8, 11):
        assert set(masked[at]) == {"secret"}, masked
    assert masked[9].startswith('--token={"secret": "hmac:')
    # What names no secret stays in sight; `--token -v` is two flags, as the reports read it.
    assert masked[12:] == ["--port", "8000", "--token", "-v", "--max-num-batched-tokens", "8192"]
    script = f"exec vllm serve m --token {CLEAR[0]} --key={CLEAR[1]} --port 8000 --token -v"
    word = run.mask_argv(["sh", "-c", script])[2]
    assert CLEAR[0] not in word and CLEAR[1] not in word
    assert word.endswith("--port 8000 --token -v")
    # The reports' mask of the same word masks what the box hashed, and only that.
    assert scrub.mask_credentials(script).count("***") == word.count("hmac:") == 2


def test_the_box_and_the_guards_judge_a_flag_by_one_rule() -> None:
    collector = _collector()
    assert collector.CREDENTIAL_WORDS == scrub.CREDENTIAL_WORDS
    assert collector.PLAIN_FLAGS == scrub.PLAIN_FLAGS
    made_up = [
        "--token", "--key", "--credentials", "--credential", "--Token", "--KEY", "--secret",
        "--db-credential", "--client_secret", "--hf_token", "--api_key", "--x-token-key",
        "--hf--token", "---token", "--token-x", "--tokens", "--keys", "--ssl-key", "--a.token",
        "--t\u00f6ken", "--\u212aey", "--\u017fecret", "--db-cred", "--openai-org", "--", "-",
        "--password", "--passwd", "--x_passwd", "--monkey", "--turkey-key", "--tokenizer",
    ]  # fmt: skip
    flags = sorted({*ALL_VLLM, *made_up})
    for patterns in ([], ["*_CRED", "OPENAI_ORG"]):
        secret_names.adopt_fleet_patterns(patterns)
        run = _run(patterns)
        for flag in flags:
            assert run.secret_flag(flag) == scrub.secret_flag(flag), (patterns, flag)
            assert collector.credential_flag(flag) == scrub.credential_flag(flag), flag
            # The name of a drift under the flag reads the same (the reports, the store).
            assert secret_path(flag) == scrub.secret_flag(flag), (patterns, flag)
    # The text scanners' expression reads a flag as the rule does (ASCII flags).
    for flag in flags:
        if flag.isascii() and flag not in scrub.PLAIN_FLAGS:
            found = re.fullmatch(scrub._FLAG_NAME, flag) is not None
            assert found == scrub.credential_flag(flag), flag


def test_no_flag_of_vllm_but_its_secrets_is_taken_for_a_secret() -> None:
    assert len(ALL_VLLM) > 250  # the lists are there: the check below means something
    run = _run()
    judged = {
        flag
        for flag in ALL_VLLM
        if run.secret_flag(flag) or scrub.secret_flag(flag) or secret_path(flag)
    }
    assert judged == SECRET_FLAGS
    for flag in sorted(ALL_VLLM - SECRET_FLAGS):
        words = ["vllm", "serve", flag, "org/model-7", f"{flag}=8192"]
        assert run.mask_argv(words) == words, flag
        assert scrub.flag_values(tuple(words)) == [], flag
        assert masking.argv(list(words)) == words, flag
        assert scrub.mask_credentials(" ".join(words)) == " ".join(words), flag


# -- the reports and the store --------------------------------------------------------------------
def _snapshot(tmp_path: Path) -> Path:
    snap = tmp_path / "snap"
    shutil.copytree(EXAMPLE / "snapshot", snap)
    return snap


def _worker(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    collected = doc["collected"]
    render_spec = collected["render"]["services"]["vllm-worker"]
    container = next(c for c in collected["docker"]["containers"] if c["service"] == "vllm-worker")
    return render_spec, container


def _replayed(snap: Path, doc: dict[str, Any]) -> Any:
    (snap / "thor.json").write_text(json.dumps(doc, indent=1, sort_keys=True), "utf-8")
    return run_drift(load_fleet(EXAMPLE, "lab"), ["thor"], from_snapshot=snap).report


def test_a_clear_credential_flag_in_a_saved_command_is_masked_in_every_report_and_the_store(
    tmp_path: Path,
) -> None:
    snap = _snapshot(tmp_path)
    doc = json.loads((snap / "thor.json").read_text("utf-8"))
    _, container = _worker(doc)
    container["cmd"] = [*container["cmd"], "--token", CLEAR[0], "--key", CLEAR[1]]
    container["cmd"] += ["--credentials", CLEAR[2], f"--credential={CLEAR[3]}", "--port2", "1"]
    report = _replayed(snap, doc)
    paths = {d.path: d for d in report.drifts}
    assert {"--token", "--key", "--credentials"} <= set(paths)
    assert CLEAR[0] in repr(paths["--token"].observed)  # the drift holds it: the reports mask it
    for fmt in FORMATS:
        shown = render(report, fmt)  # type: ignore[arg-type]
        for clear in CLEAR[:4]:
            assert clear not in shown, (fmt, clear)
    guarded_drifts = {d.path: d for d in guarded(report).drifts}
    assert guarded_drifts["--token"].secret_changed is True  # absent -> a secret: changed
    # The history store and `reconcile diff` keep none of them either.
    for kept in (masking.stored(doc), comparable(doc)):
        text = json.dumps(kept)
        assert not any(clear in text for clear in CLEAR[:4]), text


def test_a_desired_credential_flag_compares_in_sync_with_the_boxs_mask(tmp_path: Path) -> None:
    """The render's command and the container's carry the same `--token x`, each masked by the
    collector as it masks them on the box (`mask_command`, the run's key): no drift. The
    container's token changed: one drift under `--token`, `***` both sides, `changed`."""
    run = _run(key="f" * 64)
    snap = _snapshot(tmp_path)
    doc = json.loads((snap / "thor.json").read_text("utf-8"))
    render_spec, container = _worker(doc)
    base = list(container["cmd"])

    def box(token: str, spec: dict[str, Any], entry: str, cmd: str) -> None:
        want = [*base[:3], "--token", token, *base[3:]]
        spec[entry], spec[cmd] = run.mask_command(list(spec[entry]), want)

    box(CLEAR[0], render_spec, "entrypoint", "command")
    box(CLEAR[0], container, "entrypoint", "cmd")
    assert CLEAR[0] not in json.dumps(doc)
    report = _replayed(snap, doc)
    assert "--token" not in {d.path for d in report.drifts}
    box(CLEAR[1], container, "entrypoint", "cmd")
    report = _replayed(snap, doc)
    [drift] = [d for d in report.drifts if d.path == "--token"]
    assert isinstance(drift.desired, SecretValue) and isinstance(drift.observed, SecretValue)
    assert drift.secret_changed is True
    assert "*** -> *** (changed)" in render(report, "text")
