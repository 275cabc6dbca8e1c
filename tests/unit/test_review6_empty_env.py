"""`KEY=` in `.env` and no KEY line differ for a service that reads the file through
`env_file:` (lobes' lanes): compose gives it `KEY: ""` for one and no KEY for the other
(`docker compose config`), while `${KEY:-}` interpolates them alike. So the difference is an
`envfile` entry (reconciler/compare/envfile.py) where such a service reads the file, and a
snapshot's render of the box's own `.env` stands for the desired one's only with that
difference put into those services' environments (compare/render_basis.py `alike_renders`).

On captured real data: examples/lab-incidents (a live answer: one render, of the desired
`.env`) and tests/fixtures/import/lab_desired (a saved snapshot: the box's own render too),
edited where a case needs it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare import render_basis
from reconciler.compare.box import compare_box
from reconciler.compare.causes import group_causes
from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import Action, BoxResult, Drift, Kind
from reconciler.desired.entries import EnvEntry
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import drift_inputs, expectations
from reconciler.observe.document import Observed, parse_collected
from reconciler.observe.observe import load_snapshot
from reconciler.records import replace
from tests.unit.conftest import import_snapshot

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "lab-incidents"
LAB_DESIRED = REPO / "tests/fixtures/import/lab_desired"
BOXES = ("thor", "spark", "orin")
THOR_LANES = ("vllm-embed", "vllm-hand", "vllm-rerank", "vllm-worker")


@pytest.fixture(scope="module")
def captured() -> tuple[dict[str, BoxExpectation], dict[str, Any]]:
    fleet = load_fleet(EXAMPLE, "lab")
    _, observations = load_snapshot(EXAMPLE / "snapshot")
    return expectations(fleet, list(BOXES)), observations


Edit = Callable[[dict[str, Any]], None]


def compare(
    captured: Any, box: str, edit: Edit | None = None, exp: BoxExpectation | None = None
) -> BoxResult:
    exps, observations = captured
    raw = copy.deepcopy(observations[box].collected)
    if edit is not None:
        edit(raw)
    doc = parse_collected(raw, complete=True)
    assert isinstance(doc, Observed), doc
    return compare_box(exp or exps[box], doc, observations[box].probes)


def entries(result: BoxResult, kind: Kind, path: str) -> list[Drift]:
    return [d for d in result.drifts if d.kind is kind and d.path == path]


def pinned(exp: BoxExpectation, key: str, value: str | None) -> BoxExpectation:
    """`exp` with `env: {key: value}` (the last entry of a key wins, as the loader merges)."""
    env = tuple(e for e in exp.env if e.key != key)
    return replace(exp, env=(*env, EnvEntry(key, value, f"env.{key}")))


def test_the_labs_culture_key_pin_is_an_envfile_cause_on_every_box(captured: Any) -> None:
    """The lab's state writes `CULTURE_VLLM_API_KEY=` (gateway.auth); no box's `.env` has the
    line, and every lane reads `.env` through env_file: the lanes' 12 `env` entries were a
    cause of their own, the file that makes them was not reported."""
    results = [compare(captured, box) for box in BOXES]
    for result in results:
        (d,) = entries(result, Kind.ENVFILE, "CULTURE_VLLM_API_KEY")
        assert (d.subject, d.desired, d.observed) == ("file:.env", "", None)
        assert (d.action, d.source) == (Action.REWRITE_ENV, "absent")
        assert d.note == (
            "from gateway.auth; read through env_file, `CULTURE_VLLM_API_KEY=` sets it empty, "
            "no line not at all"
        )
    (cause,) = [c for c in group_causes(results) if "CULTURE_VLLM_API_KEY" in c.id]
    assert cause.id == "envfile:CULTURE_VLLM_API_KEY"
    assert (len(cause.changes), len(cause.symptoms)) == (3, 12)
    assert {d.kind for d in cause.symptoms} == {Kind.ENV}


def test_a_key_pinned_empty_that_the_box_lacks_is_drift_of_the_file(captured: Any) -> None:
    """The review's imp2: thor pins `VLLM_LOGGING_LEVEL: ""`, its `.env` has no such line. The
    render of the desired `.env` (a live collector's) gives each lane `VLLM_LOGGING_LEVEL: ""`
    through env_file; the containers lack it. The lanes were blamed, the file was not."""

    def rendered_with_the_line(raw: dict[str, Any]) -> None:
        keys = {line["key"] for line in raw["envfile"]}
        for spec in raw["render"]["services"].values():
            if keys <= spec["environment"].keys():  # reads .env whole: env_file
                spec["environment"]["VLLM_LOGGING_LEVEL"] = ""

    exps, _ = captured
    exp = pinned(exps["thor"], "VLLM_LOGGING_LEVEL", "")
    result = compare(captured, "thor", rendered_with_the_line, exp)
    (d,) = entries(result, Kind.ENVFILE, "VLLM_LOGGING_LEVEL")
    assert (d.desired, d.observed, d.action) == ("", None, Action.REWRITE_ENV)
    lanes = entries(result, Kind.ENV, "VLLM_LOGGING_LEVEL")
    assert sorted(e.subject for e in lanes) == [f"lane:{s}" for s in THOR_LANES]
    (cause,) = [c for c in group_causes([result]) if "VLLM_LOGGING_LEVEL" in c.id]
    assert cause.id == "envfile:VLLM_LOGGING_LEVEL" and len(cause.symptoms) == 4


def test_without_a_service_reading_the_file_whole_empty_and_absent_read_alike(
    captured: Any,
) -> None:
    """No service's render holds every `.env` key (none reads it through env_file): compose
    only interpolates the file, where `KEY=` and no line are the same `${KEY:-}`."""

    def no_env_file(raw: dict[str, Any]) -> None:
        for spec in raw["render"]["services"].values():
            spec["environment"].pop("LOBES_PROFILE", None)

    for box in BOXES:
        assert (
            entries(compare(captured, box, no_env_file), Kind.ENVFILE, "CULTURE_VLLM_API_KEY") == []
        )


def test_a_key_the_lanes_read_from_a_later_source_is_not_drift(captured: Any) -> None:
    """thor's lanes read GATEWAY_API_KEY from lobes' `.secrets.env` after `.env`: pinned empty
    (an open gateway) where `.env` has no line, nothing the lanes read changes."""
    exps, _ = captured
    exp = pinned(exps["thor"], "GATEWAY_API_KEY", "")
    assert entries(compare(captured, "thor", exp=exp), Kind.ENVFILE, "GATEWAY_API_KEY") == []


# -- a saved snapshot replayed against another state -----------------------------------------------
@pytest.fixture(scope="module")
def adopted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, BoxExpectation]:
    """The lab_desired snapshot imported: the state of each box's own `.env`."""
    root, code, printed = import_snapshot(LAB_DESIRED, tmp_path_factory.mktemp("r6") / "a")
    assert code == 0, printed
    return drift_inputs(load_fleet(root, "lab")).expectations


def snapshot_docs() -> dict[str, Observed]:
    out = {}
    for name, obs in load_snapshot(LAB_DESIRED)[1].items():
        assert obs.document is not None, name
        out[name] = obs.document
    return out


def test_a_snapshot_replay_sees_the_empty_pin_the_lanes_would_carry(
    adopted: dict[str, BoxExpectation],
) -> None:
    """The review's replay of its snapshot against imp2 said thor is in sync: the desired
    `.env` differs from the box's own by `VLLM_LOGGING_LEVEL=` only, and the box's own render
    (whose lanes lack it) was read as the desired one's. A live drift reports the line and the
    four lanes; so does the replay."""
    doc = snapshot_docs()["thor"]
    exp = pinned(adopted["thor"], "VLLM_LOGGING_LEVEL", "")
    assert not compare_box(adopted["thor"], doc).drifts  # the import replays to zero drift
    chosen = render_basis.for_desired(doc, exp.env)
    services = chosen.render.services
    assert services is not None
    assert {s for s, spec in services.items() if "VLLM_LOGGING_LEVEL" in spec.environment} == set(
        THOR_LANES
    )
    desired = render_basis.desired_pairs(doc, exp.env)
    assert chosen.render.basis == render_basis.env_basis(desired)
    result = compare_box(exp, doc)
    assert not result.errors
    (d,) = entries(result, Kind.ENVFILE, "VLLM_LOGGING_LEVEL")
    assert (d.desired, d.observed) == ("", None)
    lanes = entries(result, Kind.ENV, "VLLM_LOGGING_LEVEL")
    assert sorted((e.subject, e.desired, e.observed) for e in lanes) == [
        (f"lane:{s}", "", None) for s in THOR_LANES
    ]


def test_a_snapshot_replay_sees_an_empty_line_the_state_drops(
    adopted: dict[str, BoxExpectation],
) -> None:
    """The other way: thor's `.env` has `VLLM_LOGGING_LEVEL=` (added to the capture: its lanes
    run with it, its own render gives them it), and the state pins the key null. The lanes read
    it through env_file only (no compose file interpolates it) and lose it on a converge: they
    drift, as the line does."""
    raw = copy.deepcopy(load_snapshot(LAB_DESIRED)[1]["thor"].collected)
    raw["envfile"].append({"key": "VLLM_LOGGING_LEVEL", "line": 2000, "value": ""})
    for render in ("render_current", "render_login_current"):
        for name in THOR_LANES:
            raw[render]["services"][name]["environment"]["VLLM_LOGGING_LEVEL"] = ""
    for c in raw["docker"]["containers"]:
        if c["service"] in THOR_LANES:
            c["env"]["VLLM_LOGGING_LEVEL"] = ""
    first = parse_collected(raw, complete=True)
    assert isinstance(first, Observed)
    assert "VLLM_LOGGING_LEVEL" not in first.variables.names
    current = render_basis.current_pairs(first)
    assert current is not None
    raw["render_current"]["basis"] = raw["render_login_current"]["basis"] = render_basis.env_basis(
        current
    )  # the basis the box records for its own `.env`, now with the line
    doc = parse_collected(raw, complete=True)
    assert isinstance(doc, Observed)
    assert not compare_box(pinned(adopted["thor"], "VLLM_LOGGING_LEVEL", ""), doc).drifts
    exp = pinned(adopted["thor"], "VLLM_LOGGING_LEVEL", None)
    result = compare_box(exp, doc)
    assert not result.errors
    (d,) = entries(result, Kind.ENVFILE, "VLLM_LOGGING_LEVEL")
    assert (d.desired, d.observed) == (None, "")
    lanes = entries(result, Kind.ENV, "VLLM_LOGGING_LEVEL")
    assert sorted((e.subject, e.desired, e.observed) for e in lanes) == [
        (f"lane:{s}", None, "") for s in THOR_LANES
    ]
