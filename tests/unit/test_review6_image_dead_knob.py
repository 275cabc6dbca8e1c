"""An image a compose file hard-codes (review 6): the `.env`'s image variable is a dead knob.

An override's `vllm-worker: image: ...:hotfix` (or a gateway with `build:` and no `image:`)
makes compose render and run that image whatever `.env` pins (`docker compose config --images`
prints the override's). The drift blamed the image alone (`image:gateway`, pull and recreate
the gateway): the converge recreated from the same files, compose brought the same image back,
verification failed and the box rolled back. Now the render of the desired `.env` naming
another image than the desired one is a compose-file entry (restore-file), and the service's
image entries are its symptoms: the plan puts the files back before the pull and recreate.

Replayed from examples/lab-incidents' captured snapshot with thor's observation edited as
the reviewer did (t16): the render and the running container name the override's image; and
the override's digest differs from its pin, as a hand edit leaves it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.causes import Link, link_box
from reconciler.compare.drift import Action, BoxResult, Kind
from reconciler.drift_inputs import drift_inputs
from reconciler.plan import Plan, StepKind, plan_box
from tests.unit.example_replay import replay_edited

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"
REGISTRY = "10.77.0.1:5000"
HOTFIX_GATEWAY = f"{REGISTRY}/lobes/gateway:hotfix"
HOTFIX_WORKER = f"{REGISTRY}/vllm/vllm-openai:hotfix"


def _replay(
    tmp: Path, box: str, edit: Callable[[dict[str, Any]], None]
) -> tuple[BoxResult, Plan, Any]:
    """The example replayed with `box`'s collected observation edited: its result, its plan
    and its expectation."""
    fleet, run = replay_edited(tmp, box, edit)
    (result,) = [b for b in run.report.boxes if b.box == box]
    exp = drift_inputs(fleet).expectations[box]
    return result, plan_box(result, exp), exp


OVERRIDE = "docker-compose.override.yml"


def _hard_code(
    collected: dict[str, Any], service: str, image: str | None, edited: bool = True
) -> None:
    """A compose file names `image` for `service` (both renders of the desired `.env`), and the
    running container was created from it: another image, pulled by tag. `edited`: the
    override's digest differs from the one the desired state pins."""
    if edited:
        collected["files"][OVERRIDE]["sha256"] = "0e" * 32
    for name in ("render", "render_login"):
        collected[name]["services"][service]["image"] = image
    if image is None:
        return
    docker = collected["docker"]
    (c,) = [c for c in docker["containers"] if c["service"] == service]
    old = docker["images"][c["image_id"]]
    image_id = "sha256:" + ("cd" if service == "gateway" else "ef") * 32
    docker["images"][image_id] = {
        "env": old["env"],
        "repo_digests": [image.rsplit(":", 1)[0] + "@sha256:" + "ab" * 32],
        "repo_tags": [image],
    }
    c["image_ref"], c["image_id"] = image, image_id


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_a_hard_coded_gateway_image_is_the_compose_files_fault(tmp_path: Path, cache: None) -> None:
    result, plan, exp = _replay(
        tmp_path, "thor", lambda c: _hard_code(c, "gateway", HOTFIX_GATEWAY)
    )
    links = dict(zip(result.drifts, link_box(result.drifts), strict=True))
    (knob,) = [d for d in result.drifts if d.kind is Kind.COMPOSE_FILE and d.subject == "gateway"]
    assert (knob.path, knob.desired, knob.observed) == ("image", exp.gateway_image, HOTFIX_GATEWAY)
    assert knob.action is Action.RESTORE_FILE
    assert knob.note is not None and "GATEWAY_IMAGE is dead" in knob.note
    assert knob.source == OVERRIDE
    # The edited file is the cause; the dead image knob and the image entries follow from it.
    assert links[knob] == Link(f"compose-file:{OVERRIDE}", True)
    images = [d for d in result.drifts if d.kind is Kind.IMAGE and d.subject == "gateway"]
    assert {d.path for d in images} == {"digest", "reference"}  # pinned by tag, another digest
    for d in images:
        assert links[d] == Link(f"compose-file:{OVERRIDE}", True), d
    # The edited file goes back first (to its pinned digest), then the desired image is
    # pulled and the gateway recreated from the restored files.
    kinds = [s.kind for s in plan.steps]
    assert not plan.blocked, plan.blocked
    assert StepKind.RESTORE_FILES in kinds, plan.summary()
    restore = plan.steps[kinds.index(StepKind.RESTORE_FILES)]
    assert [f.name for f in restore.files] == [OVERRIDE]
    assert kinds.index(StepKind.RESTORE_FILES) < kinds.index(StepKind.PULL)
    assert [s.subject for s in plan.steps if s.kind is StepKind.PULL] == [exp.gateway_image]
    assert kinds[-1] is StepKind.RECREATE_GATEWAY


def test_a_hard_coded_lane_image_links_the_lanes_image_entry(tmp_path: Path, cache: None) -> None:
    """The reviewer's compose proof (c3): `vllm-worker: image: ...:hotfix` in an override."""
    result, plan, exp = _replay(
        tmp_path, "thor", lambda c: _hard_code(c, "vllm-worker", HOTFIX_WORKER)
    )
    links = dict(zip(result.drifts, link_box(result.drifts), strict=True))
    subject = "lane:vllm-worker"
    (knob,) = [
        d for d in result.drifts if d.kind is Kind.COMPOSE_FILE and d.subject == subject
        and d.path == "image"
    ]  # fmt: skip
    want = exp.lanes["vllm-worker"].image
    assert (knob.desired, knob.observed, knob.action) == (want, HOTFIX_WORKER, Action.RESTORE_FILE)
    images = [d for d in result.drifts if d.kind is Kind.IMAGE and d.subject == subject]
    assert images
    assert all(links[d] == Link(f"compose-file:{OVERRIDE}", True) for d in images), images
    kinds = [s.kind for s in plan.steps]
    assert StepKind.RESTORE_FILES in kinds, plan.summary()
    assert kinds.index(StepKind.RESTORE_FILES) < kinds.index(StepKind.PULL)


def test_with_every_file_as_pinned_the_dead_knob_is_its_own_cause(
    tmp_path: Path, cache: None
) -> None:
    """The reviewer's t16 as it was: only the render and the container changed, every file as
    the desired state pins it. The image entries follow from the dead knob, and no plan pulls
    and recreates the gateway in vain: there is no file to put back."""
    result, plan, _ = _replay(
        tmp_path, "thor", lambda c: _hard_code(c, "gateway", HOTFIX_GATEWAY, edited=False)
    )
    links = dict(zip(result.drifts, link_box(result.drifts), strict=True))
    (knob,) = [d for d in result.drifts if d.kind is Kind.COMPOSE_FILE]
    assert links[knob] == Link("compose-file:gateway:image", False)
    images = [d for d in result.drifts if d.kind is Kind.IMAGE and d.subject == "gateway"]
    assert images and all(links[d] == Link("compose-file:gateway:image", True) for d in images)
    assert plan.blocked and not plan.steps
    # Said as what it is (was: "no converge step can restore-file a service the desired state
    # does not know", of the gateway).
    assert [(e.where, e.what) for e in plan.blocked] == [("gateway image", PINNED_AS_IS)]


PINNED_AS_IS = (
    "every compose file is as the desired state pins it, and they render another value than "
    ".env asks for: no file to restore (fix the pinned files or the knob)"
)


def test_with_every_file_as_pinned_a_lanes_dead_knob_blocks_the_plan(
    tmp_path: Path, cache: None
) -> None:
    """A lane's image hard-coded by files that are all as pinned: recreating the lane from the
    same files would render the same image again (was: a recreate, verified in vain, rolled
    back), so the plan is blocked, saying why."""
    _, plan, _ = _replay(
        tmp_path, "thor", lambda c: _hard_code(c, "vllm-worker", HOTFIX_WORKER, edited=False)
    )
    assert not plan.steps
    assert [(e.where, e.what) for e in plan.blocked] == [("lane:vllm-worker image", PINNED_AS_IS)]


def test_the_same_image_spelled_otherwise_is_no_dead_knob(tmp_path: Path, cache: None) -> None:
    """Compared as the container comparison compares references (containers.py normal_ref):
    a tag beside the digest names the digest's image."""

    def spelled(collected: dict[str, Any]) -> None:
        for name in ("render", "render_login"):
            service = collected[name]["services"]["gateway"]
            repo, digest = service["image"].split("@", 1)
            service["image"] = f"{repo}:latest@{digest}"

    result, _, _ = _replay(tmp_path, "thor", spelled)
    assert [d for d in result.drifts if d.kind is Kind.COMPOSE_FILE] == []
    assert [d for d in result.drifts if d.kind is Kind.IMAGE] == []


def test_a_build_without_an_image_is_a_dead_knob(tmp_path: Path, cache: None) -> None:
    """The reviewer's c3 gateway: `build:` and no `image:` renders no image; compose runs
    `<project>-gateway`, never GATEWAY_IMAGE's."""

    result, _, exp = _replay(tmp_path, "thor", lambda c: _hard_code(c, "gateway", None))
    (knob,) = [d for d in result.drifts if d.kind is Kind.COMPOSE_FILE and d.subject == "gateway"]
    assert (knob.path, knob.desired, knob.observed) == ("image", exp.gateway_image, None)
    assert knob.action is Action.RESTORE_FILE
