"""A `.env` line whose value compose computes, for a key managed as null; and a desired `.env`
whose lines interpolate a key the converge writes (review 8, `.env` parity).

1. compose reads `HAND_IMAGE=${HAND_PIN:-${VLLM_NIGHTLY_IMAGE}}` (or `$PWD/m`, an ambiguous
   `${...}`) as present; the box's readers cannot compute its value. `env: {HAND_IMAGE: null}`
   promises drift reports such a line and a converge removes it (README, docs/import.md). Both
   box programs skipped it: the converge then refused every later write ("HAND_IMAGE would not
   read back ..."), drift said nothing.
2. The render of the desired `.env` recorded the basis of compose's reading of its text, where
   `C=${A}` reads A's new value; the controller computes the basis from the answer's values
   (`envfile`: `C` as it reads now), never matched it, and a replay against that very desired
   state said "saved against another desired state".

The cases compose reads as present while the readers cannot compute them are those of the
capture of the real compose (tests/fixtures/dotenv/compose_reads.json, held to compose by
test_dotenv_compose_parity.py), plus lobes' own HAND_IMAGE form.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare import render_basis
from reconciler.compare.context import BoxExpectation
from reconciler.compare.envfile import compare_envfile
from reconciler.desired.entries import EnvEntry
from reconciler.desired.facts import snapshot_facts
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import drift_inputs
from reconciler.observe.document import Observed, parse_collected
from reconciler.records import replace
from tests.unit.conftest import ROOT, load_box_program

collector = load_box_program("box_collector_envnull", "reconciler/observe/remote/collector.py")
converge = load_box_program("box_converge_envnull", "reconciler/apply/remote/converge.py")

CAPTURED = json.loads((ROOT / "tests/fixtures/dotenv/compose_reads.json").read_text())["cases"]
LOBES_HAND = (
    "VLLM_NIGHTLY_IMAGE=vllm/vllm-openai:nightly\nHAND_IMAGE=${HAND_PIN:-${VLLM_NIGHTLY_IMAGE}}\n"
)
TEXTS = {name: case["text"] for name, case in CAPTURED.items() if "refused" not in case}
TEXTS["lobes_hand_image"] = LOBES_HAND


def computed_keys() -> list[tuple[str, str]]:
    """(case, key) for each key the captured compose reads as present and the box's readers
    leave out (a value they cannot compute), and lobes' HAND_IMAGE."""
    out = [("lobes_hand_image", "HAND_IMAGE")]
    for name, case in CAPTURED.items():
        if "refused" in case:
            continue
        known = {e["key"] for e in collector.parse_dotenv(case["text"])}
        out += [
            (name, key)
            for key, read in case.items()
            if key != "text" and read is not None and key not in known
        ]
    return out


COMPUTED = computed_keys()


def test_the_capture_holds_keys_compose_computes() -> None:
    # The parametrized tests below run on these: an empty list would make them pass vacuously.
    assert {k for _, k in COMPUTED} >= {"V", "W", "PWD", "HAND_IMAGE"}
    assert len(COMPUTED) >= 8, COMPUTED


def run_of(directory: Path, managed: dict[str, Any]) -> Any:
    return collector.Run(
        {"run_key": "k" * 32, "secret_patterns": [], "directory": str(directory),
         "managed_env": managed, "compose_files": [], "box_secrets": {}}
    )  # fmt: skip


def converged(directory: Path, text: str, managed: dict[str, Any]) -> str:
    """The `.env` a converge leaves after writing `managed` over `text`."""
    env = directory / ".env"
    env.write_bytes(text.encode("utf-8"))
    env.chmod(0o600)
    box = converge.Box(
        {"directory": str(directory), "project": "lobes", "compose_files": [],
         "managed_env": managed, "env_keys": list(managed)}
    )  # fmt: skip
    converge.write_env(box, list(managed), managed)
    return env.read_bytes().decode("utf-8")


# -- 1. a null key compose computes --------------------------------------------------------------
@pytest.mark.parametrize(("case", "key"), COMPUTED)
def test_a_converge_removes_a_null_key_compose_computes_as_the_collector_renders_it(
    tmp_path: Path, case: str, key: str
) -> None:
    """Another key written too: the converge checks what it writes reads back, which refused
    the line it had not removed."""
    text = TEXTS[case]
    managed: dict[str, Any] = {key: None, "OTHER_KEY": "2"}
    written = converged(tmp_path, text, managed)
    statements, problem = collector._dotenv_read(written)
    assert problem is None
    assert key not in {s[0] for s in statements}, written  # compose reads it as absent now
    assert ("OTHER_KEY", "2") in [(s[0], s[1]) for s in statements]
    assert written == collector.desired_envfile(run_of(tmp_path, managed), text, {})


@pytest.mark.parametrize(("case", "key"), COMPUTED)
def test_alone_a_null_key_compose_computes_is_removed_by_both(
    tmp_path: Path, case: str, key: str
) -> None:
    text = TEXTS[case]
    written = converged(tmp_path, text, {key: None})
    assert written != text
    assert key not in {s[0] for s in collector._dotenv_read(written)[0]}
    assert written == collector.desired_envfile(run_of(tmp_path, {key: None}), text, {})


@pytest.fixture(scope="module")
def thor() -> BoxExpectation:
    fleet = load_fleet(
        ROOT, "lab", facts=snapshot_facts(ROOT / "tests/fixtures/import/lab_desired")
    )
    return drift_inputs(fleet).expectations["thor"]


def observed(directory: Path, text: str, managed: dict[str, Any]) -> tuple[list[Any], Observed]:
    (directory / ".env").write_text(text, encoding="utf-8")
    envfile, _ = collector.envfile_fact(run_of(directory, managed))
    doc = parse_collected(
        json.loads(json.dumps({"envfile": envfile, "secret_sources": {}})),
        complete=False,
        version=1,
    )
    assert isinstance(doc, Observed), doc
    return envfile, doc


@pytest.mark.parametrize(("case", "key"), COMPUTED)
def test_drift_reports_the_line_of_a_null_key_compose_computes(
    tmp_path: Path, thor: BoxExpectation, case: str, key: str
) -> None:
    text = TEXTS[case]
    envfile, doc = observed(tmp_path, text, {key: None})
    shown = [e for e in envfile if e["key"] == key]
    assert shown, envfile
    # Its value as written (quotes and `${...}` kept), never one compose holds; the entry has
    # only the fields every answer's has (the fast snapshot reader refuses any other).
    assert all(set(e) == {"key", "value", "line"} for e in envfile)
    last = [s for s in collector._dotenv_read(text)[0] if s[0] == key][-1]
    assert shown[-1]["line"] == last[2]
    assert shown[-1]["value"] == text[last[4] : last[5]].strip()
    exp = replace(thor, env=(EnvEntry(key, None, "group_vars/all.yml:3"),))
    drifts = [d for d in compare_envfile(exp, doc) if d.path == key]
    assert len(drifts) == 1, drifts
    assert drifts[0].desired is None and drifts[0].source == f".env:{last[2]}"
    assert drifts[0].observed == shown[-1]["value"]


def test_only_a_key_managed_as_null_shows_a_value_compose_computes(tmp_path: Path) -> None:
    """Every other answer is as before: such a key unmanaged, or managed with a value, reads
    as absent (a converge appends a value after it)."""
    for managed in ({}, {"HAND_IMAGE": "reg/hand:1"}, {"VLLM_NIGHTLY_IMAGE": None}):
        envfile, _ = observed(tmp_path, LOBES_HAND, managed)
        assert "HAND_IMAGE" not in [e["key"] for e in envfile], managed
    envfile, _ = observed(tmp_path, LOBES_HAND, {"HAND_IMAGE": None})
    assert [e["key"] for e in envfile] == ["VLLM_NIGHTLY_IMAGE", "HAND_IMAGE"]


# -- 2. the basis of the desired render --------------------------------------------------------
def collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, current: str, managed: dict[str, Any]
) -> Observed:
    """A saving run's answer (`render_current`) on a deployment holding `current`, compose
    stubbed by a service that reads the `.env` whole (env_file), as the box's reader reads it."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / ".env").write_text(current, encoding="utf-8")
    (deploy / "docker-compose.yml").write_text("services: {}\n", encoding="utf-8")

    def render(run: Any, project: str, env: dict[str, str]) -> dict[str, Any]:
        text = (Path(project) / ".env").read_text(encoding="utf-8")
        environment = {e["key"]: e["value"] for e in collector.parse_dotenv(text)}
        return {"services": {"lane": {"image": "x", "environment": environment}}}

    monkeypatch.setattr(collector, "render", render)
    monkeypatch.setattr(collector, "variables", lambda *a: {"names": []})
    monkeypatch.setattr(collector, "containers", lambda run: {"error": "stubbed"})
    monkeypatch.setattr(collector, "gateway_probes", lambda run: {})
    monkeypatch.setattr(collector, "login_shell", lambda run: ({"exports": {}}, {}))
    payload = {"run_key": "k" * 32, "secret_patterns": [], "directory": str(deploy),
               "project": "lobes", "compose_files": ["docker-compose.yml"],
               "managed_env": managed, "box_secrets": {}, "render_current": True}  # fmt: skip
    doc = parse_collected(json.loads(json.dumps(collector.collect(payload))), complete=False)
    assert isinstance(doc, Observed), doc
    return doc


def entries(managed: dict[str, Any]) -> list[EnvEntry]:
    return [EnvEntry(k, v, "group_vars/all.yml:1") for k, v in managed.items()]


INTERPOLATING = TEXTS["interp_quotes"]  # A=1, V=$A/${A}, W="$A/${A}": compose reads 1/1


@pytest.mark.parametrize(
    ("current", "managed", "reads"),
    [
        (INTERPOLATING, {"A": "2"}, {"V": "2/2", "W": "2/2", "X": "$A/${A}"}),
        # lobes' HAND_IMAGE, null, beside a line interpolating a key written
        (LOBES_HAND + INTERPOLATING, {"HAND_IMAGE": None, "A": "3"}, {"V": "3/3"}),
    ],
)
def test_a_replay_reads_the_render_of_the_desired_env_whose_lines_interpolate_a_key_written(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    current: str,
    managed: dict[str, Any],
    reads: dict[str, str],
) -> None:
    doc = collected(tmp_path, monkeypatch, current, managed)
    assert doc.render.basis is not None and doc.render_current is not None
    chosen = render_basis.for_desired(doc, entries(managed))
    assert chosen.render.error is None and chosen.render is doc.render
    services = chosen.render.services
    assert services is not None
    environment = services["lane"].environment
    assert {k: environment.get(k) for k in reads} == reads  # compose's reading, not the box's
    assert all(environment.get(k) is None for k, v in managed.items() if v is None)
    # The box's own `.env` (nothing managed): its own render, where V reads as it does now.
    own = render_basis.for_desired(doc, [])
    assert own.render is doc.render_current
    # Another desired state: no render of its `.env` in this snapshot.
    other = render_basis.for_desired(doc, entries({"A": "9"}))
    assert other.render.services is None and other.render.error == render_basis.NO_RENDER


@pytest.mark.parametrize("case", sorted(TEXTS))
def test_the_collector_and_the_controller_agree_on_the_desired_basis_of_captured_files(
    tmp_path: Path, case: str
) -> None:
    """Each key of each captured `.env` written, taken out, or both: the basis the collector
    records for the desired render is the one the controller computes from the answer."""
    text = TEXTS[case]
    keys = sorted({s[0] for s in collector._dotenv_read(text)[0] if s[0].isidentifier()})
    for index, key in enumerate(keys):
        for managed in (
            {key: "new-1"},
            {key: None},
            {key: "two words #x", keys[index - 1]: None},
            {key: None, "APPENDED": "x"},
        ):
            (tmp_path / ".env").write_text(text, encoding="utf-8")
            run = run_of(tmp_path, managed)
            envfile, _ = collector.envfile_fact(run)
            raw = {"envfile": envfile, "secret_sources": {}}
            doc = parse_collected(raw, complete=False, version=1)
            assert isinstance(doc, Observed), doc
            want = render_basis.env_basis(render_basis.desired_pairs(doc, entries(managed)))
            assert collector.desired_basis(run, text, {}) == want, managed
            current = render_basis.current_pairs(doc)
            assert current is not None
            assert collector.env_basis(run, text) == render_basis.env_basis(current), managed
