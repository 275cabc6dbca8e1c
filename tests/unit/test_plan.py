"""The converge planner on drift captured from the lab (tests/fixtures/plan/*.json) and on
single drifts of each action: order, what becomes a step, what blocks, what is only reported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import Action, BoxError, BoxResult, Drift, Kind, Part, SecretValue
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import expectations
from reconciler.plan import FileRestore, StepKind, actionable, mesh_order, plan_box

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "plan"


@pytest.fixture(scope="module")
def exps() -> dict[str, BoxExpectation]:
    fleet = load_fleet(ROOT, "hosts")
    return expectations(fleet, list(fleet.boxes))


def _value(raw: Any) -> Any:
    if isinstance(raw, dict) and set(raw) == {"secret"}:
        return SecretValue(raw["secret"])
    if isinstance(raw, list):
        return tuple(_value(v) for v in raw)
    return raw


def captured(name: str, errors: bool = True) -> BoxResult:
    doc = json.loads((FIXTURES / f"{name}.json").read_text())
    drifts = tuple(
        Drift(
            **{
                **d,
                "kind": Kind(d["kind"]),
                "action": Action(d["action"]),
                "desired": _value(d["desired"]),
                "observed": _value(d["observed"]),
            }
        )
        for d in doc["drifts"]
    )
    found = tuple(_secret_source_error(e) for e in doc["errors"]) if errors else ()
    return BoxResult(doc["box"], doc["reachable"], drifts, found)


def _secret_source_error(text: str) -> BoxError:
    # The pristine captures' only errors are secret sources missing on the lab's boxes.
    where, _, what = text.partition(": ")
    assert where.startswith("secret "), text
    return BoxError(Part.SECRET_SOURCE, where, what)


def drift(subject: str, path: str, action: Action, kind: Kind = Kind.ENV, **kw: Any) -> Drift:
    return Drift(
        "thor", kind, subject, path, kw.pop("desired", 1), kw.pop("observed", 2), action, **kw
    )


def kinds(plan: Any) -> list[tuple[str, str]]:
    return [(s.kind.value, s.subject) for s in plan.steps]


def test_pristine_thor_writes_env_then_lanes_one_by_one_then_the_gateway(exps):
    plan = plan_box(captured("thor_pristine", errors=False), exps["thor"])
    assert kinds(plan) == [
        ("write-env", ".env"),
        ("recreate-lane", "vllm-embed"),
        ("recreate-lane", "vllm-rerank"),
        ("recreate-lane", "vllm-hand"),
        ("recreate-lane", "vllm-worker"),
        ("recreate-gateway", "gateway"),
    ]
    assert plan.steps[0].keys == ("GATEWAY_IMAGE", "HAND_IMAGE", "VLLM_GDN_DECODE_KERNEL")
    assert plan.services == ("vllm-embed", "vllm-rerank", "vllm-hand", "vllm-worker", "gateway")
    gateway = plan.steps[-1]
    assert gateway.timeout_s == exps["thor"].gateway.health_timeout_s
    assert "GET /v1/models without key (loopback)" in gateway.reasons
    worker = plan.steps[4]
    assert worker.timeout_s == 900 and worker.gpu_memory_utilization == 0.45


def test_pristine_spark_recreates_its_lanes_but_not_its_gateway(exps):
    plan = plan_box(captured("spark_pristine", errors=False), exps["spark"])
    assert ("recreate-gateway", "gateway") not in kinds(plan)
    assert [s for _, s in kinds(plan)][1:] == [
        "vllm-embed",
        "vllm-rerank",
        "vllm-hand",
        "vllm-primary",
    ]


def test_a_missing_secret_source_blocks_the_converge(exps):
    plan = plan_box(captured("orin_pristine"), exps["orin"])
    assert plan.empty and len(plan.blocked) == 2
    assert plan.summary().startswith("blocked: secret gateway_api_key: file-missing")


def test_an_unreachable_box_is_blocked(exps):
    unreachable = BoxError(Part.OBSERVATION, "unreachable: timeout")
    plan = plan_box(BoxResult("thor", False, errors=(unreachable,)), exps["thor"])
    assert plan.blocked == ("unreachable: timeout",)


def test_no_drift_no_steps(exps):
    plan = plan_box(BoxResult("thor", True), exps["thor"])
    assert plan.empty and not plan.blocked and plan.summary() == "no changes"


def test_a_gateway_that_does_not_answer_is_recreated_not_blocked(exps):
    refused = BoxError(Part.GATEWAY_PROBE, "gateway health (loopback)", "URLError: refused")
    result = BoxResult("thor", True, errors=(refused,))
    plan = plan_box(result, exps["thor"])
    assert kinds(plan) == [("recreate-gateway", "gateway")]
    assert plan.steps[0].reasons == ("gateway health (loopback)",)


def test_a_fault_blocks_by_its_part_never_by_its_text(exps):
    """A box's error text is whatever the box made it: a docker error that reads like a
    gateway probe's still blocks, a gateway probe's error still only recreates."""
    lookalike = BoxError(Part.DOCKER, "docker", "gateway health (loopback): refused")
    plan = plan_box(BoxResult("thor", True, errors=(lookalike,)), exps["thor"])
    assert plan.blocked == (lookalike,) and plan.empty
    shell = BoxError(Part.LOGIN_SHELL, "login_shell", "bash exited 1")
    assert not plan_box(BoxResult("thor", True, errors=(shell,)), exps["thor"]).blocked


def test_login_shell_exports_and_memory_are_reported_never_stepped(exps):
    leak = drift(
        "shell", "GATEWAY_API_KEY", Action.SCRUB_SHELL, Kind.SHELL_LEAK, source="~/.bashrc:6"
    )
    mem = drift("host", "MemAvailable", Action.DROP_CACHES, Kind.HOST)
    plan = plan_box(BoxResult("thor", True, (leak, mem)), exps["thor"])
    assert plan.empty and plan.report_only == (leak, mem)
    assert actionable((leak, mem)) == ()


def test_an_image_drift_pulls_the_desired_digest_before_any_lane(exps):
    exp = exps["thor"]
    image = drift("lane:vllm-worker", "digest", Action.PULL_RECREATE, Kind.IMAGE)
    argv = drift("lane:vllm-hand", "--max-model-len", Action.RECREATE, Kind.ARGV)
    plan = plan_box(BoxResult("thor", True, (argv, image)), exp)
    assert kinds(plan) == [
        ("pull", exp.lanes["vllm-worker"].image),
        ("recreate-lane", "vllm-hand"),
        ("recreate-lane", "vllm-worker"),
    ]


def test_a_window_change_recreates_the_lane_and_the_gateway_last(exps):
    lane = drift("lane:vllm-worker", "--max-model-len", Action.RECREATE, Kind.ARGV)
    env = drift("gateway", "WORKER_MAX_MODEL_LEN", Action.RECREATE_GATEWAY)
    stale = drift("gateway", "capabilities.worker.context", Action.RECREATE_GATEWAY, Kind.CONTRACT)
    key = drift("file:.env", "WORKER_MAX_MODEL_LEN", Action.REWRITE_ENV, Kind.ENVFILE)
    plan = plan_box(BoxResult("thor", True, (stale, env, lane, key)), exps["thor"])
    assert kinds(plan) == [
        ("write-env", ".env"),
        ("recreate-lane", "vllm-worker"),
        ("recreate-gateway", "gateway"),
    ]
    assert plan.steps[-1].reasons == ("capabilities.worker.context", "WORKER_MAX_MODEL_LEN")


def test_an_edited_pinned_file_is_restored_by_its_digest(exps):
    exp = exps["thor"]
    pinned = dict(exp.file_digests)
    name = next(iter(pinned))  # thor pins its shape file (group_vars/thor.yaml)
    edited = drift(f"file:{name}", "sha256", Action.RESTORE_FILE, Kind.COMPOSE_FILE)
    plan = plan_box(BoxResult("thor", True, (edited,)), exp)
    assert plan.steps[0].files == (FileRestore(name, pinned[name]),)


def test_a_dead_knob_restores_the_unpinned_files_and_recreates_its_lane(exps):
    exp = exps["thor"]
    chain = " / ".join(exp.compose_files)
    knob = drift(
        "lane:vllm-worker", "--max-model-len", Action.RESTORE_FILE, Kind.COMPOSE_FILE, source=chain
    )
    plan = plan_box(BoxResult("thor", True, (knob,)), exp)
    unpinned = [n for n in exp.compose_files if n not in exp.file_digests]
    assert plan.steps[0].kind is StepKind.RESTORE_FILES
    assert [f.name for f in plan.steps[0].files] == sorted(unpinned)
    assert all(f.sha256 is None for f in plan.steps[0].files)
    assert kinds(plan)[1:] == [("recreate-lane", "vllm-worker")]


def test_a_stray_container_is_removed_after_the_lanes_before_the_gateway(exps):
    stray = drift("lane:vllm-muse", "container", Action.REMOVE, Kind.STATE)
    lane = drift("lane:vllm-hand", "status", Action.START, Kind.STATE)
    auth = drift("gateway", "auth", Action.RECREATE_GATEWAY, Kind.AUTH)
    plan = plan_box(BoxResult("thor", True, (auth, stray, lane)), exps["thor"])
    assert kinds(plan) == [
        ("recreate-lane", "vllm-hand"),
        ("remove", "vllm-muse"),
        ("recreate-gateway", "gateway"),
    ]


def test_the_plan_names_keys_and_services_never_values(exps):
    secret = SecretValue("hmac:0123456789abcdef")
    key = drift(
        "file:.env", "GATEWAY_API_KEY", Action.REWRITE_ENV, Kind.ENVFILE, desired=secret,
        observed="shell-0f0f0f0f",
    )  # fmt: skip
    env = drift("gateway", "GATEWAY_API_KEY", Action.RECREATE_GATEWAY, desired=secret)
    plan = plan_box(BoxResult("thor", True, (key, env)), exps["thor"])
    text = plan.summary() + repr(plan.steps)
    assert "GATEWAY_API_KEY" in text
    assert "0123456789abcdef" not in text and "shell-0f0f0f0f" not in text


@pytest.mark.parametrize(
    ("proxies", "boxes", "order"),
    [
        # each box proxies to the next one: the hosts come first
        ({"a": ["b"], "b": ["c"]}, ["a", "b", "c"], ["c", "b", "a"]),
        # no proxies: the given order
        ({}, ["a", "b", "c"], ["a", "b", "c"]),
        # the lab's mesh: everyone proxies someone; broken at the most depended-on box
        (
            {"thor": ["spark", "orin"], "spark": ["thor", "orin"], "orin": ["spark", "thor"]},
            ["thor", "spark", "orin"],
            ["thor", "spark", "orin"],
        ),
        # a cycle a<->b with c proxying to b only: b is the most depended on
        ({"a": ["b"], "b": ["a"], "c": ["b"]}, ["a", "b", "c"], ["b", "a", "c"]),
        # a proxy to a box outside the run is ignored
        ({"a": ["zz"]}, ["a"], ["a"]),
    ],
)
def test_mesh_order_puts_a_roles_host_before_its_proxies(proxies, boxes, order):
    assert mesh_order(proxies, boxes) == order


def test_mesh_order_of_the_real_inventory_is_complete():
    fleet = load_fleet(ROOT, "hosts")
    proxies = {
        n: [c.proxied_to for c in s.contract.values() if c.proxied_to]
        for n, s in fleet.boxes.items()
    }
    assert sorted(mesh_order(proxies, list(fleet.boxes))) == sorted(fleet.boxes)
