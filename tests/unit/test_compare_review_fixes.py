"""Review fixes of the drift comparison and its reports, on the captured lab data
(examples/lab-incidents, edited as plain JSON: tests/unit/test_compare_rules.py's helpers):

1. a second container of a desired service is an entry of its own, and the contract reads the
   same container as every other comparison;
2. the HTML matrix greys cells a box's answer did not cover (a partial box, a section's fault);
3. a desired service missing from a successful render is an entry, never a silent skip;
4. the login shell exporting compose's or docker's own variables is always a leak;
5. image references compare as the registry resolves them (`repo:tag@digest`, docker.io);
6. HTML shows sources and notes as text and markdown do;
7. a container's runtime against the render's.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from reconciler import records
from reconciler.compare.box import compare_box
from reconciler.compare.causes import link_box
from reconciler.compare.containers import normal_ref
from reconciler.compare.drift import (
    Action,
    BoxError,
    BoxResult,
    Drift,
    DriftReport,
    Kind,
    Part,
)
from reconciler.drift_inputs import expectations
from reconciler.observe.document import Observed, parse_collected
from reconciler.report.html import drift_matrix, render_drift_html
from tests.unit.test_compare_rules import captured, compare, find

__all__ = ["captured"]  # a fixture, used by name

WORKER = "model-gear-vllm-worker"
COPY = "lobes-vllm-worker-run-1a2b3c4d5e6f"  # `docker compose run`: keeps compose's labels
DIGEST = "sha256:" + "ab" * 32


def _container(raw: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in raw["docker"]["containers"] if c["name"] == name)


def _of(result: BoxResult, kind: Kind, subject: str) -> list[Drift]:
    return [d for d in result.drifts if (d.kind, d.subject) == (kind, subject)]


# -- 1. a second container of a desired service ----------------------------------------------
def _with_copy(first: bool) -> Any:
    """thor's worker and a `compose run` copy of it, on another window, published everywhere."""

    def edit(raw: dict[str, Any]) -> None:
        worker = _container(raw, WORKER)
        dup = {**worker, "name": COPY, "id": "deadbeef0001"}
        dup["ports"] = {"8000/tcp": [{"HostIp": "", "HostPort": "8001"}]}
        dup["cmd"] = [
            "--max-model-len=65536" if str(x).startswith("--max-model-len") else x
            for x in worker["cmd"]
        ]
        containers = raw["docker"]["containers"]
        containers.insert(0, dup) if first else containers.append(dup)

    return edit


@pytest.mark.parametrize("first", [True, False], ids=["copy-listed-first", "copy-listed-last"])
def test_a_second_container_of_a_lane_is_its_own_entry(captured: Any, first: bool) -> None:
    plain = compare(captured, "thor")
    result = compare(captured, "thor", _with_copy(first))
    dup = find(result, Kind.STATE, "lane:vllm-worker", "container")
    assert (dup.desired, dup.observed, dup.source) == (None, "running", COPY)
    assert dup.action is Action.REPORT  # plan.py removes by service: it could take the lane
    assert WORKER in (dup.note or "")
    port = find(result, Kind.PORT, "lane:vllm-worker", "8000/tcp")
    assert (port.observed, port.source, port.action) == ("0.0.0.0:8001", COPY, Action.REPORT)
    # Everything else reads the service's own container (its render's container_name), the
    # contract's lane window included: no entry about the copy's 65536.
    rest = [d for d in result.drifts if d.source != COPY]
    assert rest == list(plain.drifts)
    assert all("65536" not in str((d.desired, d.observed)) for d in result.drifts)


def test_without_a_container_name_compose_numbered_replica_one_is_the_service(
    captured: Any,
) -> None:
    def scaled(raw: dict[str, Any]) -> None:
        raw["render"]["services"]["vllm-worker"]["container_name"] = None
        worker = _container(raw, WORKER)
        worker["name"] = "lobes-vllm-worker-1"
        raw["docker"]["containers"].insert(0, {**worker, "name": "lobes-vllm-worker-2"})

    dup = find(compare(captured, "thor", scaled), Kind.STATE, "lane:vllm-worker", "container")
    assert dup.source == "lobes-vllm-worker-2"


# -- 2. the HTML matrix greys what was not observed ------------------------------------------
LANES = {"thor": ["vllm-worker", "vllm-embed"]}


def _matrix(box: BoxResult) -> dict[str, str]:
    report = DriftReport((box,), "inventory/lab.yaml", "2026-01-01T00:00:00Z", "run")
    _, matrix = drift_matrix(report, LANES)
    return {col: cell.state for col, cell in matrix["thor"].items()}


def test_html_cells_of_a_partial_box_are_not_in_sync() -> None:
    contract = Drift("thor", Kind.CONTRACT, "gateway", "health.version", "1", "2", Action.REPORT)
    partial = BoxResult(
        "thor",
        reachable=False,
        drifts=(contract,),
        errors=(BoxError(Part.OBSERVATION, "ssh", "connection refused"),),
        partial="only the gateway, as the controller sees it: GET /health 200",
    )
    assert _matrix(partial) == {
        "gateway": "warn",  # what the controller saw is still shown
        "vllm-worker": "unobserved",
        "vllm-embed": "unobserved",
        "box-wide": "unobserved",
    }


@pytest.mark.parametrize(
    ("part", "grey"),
    [
        (Part.DOCKER, {"gateway", "vllm-worker", "vllm-embed"}),
        (Part.RENDER, {"gateway", "vllm-worker", "vllm-embed"}),
        (Part.GATEWAY_PROBE, {"gateway"}),
        (Part.LOGIN_SHELL, {"box-wide"}),
        (Part.CONNECTION, set()),
    ],
)
def test_html_cells_a_faulty_section_answers_for_are_not_in_sync(part: Part, grey: set) -> None:
    box = BoxResult("thor", reachable=True, errors=(BoxError(part, "x", "permission denied"),))
    states = _matrix(box)
    assert {col for col, state in states.items() if state == "unobserved"} == grey
    assert {col for col, state in states.items() if state == "ok"} == set(states) - grey


# -- 3. a desired service the render lacks ---------------------------------------------------
def test_a_lane_missing_from_the_render_is_reported_not_skipped(captured: Any) -> None:
    def dropped(raw: dict[str, Any]) -> None:
        del raw["render"]["services"]["vllm-worker"]
        del raw["render"]["services"]["gateway"]

    result = compare(captured, "thor", dropped)
    for subject in ("lane:vllm-worker", "gateway"):
        d = find(result, Kind.COMPOSE_FILE, subject, "(service)")
        assert (d.desired, d.observed) == ("rendered", None)
        # thor's files are all as pinned: nothing to put back, a person decides
        assert d.action is Action.REPORT
        assert "not in compose's render" in (d.note or "")


def test_a_lane_an_edited_file_dropped_is_restored_with_the_file(captured: Any) -> None:
    def dropped(raw: dict[str, Any]) -> None:
        del raw["render"]["services"]["vllm-primary"]

    result = compare(captured, "spark", dropped)
    d = find(result, Kind.COMPOSE_FILE, "lane:vllm-primary", "(service)")
    assert (d.action, d.source) == (Action.RESTORE_FILE, "docker-compose.override.yml")
    link = link_box(result.drifts)[result.drifts.index(d)]
    assert (link.cause, link.symptom) == ("compose-file:docker-compose.override.yml", True)


def test_a_failed_render_is_a_box_error_not_a_missing_service(captured: Any) -> None:
    def failed(raw: dict[str, Any]) -> None:
        raw["render"] = {"error": "compose: no such file"}

    result = compare(captured, "thor", failed)
    assert not [d for d in result.drifts if d.path == "(service)"]
    assert [e.part for e in result.errors] == [Part.RENDER]


# -- 4. compose's and docker's own variables from the login shell ----------------------------
@pytest.mark.parametrize(
    "name", ["COMPOSE_PROJECT_NAME", "COMPOSE_ENV_FILES", "COMPOSE_FILE", "DOCKER_HOST",
             "DOCKER_CONTEXT", "DOCKER_CONFIG"],
)  # fmt: skip
def test_the_shell_exporting_compose_or_docker_control_variables_is_a_leak(
    captured: Any, name: str
) -> None:
    def exported(raw: dict[str, Any]) -> None:
        exports = raw["login_shell"]["exports"]
        exports[name] = {"source": "~/.bashrc:7", "value": "elsewhere"}
        exports["EDITOR"] = {"source": "~/.bashrc:8", "value": "vi"}  # none of compose's
        assert name not in raw["variables"]["names"]

    result = compare(captured, "thor", exported)
    d = find(result, Kind.SHELL_LEAK, "shell", name)
    assert (d.observed, d.source, d.action) == ("elsewhere", "~/.bashrc:7", Action.SCRUB_SHELL)
    assert "compose or docker reads it itself" in (d.note or "")
    assert all(d.path != "EDITOR" for d in result.drifts)


# -- 5. image references as the registry resolves them ---------------------------------------
@pytest.mark.parametrize(
    ("ref", "normal"),
    [
        (f"repo:tag@{DIGEST}", f"docker.io/library/repo@{DIGEST}"),
        (f"repo@{DIGEST}", f"docker.io/library/repo@{DIGEST}"),
        (f"docker.io/repo@{DIGEST}", f"docker.io/library/repo@{DIGEST}"),
        (f"docker.io/library/repo:1@{DIGEST}", f"docker.io/library/repo@{DIGEST}"),
        (f"index.docker.io/vllm/vllm-openai:v1@{DIGEST}", f"docker.io/vllm/vllm-openai@{DIGEST}"),
        (f"vllm/vllm-openai@{DIGEST}", f"docker.io/vllm/vllm-openai@{DIGEST}"),
        (f"10.77.0.1:5000/lobes/gateway:0.91.0@{DIGEST}", f"10.77.0.1:5000/lobes/gateway@{DIGEST}"),
        (f"10.77.0.1:5000/lobes/gateway@{DIGEST}", f"10.77.0.1:5000/lobes/gateway@{DIGEST}"),
        (f"localhost/x:1@{DIGEST}", f"localhost/x@{DIGEST}"),
        ("repo:tag", "docker.io/library/repo:tag"),  # no digest: the tag is all there is
        ("registry.lab:5000/repo", "registry.lab:5000/repo"),
    ],
)
def test_normal_ref(ref: str, normal: str) -> None:
    assert normal_ref(ref) == normal


def _compare_with(captured: Any, box: str, exp_edit: Any, raw_edit: Any = None) -> BoxResult:
    """`compare`, with the box's expectation edited too (another spelling of an image)."""
    fleet, observations = captured
    obs = observations[box]
    raw = copy.deepcopy(obs.collected)
    if raw_edit is not None:
        raw_edit(raw)
    doc = parse_collected(raw, complete=True)
    assert isinstance(doc, Observed)
    return compare_box(exp_edit(expectations(fleet, [box])[box]), doc, obs.probes)


def test_a_tagged_digest_reference_matches_the_repo_digest(captured: Any) -> None:
    def tagged(exp: Any) -> Any:
        want = exp.gateway_image.replace("/lobes/gateway@", "/lobes/gateway:0.91.0@")
        return records.replace(exp, gateway_image=want)

    result = _compare_with(captured, "thor", tagged)
    assert not _of(result, Kind.IMAGE, "gateway")


def test_a_docker_hub_reference_matches_its_short_repo_digest(captured: Any) -> None:
    hub = f"vllm/vllm-openai@{DIGEST}"

    def digests(raw: dict[str, Any]) -> None:
        image = _container(raw, WORKER)["image_id"]
        raw["docker"]["images"][image]["repo_digests"] = [hub]

    def pinned(exp: Any) -> Any:
        lane = records.replace(exp.lanes["vllm-worker"], image=f"docker.io/{hub}")
        return records.replace(exp, lanes={**exp.lanes, "vllm-worker": lane})

    result = _compare_with(captured, "thor", pinned, digests)
    assert not [d for d in _of(result, Kind.IMAGE, "lane:vllm-worker") if d.path == "digest"]
    other = _compare_with(captured, "thor", pinned)  # the captured digest is another: drift
    assert find(other, Kind.IMAGE, "lane:vllm-worker", "digest").desired == f"docker.io/{hub}"


# -- 6. HTML sources and notes as text and markdown show them ---------------------------------
def test_html_shows_a_stray_containers_name_and_still_masks_digests() -> None:
    stray = Drift(
        "thor", Kind.STATE, "lane:lobes-vllm-worker-run-3f2a9c1b7d4e", "container", None,
        "running", Action.REMOVE, source="lobes-vllm-worker-run-3f2a9c1b7d4e",
        note="carries hmac:" + "c0ffee" * 8,
    )  # fmt: skip
    report = DriftReport((BoxResult("thor", True, (stray,)),), "inv", "2026", "run")
    page = render_drift_html(report, LANES)
    assert "from ***" not in page and "lobes-vllm-worker-run-3f2a9c1b7d4e</" in page
    assert "c0ffee" * 8 not in page and "carries ***" in page


# -- 7. the container's runtime against the render's ------------------------------------------
def test_a_lane_on_another_runtime_than_its_render_is_recreated(captured: Any) -> None:
    def runc(raw: dict[str, Any]) -> None:
        _container(raw, "model-gear-vllm-multimodal")["runtime"] = "runc"

    d = find(compare(captured, "orin", runc), Kind.STATE, "lane:vllm-multimodal", "runtime")
    assert (d.desired, d.observed, d.action) == ("nvidia", "runc", Action.RECREATE)


def test_runtime_is_not_drift_where_the_render_names_none_or_the_lab_agrees(
    captured: Any,
) -> None:
    def nvidia(raw: dict[str, Any]) -> None:  # spark's render names no runtime
        _container(raw, "model-gear-vllm-primary")["runtime"] = "nvidia"

    results = [compare(captured, box) for box in ("thor", "spark", "orin")]
    results.append(compare(captured, "spark", nvidia))
    assert not [d for r in results for d in r.drifts if d.path == "runtime"]
