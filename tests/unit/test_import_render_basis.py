"""Which compose render a comparison reads (reconciler/compare/render_basis.py), and the basis
the collector and the controller each compute for a `.env`.

tests/fixtures/import/lab_desired/ is the pristine lab (lobes' own render) observed by
`reconcile -i lab drift --save-snapshot`: the lab's desired `.env` differs from every box's, so
each answer holds the render of the desired `.env` (`render`) and of the box's own
(`render_current`). Imported, it must replay to zero drift; judged against the lab's desired
state, it must replay exactly as the live run reported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare import render_basis
from reconciler.compare.box import compare_box
from reconciler.compare.context import BoxExpectation
from reconciler.desired.entries import EnvEntry, SecretName
from reconciler.desired.facts import snapshot_facts
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import drift_inputs
from reconciler.observe.document import Observed, parse_collected
from reconciler.observe.observe import load_snapshot
from reconciler.records import replace
from tests.unit.conftest import import_snapshot, load_box_program

REPO = Path(__file__).resolve().parents[2]
LAB_DESIRED = REPO / "tests/fixtures/import/lab_desired"
PRISTINE = REPO / "tests/fixtures/import/pristine"  # saved before renders had a basis
BOXES = ("thor", "spark", "orin")

collector = load_box_program("box_collector_basis", "reconciler/observe/remote/collector.py")


def docs(snapshot: Path) -> dict[str, Observed]:
    out = {}
    for name, obs in load_snapshot(snapshot)[1].items():
        assert obs.document is not None, name
        out[name] = obs.document
    return out


def lab_expectations() -> dict[str, BoxExpectation]:
    """The lab's desired state, with the facts the snapshot was judged against."""
    fleet = load_fleet(REPO, "lab", facts=snapshot_facts(LAB_DESIRED))
    return drift_inputs(fleet).expectations


@pytest.fixture(scope="module")
def adopted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    """The snapshot imported: the repository, import's exit code and what it printed."""
    return import_snapshot(LAB_DESIRED, tmp_path_factory.mktemp("basis") / "adopted")


# -- captured data ------------------------------------------------------------------------------
def test_the_controller_computes_the_basis_of_each_boxs_own_env() -> None:
    """From the answer's `envfile` alone, the basis the box recorded for its own `.env`: the two
    implementations agree on real answers. (The desired `.env`'s basis depends on the lab's
    group_vars of the day: the synthetic cases below check that one.)"""
    for name, doc in docs(LAB_DESIRED).items():
        assert doc.render_current is not None and doc.render_login_current is not None, name
        assert doc.render.basis is not None and doc.render_login is not None
        assert doc.render_login.basis == doc.render.basis
        current = render_basis.current_pairs(doc)
        assert current is not None
        assert doc.render_current.basis == render_basis.env_basis(current), name
        assert doc.render_current.basis != doc.render.basis
        assert doc.render_login_current.basis == doc.render_current.basis
        assert render_basis.current_render(doc) is doc.render_current


def test_judged_against_the_lab_the_own_render_changes_nothing() -> None:
    """The lab's desired `.env` is not the boxes' own: compare reads the desired render, and
    the second render changes nothing in the lab's verdict (what the saving run reported)."""
    expectations = lab_expectations()
    for name, doc in docs(LAB_DESIRED).items():
        assert render_basis.for_desired(doc, expectations[name].env) is doc, name
        alone = replace(doc, render_current=None, render_login_current=None)
        with_both = compare_box(expectations[name], doc)
        assert with_both.drifts, name  # the pristine lab drifts from the lab's desired state
        assert with_both.drifts == compare_box(expectations[name], alone).drifts, name


def test_the_imported_state_reads_the_render_of_the_boxes_own_env(
    adopted: tuple[Path, int, str],
) -> None:
    root, code, printed = adopted
    assert code == 0, printed
    assert "found while importing" not in printed
    fleet = load_fleet(root, "lab")
    expectations = drift_inputs(fleet).expectations
    read = {}
    for name, doc in docs(LAB_DESIRED).items():
        assert doc.render_current is not None
        chosen = render_basis.for_desired(doc, expectations[name].env)
        assert chosen.render is doc.render_current, name
        assert chosen.render_login is doc.render_login_current, name
        desired = render_basis.desired_pairs(doc, expectations[name].env)
        read[name] = render_basis.env_basis(desired) == doc.render_current.basis
        result = compare_box(expectations[name], doc)
        assert not result.errors and not result.drifts, (name, result.drifts[:3])
    # spark's .env is exactly what the adopted state writes; thor and orin run an open gateway,
    # whose adopted state writes `GATEWAY_API_KEY=` where lobes' .env has no line (read alike).
    assert read == {"thor": False, "spark": True, "orin": False}


def test_an_older_snapshot_without_bases_is_read_as_before() -> None:
    for name, doc in docs(PRISTINE).items():
        assert doc.render.basis is None and doc.render_current is None, name
        assert render_basis.for_desired(doc, ()) is doc
        assert render_basis.current_render(doc) is doc.render


# -- one basis, two implementations -------------------------------------------------------------
CURRENT = (
    "# lobes' render\n"
    "export KEEP=1\n"
    'QUOTED="a b # not a comment"  # a comment\n'
    "SINGLE='x\"y'\n"
    "WORKER_MAX_MODEL_LEN=1024\n"
    "WORKER_MAX_MODEL_LEN=4096\n"
    "GATEWAY_API_KEY=old-key-value\n"
    "HF_TOKEN=\n"
    "HAND_IMAGE=reg/hand@sha256:" + "1" * 64 + "\n"
    "  # HAND_IMAGE=commented\n"
    "WORKER_SPECULATIVE_CONFIG=\n"
)


def box(tmp_path: Path, managed: dict[str, Any]) -> tuple[Any, Observed, dict[str, str]]:
    """A collector run on a deployment holding CURRENT, and its answer's typed `.env` part."""
    (tmp_path / ".env").write_text(CURRENT, encoding="utf-8")
    (tmp_path / ".secrets.env").write_text("GATEWAY_API_KEY=new-key-value\n", encoding="utf-8")
    run = collector.Run(
        {"run_key": "k" * 32, "secret_patterns": [], "directory": str(tmp_path),
         "managed_env": managed, "compose_files": [],
         "box_secrets": {"gw": {"path": str(tmp_path / ".secrets.env"), "key": "GATEWAY_API_KEY"},
                         "gone": {"path": str(tmp_path / "missing.env"), "key": "X"}}}
    )  # fmt: skip
    envfile, _ = collector.envfile_fact(run)
    sources, values = collector.secret_sources(run)
    raw = json.loads(json.dumps({"envfile": envfile, "secret_sources": sources}))
    doc = parse_collected(raw, complete=False, version=1)
    assert isinstance(doc, Observed)
    return run, doc, values


def test_the_collector_and_the_controller_agree_on_the_boxes_own_env(tmp_path: Path) -> None:
    run, doc, _ = box(tmp_path, {})
    pairs = render_basis.current_pairs(doc)
    assert pairs is not None and pairs["WORKER_MAX_MODEL_LEN"] == "4096"  # the last one wins
    assert collector.env_basis(run, CURRENT) == render_basis.env_basis(pairs)


def test_the_collector_and_the_controller_agree_on_a_desired_env(tmp_path: Path) -> None:
    managed = {
        "WORKER_MAX_MODEL_LEN": "2048",  # written in place of two lines
        "QUOTED": 'it\'s "quoted" # too',  # needs quoting to read back
        "HAND_IMAGE": None,  # its lines dropped
        "NEW_SETTING": "appended",
        "GATEWAY_API_KEY": {"secret": "gw"},  # read on the box, hashed
        "HF_TOKEN": {"secret": "gone"},  # its source is missing: the box's line stays
    }
    env = [
        EnvEntry(k, SecretName(v["secret"]) if isinstance(v, dict) else v, "test")
        for k, v in managed.items()
    ]
    run, doc, values = box(tmp_path, managed)
    text = collector.desired_envfile(run, CURRENT, values)
    want = render_basis.env_basis(render_basis.desired_pairs(doc, env))
    assert collector.env_basis(run, text) == want
    assert want != collector.env_basis(run, CURRENT)


# -- reading alike --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("desired", "current", "alike"),
    [
        ({"A": "1", "GATEWAY_API_KEY": ""}, {"A": "1"}, True),  # an open gateway's pin
        ({"A": "1"}, {"A": "1", "HF_TOKEN": ""}, True),
        ({"A": "1", "WORKER_SPECULATIVE_CONFIG": ""}, {"A": "1"}, False),  # ${KEY-default}
        ({"A": "2"}, {"A": "1"}, False),
        ({"A": "1", "B": "x"}, {"A": "1"}, False),
        ({"A": "1"}, None, False),  # no .env on the box
    ],
)
def test_only_empty_against_absent_reads_alike(
    desired: dict[str, str], current: dict[str, str] | None, alike: bool
) -> None:
    assert render_basis.reads_alike(desired, current) is alike


# -- the collector: which renders it makes ------------------------------------------------------
def collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, managed: dict[str, Any], **extra: Any
) -> tuple[dict[str, Any], list[tuple[str, bool]]]:
    """collect() on a deployment holding CURRENT, compose and the slow probes stubbed: the
    answer, and each render asked for (the `.env` text it read, under a login shell or not)."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / ".env").write_text(CURRENT, encoding="utf-8")
    (deploy / "docker-compose.yml").write_text("services: {}\n", encoding="utf-8")
    renders: list[tuple[str, bool]] = []

    def render(run: Any, project: str, env: dict[str, str]) -> dict[str, Any]:
        text = (Path(project) / ".env").read_text(encoding="utf-8")
        renders.append((text, "LOGIN" in env))
        return {"services": {}}

    login_env = extra.pop("login_env", {})
    monkeypatch.setattr(collector, "render", render)
    monkeypatch.setattr(collector, "variables", lambda *a: {"names": []})
    monkeypatch.setattr(collector, "containers", lambda run: {"error": "stubbed"})
    monkeypatch.setattr(collector, "gateway_probes", lambda run: {})
    monkeypatch.setattr(collector, "login_shell", lambda run: ({"exports": {}}, login_env))
    payload = {"run_key": "k" * 32, "secret_patterns": [], "directory": str(deploy),
               "project": "lobes", "compose_files": ["docker-compose.yml"],
               "managed_env": managed, "box_secrets": {}, **extra}  # fmt: skip
    return json.loads(json.dumps(collector.collect(payload))), renders


def test_a_live_drift_renders_once_whatever_the_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc, renders = collected(tmp_path, monkeypatch, {"WORKER_MAX_MODEL_LEN": "2048"})
    assert [text for text, _ in renders] == [
        collector.desired_envfile(collector.Run({**PAYLOAD, "managed_env": {
            "WORKER_MAX_MODEL_LEN": "2048"}}), CURRENT, {})
    ]  # fmt: skip
    assert "render_current" not in doc and "render_current" not in doc["timings_ms"]
    assert "basis" not in doc["render"]  # not even the digest: nothing reads it


def test_a_saving_run_renders_the_boxes_own_env_where_it_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc, renders = collected(
        tmp_path, monkeypatch, {"WORKER_MAX_MODEL_LEN": "2048"}, render_current=True,
        login_env={"LOGIN": "1"},
    )  # fmt: skip
    own = [login for text, login in renders if text == CURRENT]
    assert sorted(own) == [False, True] and len(renders) == 4  # scrubbed and login, each .env
    assert doc["render_current"]["basis"] == doc["render_login_current"]["basis"]
    assert doc["render_current"]["basis"] == basis_of(CURRENT) != doc["render"]["basis"]


def test_a_saving_run_renders_once_where_the_env_is_already_the_desired_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Written differently (unquoted), read the same: one render serves both.
    doc, renders = collected(
        tmp_path, monkeypatch, {"WORKER_MAX_MODEL_LEN": "4096", "SINGLE": 'x"y'},
        render_current=True,
    )  # fmt: skip
    assert len(renders) == 1 and "render_current" not in doc
    assert doc["render"]["basis"] == basis_of(CURRENT)


PAYLOAD = {"run_key": "k" * 32, "secret_patterns": [], "directory": "/nonexistent"}


def basis_of(text: str) -> str:
    return str(collector.env_basis(collector.Run(PAYLOAD), text))


def test_a_basis_that_is_not_a_sha256_is_a_fault_of_that_box() -> None:
    from reconciler.observe.document import Fault

    for where in ("render", "render_current"):
        raw = {where: {"services": {}, "basis": "hmac:" + "0" * 64}}
        fault = parse_collected(raw, complete=False, version=1)
        assert isinstance(fault, Fault) and fault.path == f"{where}.basis", fault
