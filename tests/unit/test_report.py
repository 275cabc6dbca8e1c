"""The report layer: text, markdown and JSON renderings of a DriftReport.

The fixture is the run an operator meets most: thor drifted (a window change that reached the
.env but not the gateway, a login shell exporting the gateway key), orin unreachable, spark clean.
Text and markdown group the entries by cause (tests/unit/test_report_causes.py covers the
grouping on captured lab data); JSON lists every entry with its cause id.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from reconciler import records
from reconciler.compare.drift import (
    Action,
    BoxResult,
    Drift,
    DriftReport,
    Kind,
    SecretValue,
)
from reconciler.report import FORMATS, Format, render
from reconciler.report.document import SCHEMA_ID, VERSION, DriftReportDoc
from reconciler.report.json_report import (
    drift_report_schema_json,
    render_json,
    secret_digest,
    to_document,
)
from reconciler.report.markdown import render_markdown
from reconciler.report.text import render_text

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")

# Canary digests: one in the collector's wire format, one that no scrubbing regex would catch,
# so the "never printed" tests hold because of SecretValue handling, not a pattern.
KEY_WANT = SecretValue("hmac:" + "c0ffee" * 10 + "beef")
KEY_SHELL = SecretValue("CANARY-shell-exported-gateway-key-digest")
MESH = SecretValue("hmac:" + "5eed" * 16)
SPEC = {"method": "eagle3", "model": "/models/qwen3-eagle3", "num_speculative_tokens": 3}
LONG_SPEC_WANT = json.dumps({**SPEC, "draft_model_config": {"hf_overrides": "x" * 400}})
LONG_SPEC_GOT = LONG_SPEC_WANT.replace('"num_speculative_tokens": 3', '"num_speculative_tokens": 5')
IMAGE = "registry.lab:5000/lobes/vllm-openai@sha256:"

THOR_DRIFTS = (
    Drift(
        "thor",
        Kind.ENVFILE,
        "file:.env",
        "WORKER_MAX_MODEL_LEN",
        "262144",
        "131072",
        Action.REWRITE_ENV,
        source=".env:88",
    ),
    Drift(
        "thor",
        Kind.CONTRACT,
        "gateway",
        "capabilities.worker.context",
        262144,
        131072,
        Action.RECREATE_GATEWAY,
        source="/capabilities",
        note="the gateway still advertises the old window",
    ),
    Drift(
        "thor",
        Kind.SHELL_LEAK,
        "shell",
        "GATEWAY_API_KEY",
        KEY_WANT,
        KEY_SHELL,
        Action.SCRUB_SHELL,
        source="~/.bashrc:6",
        note="a plain `docker compose up` would start the gateway with the shell's key",
    ),
    Drift(
        "thor",
        Kind.SHELL_LEAK,
        "shell",
        "LOBES_MESH_KEY",
        MESH,
        MESH,
        Action.SCRUB_SHELL,
        source="~/.profile:12",
    ),
    Drift(
        "thor",
        Kind.ARGV,
        "lane:vllm-worker",
        "--speculative-config",
        LONG_SPEC_WANT,
        LONG_SPEC_GOT,
        Action.RECREATE,
        source="lobes-vllm-worker-1",
    ),
    Drift(
        "thor",
        Kind.IMAGE,
        "lane:vllm-worker",
        "digest",
        IMAGE + "a" * 64,
        IMAGE + "b" * 64,
        Action.PULL_RECREATE,
    ),
    Drift(
        "thor",
        Kind.ARGV,
        "lane:vllm-worker",
        "--served-model-name",
        ("worker", "qwen3"),
        ("worker",),
        Action.RECREATE,
        source="lobes-vllm-worker-1",
    ),
)
ORIN_ERROR = "ssh: connect to host 10.77.0.4 port 22: No route to host"


def make_report(thor_drifts: tuple[Drift, ...] = THOR_DRIFTS) -> DriftReport:
    return DriftReport(
        boxes=(
            BoxResult("thor", True, drifts=thor_drifts, facts={"lobes": "0.9.2", "mem": MESH}),
            BoxResult("orin", False, errors=(ORIN_ERROR,)),
            BoxResult("spark", True, facts={"lobes": "0.9.2", "containers": 4}),
        ),
        inventory="lab",
        generated_at="2026-11-29T08:30:00Z",
        run_id="20261129T083000Z-7f3a",
    )


REPORT = make_report()
# 5 causes: the .env window (the gateway's stale contract is its symptom), two shell exports,
# the worker's command, the worker's image.
SUMMARY = (
    "drift: 5 causes, 7 differences on 1 of 3 boxes (argv 2, shell-leak 2, contract 1, "
    "envfile 1, image 1); 1 box not observed"
)


def _plain(report: DriftReport = REPORT, width: int = 100) -> str:
    return render_text(report, color=False, width=width)


def _joined(text: str) -> str:
    """The text with wrapping undone, to find sentences regardless of width."""
    return " ".join(text.split())


# -- text ------------------------------------------------------------------------------------


def test_text_box_headers_rows_and_summary() -> None:
    lines = _plain().splitlines()
    assert "thor: reachable, 7 differences" in lines
    assert "spark: in sync" in lines
    assert "orin: not observed, 1 error" in lines
    assert f"  error: {ORIN_ERROR}" in lines
    row = lines.index(
        next(x for x in lines if re.fullmatch(r"  cause +envfile +WORKER_MAX_MODEL_LEN +262144"
                                               r" -> 131072 +rewrite-env", x))
    )  # fmt: skip
    # Where and where from, below the row.
    assert lines[row + 1].strip() == "on: file:.env on thor"
    assert lines[row + 2].strip() == "source: .env:88"
    shell = next(
        i
        for i, x in enumerate(lines)
        if re.fullmatch(
            r"  cause +shell-leak +GATEWAY_API_KEY +\*\*\* -> \*\*\* \(changed\)"
            r" +report-only:shell",
            x,
        )
    )
    assert lines[shell + 2].strip() == "source: ~/.bashrc:6"
    assert any(re.search(r"LOBES_MESH_KEY +\*\*\* -> \*\*\* \(unchanged\)", x) for x in lines)
    assert any(re.search(r"--served-model-name +worker qwen3 -> worker ", x) for x in lines)
    assert "note: the gateway still advertises the old window" in _plain()
    # The summary closes the report, after a blank line.
    tail = _plain().split("\n\n")[-1]
    assert _joined(tail) == SUMMARY


def test_text_lists_boxes_then_causes_in_fix_order() -> None:
    body = _plain().rsplit("\n\n", 1)[0]  # without the closing summary
    heads = [x for x in body.splitlines()[1:] if re.match(r"\S", x)]
    assert heads == [
        "thor: reachable, 7 differences",
        "orin: not observed, 1 error",
        "spark: in sync",
        # .env first, then the shell, then the lane's image and command
        "envfile:WORKER_MAX_MODEL_LEN: 2 differences on thor",
        "shell:GATEWAY_API_KEY: 1 difference on thor",
        "shell:LOBES_MESH_KEY: 1 difference on thor",
        "image:vllm-worker: 1 difference on thor",
        "argv:vllm-worker: 2 differences on thor",
    ]
    # The gateway's stale window is the .env change's symptom, listed under it.
    block = body.split("envfile:WORKER_MAX_MODEL_LEN:", 1)[1].split("\n\n", 1)[0]
    assert re.search(
        r"\n  symptom +contract +capabilities\.worker\.context +262144 -> 131072", block
    )


def test_text_columns_line_up_across_subjects() -> None:
    rows = [x for x in _plain().splitlines() if re.match(r" {2}(cause|symptom) ", x)]
    assert len(rows) == 7
    for column in ("path", "action"):
        starts = {_column_start(row, column) for row in rows}
        assert len(starts) == 1, (column, rows)


def _column_start(row: str, column: str) -> int:
    cells = list(re.finditer(r"\S+(?: \S+)*", row))  # cells are separated by 2+ spaces
    return (
        cells[2].start()
        if column == "path"
        else next(c.start() for c in cells if c.group() in {a.value for a in Action})
    )


@pytest.mark.parametrize("width", [100, 80, 72, 132])
def test_text_fits_the_width(width: int) -> None:
    text = _plain(width=width)
    too_long = [x for x in text.splitlines() if len(x) > width]
    assert not too_long
    assert not [x for x in text.splitlines() if x != x.rstrip()]


def test_text_cuts_very_long_values_keeping_the_difference() -> None:
    text = _plain()
    assert LONG_SPEC_WANT not in _joined(text)
    assert "…" in text
    # The cut keeps where the two configs differ in view.
    assert '"num_speculative_tokens": 3' in _joined(text)
    assert '"num_speculative_tokens": 5' in _joined(text)
    # Other formats carry the whole value.
    assert LONG_SPEC_WANT in render_markdown(REPORT)
    drifts = json.loads(render_json(REPORT))["boxes"][0]["drifts"]
    spec = next(d for d in drifts if d["path"] == "--speculative-config")
    assert spec["desired"] == LONG_SPEC_WANT


def test_text_in_colour_is_the_same_text_with_styles() -> None:
    coloured = render_text(REPORT, color=True)
    assert "\x1b[" in coloured
    plain = "\n".join(ANSI.sub("", x).rstrip() for x in coloured.splitlines()) + "\n"
    assert plain == _plain()
    assert "\x1b[" not in _plain()


def test_text_clean_fleet_and_partial_observation() -> None:
    clean = DriftReport(
        (BoxResult("thor", True), BoxResult("spark", True, errors=("gateway probe timed out",))),
        "hosts",
        "2026-11-29T09:00:00Z",
        "r2",
    )
    lines = _plain(clean).splitlines()
    assert "thor: in sync" in lines
    # Errors mean part of the box went unchecked: never "in sync".
    assert "spark: reachable, no differences found, 1 error" in lines
    assert lines[-1] == "drift: no differences on 2 of 2 boxes; 1 box with errors"


def test_text_escapes_control_characters_from_boxes() -> None:
    hostile = Drift(
        "thor", Kind.ENV, "lane:x", "PS1", "ok", "\x1b[2J\x1b[31mpwned", Action.RECREATE
    )
    report = make_report((hostile,))
    for text in (_plain(report), render_markdown(report)):
        assert "\x1b" not in text
        assert "\\x1b[2J" in text


def test_text_does_not_interpret_markup_in_values() -> None:
    drift = Drift("thor", Kind.ENV, "lane:x", "[bold]KEY[/bold]", "[red]a", "b", Action.RECREATE)
    text = render_text(make_report((drift,)), color=True)
    assert "[bold]KEY[/bold]" in ANSI.sub("", text)
    assert "[red]a" in ANSI.sub("", text)


# -- secrets ---------------------------------------------------------------------------------


def _canaries() -> list[str]:
    out = []
    for secret in (KEY_WANT, KEY_SHELL, MESH):
        digest = secret.digest
        out += [digest, digest.removeprefix("hmac:")[:12], digest.removeprefix("hmac:")[-12:]]
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_secret_digests_never_printed(fmt: Format) -> None:
    out = render(REPORT, fmt)
    for canary in _canaries():
        assert canary not in out, (fmt, canary)


def test_secrets_show_as_masks_with_changed_state() -> None:
    md = render_markdown(REPORT)
    assert "| cause | shell-leak | `GATEWAY_API_KEY` | `***` | `***` (changed) |" in md
    assert "| cause | shell-leak | `LOBES_MESH_KEY` | `***` | `***` (unchanged) |" in md
    assert "`mem=***`" in md  # a secret among the facts


def test_wire_form_and_embedded_digests_are_masked_too() -> None:
    # Should compare ever pass the collector's {"secret": digest} through, reports still mask.
    leaked = Drift(
        "thor",
        Kind.ARGV,
        "gateway",
        "--api-key",
        {"secret": KEY_WANT.digest},  # type: ignore[arg-type]
        f'--api-key={{"secret": "{MESH.digest}"}}',
        Action.RECREATE_GATEWAY,
    )
    report = make_report((leaked,))
    for fmt in FORMATS:
        out = render(report, fmt)
        assert KEY_WANT.digest not in out and MESH.digest not in out
    drift = to_document(report)["boxes"][0]["drifts"][0]
    assert drift["desired"] == {"secret": True, "digest": secret_digest(KEY_WANT)}
    # Not a digest alone: a clear value under a secret path, masked whole (a value that merely
    # holds a digest can hold a clear secret beside it: test_report_review_fixes.py).
    assert drift["observed"]["secret"] is True and set(drift["observed"]) == {"secret", "digest"}
    # A guard's digest (this process's key) against the box's (the run's key): two keys, so
    # whether the value changed cannot be said (docs/drift-report.md: `changed` is null).
    assert drift["secret"] is True and drift["changed"] is None


# -- stable order ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_output_does_not_depend_on_drift_order(seed: int) -> None:
    shuffled = list(THOR_DRIFTS)
    random.Random(seed).shuffle(shuffled)
    other = make_report(tuple(shuffled))
    for fmt in FORMATS:
        assert render(other, fmt) == render(REPORT, fmt)


def test_ties_on_sort_key_are_ordered_too() -> None:
    a = Drift("thor", Kind.STATE, "lane:x", "status", "running", "exited", Action.START)
    b = records.replace(a, observed="restarting", action=Action.RECREATE)
    assert render_json(make_report((a, b))) == render_json(make_report((b, a)))


# -- JSON ------------------------------------------------------------------------------------


def test_json_document_shape() -> None:
    doc = to_document(REPORT)
    assert list(doc) == [
        "schema",
        "version",
        "run_id",
        "generated_at",
        "inventory",
        "summary",
        "boxes",
    ]
    assert (doc["schema"], doc["version"]) == ("fleet-reconciler/drift-report", 2)
    assert (doc["schema"], doc["version"]) == (SCHEMA_ID, VERSION)
    assert doc["summary"] == {
        "boxes": 3,
        "reachable": 2,
        "unreachable": 1,
        "with_errors": 1,
        "drifted_boxes": 1,
        "drifts": 7,
        "causes": 5,
        "by_kind": {"argv": 2, "contract": 1, "envfile": 1, "image": 1, "shell-leak": 2},
        "exit_code": 1,
    }
    assert [b["box"] for b in doc["boxes"]] == ["thor", "orin", "spark"]
    thor, orin, spark = doc["boxes"]
    assert orin == {
        "box": "orin",
        "reachable": False,
        "observation": "none",
        "partial": None,
        "errors": [ORIN_ERROR],
        "facts": {},
        "drifts": [],
    }
    assert spark["facts"] == {"containers": 4, "lobes": "0.9.2"}
    assert list(spark["facts"]) == ["containers", "lobes"]
    keys = [(d["kind"], d["subject"], d["path"]) for d in thor["drifts"]]
    assert keys == sorted(keys)
    by_path = {d["path"]: d for d in thor["drifts"]}
    assert by_path["GATEWAY_API_KEY"] == {
        "kind": "shell-leak",
        "subject": "shell",
        "path": "GATEWAY_API_KEY",
        "desired": {"secret": True, "digest": secret_digest(KEY_WANT)},
        "observed": {"secret": True, "digest": secret_digest(KEY_SHELL)},
        "action": "report-only:shell",
        "source": "~/.bashrc:6",
        "note": "a plain `docker compose up` would start the gateway with the shell's key",
        "secret": True,
        "changed": True,
        "cause": "shell:GATEWAY_API_KEY",
        "symptom": False,
    }
    mesh = by_path["LOBES_MESH_KEY"]
    assert mesh["desired"] == mesh["observed"] and mesh["changed"] is False
    contract = by_path["capabilities.worker.context"]
    assert (contract["desired"], contract["observed"]) == (262144, 131072)
    assert (contract["secret"], contract["changed"]) == (False, None)
    assert (contract["cause"], contract["symptom"]) == ("envfile:WORKER_MAX_MODEL_LEN", True)
    assert (
        by_path["WORKER_MAX_MODEL_LEN"]["cause"],
        by_path["WORKER_MAX_MODEL_LEN"]["symptom"],
    ) == (
        "envfile:WORKER_MAX_MODEL_LEN",
        False,
    )
    assert by_path["--served-model-name"]["desired"] == ["worker", "qwen3"]  # tuple -> list
    assert thor["facts"]["mem"] == {"secret": True, "digest": secret_digest(MESH)}


def test_secret_digest_is_12_hex_and_equal_for_equal_secrets() -> None:
    assert re.fullmatch(r"[0-9a-f]{12}", secret_digest(KEY_WANT))
    assert secret_digest(SecretValue(KEY_WANT.digest)) == secret_digest(KEY_WANT)
    assert secret_digest(KEY_WANT) != secret_digest(KEY_SHELL)
    # Hashed, not truncated: even a clear value put in a SecretValue by mistake stays hidden.
    assert "hunter2" not in secret_digest(SecretValue("hunter2hunter2"))


def test_json_round_trips_and_validates_against_the_schema_models() -> None:
    text = render_json(REPORT)
    assert text.endswith("}\n")
    assert json.loads(text) == to_document(REPORT)
    parsed = DriftReportDoc.model_validate_json(text)
    assert parsed.model_dump(mode="json", by_alias=True) == to_document(REPORT)


def test_json_stays_valid_for_odd_facts() -> None:
    facts: dict[Any, Any] = {
        "secret": "hmac:" + "ab" * 32,
        "ratio": float("nan"),
        "peaks": {3, 1, 2},
        "where": Path("/srv/lobes"),
        7: None,
    }
    report = DriftReport((BoxResult("thor", True, facts=facts),), "lab", "t", "r")
    text = render_json(report)
    DriftReportDoc.model_validate_json(text)
    assert json.loads(text)["boxes"][0]["facts"] == {
        "7": None,
        "secret": "***",  # a fact called "secret": kept as a fact, its digest still masked
        "peaks": [1, 2, 3],
        "ratio": "nan",
        "where": "/srv/lobes",
    }


def test_committed_schema_is_current() -> None:
    committed = (ROOT / "schema" / "drift-report.schema.json").read_text(encoding="utf-8")
    assert committed == drift_report_schema_json(), (
        "run: python -m reconciler.report.json_report > schema/drift-report.schema.json"
    )
    schema = json.loads(committed)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["schema"]["const"] == SCHEMA_ID
    assert schema["$defs"]["Secret"]["properties"]["digest"]["pattern"] == "^[0-9a-f]{12}$"


def _mutated(change: str) -> str:
    doc = to_document(REPORT)
    drift = doc["boxes"][0]["drifts"][0]
    secret = next(d for d in doc["boxes"][0]["drifts"] if d["secret"])
    if change == "full digest":
        secret["desired"]["digest"] = KEY_WANT.digest
    elif change == "changed without secret":
        drift["changed"] = False
    elif change == "secret look-alike":
        drift["desired"] = {"x": {"secret": KEY_WANT.digest}}
    elif change == "extra key":
        drift["value"] = "x"
    elif change == "bad exit code":
        doc["summary"]["exit_code"] = 3
    elif change == "count as string":
        doc["summary"]["drifts"] = "7"
    elif change == "unknown kind":
        drift["kind"] = "vibes"
    elif change == "version 1":  # a version-1 document has no causes: not this schema
        doc["version"] = 1
    elif change == "no cause":
        del drift["cause"]
    return json.dumps(doc)


@pytest.mark.parametrize(
    "change",
    [
        "full digest",
        "changed without secret",
        "secret look-alike",
        "extra key",
        "bad exit code",
        "count as string",
        "unknown kind",
        "version 1",
        "no cause",
    ],
)
def test_schema_models_reject_malformed_documents(change: str) -> None:
    with pytest.raises(ValidationError):
        DriftReportDoc.model_validate_json(_mutated(change))


# -- exit codes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("boxes", "exit_code", "summary"),
    [
        ((BoxResult("spark", True),), 0, "drift: no differences on 1 of 1 box"),
        (
            (BoxResult("thor", True, drifts=THOR_DRIFTS[:1]), BoxResult("spark", True)),
            2,
            "drift: 1 cause, 1 difference on 1 of 2 boxes (envfile 1)",
        ),
        (
            (BoxResult("spark", True), BoxResult("orin", False, errors=(ORIN_ERROR,))),
            1,
            "drift: no differences on 1 of 2 boxes; 1 box not observed",
        ),
    ],
)
def test_exit_codes_in_every_format(
    boxes: tuple[BoxResult, ...], exit_code: int, summary: str
) -> None:
    report = DriftReport(boxes, "lab", "2026-11-29T08:30:00Z", "r1")
    assert report.exit_code == exit_code
    assert to_document(report)["summary"]["exit_code"] == exit_code
    assert _plain(report).splitlines()[-1] == summary
    md = render_markdown(report)
    assert f"Exit code {exit_code}: " in md
    assert f"**{summary}**" in md


# -- markdown --------------------------------------------------------------------------------


def test_markdown_title_summary_table_and_sections() -> None:
    md = render_markdown(REPORT)
    lines = md.splitlines()
    assert lines[0] == "# Drift report: lab, run `20261129T083000Z-7f3a`, 2026-11-29T08:30:00Z"
    assert f"**{SUMMARY}**" in lines
    assert "| thor | yes | 7 | 0 | drift |" in lines
    assert "| orin | **no** | 0 | 1 | not observed |" in lines
    assert "| spark | yes | 0 | 0 | in sync |" in lines
    assert [x for x in lines if x.startswith("## ")] == [
        "## Summary",
        "## Causes",
        "## thor",
        "## orin",
        "## spark",
    ]
    causes = md.split("## Causes\n", 1)[1].split("\n## thor", 1)[0]
    assert [x for x in causes.splitlines() if x.startswith("### ")] == [
        "### `envfile:WORKER_MAX_MODEL_LEN`: 2 differences on thor",
        "### `shell:GATEWAY_API_KEY`: 1 difference on thor",
        "### `shell:LOBES_MESH_KEY`: 1 difference on thor",
        "### `image:vllm-worker`: 1 difference on thor",
        "### `argv:vllm-worker`: 2 differences on thor",
    ]
    assert (
        "| cause | envfile | `WORKER_MAX_MODEL_LEN` | `262144` | `131072` | rewrite-env"
        " | file:.env on thor | `.env:88` |  |" in lines
    )
    assert (
        "| symptom | contract | `capabilities.worker.context` | `262144` | `131072` |"
        " recreate-gateway | gateway on thor | `/capabilities` |"
        " the gateway still advertises the old window |" in lines
    )
    thor = md.split("## thor\n", 1)[1].split("## orin", 1)[0]
    assert "7 differences, 5 causes: `envfile:WORKER_MAX_MODEL_LEN`, " in thor
    assert f"- error: `{ORIN_ERROR}`" in lines
    spark = md.split("## spark\n", 1)[1]
    assert spark.startswith("\nIn sync.\n")


def test_markdown_escapes_pipes_so_tables_keep_their_columns() -> None:
    piped = Drift(
        "thor",
        Kind.ENV,
        "lane:x",
        "CMD",
        "cat a | tee b",
        "`x` | y",
        Action.RECREATE,
        note="pipes | everywhere_*here*",
    )
    md = render_markdown(make_report((piped, *THOR_DRIFTS)))
    table = [x for x in md.split("## Causes\n", 1)[1].split("## thor", 1)[0].splitlines() if x]
    table = [x for x in table if x.startswith("|")]
    cells = {len(re.split(r"(?<!\\)\|", x)) for x in table}
    assert len(cells) == 1, table
    row = next(x for x in table if "CMD" in x)
    assert "`cat a \\| tee b`" in row
    assert "`` `x` \\| y ``" in row
    assert "pipes \\| everywhere\\_\\*here\\*" in row


# -- entry point -----------------------------------------------------------------------------


def test_render_dispatches_and_rejects_unknown_formats() -> None:
    assert render(REPORT, "json") == render_json(REPORT)
    assert render(REPORT, "markdown") == render_markdown(REPORT)
    assert render(REPORT, "text") == _plain()
    assert render(REPORT, "text", color=True) == render_text(REPORT, color=True)
    with pytest.raises(ValueError, match="unknown report format 'yaml'"):
        render(REPORT, "yaml")  # type: ignore[arg-type]


def test_json_and_markdown_do_not_import_rich_or_pydantic() -> None:
    code = (
        "import sys\n"
        "from reconciler.compare.drift import BoxResult, DriftReport\n"
        "from reconciler.report import render\n"
        "r = DriftReport((BoxResult('thor', True),), 'lab', 't', 'r')\n"
        "render(r, 'json'); render(r, 'markdown')\n"
        "print(sorted(m for m in ('rich', 'pydantic') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_absent_reads_as_absent_not_as_a_value() -> None:
    missing = Drift("thor", Kind.STATE, "lane:vllm-senses", "status", "running", None, Action.START)
    report = make_report((missing,))
    assert "| `running` | *absent* | start |" in render_markdown(report)
    assert re.search(r"status +running -> \(absent\) +start", _plain(report))
    assert to_document(report)["boxes"][0]["drifts"][0]["observed"] is None


def test_text_names_at_most_a_dozen_boxes_per_list_and_json_every_one() -> None:
    """A cause on 30 boxes: its header and its row's `on:` name the first 12 and say how many
    more; the box lines above still name all 30, and JSON has every box's entry."""
    names = [f"thor-{n}" for n in range(30)]
    window = THOR_DRIFTS[0]
    boxes = tuple(
        BoxResult(name, True, drifts=(records.replace(window, box=name),)) for name in names
    )
    report = DriftReport(boxes, "lab", "2026-11-29T08:30:00Z", "20261129T083000Z-7f3a")
    text = _joined(_plain(report))
    listed = ", ".join(names[:12])
    assert f"WORKER_MAX_MODEL_LEN: 30 differences on {listed} and 18 more cause" in text
    assert f"on: file:.env on {listed} and 18 more source" in text
    assert text.count(f"{names[12]},") == 0  # named only in its own box line
    for name in names:
        assert f"{name}: reachable, 1 difference" in text
    entries = json.loads(render_json(report))["boxes"]
    assert [entry["box"] for entry in entries] == names


@pytest.mark.parametrize("seed", range(6))
def test_values_folded_below_a_row_read_as_the_grid_lays_them_out(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values too long for one line are folded line by line without a rich table
    (text._folded_values): the report reads exactly as the grid would print it, in every
    width, with and without colour, for values with and without spaces and wide characters."""
    import reconciler.report.text as text_module

    rng = random.Random(seed)
    pieces = ["http://10.77.0.11:8000,", "word ", "ünï ", "宽字符", "x" * 37, "--flag=", " "]

    def value() -> str:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(8, 60))).strip() or "v"

    drifts = tuple(
        Drift("thor", Kind.ENVFILE, "file:.env", f"KEY_{n}", value(), value(), Action.REWRITE_ENV)
        for n in range(8)
    )
    report = make_report(drifts)
    width = rng.choice([64, 80, 100, 133])
    color = bool(seed % 2)
    folded = render_text(report, color=color, width=width)
    monkeypatch.setattr(text_module, "_folded_values", lambda *args: None)
    assert render_text(report, color=color, width=width) == folded
    assert "desired" in ANSI.sub("", folded)
