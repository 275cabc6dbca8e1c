"""Review fixes of the reports' last line of defence and the box's masking of command lines:

1. a secret assigned inside a command word (`HF_TOKEN=x` as a word, `export GATEWAY_API_KEY=x;
   exec "$@"` as a `bash -c` script) is hashed on the box (the render's command and the
   container's alike, so compare still tells equal from changed) and masked by every report
   whatever path its drift has (an old or edited snapshot still holds it in clear);
2. a partial box's text is scrubbed in JSON as in the other formats;
3. the `.env` the box could not read: its error text is scrubbed in the drift's note;
4. the scrubbers mask a secret under a quoted mapping key (`{'HF_TOKEN': 'x'}`);
5. the scrubber's cut never leaves the start of a secret or a key that straddles it;
6. a clear value that merely contains a digest is no digest: masked whole;
8. HTML escapes control and bidi characters in names as text and markdown do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from reconciler.compare.drift import Action, BoxResult, Drift, DriftReport, Kind
from reconciler.desired.secret_names import adopt_fleet_patterns, fleet_patterns
from reconciler.report.html import render_drift_html
from reconciler.report.json_report import render_json
from reconciler.report.markdown import render_markdown
from reconciler.report.text import render_text
from reconciler.report.values import guarded
from reconciler.scrub import remember, scrub_text
from tests.unit.cpu_bound import cpu_bound
from tests.unit.test_compare_rules import captured, compare, find
from tests.unit.test_secret_boundaries import _collector, _converge

__all__ = ["captured"]  # a fixture, used by name

RUN_KEY = "k" * 64
HF = "hf_CLEAR55secret"
GW = "gwCLEAR44secret"
SCRIPT = 'export GATEWAY_API_KEY={}; exec "$@"'


def _report(*drifts: Drift, **box: Any) -> DriftReport:
    return DriftReport(
        (BoxResult("thor", True, drifts=drifts, **box),), "lab", "2026-12-01T00:00:00Z", "run-1"
    )


def _argv(path: str, desired: Any, observed: Any, subject: str = "lane:vllm-hand") -> Drift:
    return Drift("thor", Kind.ARGV, subject, path, desired, observed, Action.RECREATE)


def _every_format(report: DriftReport) -> dict[str, str]:
    return {
        "text": render_text(report, color=False),
        "json": render_json(report),
        "markdown": render_markdown(report),
        "html": render_drift_html(report),
    }


@pytest.fixture
def fleet_pattern() -> Iterator[None]:
    before = fleet_patterns()
    adopt_fleet_patterns(["FLEET_SEED*"])
    yield
    adopt_fleet_patterns(before)


# -- 1. a secret assigned inside a command word -------------------------------------------------
def test_a_secret_assignment_in_a_command_word_is_masked_in_every_format(fleet_pattern) -> None:
    report = _report(
        _argv("argv[4]", None, f"HF_TOKEN={HF}", "lane:vllm-embed"),
        _argv("argv[1]", "/usr/local/bin/mg-logwrap", ("-c", SCRIPT.format(GW))),
        _argv("argv[2]", "FLEET_SEED_A=seedCLEAR1", "python -c \"k={'HF_TOKEN': 'hfCLEAR2'}\""),
        # what the box sends now: the collector's digest, shown as the mask too
        _argv("argv[5]", 'HF_TOKEN={"secret": "hmac:' + "ab" * 32 + '"}', None),
    )
    for name, out in _every_format(report).items():
        for clear in (HF, GW, "seedCLEAR1", "hfCLEAR2", "abab"):
            assert clear not in out, (name, clear)
        assert "HF_TOKEN=***" in out and "GATEWAY_API_KEY=***" in out, name
    doc = json.loads(render_json(report))
    drifts = {d["path"]: d for d in doc["boxes"][0]["drifts"]}
    assert drifts["argv[1]"]["observed"] == ["-c", 'export GATEWAY_API_KEY=***; exec "$@"']
    assert drifts["argv[1]"]["desired"] == "/usr/local/bin/mg-logwrap"
    assert drifts["argv[2]"]["desired"] == "FLEET_SEED_A=***"  # the fleet's own pattern
    assert drifts["argv[5]"]["desired"] == "HF_TOKEN=***"


def test_a_report_with_no_secret_assignment_is_returned_as_it_was() -> None:
    image = "10.77.0.1:5000/vllm/vllm-openai@sha256:" + "0e" * 32
    report = _report(
        _argv("--max-model-len", "262144", "131072"),
        _argv("argv[1]", ("-c", 'export MODEL=x; exec "$@"'), None),
        Drift("thor", Kind.IMAGE, "lane:vllm-hand", "digest", image, None, Action.RECREATE),
        _argv("--attention-config", '{"backend": "TRITON_ATTN"}', None),
    )
    assert guarded(report) is report


def test_the_collector_hashes_a_secret_assigned_inside_any_command_word() -> None:
    collector = _collector()
    run = collector.Run({"run_key": RUN_KEY, "secret_patterns": ["FLEET_SEED*"], "directory": "/x"})
    entrypoint = ["bash", "-c", SCRIPT.format(GW)]
    command = ["vllm", "serve", f"HF_TOKEN={HF}", "FLEET_SEED=seedCLEAR1", "MODEL=a,b", "--port=1"]
    command += ["--env=LOBES_MESH_KEY='mesh key'", '{"VLLM_API_KEY": "vkCLEAR3"}']
    masked_entry, masked_cmd = run.mask_command(entrypoint, command)
    assert all(c not in json.dumps([masked_entry, masked_cmd]) for c in (HF, GW, "CLEAR", "mesh"))

    def inline(value: str) -> str:  # the form an inline flag's value takes
        return collector.json_dumps({"secret": run.digest(value)})

    assert masked_entry == ["bash", "-c", SCRIPT.format(inline(GW))]
    assert masked_cmd == [
        "vllm",
        "serve",
        f"HF_TOKEN={inline(HF)}",
        f"FLEET_SEED={inline('seedCLEAR1')}",  # the payload's patterns count too
        "MODEL=a,b",  # not a secret name: as it was
        "--port=1",
        f"--env=LOBES_MESH_KEY={inline('mesh key')}",
        '{"VLLM_API_KEY": ' + inline("vkCLEAR3") + "}",
    ]
    assert inline(HF).startswith('{"secret": "hmac:')
    # nothing assigned, nothing named like a secret: the same words
    plain = ["vllm", "HF_TOKEN=", '--hf-overrides={"is_matryoshka": true}', "http://H:1/"]
    assert run.mask_argv(plain) == plain


def _lane_command(collector: Any, command: list[str], hf: str, gw: str) -> tuple[Any, Any]:
    """vllm-hand's entrypoint and command as a box's collector masks them: a `bash -c` script
    and a command word that assign secrets in clear (the same run key for the render and the
    container, as in one answer)."""
    run = collector.Run({"run_key": RUN_KEY, "secret_patterns": [], "directory": "/nonexistent"})
    entrypoint = ["bash", "-c", SCRIPT.format(gw), "mg-logwrap"]
    return run.mask_command(entrypoint, [*command, f"HF_TOKEN={hf}"])


@pytest.mark.parametrize("changed", [False, True], ids=["same-secret", "changed-secret"])
def test_compare_tells_equal_masked_commands_from_a_changed_secret(
    captured: Any, changed: bool
) -> None:
    collector = _collector()

    def edit(raw: dict[str, Any]) -> None:
        service = raw["render"]["services"]["vllm-hand"]
        masked = _lane_command(collector, service["command"], HF, GW)
        service["entrypoint"], service["command"] = masked
        container = next(c for c in raw["docker"]["containers"] if c["service"] == "vllm-hand")
        running = (HF + "x", GW) if changed else (HF, GW)
        container["entrypoint"], container["cmd"] = _lane_command(
            collector, container["cmd"], *running
        )
        assert HF not in json.dumps(raw) and GW not in json.dumps(raw)

    result = compare(captured, "thor", edit)
    hand = [d for d in result.drifts if d.subject == "lane:vllm-hand"]
    argv = [d for d in hand if d.kind is Kind.ARGV]
    if not changed:
        assert argv == [] and compare(captured, "thor").drifts == result.drifts
        return
    assert len(argv) == 1, argv  # the one word whose secret changed, nothing else
    (drift,) = argv
    assert drift.desired != drift.observed
    assert str(drift.desired).startswith('HF_TOKEN={"secret": "hmac:')
    assert str(drift.observed).startswith('HF_TOKEN={"secret": "hmac:')
    out = _every_format(DriftReport((result,), "lab", "t", "r"))
    for name, text in out.items():
        assert HF not in text and GW not in text and "hmac:" not in text, name
        assert "HF_TOKEN=***" in text, name


# -- 2. a partial box's text in JSON ---------------------------------------------------------
def test_a_partial_boxs_text_is_scrubbed_in_json() -> None:
    partial = (
        'GET /health no answer (ValueError: Invalid header value b"Bearer gwkey-abcdef123") '
        "HF_TOKEN=hf_abc999 \x1b]0;pwned\x07"
    )
    report = DriftReport(
        (BoxResult("thor", False, partial=partial),), "lab", "2026-12-01T00:00:00Z", "r"
    )
    shown = json.loads(render_json(report))["boxes"][0]["partial"]
    assert shown.startswith("GET /health no answer")
    for gone in ("gwkey-abcdef123", "hf_abc999", "\x1b", "\x07"):
        assert gone not in shown


# -- 3. the `.env` the box could not read ------------------------------------------------------
def test_the_unread_env_files_error_is_scrubbed_in_the_note(captured: Any) -> None:
    why = (
        "PermissionError: HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789 "
        "Authorization: Bearer sk-livekey1234567890abcdefABCDEF \x1b[31mRED"
    )

    def unread(raw: dict[str, Any]) -> None:
        raw["envfile"] = None
        raw["file_errors"] = {".env": why}

    drift = find(compare(captured, "thor", unread), Kind.ENVFILE, "file:.env", "(file)")
    assert drift.note is not None
    assert drift.note.startswith("the deployment's .env could not be read: PermissionError")
    for gone in ("hf_AbCd", "sk-livekey", "\x1b"):
        assert gone not in drift.note


# -- 4. a quoted mapping key -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "compose config failed: {'HF_TOKEN': 'hf_short12'}",
            "compose config failed: {'HF_TOKEN': ***}",
        ),
        (
            'compose config failed: {"GATEWAY_API_KEY": "abc12345", "X": 1}',
            'compose config failed: {"GATEWAY_API_KEY": ***, "X": 1}',
        ),
        ("env {'LOBES_MESH_KEY': 'mesh-s3cret'} refused", "env {'LOBES_MESH_KEY': ***} refused"),
        ("{HF_TOKEN=abc123}", "{HF_TOKEN=***}"),  # the mapping's brace is not the value's
        ("ERROR: {'HF_TOKEN': 'hf_x1234'}", "ERROR: {'HF_TOKEN': ***}"),  # a label before it
        ("--env=HF_TOKEN=hf_x1234 set", "--env=HF_TOKEN=*** set"),  # an assignment's value
    ],
)
def test_a_secret_under_a_quoted_mapping_key_is_masked_by_every_scrubber(text, shown) -> None:
    assert scrub_text(text) == shown
    assert _collector().scrub_text(text) == shown
    secret = next(
        w for w in ("hf_short12", "abc12345", "mesh-s3cret", "abc123", "hf_x1234") if w in text
    )
    assert secret not in _converge().scrub(text)  # converge's copy: names only, masked too


@pytest.mark.parametrize(
    "text",
    [
        "the gateway's GATEWAY_API_KEY: set (digest 1)",
        "with the key from secret:gateway_api_key (digest 7d4425…): GET /v1/models 200",
        "{'MODEL': 'qwen3'} and {\"backend\": \"auto\"}",
    ],
)
def test_prose_and_plain_mappings_are_kept(text) -> None:
    assert scrub_text(text) == text == _collector().scrub_text(text)


# -- 5. the scrubber's cut ---------------------------------------------------------------------
def test_a_known_secret_straddling_the_cut_is_masked_whole() -> None:
    remember("Zq8pLmN3vR5tW7yB")
    out = scrub_text("error:" + " " * 2386 + "Zq8pLmN3vR5tW7yB rest")
    assert "Zq8p" not in out and out == "error: *** rest"
    boxed = _collector().scrub_text(
        "error:" + " " * 2386 + "Zq8pLmN3vR5tW7yC rest", ["Zq8pLmN3vR5tW7yC"]
    )
    assert "Zq8p" not in boxed


def test_the_cut_never_keeps_the_start_of_a_word_that_went_on() -> None:
    key = "AbCdEfGh12345678IjKlMnOp90"  # key-shaped: masked whole, but not once cut in two
    text = "error:" + " " * 2390 + key + " more"
    for scrub in (scrub_text, _collector().scrub_text):
        out = scrub(text)
        assert "AbCd" not in out and out.startswith("error:"), out


def test_the_cut_still_bounds_a_hostile_text() -> None:
    remember("a-known-secret-value-for-the-bound")
    text = "HF_TOKEN=" + "a1" * 5_000_000
    with cpu_bound(1.0):
        out = scrub_text(text)
    assert len(out) <= 300 and "a1a1" not in out


# -- 6. a clear value holding a digest -----------------------------------------------------------
def test_a_clear_value_that_merely_holds_a_digest_is_masked() -> None:
    drift = Drift(
        "thor",
        Kind.ENV,
        "lane:vllm-worker",
        "HF_TOKEN",
        None,
        "hmac:0123456789abcdef0 hf_CLEARtok",
        Action.RECREATE,
    )
    for name, out in _every_format(_report(drift)).items():
        assert "hf_CLEARtok" not in out, name


# -- 8. HTML names ---------------------------------------------------------------------------
def test_html_escapes_control_and_bidi_characters_in_names() -> None:
    hostile = "x\u202e\x1b[2J\x00"
    drift = Drift(
        "thor", Kind.ENV, f"lane:vllm{hostile}", f"PATH{hostile}", "1", "2", Action.RECREATE
    )
    report = DriftReport(
        (BoxResult("thor", True, drifts=(drift,)),), f"lab{hostile}", "t", f"run{hostile}"
    )
    page = render_drift_html(report, {"thor": [f"vllm{hostile}"]})
    odd = {c for c in page if not c.isprintable() and c not in "\n"}
    assert odd == set(), odd
    assert "x\\u202e\\x1b[2J\\x00" in page  # shown, escaped, as text and markdown show it
