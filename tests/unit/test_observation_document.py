"""A hostile or broken box is that box's error, never the run's (issue 10, class 5).

Every crafted answer is a mutation of a real capture (examples/lab-incidents: what the lab's
collectors printed) and goes through the live path: the transport's result -> `gather` ->
the observation document. Each must become a typed fault of THAT box, with no exception, and
the fault's text names the field path but never the value that was wrong.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.drift import Part
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift, run_drift_on
from reconciler.drift_inputs import drift_inputs
from reconciler.observe.document import (
    MAX_ANSWER_BYTES,
    Fault,
    FaultKind,
    Observed,
    load_json,
    parse_answer,
    parse_collected,
    parse_probes,
)
from reconciler.observe.early import EarlyStart
from reconciler.observe.observe import BoxObservation, gather, load_snapshot
from reconciler.observe.probes import NOT_MADE
from reconciler.observe.transport import RemoteResult
from reconciler.report import render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"
AUDIT_FIXTURES = ROOT / "tests" / "fixtures" / "audit"
CANARY = "CANARY-hunter2-must-never-be-printed"
DIGEST = "hmac:" + "ab" * 32


def capture(box: str = "thor") -> dict[str, Any]:
    raw = json.loads((EXAMPLE / "snapshot" / f"{box}.json").read_text(encoding="utf-8"))
    return raw


def collected(box: str = "thor") -> dict[str, Any]:
    doc: dict[str, Any] = copy.deepcopy(capture(box)["collected"])
    return doc


# -- the live path, without SSH ------------------------------------------------------------------
class Answered:
    """A finished collector run, as transport.Running hands it over."""

    def __init__(self, box: str, stdout: str = "", code: int = 0, stderr: str = "", **kw: Any):
        self.box, self.stdout, self.code, self.stderr = box, stdout, code, stderr
        self.error: str | None = kw.get("error")
        self.raises: BaseException | None = kw.get("raises")
        self.cancelled = False

    def finish(self, timeout: float, limit: int = MAX_ANSWER_BYTES) -> RemoteResult:
        if self.raises is not None:
            raise self.raises
        return RemoteResult(self.box, self.code, self.stdout, self.stderr, self.error)

    def cancel(self) -> None:
        self.cancelled = True

    def refused_anew(self) -> str | None:
        return None  # no master connection in play: the box took this run's connection


def done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


def observe_one(handle: Answered, controller: dict[str, Any] | None = None) -> BoxObservation:
    probes = {handle.box: controller if controller is not None else capture()["controller"]}
    return gather({handle.box: handle}, done(probes), 5.0)[handle.box]  # type: ignore[dict-item]


def text(doc: Any) -> str:
    return json.dumps(doc)


def edited(change: Callable[[dict[str, Any]], Any]) -> str:
    doc = collected()
    change(doc)
    return text(doc)


def container(doc: dict[str, Any], service: str = "gateway") -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in doc["docker"]["containers"] if c["service"] == service)
    return found


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value

    return change


def _nested(depth: int) -> Any:
    value: Any = CANARY
    for _ in range(depth):
        value = [value]
    return value


def _non_utf8() -> bytes:
    return edited(_set("user", "fl-thor-MARK")).encode().replace(b"MARK", b"\xff\xfe")


def _surrogate_escaped() -> str:
    # What a pipe decoded with errors="surrogateescape" hands over for the same bytes.
    return _non_utf8().decode("utf-8", errors="surrogateescape")


def _duplicate_key() -> str:
    return text(collected()).replace('"collector": 1', '"collector": 1, "collector": 1', 1)


def _nan(constant: str) -> str:
    answer = text(collected())
    return answer.replace('"MemAvailable_kib": ', f'"MemAvailable_kib": {constant}, "x": ', 1)


def _long_number() -> str:
    return text(collected()).replace('"restart_count": 0', '"restart_count": ' + "9" * 5000, 1)


def _env_without_equals(doc: dict[str, Any]) -> None:
    # Docker's own form (a list of NAME=value entries, one without "="), not the collector's.
    container(doc)["env"] = ["GATEWAY_API_KEY", f"HF_TOKEN={CANARY}"]


def _lone_surrogate() -> str:
    return text(collected()).replace('"user": "fl-thor"', '"user": "fl-\\ud800thor"', 1)


def _null_everywhere(doc: dict[str, Any]) -> None:
    for key in list(doc):
        if key != "collector":
            doc[key] = None


# name -> (answer, kind, field path or None, accepted?)
Case = tuple[Callable[[], str | bytes], FaultKind, str | None]
CASES: dict[str, Case] = {
    "truncated JSON": (lambda: text(collected())[:50_000], FaultKind.NOT_JSON, None),
    "a 100 MB answer": (lambda: " " * (100 * 1024 * 1024) + "{}", FaultKind.TOO_LARGE, None),
    "empty answer": (lambda: "", FaultKind.NOT_JSON, None),
    "two documents": (lambda: text(collected()) + "{}", FaultKind.NOT_JSON, None),
    "the answer is a list": (lambda: text([collected()]), FaultKind.MALFORMED, None),
    "the answer is null": (lambda: "null", FaultKind.MALFORMED, None),
    "a list where docker's object is": (
        lambda: edited(_set("docker", [CANARY])),
        FaultKind.MALFORMED,
        "docker",
    ),
    "a string where an int is": (
        lambda: edited(_set("meminfo.MemAvailable_kib", "4096")),
        FaultKind.MALFORMED,
        "meminfo.MemAvailable_kib",
    ),
    "a boolean where an int is": (
        lambda: edited(lambda d: container(d).update(exit_code=True)),
        FaultKind.MALFORMED,
        "docker.containers[0].exit_code",
    ),
    "a negative count": (
        lambda: edited(lambda d: container(d).update(restart_count=-1)),
        FaultKind.MALFORMED,
        "docker.containers[0].restart_count",
    ),
    "a huge size": (
        lambda: edited(lambda d: d["files"][".env"].update(size=10**30)),
        FaultKind.MALFORMED,
        None,
    ),
    "a number of 5000 digits": (_long_number, FaultKind.NOT_JSON, None),
    "huge nesting": (lambda: "[" * 200_000 + "]" * 200_000, FaultKind.NOT_JSON, None),
    "nesting inside a compose port": (
        lambda: edited(_set("render.services.gateway.ports", [_nested(60)])),
        FaultKind.NOT_JSON,  # past load_json's depth bound, before any field is read
        None,
    ),
    "an unknown collector version": (
        lambda: edited(_set("collector", 2)),
        FaultKind.UNSUPPORTED_VERSION,
        "collector",
    ),
    "the version as a string": (
        lambda: edited(_set("collector", CANARY)),
        FaultKind.UNSUPPORTED_VERSION,
        "collector",
    ),
    "no collector version": (
        lambda: edited(lambda d: d.pop("collector")),
        FaultKind.UNSUPPORTED_VERSION,
        "collector",
    ),
    "null everywhere": (lambda: edited(_null_everywhere), FaultKind.MALFORMED, None),
    "a lone answer missing its sections": (
        lambda: text({"collector": 1, "user": "fl-thor"}),
        FaultKind.MALFORMED,
        None,
    ),
    "a container with no id": (
        lambda: edited(lambda d: container(d).pop("id")),
        FaultKind.MALFORMED,
        "docker.containers[0].id",
    ),
    "a container with no name": (
        lambda: edited(lambda d: container(d).pop("name")),
        FaultKind.MALFORMED,
        "docker.containers[0].name",
    ),
    "ports as a string": (
        lambda: edited(lambda d: container(d).update(ports="0.0.0.0:8000->8000/tcp")),
        FaultKind.MALFORMED,
        "docker.containers[0].ports",
    ),
    "a host port as a number": (
        lambda: edited(
            lambda d: container(d).update(ports={"8000/tcp": [{"HostIp": "", "HostPort": 8000}]})
        ),
        FaultKind.MALFORMED,
        "docker.containers[0].ports.8000/tcp[0].HostPort",
    ),
    "env entries without =": (
        lambda: edited(_env_without_equals),
        FaultKind.MALFORMED,
        "docker.containers[0].env",
    ),
    "non-UTF-8 bytes": (_non_utf8, FaultKind.NOT_JSON, None),
    "non-UTF-8 through the pipe": (_surrogate_escaped, FaultKind.NOT_JSON, None),
    "a lone surrogate escape": (_lone_surrogate, FaultKind.MALFORMED, "user"),
    "NaN": (lambda: _nan("NaN"), FaultKind.NOT_JSON, None),
    "Infinity": (lambda: _nan("-Infinity"), FaultKind.NOT_JSON, None),
    "a duplicate key": (_duplicate_key, FaultKind.NOT_JSON, None),
    "a secret that is not a digest": (
        lambda: edited(lambda d: container(d)["env"].update(GATEWAY_API_KEY={"secret": CANARY})),
        FaultKind.MALFORMED,
        "docker.containers[0].env.GATEWAY_API_KEY.secret",
    ),
    "a .env line numbered 0": (
        lambda: edited(_set("envfile.0.line", 0)),
        FaultKind.MALFORMED,
        "envfile[0].line",
    ),
    "an HTTP status of 999": (
        lambda: edited(_set("gateway.health.status", 999)),
        FaultKind.MALFORMED,
        "gateway.health.status",
    ),
    "a string too long to be a value": (
        lambda: edited(lambda d: container(d)["env"].update(LOBES_MESH_NAME="x" * 100_000)),
        FaultKind.MALFORMED,
        "docker.containers[0].env.LOBES_MESH_NAME",
    ),
    "a list too long to compare": (
        lambda: edited(_set("current_env_keys", [f"K{i}" for i in range(30_000)])),
        FaultKind.MALFORMED,
        "current_env_keys",
    ),
    "a name with terminal escapes": (
        lambda: edited(lambda d: container(d).update(service="gateway\x1b[2J")),
        FaultKind.MALFORMED,
        "docker.containers[0].service",
    ),
    "a file digest that is not hex": (
        lambda: edited(lambda d: d["files"]["docker-compose.yml"].update(sha256=CANARY)),
        FaultKind.MALFORMED,
        "files.docker-compose.yml.sha256",
    ),
    "a secret source read without its digest": (
        lambda: edited(lambda d: d["secret_sources"]["mesh_key"].pop("digest")),
        FaultKind.MALFORMED,
        "secret_sources.mesh_key.digest",
    ),
    "an argv token that is an object": (
        lambda: edited(lambda d: container(d).update(cmd=["python", {"argv": CANARY}])),
        FaultKind.MALFORMED,
        "docker.containers[0].cmd[1]",
    ),
    "docker with neither containers nor error": (
        lambda: edited(_set("docker", {})),
        FaultKind.MALFORMED,
        "docker.containers",
    ),
}


def test_enough_crafted_answers() -> None:
    assert len(CASES) >= 27


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_crafted_answer_is_a_typed_fault_of_that_box(name: str) -> None:
    make, kind, path = CASES[name]
    answer = make()
    handle = Answered("thor", answer if isinstance(answer, str) else "")
    if isinstance(answer, bytes):
        # The transport keeps undecodable bytes as lone surrogates (it never raises on them).
        handle.stdout = answer.decode("utf-8", "surrogateescape")
        direct = parse_answer(answer)
        assert isinstance(direct, Fault) and direct.kind is kind
    obs = observe_one(handle)
    fault = obs.failure
    assert fault is not None, name
    assert (fault.kind, obs.document, obs.collected) == (kind, None, None)
    if path is not None:
        assert fault.path == path
    assert obs.error == str(fault)
    assert CANARY not in str(fault) and "hunter2" not in str(fault)
    assert str(fault).isprintable() and len(str(fault)) < 400


def test_a_fault_names_the_field_never_the_value() -> None:
    answer = edited(_set("meminfo.MemAvailable_kib", CANARY))
    fault = parse_answer(answer)
    assert isinstance(fault, Fault)
    assert str(fault) == (
        "the collector's answer is malformed: meminfo.MemAvailable_kib: "
        "expected an integer, got a string"
    )


def test_extra_keys_are_accepted() -> None:
    """A newer collector may add fields: what the tool does not read is not checked."""

    def add(doc: dict[str, Any]) -> None:
        doc["added_later"] = {"anything": [1, 2, {"deep": None}]}
        container(doc)["added_later"] = CANARY
        doc["gateway"]["health"]["body"]["uptime_s"] = 12.5

    obs = observe_one(Answered("thor", edited(add)))
    assert obs.failure is None and isinstance(obs.document, Observed)
    assert obs.document.docker.containers is not None
    assert [c.service for c in obs.document.containers] == [
        c["service"] for c in collected()["docker"]["containers"]
    ]


def test_a_real_answer_reads_whole() -> None:
    obs = observe_one(Answered("thor", text(collected())))
    doc = obs.document
    assert doc is not None and obs.failure is None
    assert doc.collector == 1 and doc.deploy_dir == "/home/fl-thor/.lobes"
    assert doc.meminfo.available_kib == collected()["meminfo"]["MemAvailable_kib"]
    gateway = next(c for c in doc.containers if c.service == "gateway")
    assert gateway.ports["8000/tcp"][0].host_port == "8000"
    assert obs.probes.capabilities is not None and obs.probes.capabilities.roles is not None
    assert obs.collected == collected()  # the raw answer is kept for --save-snapshot


def test_no_answer_and_a_failed_collector_are_typed_too() -> None:
    unreachable = observe_one(Answered("thor", error="unreachable: ssh: connection refused"))
    assert unreachable.failure is not None
    assert unreachable.failure.kind is FaultKind.UNREACHABLE
    assert unreachable.error == "unreachable: ssh: connection refused"
    failed = observe_one(Answered("thor", code=1, stderr="Traceback ...\nKeyError: 'x'\x1b[2J\n"))
    assert failed.failure is not None and failed.failure.kind is FaultKind.COLLECTOR_FAILED
    assert failed.error == "collector failed: KeyError: 'x'?[2J"


def test_reading_one_box_fails_and_the_other_is_observed() -> None:
    handles = {
        "thor": Answered("thor", raises=OSError("pipe broke")),
        "spark": Answered("spark", text(collected("spark"))),
    }
    probes = {"thor": {}, "spark": capture("spark")["controller"]}
    found = gather(handles, done(probes), 5.0)  # type: ignore[arg-type]
    assert found["thor"].failure is not None and handles["thor"].cancelled
    assert found["spark"].document is not None


def test_probes_that_crashed_leave_every_box_observed() -> None:
    failed: Future[Any] = Future()
    failed.set_exception(RuntimeError("httpx blew up"))
    found = gather({"thor": Answered("thor", text(collected()))}, failed, 5.0)  # type: ignore[dict-item]
    assert found["thor"].document is not None
    # Each probe says the controller could not make it (its kind, never its text)
    health = found["thor"].probes.health
    assert health is not None and health.status is None and health.error is not None
    assert health.error.startswith(NOT_MADE) and "blew up" not in health.error


def test_a_hostile_gateway_body_in_the_controller_probes_is_that_probes_error() -> None:
    """A body lobes never sends fails that probe, saying where, and nothing else: the box's
    own answer is read (it was thrown away, blamed on the collector)."""
    controller = copy.deepcopy(capture()["controller"])
    controller["capabilities"]["body"] = {"worker": {"ready": CANARY}}
    obs = observe_one(Answered("thor", text(collected())), controller)
    assert obs.failure is None and obs.document is not None
    odd = obs.probes.capabilities
    assert odd is not None and odd.roles is None and odd.status == 200
    assert odd.error == (
        "the gateway's answer is not what lobes sends "
        "(controller.capabilities.body.worker.ready: expected true or false, got a string)"
    )
    # The controller's own record of its probes (a snapshot's, edited) is still a fault
    controller["capabilities"]["status"] = "200"
    probes = parse_probes(controller)
    assert isinstance(probes, Fault) and CANARY not in str(probes)
    assert str(probes).startswith("the controller's record of its probes is malformed")


@pytest.mark.parametrize(
    ("edit", "path"),
    [
        (_set("gateway.capabilities.body.worker.context", CANARY), "capabilities"),
        (_set("gateway.health.body", [CANARY]), "health"),
    ],
    ids=["a capabilities window as text", "a health body that is a list"],
)
def test_an_odd_body_the_box_got_from_its_gateway_is_that_probes_error(
    edit: Callable[[dict[str, Any]], None], path: str
) -> None:
    doc = parse_answer(edited(edit))
    assert isinstance(doc, Observed)
    probe = getattr(doc.gateway, path)
    assert probe.error.startswith(f"the gateway's answer is not what lobes sends (gateway.{path}.")
    assert CANARY not in probe.error


def test_the_size_limit_is_checked_before_parsing() -> None:
    just_over = " " * MAX_ANSWER_BYTES + "{}"
    fault = load_json(just_over)
    assert isinstance(fault, Fault) and fault.kind is FaultKind.TOO_LARGE
    assert load_json(" " * (MAX_ANSWER_BYTES - 2) + "{}") == {}


# -- snapshots ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "directory",
    [EXAMPLE / "snapshot", *sorted(p for p in AUDIT_FIXTURES.iterdir() if p.is_dir())],
    ids=lambda p: p.name if p.name != "snapshot" else "lab-incidents",
)
def test_snapshots_saved_by_earlier_versions_still_load(directory: Path) -> None:
    index, observations = load_snapshot(directory)
    assert set(observations) == set(index["boxes"])
    for name, obs in observations.items():
        assert obs.failure is None, (name, obs.failure)
        assert isinstance(obs.document, Observed) and obs.document.collector == 1


def test_a_damaged_snapshot_file_is_that_boxs_fault(tmp_path: Path) -> None:
    source = EXAMPLE / "snapshot"
    for path in source.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    (tmp_path / "thor.json").write_text('{"box": "thor", "collected": {"collector": 1,')
    (tmp_path / "orin.json").write_text(json.dumps({"box": "orin", "collected": [CANARY]}))
    _, observations = load_snapshot(tmp_path)
    assert observations["thor"].failure is not None
    assert observations["thor"].failure.kind is FaultKind.NOT_JSON
    assert observations["orin"].failure is not None
    assert observations["orin"].failure.kind is FaultKind.MALFORMED
    assert CANARY not in str(observations["orin"].failure)
    assert observations["spark"].document is not None


def test_a_snapshot_keeps_the_fault_never_the_refused_data(tmp_path: Path) -> None:
    from reconciler.observe.observe import save_snapshot

    hostile = observe_one(Answered("thor", edited(_set("docker", [CANARY]))))
    save_snapshot(tmp_path, {"thor": hostile}, {"run_id": "r"})
    saved = (tmp_path / "thor.json").read_text(encoding="utf-8")
    assert CANARY not in saved
    _, again = load_snapshot(tmp_path)
    assert again["thor"].document is None and again["thor"].error == hostile.error


# -- one hostile box among real ones: the whole run ----------------------------------------------
def test_a_hostile_box_is_its_own_error_and_the_others_are_fully_reported() -> None:
    fleet = load_fleet(EXAMPLE, "lab")
    inputs = drift_inputs(fleet)
    boxes = ["thor", "spark", "orin"]
    baseline = run_drift(fleet, boxes, from_snapshot=EXAMPLE / "snapshot").report
    handles = {
        "thor": Answered("thor", edited(lambda d: container(d).update(ports=CANARY))),
        "spark": Answered("spark", text(collected("spark"))),
        "orin": Answered("orin", text(collected("orin"))),
    }
    probes = done({b: capture(b)["controller"] for b in boxes})
    early = EarlyStart(inputs, handles, "k", probes)  # type: ignore[arg-type]
    report = run_drift_on(inputs, boxes, early=early).report

    by_box = {b.box: b for b in report.boxes}
    before = {b.box: b for b in baseline.boxes}
    assert report.exit_code == 1
    thor = by_box["thor"]
    # Its answer is refused; what its gateway answered the controller is still compared
    # (issue 11 §3): only the gateway's contract and auth, from the mesh side.
    assert (thor.reachable, thor.observation, len(thor.errors)) == (False, "partial", 1)
    assert {d.kind.value for d in thor.drifts} <= {"contract", "auth"}
    assert thor.errors[0].part is Part.OBSERVATION
    assert "docker.containers[0].ports" in thor.errors[0]
    for name in ("spark", "orin"):
        assert by_box[name].reachable and by_box[name].drifts
        assert by_box[name].drifts == before[name].drifts
        assert by_box[name].errors == before[name].errors

    document = json.loads(render(report, "json"))
    assert document["summary"]["exit_code"] == 1
    entries = {b["box"]: b for b in document["boxes"]}
    assert entries["thor"]["reachable"] is False and entries["thor"]["observation"] == "partial"
    assert {d["kind"] for d in entries["thor"]["drifts"]} <= {"contract", "auth"}
    for name in ("spark", "orin"):
        assert len(entries[name]["drifts"]) == len(before[name].drifts)
    markdown = render(report, "markdown")
    for name in ("spark", "orin"):
        for drift in before[name].drifts:
            assert drift.path in markdown, (name, drift.path)
    shown = render(report, "text", width=300)
    for name in ("spark", "orin"):
        assert f"{name}: reachable, {len(before[name].drifts)} differences" in shown
    for rendered in (shown, markdown):
        assert CANARY not in rendered and "docker.containers[0].ports" in rendered
    assert CANARY not in render(report, "json")


# -- the repeated drift path stays light ---------------------------------------------------------
def test_parsing_an_answer_imports_nothing_heavy() -> None:
    """`reconcile drift`'s fast path reads every answer through this module: stdlib only."""
    code = (
        "import sys, json\n"
        "from reconciler.observe.document import parse_answer, Observed\n"
        "import reconciler.observe.observe, reconciler.compare.box, reconciler.drift\n"
        f"raw = json.load(open({str(EXAMPLE / 'snapshot' / 'thor.json')!r}))['collected']\n"
        "assert isinstance(parse_answer(json.dumps(raw)), Observed)\n"
        "heavy = {'pydantic', 'ruamel', 'rich', 'pyinfra', 'yaml'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_live_answer_must_be_complete_a_snapshot_may_be_cut_down() -> None:
    cut = {"collector": 1, "docker": {"containers": []}}
    live = parse_collected(cut)
    assert isinstance(live, Fault) and live.kind is FaultKind.MALFORMED
    assert isinstance(parse_collected(cut, complete=False), Observed)
    wrong = parse_collected({"collector": 1, "docker": {"containers": {}}}, complete=False)
    assert isinstance(wrong, Fault) and wrong.path == "docker.containers"


def test_the_pyinfra_fact_reads_through_the_same_checks() -> None:
    from reconciler.observe.fact import Collected

    fact = Collected()
    assert fact.process([text(collected())]) == collected()
    truncated = fact.process([text(collected())[:1000]])
    assert truncated["fault"] == "not-json"
    hostile = fact.process([edited(_set("docker", [CANARY]))])
    assert hostile["fault"] == "malformed" and CANARY not in hostile["error"]


# -- the converge program's answer (apply/) --------------------------------------------------------
def test_a_hostile_converge_result_is_a_failure_naming_the_field() -> None:
    from reconciler.apply.answer import converge_result

    assert converge_result({"ok": True, "snapshot": "20261130T101010Z"}).ok
    for raw in (
        [CANARY],
        {"ok": "yes"},
        {"ok": True, "snapshot": "../../" + CANARY},
        {"ok": True, "snapshot": ["20261130T101010Z"]},
    ):
        result = converge_result(raw)
        assert not result.ok and result.snapshot is None, raw
        assert result.failed is not None and CANARY not in result.failed


def test_hostile_converge_events_are_not_shown_and_never_crash() -> None:
    import io

    from reconciler.apply.progress import Reporter

    stream = io.StringIO()
    reporter = Reporter("thor", stream, bar=False)
    for raw in (
        {"event": "wait", "service": "vllm-hand", "elapsed": "x", "timeout": 5},
        {"event": "healthy", "service": ["x"], "elapsed": 1},
        {"event": "memory", "service": "vllm-hand", "available_kib": float("nan"), "need_kib": 1},
        {"event": "step", "step": "write-env", "status": "done", "keys": "GATEWAY_API_KEY"},
        {"event": "snapshot", "id": CANARY},
        [CANARY],
        "text",
    ):
        reporter.on_event(raw)  # type: ignore[arg-type]
    reporter.on_event({"event": "note", "message": "done\x1b[2J"})
    reporter.on_event({"event": "healthy", "service": "vllm-hand", "elapsed": 12})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("thor: done") and "\x1b" not in lines[0]
    assert lines[1] == "thor: vllm-hand healthy after 12s"


def test_well_typed_but_nasty_values_are_compared_not_crashed_on() -> None:
    """Strings are strings: one that nests past json's depth, a window in other digits, an
    argv secret that is not one. The comparison reports them as drift."""
    fleet = load_fleet(EXAMPLE, "lab")
    inputs = drift_inputs(fleet)

    def nasty(doc: dict[str, Any]) -> None:
        worker = container(doc, "vllm-worker")
        worker["env"]["WORKER_MAX_MODEL_LEN"] = "[" * 60_000
        worker["cmd"] = [
            *worker["cmd"],
            "--max-model-len=²⁶²¹⁴⁴",
            '--api-key={"secret": ' + "[" * 9000,
        ]
        render = doc["render"]["services"]["vllm-worker"]
        render["environment"]["WORKER_MAX_MODEL_LEN"] = "[" * 50_000

    handles = {"thor": Answered("thor", edited(nasty))}
    early = EarlyStart(inputs, handles, "k", done({"thor": capture()["controller"]}))  # type: ignore[arg-type]
    report = run_drift_on(inputs, ["thor"], early=early).report
    thor = report.boxes[0]
    assert thor.reachable and not thor.errors
    assert any(
        d.path == "WORKER_MAX_MODEL_LEN" and d.subject == "lane:vllm-worker" for d in thor.drifts
    )
    assert "[[[" in render(report, "json")


# -- generated: random mutations of the captures never crash a run ---------------------------------
_POOL: list[Any] = [
    None, "", "x", -1, 0, 2**60, 1.5, [], {}, [None], {"secret": DIGEST}, {"secret": 3},
    "[" * 100, "²", True, False, ["a", "b"], {"a": 1}, "0o777", "--max-model-len=5", 200, 401,
    "running", "exited", "gateway", "vllm-worker",
]  # fmt: skip


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path] if path else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out += _paths(value, (*path, index))
    return out


def _mutate(raw: dict[str, Any], rng: Any) -> None:
    paths = _paths(raw)
    for _ in range(rng.randint(1, 3)):
        *parents, last = rng.choice(paths)
        node: Any = raw
        try:
            for key in parents:
                node = node[key]
            roll = rng.random()
            if roll < 0.15 and isinstance(node, dict):
                node.pop(last, None)
            elif roll < 0.7:  # mostly the same type: past the parser, into the comparison
                kin = [v for v in _POOL if type(v) is type(node[last])] or _POOL
                node[last] = copy.deepcopy(rng.choice(kin))
            else:
                node[last] = copy.deepcopy(rng.choice(_POOL))
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed the way there


def test_random_mutations_of_real_answers_are_faults_or_reports_never_crashes() -> None:
    import random

    from reconciler.apply.payload import fingerprint
    from reconciler.compare.box import compare_box
    from reconciler.compare.drift import DriftReport
    from reconciler.plan import plan_box

    inputs = drift_inputs(load_fleet(EXAMPLE, "lab"))
    captures = {b: capture(b) for b in ("thor", "spark", "orin")}
    rng = random.Random(20261130)
    outcomes = {"fault": 0, "compared": 0}
    for case in range(200):
        box = rng.choice(sorted(captures))
        raw = copy.deepcopy(captures[box])
        _mutate(raw, rng)
        obs = BoxObservation(box, raw["collected"], None, raw["controller"] or {})
        outcomes["fault" if obs.failure else "compared"] += 1
        result = compare_box(inputs.expectations[box], obs.document, obs.probes, obs.failure)
        report = DriftReport((result,), "lab", "t", "r")
        formats = ("json", "text", "markdown") if case % 10 == 0 else ("json",)
        for fmt in formats:
            render(report, fmt)  # type: ignore[arg-type]
        plan_box(result, inputs.expectations[box]).summary()
        fingerprint(obs.document)
    # Both halves exercised: the parser refuses some, the comparison meets the rest.
    assert outcomes["fault"] > 20 and outcomes["compared"] > 20, outcomes
