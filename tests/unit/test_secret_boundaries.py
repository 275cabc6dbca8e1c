"""Secrets cannot leak by construction (issue 10, class 4).

- `secret_patterns` can only add names: a built-in floor is unioned in by the model, every
  payload, the remembered drift inputs and the box programs themselves;
- no exception text that can hold a header or a value reaches a report: real exceptions from
  http.client, urllib, httpx and ssh through the scrubber, and the audit of a key with an
  embedded CR/LF (a real local HTTP server) printed in text, JSON and markdown without it;
- a refused literal in a secret-named key is never echoed, by the checks or by pydantic's
  explanation.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import http.server
import json
import re
import shutil
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.audit.report_json import render_json
from reconciler.audit.report_md import render_markdown
from reconciler.audit.report_text import render_text
from reconciler.audit.run import audit_report
from reconciler.cli import main
from reconciler.desired import secret_names
from reconciler.desired.envfile import box_env
from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError
from reconciler.drift_inputs import drift_inputs
from reconciler.observe.observe import load_snapshot
from reconciler.observe.payload import collector_payload
from reconciler.scrub import exception_text, remember, scrub_text
from tests.unit.conftest import load_box_program
from tests.unit.test_audit_snapshots import FIXTURES, fleet

REPO = Path(__file__).resolve().parents[2]
FLEET = REPO / "tests" / "fixtures" / "fleet"
MESH_NAMES = ("GATEWAY_API_KEY", "CULTURE_VLLM_API_KEY", "LOBES_MESH_KEY", "HF_TOKEN")
KEY = "hunter2-real-key-7Qx9"  # what an operator might paste; must never be printed


def _collector() -> Any:
    return load_box_program("fleet_collector_secrets", "reconciler/observe/remote/collector.py")


def _converge() -> Any:
    return load_box_program("fleet_converge_secrets", "reconciler/apply/remote/converge.py")


def _fleet_with(tmp_path: Path, file: str, old: str | None, new: str) -> Path:
    root = tmp_path / "fleet"
    shutil.copytree(FLEET, root)
    target = root / file
    text = target.read_text(encoding="utf-8")
    if old is None:
        target.write_text(text + new, encoding="utf-8")
    else:
        assert old in text, f"the fixture no longer contains {old!r}"
        target.write_text(text.replace(old, new, 1), encoding="utf-8")
    return root


# -- 1. the floor ------------------------------------------------------------------------------
@pytest.mark.parametrize("narrowed", ["[HF_TOKEN]", "[]", '["*_NOTHING"]'])
def test_a_layer_that_narrows_secret_patterns_cannot_remove_a_name(tmp_path, narrowed):
    root = _fleet_with(tmp_path, "group_vars/thor.yaml", None, f"secret_patterns: {narrowed}\n")
    loaded = load_fleet(root)
    thor = loaded.boxes["thor"]
    for name in MESH_NAMES:
        assert secret_names.is_secret_name(name, thor.secret_patterns), name
    # all.yaml's own globs stay too: a layer only adds
    assert {"*_KEY", "*_TOKEN"} <= set(thor.secret_patterns)
    payload = collector_payload(thor, box_env(loaded, "thor"), run_key="k" * 32)
    assert set(secret_names.FLOOR) <= set(payload["secret_patterns"])
    assert set(secret_names.FLOOR) <= set(
        drift_inputs(loaded).payload("thor", "k" * 32)["secret_patterns"]
    )


def test_a_narrowing_layer_still_refuses_a_literal_under_a_floor_name(tmp_path):
    root = _fleet_with(
        tmp_path,
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        f"  DB_PASSWORD: {KEY}\nsecret_patterns: [HF_TOKEN]",
    )
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(root)
    lines = [str(p) for p in caught.value.problems]
    assert lines == [
        "group_vars/thor.yaml:5:3: env.DB_PASSWORD: DB_PASSWORD is a secret name: "
        "use {secret: <name>}, never a literal value"
    ]
    assert KEY not in "\n".join(lines)


def test_show_reports_the_effective_list(tmp_path, capsys):
    root = _fleet_with(tmp_path, "group_vars/thor.yaml", None, "secret_patterns: [HF_TOKEN]\n")
    assert main(["--root", str(root), "show", "thor", "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)["desired"]["secret_patterns"]
    assert shown[:2] == ["*_KEY", "*_TOKEN"]  # the layers' own, in layer order
    assert set(secret_names.FLOOR) <= set(shown)


def test_remembered_inputs_are_refloored_on_use(tmp_path):
    inputs = drift_inputs(load_fleet(FLEET))
    stale = {**inputs.payloads["thor"], "secret_patterns": []}  # an old or edited cache entry
    inputs.payloads["thor"] = stale
    assert set(secret_names.FLOOR) <= set(inputs.payload("thor", "k" * 32)["secret_patterns"])


def test_the_floor_does_not_swallow_the_values_drift_compares_in_the_clear():
    """Every `.env` key and container variable the lab's captures carry, other than the mesh's
    secrets, stays readable: drift shows their values, so the floor must not hash them."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, str) and key.isupper():
                    names.add(key)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                name = item.split("=")[0] if isinstance(item, str) else ""
                if re.fullmatch(r"[A-Z][A-Z0-9_]+", name):  # `KEY=value`, or a name listed
                    names.add(name)
                walk(item)

    for path in [*FIXTURES.glob("*/*.json"), *(REPO / "examples").glob("**/*.json")]:
        walk(json.loads(path.read_text(encoding="utf-8")))
    assert len(names) > 100  # the captures are there: the check below means something
    hashed = {n for n in names if secret_names.is_secret_name(n)}
    assert hashed == {"GATEWAY_API_KEY", "CULTURE_VLLM_API_KEY", "LOBES_MESH_KEY", "HF_TOKEN"}
    for kept in ("WORKER_MAX_NUM_BATCHED_TOKENS", "TOKENIZERS_PARALLELISM"):
        assert kept in names and not secret_names.is_secret_name(kept)


def test_the_box_programs_carry_the_same_floor():
    assert _collector().FLOOR == secret_names.FLOOR
    assert _converge().FLOOR == secret_names.FLOOR


def test_the_collector_hashes_the_floor_whatever_the_payload_says(tmp_path):
    collector = _collector()
    (tmp_path / ".env").write_text(
        f"GATEWAY_API_KEY={KEY}\nLOBES_MESH_KEY={KEY}-mesh\nhf_token={KEY}-hf\nWORKER_MAX_NUM_SEQS=1\n"
    )
    for crafted in ({"secret_patterns": []}, {}, {"secret_patterns": "nope"}):
        run = collector.Run({"run_key": "k" * 32, "directory": str(tmp_path), **crafted})
        shown, _ = collector.envfile_fact(run)
        values = {e["key"]: e["value"] for e in shown}
        assert values["WORKER_MAX_NUM_SEQS"] == "1"
        for name in ("GATEWAY_API_KEY", "LOBES_MESH_KEY", "hf_token"):
            assert set(values[name]) == {"secret"}, name
        assert KEY not in json.dumps(shown)


@pytest.mark.parametrize("run_key", ["", "short", None])
def test_a_guessable_run_key_is_replaced_on_the_box(tmp_path, run_key):
    collector = _collector()
    run = collector.Run({"run_key": run_key, "secret_patterns": [], "directory": str(tmp_path)})
    known = "hmac:" + hmac.new((run_key or "").encode(), KEY.encode(), hashlib.sha256).hexdigest()
    assert run.digest(KEY) != known
    assert len(run.key) >= 32


def test_no_hashed_value_survives_anywhere_in_the_collector_answer(tmp_path):
    collector = _collector()
    run = collector.Run({"run_key": "k" * 32, "secret_patterns": [], "directory": str(tmp_path)})
    run.digest(KEY)  # the run saw this value as a secret
    doc = {"login_shell": {"error": f"bash: line 3: {KEY}: command not found"}, KEY[:4]: 1}
    out = json.loads(collector.without_known_secrets(doc))
    assert KEY not in json.dumps(out)
    assert out["login_shell"]["error"] == "bash: line 3: ***: command not found"


# -- 2. the scrubber on real exceptions --------------------------------------------------------
SMUGGLED = f"{KEY}\r\nX-Smuggled: yes"


class _Gateway(http.server.BaseHTTPRequestHandler):
    """A gateway stand-in: 401 without a key, like a keyed lobes gateway."""

    def do_GET(self) -> None:
        status = 200 if self.headers.get("Authorization") else 401
        body = json.dumps({"error": {"type": "invalid_api_key"}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _raised(call: Any) -> BaseException:
    try:
        call()
    except Exception as exc:  # the exception itself is what is under test
        return exc
    raise AssertionError("no exception")


def test_http_client_quotes_the_key_and_the_scrubber_does_not(gateway):
    conn = http.client.HTTPConnection("127.0.0.1", gateway, timeout=2)
    conn.putrequest("GET", "/v1/models")
    exc = _raised(lambda: conn.putheader("Authorization", "Bearer " + SMUGGLED))
    assert KEY in str(exc)  # the leak this guards against is real
    text = exception_text(exc)
    assert KEY not in text and "Bearer" not in text and "Smuggled" not in text
    assert text.startswith("ValueError: a request header held a character HTTP forbids")


def test_urllib_and_httpx_quote_the_key_and_the_scrubber_does_not(gateway):
    url = f"http://127.0.0.1:{gateway}/v1/models"
    headers = {"Authorization": "Bearer " + SMUGGLED}
    raised = [
        _raised(lambda: urllib.request.urlopen(urllib.request.Request(url, headers=headers))),
        _raised(lambda: httpx.get(url, headers=headers)),
    ]
    for exc in raised:
        assert KEY in str(exc) or KEY in repr(exc.args), type(exc)
        text = exception_text(exc)
        assert KEY not in text and "Bearer" not in text, text
        assert text.startswith(type(exc).__name__ + ": ")


def test_connection_failures_read_from_their_type():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    refused = _raised(lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=2))
    assert exception_text(refused) == "ConnectError: connection refused"
    with socket.socket() as listener:  # accepts, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/health"
        slow = _raised(lambda: httpx.get(url, timeout=0.2))
    assert exception_text(slow) == "ReadTimeout: timed out"


def test_ssh_errors_pass_through_readable():
    proc = subprocess.run(
        ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=2", "-p", "1", "nobody@127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert "127.0.0.1" in last and "refused" in last.lower()
    assert scrub_text(last) == last  # nothing secret in it: kept whole


@pytest.mark.parametrize(
    ("text", "gone", "kept"),
    [
        (f"Invalid header value b'Bearer {KEY}\\r\\nX: y'", KEY, "Invalid header value"),
        (
            f"401 for Authorization: Basic {base64.b64encode(b'u:' + KEY.encode()).decode()}",
            "Basic",
            "401",
        ),
        (f"compose: HF_TOKEN={KEY} is not valid", KEY, "HF_TOKEN=***"),
        ("env: LOBES_MESH_KEY: hunter2 refused", "hunter2", "LOBES_MESH_KEY: ***"),
        (f"first line\n{KEY}", KEY, "first line"),
        (
            "token 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "9f86d0",
            "token",
        ),
        ("key q1W2e3R4t5Y6u7I8o9P0a1S2d3F4g5H6/j7K8+l9Z0x1C2v3B4n5M6== end", "q1W2e3", "end"),
        # free text no secret name marks: a URL's password, a credential flag's value
        ("GET http://lobes:hunter2@10.77.0.11:8000/v1/models gave 401", "hunter2", "lobes:***@"),
        ("vllm serve m --hf-token=hf_sh0rt --port 8000", "hf_sh0rt", "--hf-token=*** --port"),
        ("login --password 'pass word' failed", "pass word", "--password *** failed"),
        ("git --token hunter2 -v", "hunter2", "--token *** -v"),
        ("GET http://u:p@ssw0rd@10.77.0.11/ 401", "ssw0rd", "http://u:***@10.77.0.11/"),
        ("app --db-password=p,ss2 exited", "ss2", "--db-password=*** exited"),
        ("Command '['app', '--password', 'hunter2']' failed", "hunter2", "'--password', '***'"),
        ('argv ["--hf_token", "hf abc"] refused', "hf abc", '["--hf_token", "***"]'),
    ],
)
def test_scrub_text_drops_what_can_hold_a_secret(text, gone, kept):
    out = scrub_text(text)
    assert gone not in out and kept in out
    assert out.isprintable() and len(out) <= 300


@pytest.mark.parametrize(
    "text",
    [
        "ssh: connect to host 10.77.0.4 port 22: No route to host",
        "pull 10.77.0.1:5000/vllm/vllm-openai@sha256:"
        "1543f98bc7add33fcd6d1b95dfe4b59d0cf9f43ab2513cbf3bc8e7f06c5e662e failed",
        "secret source missing: gateway_api_key (GATEWAY_API_KEY in ~/.lobes/.secrets.env)",
        "GET http://10.77.0.11:8000/v1/chat/completions gave 401",
        # the audit's own sentences about a key: states and a secret's name, never a value
        "the gateway's GATEWAY_API_KEY: set (digest 7d4425…) from .env:1194",
        "the gateway's GATEWAY_API_KEY: empty (.env and login shell agree)",
        "with the key from secret:gateway_api_key (digest 7d4425…): GET /v1/models 200",
        "malformed: env.GATEWAY_API_KEY: a secret's value in clear text (expected a hashed secret)",
        # flags whose last word is not a credential's, a URL without a password, a flag
        # with no value
        "vllm serve m --max-num-batched-tokens 8192 --tokenizer meta/x --ssl-keyfile /k.pem",
        "GET http://10.77.0.11:8000/v1/models and ssh://deploy@10.77.0.4 refused",
        "usage: --token -v given twice",
        "GET http://10.77.0.11:8000/v1/models@latest gave 404",  # an @ after the authority
        "the gateway's --token: set",
    ],
)
def test_scrub_text_keeps_what_an_operator_needs(text):
    assert scrub_text(text) == text


def test_a_secret_this_process_holds_is_masked_in_any_text():
    remember("controller-env-secret-value-1")
    assert scrub_text("echo controller-env-secret-value-1 here") == "echo *** here"


@pytest.mark.parametrize(
    "text",
    [
        f"Invalid header value b'Bearer {KEY}\\r\\nX: y'",
        f"compose: HF_TOKEN={KEY} is not valid",
        f"first line\n{KEY}",
        "ssh: connect to host 10.77.0.4 port 22: No route to host",
        "key q1W2e3R4t5Y6u7I8o9P0a1S2d3F4g5H6/j7K8+l9Z0x1C2v3B4n5M6== end",
        f"GET http://lobes:{KEY}@10.77.0.11:8000/v1/models gave 401",
        f"vllm serve m --hf-token={KEY} --port 8000",
        f"git --token {KEY} -v",
        "vllm serve m --max-num-batched-tokens 8192 --tokenizer meta/x",
    ],
)
def test_the_box_copies_scrub_like_the_controller(text):
    assert _collector().scrub_text(text) == scrub_text(text)
    assert KEY not in _converge().scrub(text)  # converge's messages: names, not key-shaped runs


@pytest.mark.parametrize(
    "text",
    [
        "GET http://lobes:hunter2@10.77.0.11:8000/v1/models gave 401",
        "GET http://u:p@ssw0rd@10.77.0.11/ and http://10.77.0.11:8000/a@b",
        "vllm serve m --hf-token=hf_sh0rt --hf_token x --password 'pass word' --token -v",
        "Command '['app', '--client-secret', 'pass word', '--token', '-v']' failed",
        "--db-password=p,ss2 --token set --max-num-batched-tokens 8192 --tokenizer meta/x",
    ],
)
def test_the_three_scrubbers_mask_flags_and_url_passwords_alike(text):
    # Short texts with no key-shaped run: the box copies must give the controller's text.
    assert _collector().scrub_text(text) == scrub_text(text) == _converge().scrub(text)
    assert "hunter2" not in scrub_text(text) and "pass word" not in scrub_text(text)


def test_converge_masks_a_floor_named_value_sent_as_plain_text():
    converge = _converge()
    box = converge.Box(
        {"directory": "/nonexistent", "project": "lobes", "managed_env": {"HF_TOKEN": KEY}}
    )
    box.p["env_keys"] = []
    converge.desired_values(box)
    assert KEY in box.secrets
    assert KEY not in converge.reason_of(converge.Failed(f"write {KEY} failed"), box.secrets)


# -- 2b. the audit of a key with an embedded CR/LF, end to end -------------------------------------
def test_a_crlf_key_never_reaches_an_audit_report(tmp_path, gateway):
    """The collector's keyed probe on a real local server, with the key `.env` declares
    holding CR/LF; then that answer, and an old collector's raw one, through the audit's
    text, JSON and markdown."""
    collector = _collector()
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    escaped = SMUGGLED.replace("\r", "\\r").replace("\n", "\\n")
    (deploy / ".env").write_text(f'GATEWAY_API_KEY="{escaped}"\n')
    run = collector.Run(
        {
            "run_key": "k" * 32,
            "secret_patterns": [],
            "directory": str(deploy),
            "project": "lobes",
            "gateway_port": gateway,
            "probe_timeout_s": 2,
            "audit": {"env_keys": ["GATEWAY_API_KEY"], "api_key_secret": "gateway_api_key"},
        }
    )
    section = collector.audit_section(run, {})
    probe = section["probes"]["models_key"]
    assert probe["status"] is None and probe["key_from"] == ".env:GATEWAY_API_KEY"
    assert KEY not in json.dumps(section)

    raw = dict(probe, error=f"ValueError: Invalid header value b'Bearer {SMUGGLED}'")
    for answer in (probe, raw):  # the fixed collector's answer; an old one's, unscrubbed
        snapshot = tmp_path / f"snap-{id(answer)}"
        shutil.copytree(FIXTURES / "fully_keyed_mesh", snapshot)
        thor = json.loads((snapshot / "thor.json").read_text())
        thor["collected"]["audit"]["probes"]["models_key"] = answer
        (snapshot / "thor.json").write_text(json.dumps(thor))
        index, observations = load_snapshot(snapshot)
        report = audit_report(fleet({}), ["thor", "spark", "orin"], observations, index["run_id"])
        codes = {f.code for f in report.verdict_of("thor").findings}
        assert "key.unproven" in codes  # the probe's error is in the report's findings
        for out in (render_text(report), render_json(report), render_markdown(report)):
            assert KEY not in out and "Bearer" not in out and "Smuggled" not in out


# -- 3. a refused literal is never echoed --------------------------------------------------------
@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("  VLLM_GDN_DECODE_KERNEL: triton", f"  GATEWAY_API_KEY: {KEY}"),
        ("  VLLM_GDN_DECODE_KERNEL: triton", f"  HF_TOKEN: [{KEY}]"),
        ("  VLLM_GDN_DECODE_KERNEL: triton", f"  LOBES_MESH_KEY: {{secret: {KEY}}}"),
        ("  VLLM_GDN_DECODE_KERNEL: triton", f"  MY_SECRET: {{value: {KEY}}}"),
        ("  VLLM_GDN_DECODE_KERNEL: triton", f"  DB_PASSWORD: {{secret: x, also: {KEY}}}"),
        ("      WORKER_MAX_NUM_SEQS: 1", f"      WORKER_API_KEY: {KEY}"),
        # refused by the value's own type (one line of text): its message must not quote it
        ("  VLLM_GDN_DECODE_KERNEL: triton", f'  HF_TOKEN: "{KEY}\\nX-Smuggled: yes"'),
        ("  VLLM_GDN_DECODE_KERNEL: triton", f'  GATEWAY_API_KEY: "{KEY}\\u0000"'),
    ],
)
def test_a_secret_named_env_key_never_echoes_its_value(tmp_path, old, new):
    root = _fleet_with(tmp_path, "group_vars/thor.yaml", old, new)
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(root)
    text = "\n".join(str(p) for p in caught.value.problems)
    assert text.startswith("group_vars/thor.yaml:")  # located
    assert KEY not in text


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("  api_key: {secret: gateway_api_key}", f"  api_key: {KEY}"),
        (
            "  api_key: {secret: gateway_api_key}",
            f"  api_key: {{secret: gateway_api_key, v: {KEY}}}",
        ),
        ("  key: {secret: mesh_key}", f"  key: {KEY}"),
        ("  key: {secret: mesh_key}", f"  key: [{KEY}]"),
    ],
)
def test_a_secret_slot_never_echoes_a_literal(tmp_path, old, new):
    root = _fleet_with(tmp_path, "group_vars/all.yaml", old, new)
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(root)
    text = "\n".join(str(p) for p in caught.value.problems)
    assert text.startswith("group_vars/all.yaml:")
    assert KEY not in text and "input_value" not in text


def test_the_exact_message_of_a_literal_gateway_key(tmp_path, capsys):
    root = _fleet_with(
        tmp_path,
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        f"  GATEWAY_API_KEY: {KEY}",
    )
    assert main(["--root", str(root), "validate"]) == 1
    err = capsys.readouterr().err
    assert (
        "group_vars/thor.yaml:5:3: env.GATEWAY_API_KEY: GATEWAY_API_KEY is a secret name: "
        "use {secret: <name>}, never a literal value"
    ) in err
    assert KEY not in err


def test_a_value_is_still_shown_where_no_secret_can_be(tmp_path):
    root = _fleet_with(
        tmp_path,
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        "  VLLM_GDN_DECODE_KERNEL: [triton]",
    )
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(root)
    assert "['triton']" in str(caught.value)  # a typo's value helps; only secrets are hidden


# -- 2c. apply: the converge's failure texts, summary and evidence ---------------------------------
def test_an_apply_failure_holding_a_header_is_scrubbed_in_the_summary_and_evidence(tmp_path):
    from reconciler.apply.engine import Outcome
    from reconciler.apply.evidence import write
    from reconciler.apply.summary import outcome_lines
    from reconciler.plan import Plan

    failed = f"docker compose up gateway failed: Authorization: Bearer {SMUGGLED}"
    out = Outcome(
        box="thor",
        ok=False,
        changed=True,
        plan=Plan("thor"),
        started_at="2026-11-30T16:00:00Z",
        failed=failed,
        rollback={"ok": False, "failed": f"restore .env: HF_TOKEN={KEY}"},
    )
    lines = "\n".join(outcome_lines(out))
    assert "docker compose up gateway failed" in lines and "ROLLBACK FAILED" in lines
    evidence = write(tmp_path, out, "inventory/lab.yaml", "me").read_text()
    for text in (lines, evidence):
        assert KEY not in text and "Bearer" not in text


def test_a_controller_env_secret_is_masked_in_every_later_scrubbed_text():
    from reconciler.apply.payload import managed_env
    from reconciler.desired.models import ControllerEnvSecret
    from reconciler.drift_inputs import expectations

    loaded = load_fleet(REPO, "hosts")
    spec = loaded.boxes["thor"]
    box = spec.model_copy(
        update={"secrets": {**spec.secrets, "mesh_key": ControllerEnvSecret(
            source="controller_env", variable="FLEET_MESH_KEY")}}
    )  # fmt: skip
    value = "controller-held-mesh-key-0451"
    managed_env(expectations(loaded, ["thor"])["thor"], box, {"FLEET_MESH_KEY": value})
    assert scrub_text(f"compose said: {value} is not valid") == "compose said: *** is not valid"


def test_a_flag_named_like_a_secret_is_hashed_in_argv(tmp_path):
    run = _collector().Run({"run_key": "k" * 32, "secret_patterns": [], "directory": str(tmp_path)})
    argv = ["vllm", "serve", "--hf-token", KEY, "--max-num-batched-tokens", "8192"]
    argv += [f"--api-key={KEY}", "--db-password", f"{KEY}-db", "--api-key", "--enforce-eager"]
    masked = run.mask_argv(argv)
    assert KEY not in json.dumps(masked)
    assert masked[:3] == ["vllm", "serve", "--hf-token"] and set(masked[3]) == {"secret"}
    assert masked[4:6] == ["--max-num-batched-tokens", "8192"]  # compared in the clear
    assert masked[6].startswith('--api-key={"secret": "hmac:')
    assert masked[-2:] == ["--api-key", "--enforce-eager"]  # a flag is never taken for a value


# -- 2d. a clear value under a secret name in a drift report (an old or edited snapshot) --------
def test_a_clear_value_under_a_secret_name_is_masked_in_every_drift_report():
    from reconciler.compare.drift import Action, BoxResult, Drift, DriftReport, Kind
    from reconciler.report.json_report import render_json
    from reconciler.report.markdown import render_markdown
    from reconciler.report.text import render_text

    old = f"{KEY}-old"
    drifts = (
        Drift("thor", Kind.ENVFILE, "file:.env", "HF_TOKEN", KEY, old, Action.REWRITE_ENV),
        Drift("thor", Kind.ARGV, "lane:vllm-worker", "--hf-token", (KEY,), (old,), Action.RECREATE),
        Drift("thor", Kind.ENV, "lane:vllm-worker", "HF_TOKEN", KEY, KEY, Action.RECREATE),
        Drift(
            "thor", Kind.ENVFILE, "file:.env", "WORKER_MAX_NUM_SEQS", "1", "2", Action.REWRITE_ENV
        ),
    )
    report = DriftReport(
        (BoxResult("thor", True, drifts=drifts),), "lab", "2026-11-30T16:00:00Z", "run-1"
    )
    outputs = (render_text(report, color=False), render_json(report), render_markdown(report))
    for out in outputs:
        assert KEY not in out
    text = outputs[0]
    assert "changed" in text and "unchanged" in text  # equal values still compare equal
    doc = json.loads(outputs[1])
    seqs = next(d for d in doc["boxes"][0]["drifts"] if d["path"] == "WORKER_MAX_NUM_SEQS")
    assert (seqs["desired"], seqs["observed"]) == ("1", "2")  # not a secret: shown
