"""Review 2, item 1: a box cannot turn a drift check off by answering null (or nothing) for it.

A live answer (complete) with `"docker": null`, `"login_shell": null`, `"variables": null`,
`"secret_sources": null` or `"lanes": null` is malformed, naming the key: read as empty, each
silently skipped whole checks (a lane exited on a wrong image was 20 drifts, the same box with
`"docker": null` 5 and no error). A snapshot (not complete) without such a section is still
read, and the box's result says which checks could not be made: an error, never "in sync". A
desired secret the answer has no `secret_sources` entry for is an error of the box, live or not.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.box import compare_box
from reconciler.compare.drift import BoxResult, DriftReport, Part
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import expectations
from reconciler.observe.document import Fault, FaultKind, Observed, parse_answer, parse_collected
from reconciler.observe.observe import snapshot_observation
from reconciler.report import render
from tests.unit.test_document_c import _both

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"


@pytest.fixture(scope="module")
def thor_exp() -> Any:
    return expectations(load_fleet(EXAMPLE, "lab"), ["thor"])["thor"]


def capture() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((EXAMPLE / "snapshot" / "thor.json").read_text("utf-8"))
    return raw


def answer() -> dict[str, Any]:
    """thor's live answer, with its worker lane exited on another image (container drift)."""
    doc: dict[str, Any] = copy.deepcopy(capture()["collected"])
    for c in doc["docker"]["containers"]:
        if c["service"] == "vllm-worker":
            c.update(status="exited", exit_code=137, image_ref="evil/miner:latest")
    return doc


def compared(exp: Any, doc: Observed | Fault) -> BoxResult:
    if isinstance(doc, Fault):
        return compare_box(exp, None, fault=doc)
    return compare_box(exp, doc)


def report(result: BoxResult) -> DriftReport:
    return DriftReport((result,), "lab", "2026-12-01T00:00:00Z", "r1")


# -- a live answer ---------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["docker", "login_shell", "variables", "secret_sources", "lanes"])
def test_a_live_answers_null_section_is_malformed_naming_it(key: str) -> None:
    doc = answer()
    doc[key] = None
    got = parse_answer(json.dumps(doc))
    assert isinstance(got, Fault), f"{key}: null was read as an empty section"
    assert got.kind is FaultKind.MALFORMED and got.path == key
    assert "null" in got.message


def test_a_live_answer_with_docker_null_is_the_boxs_error_never_fewer_drifts(thor_exp: Any) -> None:
    full = compared(thor_exp, parse_answer(json.dumps(answer())))
    assert {"state", "image"} <= {d.kind.value for d in full.drifts} and not full.errors
    doc = answer()
    doc["docker"] = None
    nulled = compared(thor_exp, parse_answer(json.dumps(doc)))
    assert not nulled.reachable and nulled.errors
    assert "docker" in nulled.errors[0] and nulled.errors[0].part is Part.OBSERVATION


def test_a_live_answer_without_a_desired_secrets_source_is_an_error(thor_exp: Any) -> None:
    doc = answer()
    doc["secret_sources"] = {}
    result = compared(thor_exp, parse_answer(json.dumps(doc)))
    missing = [e for e in result.errors if e.part is Part.SECRET_SOURCE]
    assert {e.where for e in missing} == {"secret gateway_api_key", "secret mesh_key"}
    assert all("not compared" in e.what for e in missing)
    assert report(result).exit_code == 1


# -- a snapshot ------------------------------------------------------------------------------------
def _snapshot_doc(**changes: Any) -> Observed:
    doc = answer()
    for key, value in changes.items():
        if value is ...:
            del doc[key]
        else:
            doc[key] = value
    got = parse_collected(doc, complete=False, version=1)
    assert isinstance(got, Observed)
    return got


SECTIONS = {
    "docker": Part.DOCKER,
    "login_shell": Part.LOGIN_SHELL,
    "variables": Part.VARIABLES,
    "render": Part.RENDER,
}


@pytest.mark.parametrize("key", sorted(SECTIONS))
@pytest.mark.parametrize("how", ["absent", "null"])
def test_a_snapshot_without_a_section_says_which_checks_were_not_made(
    thor_exp: Any, key: str, how: str
) -> None:
    doc = _snapshot_doc(**{key: ... if how == "absent" else None})
    result = compare_box(thor_exp, doc)
    said = [e for e in result.errors if e.part is SECTIONS[key]]
    assert len(said) == 1 and said[0].where == key
    assert "not in this observation" in said[0].what and "not compared" in said[0].what
    assert report(result).exit_code == 1  # not "no drift", not only "drift"


def test_a_snapshot_without_docker_is_never_reported_in_sync(thor_exp: Any) -> None:
    doc = _snapshot_doc(docker=...)
    # The box's other findings taken away: what each report says of a box with nothing else.
    result = BoxResult("thor", True, (), compare_box(thor_exp, doc).errors)
    for fmt in ("text", "markdown", "json"):
        shown = render(report(result), fmt)
        assert "docker: not in this observation" in shown, fmt
        assert "in sync" not in shown.lower().replace("exit 0 = in sync", ""), fmt
    # html: the gateway's cell is not observed (the box-wide ones were).
    html = render(report(result), "html")
    assert 'title="not observed: docker: not in this observation' in html
    box = json.loads(render(report(result), "json"))["boxes"][0]
    assert box["errors"] and box["drifts"] == []


def test_a_snapshot_without_a_secrets_source_says_so(thor_exp: Any) -> None:
    doc = _snapshot_doc(secret_sources=...)
    result = compare_box(thor_exp, doc)
    assert {e.where for e in result.errors if e.part is Part.SECRET_SOURCE} == {
        "secret gateway_api_key",
        "secret mesh_key",
    }


# -- the fast path reads a cut-down snapshot as document.py does ----------------------------------
@pytest.mark.parametrize("key", ["docker", "login_shell", "variables", "secret_sources"])
def test_the_c_path_reads_a_snapshot_without_a_section_as_document_py(
    tmp_path: Path, key: str
) -> None:
    raw = capture()
    del raw["collected"][key]
    path = tmp_path / "thor.json"
    path.write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    typed, c_path, two_steps = _both(path)
    assert typed and c_path == two_steps
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    for in_c, kept in ((True, False), (False, True)):
        doc = snapshot_observation("thor", path, digest, in_c=in_c, raw_kept=kept).document
        assert doc is not None
        assert doc.variables.observed is (key != "variables")
        assert doc.login_shell.observed is (key != "login_shell")
