"""A hostile or broken box is that box's error, never the run's (issue 10, class 5).

Each case below crafts one box's answer from a real lab capture
(tests/fixtures/audit/weakest_link_proven_live: thor open, spark and orin keyed, one mesh) and
judges the three boxes together. Whatever the crafted box sent, the audit must:
  - raise nothing, and render text, JSON (valid against its schema) and markdown;
  - report that box as not audited, with a typed fault (a kind, and where in its answer);
  - judge every other box and the mesh exactly as if the crafted box had been unreachable
    (whose gateway still answered the controller, unless the crafted part is those answers:
    issue 11 §3, a box seen from the mesh side only);
  - exit 1;
  - never print a value the crafted answer put where a secret (or its digest) belongs.
"""

from __future__ import annotations

import copy
import functools
import html
import json
import re
import shutil
from collections.abc import Callable
from typing import Any

import pytest

from reconciler.audit.document import AuditReportDoc
from reconciler.audit.report import AuditReport
from reconciler.audit.report_html import render_html
from reconciler.audit.report_json import render_json
from reconciler.audit.report_md import render_markdown
from reconciler.audit.report_text import render_text
from reconciler.audit.run import audit_report
from reconciler.desired.fleet import Fleet
from reconciler.observe.document import Fault, FaultKind
from reconciler.observe.observe import (
    SNAPSHOT_FILE_LIMIT,
    BoxObservation,
    load_snapshot,
    save_snapshot,
)
from tests.unit.test_audit_snapshots import FIXTURES, fleet

SCENARIO = "weakest_link_proven_live"
AUTH = {"thor": "open"}
BOXES = ["orin", "spark", "thor"]
VICTIM = "spark"
# What a hostile box puts where a secret or its digest belongs: it must never be printed.
CANARY = "sk-canary-3f9d0c1e77aa"

WIRE_DIGEST = re.compile(r"hmac:[0-9a-f]{8}")  # the collector's digest, as it travels

Doc = dict[str, Any]
Craft = Callable[[Doc, Doc], Any]


def observations() -> dict[str, BoxObservation]:
    _, found = load_snapshot(FIXTURES / SCENARIO)
    return found


def crafted(craft: Craft) -> dict[str, BoxObservation]:
    """The scenario with VICTIM's collector answer (and controller probes) crafted."""
    found = observations()
    obs = found[VICTIM]
    collected, controller = copy.deepcopy(obs.collected), copy.deepcopy(obs.controller)
    replaced = craft(collected, controller)
    answer = collected if replaced is None else replaced
    # Read as a snapshot's file is (complete=False): the captures are cut down to what the
    # audit reads, so only the crafted part can make the answer refused.
    found[VICTIM] = BoxObservation(VICTIM, answer, None, controller, complete=False)
    return found


@functools.cache
def desired() -> Fleet:
    return fleet(AUTH)


def judge(found: dict[str, BoxObservation]) -> AuditReport:
    return audit_report(desired(), BOXES, found, "r1")


def unreachable(probed: bool = False) -> AuditReport:
    """VICTIM unreachable over SSH; `probed`: its gateway still answered the controller."""
    found = observations()
    controller = found[VICTIM].controller if probed else {}
    found[VICTIM] = BoxObservation(
        VICTIM, None, "ssh: connect to host spark port 22: timed out", controller
    )
    return judge(found)


def probes_kept(craft: Craft) -> bool:
    """Does `craft` leave VICTIM's controller probes as they were?"""
    obs = observations()[VICTIM]
    collected, controller = copy.deepcopy(obs.collected), copy.deepcopy(obs.controller)
    craft(collected, controller)
    return controller == obs.controller


# -- crafting helpers ----------------------------------------------------------------------------
def at(*path: str | int) -> Callable[[Any], Craft]:
    """Set the value at `path` in the collector's answer."""

    def value(new: Any) -> Craft:
        def craft(collected: Doc, controller: Doc) -> None:
            node: Any = collected
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = new

        return craft

    return value


def without(*path: str) -> Craft:
    def craft(collected: Doc, controller: Doc) -> None:
        node: Any = collected
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return craft


def answer(new: Any) -> Craft:
    return lambda collected, controller: new


def gateway_container(**changes: Any) -> Craft:
    def craft(collected: Doc, controller: Doc) -> None:
        for c in collected["docker"]["containers"]:
            if c["service"] == "gateway":
                c.update(changes)

    return craft


def in_controller(*path: str) -> Callable[[Any], Craft]:
    def value(new: Any) -> Craft:
        def craft(collected: Doc, controller: Doc) -> None:
            node: Any = controller
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = new

        return craft

    return value


def nulls(collected: Doc, controller: Doc) -> Doc:
    return {key: None for key in collected}


def null_leaves(collected: Doc, controller: Doc) -> Any:
    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return None

    return walk(collected)


def nested(depth: int) -> Any:
    return json.loads("[" * depth + "]" * depth)


ENV_KEY = at("audit", "envfile_keys", "GATEWAY_API_KEY")
PROBES = at("audit", "probes")
CHAT = at("audit", "probes", "chat_noauth")

CASES: dict[str, Craft] = {
    # the whole answer
    "answer is a list": answer([]),
    "answer is a string": answer(CANARY),
    "answer is a number": answer(7),
    "null everywhere": nulls,
    "null in every field": null_leaves,
    "deeply nested": at("audit", "probes", "chat_noauth")(nested(900)),
    # missing sections the audit reads
    "no audit section": without("audit"),
    "no docker section": without("docker"),
    "no gateway probes": without("gateway"),
    # the engine could not be read (its socket refused): no container seen is not none running
    "docker unreadable": at("docker")({"error": "docker engine not reachable: refused"}),
    # the audit section
    "audit is a list": at("audit")([]),
    "envfile_keys is a list": at("audit", "envfile_keys")(["GATEWAY_API_KEY"]),
    # a wrong type that is falsy must not read as "empty"
    "envfile_keys is an empty string": at("audit", "envfile_keys")(""),
    "envfile_keys is 0": at("audit", "envfile_keys")(0),
    "an envfile entry is a string": ENV_KEY("set"),
    "an envfile state is unknown": ENV_KEY({"state": "maybe", "line": 3}),
    "an envfile line is a string": ENV_KEY({"state": "set", "line": "12"}),
    "an envfile line is NaN": ENV_KEY({"state": "set", "line": float("nan")}),
    "an envfile digest is clear text": ENV_KEY({"state": "set", "line": 3, "digest": CANARY}),
    "an envfile digest is a number": ENV_KEY({"state": "set", "line": 3, "digest": 7}),
    "probes is a list": PROBES([1, 2]),
    "a probe status is a string": CHAT({"status": "401", "model": "hand"}),
    "a probe status is a bool": CHAT({"status": True}),
    "a probe status is NaN": CHAT({"status": float("nan")}),
    "a probe status is out of range": CHAT({"status": 10**30}),
    "the keyed probe's key is clear text": at("audit", "probes", "models_key")(
        {"status": 200, "key_from": "secret:gateway_api_key", "key": CANARY}
    ),
    "host_network containers is a string": at("audit", "host_network", "containers")("gw"),
    "host_network is a list": at("audit", "host_network")(["gw"]),
    # the containers
    "containers is a dict": at("docker", "containers")({"gateway": {"name": "gw"}}),
    "a container is a string": at("docker", "containers")(["model-gear-gateway"]),
    "env is a list with an entry with no =": gateway_container(
        env=["GATEWAY_API_KEY", f"LOBES_MESH_KEY={CANARY}"]
    ),
    "a secret env value is clear text": gateway_container(
        env={"GATEWAY_API_KEY": CANARY, "LOBES_MESH_NAME": "spark"}
    ),
    "a secret env value is a wrongly shaped secret": gateway_container(
        env={"GATEWAY_API_KEY": {"secret": 5, "clear": CANARY}, "LOBES_MESH_NAME": "spark"}
    ),
    "ports is a list": gateway_container(ports=["8000"]),
    "a binding is a string": gateway_container(ports={"8000/tcp": "0.0.0.0:8000"}),
    "a host port is a number": gateway_container(ports={"8000/tcp": [{"HostPort": 8000}]}),
    "a container status is a number": gateway_container(status=1),
    # the controller sends a request to a published lane's address: no URL parts in it
    "a host address is a URL": gateway_container(
        ports={"8000/tcp": [{"HostIp": "evil.example/x?", "HostPort": "8000"}]}
    ),
    "a host port carries a path": gateway_container(
        ports={"8000/tcp": [{"HostIp": "", "HostPort": "80/admin#"}]}
    ),
    "a host port is out of range": gateway_container(
        ports={"8000/tcp": [{"HostIp": "", "HostPort": "70000"}]}
    ),
    # the gateway probes, the login shell, the variables, the secret sources
    "gateway probes are a list": at("gateway")([]),
    "a gateway probe status is a string": at("gateway", "models_noauth")({"status": "401"}),
    "login_shell is a string": at("login_shell")("bash"),
    "exports is a list": at("login_shell", "exports")(["GATEWAY_API_KEY"]),
    "an export is a string": at("login_shell", "exports")({"GATEWAY_API_KEY": CANARY}),
    "a secret export is clear text": at("login_shell", "exports")(
        {"GATEWAY_API_KEY": {"value": CANARY, "source": "~/.bashrc:3"}}
    ),
    "variable names are a string": at("variables", "names")("GATEWAY_API_KEY"),
    "secret_sources is a list": at("secret_sources")([]),
    "a secret source is a string": at("secret_sources", "gateway_api_key")("ok"),
    "a secret source digest is clear text": at("secret_sources", "gateway_api_key")(
        {"status": "ok", "path": "~/.lobes/.secrets.env", "digest": CANARY}
    ),
    # what the box's gateway answered the controller
    "the controller's audit probes are a list": in_controller("audit")([]),
    "a mesh-side status is a string": in_controller("models_noauth")({"status": "200"}),
    "the weakest-link proofs are a string": in_controller("audit", "weakest_link")(CANARY),
    "the weakest-link proofs are an empty object": in_controller("audit", "weakest_link")({}),
    "the lane-port probes are false": in_controller("audit", "lane_ports")(False),
}


# What a crafted answer is: never confused with a box that did not answer.
REFUSED = {
    FaultKind.MALFORMED,
    FaultKind.NOT_JSON,
    FaultKind.TOO_LARGE,
    FaultKind.UNSUPPORTED_VERSION,
    FaultKind.NOT_OBSERVED,
}


def outputs(report: AuditReport) -> dict[str, str]:
    return {
        "text": render_text(report),
        "json": render_json(report),
        "markdown": render_markdown(report),
        "html": render_html(report),
    }


@pytest.fixture(scope="module")
def baselines() -> dict[bool, AuditReport]:
    return {False: unreachable(), True: unreachable(probed=True)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_crafted_answer_is_that_boxs_error(case, baselines):
    report = judge(crafted(CASES[case]))
    baseline = baselines[probes_kept(CASES[case])]

    row = report.row_of(VICTIM)
    assert not report.verdict_of(VICTIM).audited
    assert isinstance(row.fault, Fault) and row.fault.kind in REFUSED
    assert report.exit_code == 1

    # Every other box, and the mesh, judged as if the crafted box had not answered at all.
    for box in BOXES:
        if box != VICTIM:
            assert report.verdict_of(box) == baseline.verdict_of(box), box
    assert report.mesh_verdict == baseline.mesh_verdict
    assert VICTIM in report.mesh.unaudited

    out = outputs(report)
    doc = AuditReportDoc.model_validate_json(out["json"])
    assert [b.box for b in doc.boxes] == BOXES
    (victim,) = [b for b in doc.boxes if b.box == VICTIM]
    assert not victim.audited and victim.evidence is None
    assert victim.fault is not None and victim.fault.kind == row.fault.kind.value
    assert all(b.audited and b.evidence is not None for b in doc.boxes if b.box != VICTIM)
    assert doc.summary.exit_code == 1 and VICTIM in doc.mesh.unaudited
    for box in BOXES:
        assert box in out["text"] and f"## {box}:" in out["markdown"]
    assert f"{VICTIM}: FAIL (not audited)" in out["text"]
    assert f"({row.fault.kind.value})" in out["text"]  # the matrix cell may wrap
    assert "## mesh:" in out["markdown"] and "mesh:" in out["text"]
    for name, text in out.items():
        assert CANARY not in text, name
        assert not WIRE_DIGEST.search(text), name


def test_the_fault_says_where_in_the_answer():
    report = judge(crafted(at("audit", "probes", "chat_noauth")({"status": "401"})))
    fault = report.row_of(VICTIM).fault
    assert fault is not None and fault.kind is FaultKind.MALFORMED
    assert fault.path == "audit.probes.chat_noauth.status"
    (finding,) = report.verdict_of(VICTIM).findings
    assert finding.code == "audit.unobserved" and fault.path in finding.message
    doc = json.loads(render_json(report))
    (victim,) = [b for b in doc["boxes"] if b["box"] == VICTIM]
    assert victim["fault"] == {"kind": "malformed", "path": fault.path, "what": fault.what}


def test_two_broken_boxes_and_one_sound_one():
    found = observations()
    found["spark"] = BoxObservation("spark", {"audit": []}, None, found["spark"].controller)
    found["thor"] = BoxObservation("thor", [CANARY], None, {"audit": CANARY})
    report = judge(found)
    assert [v.audited for v in report.verdicts] == [True, False, False]
    assert report.exit_code == 1
    assert set(report.mesh.unaudited) == {"spark", "thor"}
    for text in outputs(report).values():
        assert CANARY not in text


def test_an_unreachable_box_is_a_typed_fault_too(baselines):
    baseline = baselines[False]
    fault = baseline.row_of(VICTIM).fault
    assert fault is not None and fault.kind in (FaultKind.UNREACHABLE, FaultKind.RECORDED)
    assert baseline.exit_code == 1


def test_the_real_captures_still_audit_without_a_fault():
    for found in (observations(), crafted(lambda collected, controller: None)):
        report = judge(found)
        assert all(r.audited and r.fault is None for r in report.rows)
        assert report.exit_code == 2  # the weakest link: a finding, every box audited


# -- the same through a snapshot on disk: one broken file is that box's error ---------------------
def snapshot_with(tmp_path, name: str, text: str):
    found = observations()
    save_snapshot(tmp_path, found, {"run_id": "r1", "inventory": "hosts", "taken_at": "now"})
    # surrogateescape: "\udcff" in a crafted text is the byte 0xff on disk (not UTF-8).
    (tmp_path / f"{name}.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    return tmp_path


def real_file() -> str:
    return (FIXTURES / SCENARIO / f"{VICTIM}.json").read_text(encoding="utf-8")


SNAPSHOT_FILES: dict[str, Callable[[], str]] = {
    "empty": lambda: "",
    "truncated": lambda: real_file()[: len(real_file()) // 2],
    "a list": lambda: "[1, 2, 3]",
    "wrong type": lambda: '{"box": "spark", "collected": {"audit": 5}, "error": null}',
    "NaN": lambda: '{"box": "spark", "collected": NaN, "error": null}',
    "nested past the parser": lambda: '{"collected": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "not UTF-8": lambda: real_file().replace('"status"', '"st\udcffatus"', 1),
    "a key twice": lambda: real_file().replace('"collected": {', '"collected": {"audit": 1, ', 1),
    "oversized": lambda: real_file().replace(
        '"collected": {', '"collected": {"pad": "' + "x" * SNAPSHOT_FILE_LIMIT + '", ', 1
    ),
    "a clear secret in a digest's place": lambda: real_file().replace(
        '"digest": "hmac:', f'"digest": "{CANARY}', 1
    ),
}


@pytest.mark.parametrize("case", sorted(SNAPSHOT_FILES))
def test_a_broken_snapshot_file_is_that_boxs_error(tmp_path, case):
    text = SNAPSHOT_FILES[case]()
    assert text != real_file()
    directory = snapshot_with(tmp_path, VICTIM, text)
    _, found = load_snapshot(directory)
    report = judge(found)
    assert not report.verdict_of(VICTIM).audited
    assert [v.audited for v in report.verdicts] == [True, False, True]
    assert report.exit_code == 1
    for out in outputs(report).values():
        assert CANARY not in out


# -- the command as an operator runs it --------------------------------------------------------
@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "html"])
def test_the_audit_command_reports_every_box_around_a_hostile_one(tmp_path, capsys, fmt):
    from reconciler.cli import main

    directory = tmp_path / "snapshot"
    shutil.copytree(FIXTURES / SCENARIO, directory)
    # The victim's gateway key in clear, where the collector always sends a digest.
    victim = directory / f"{VICTIM}.json"
    doc = json.loads(victim.read_text(encoding="utf-8"))
    (gw,) = [c for c in doc["collected"]["docker"]["containers"] if c["service"] == "gateway"]
    gw["env"]["GATEWAY_API_KEY"] = CANARY
    victim.write_text(json.dumps(doc), encoding="utf-8")
    root = str(FIXTURES.parents[2])
    argv = ["--root", root, "-i", "hosts", "audit", "--from-snapshot", str(directory)]
    code = main([*argv, "--format", fmt])
    out, err = capsys.readouterr()
    assert code == 1
    assert CANARY not in out + err and not WIRE_DIGEST.search(out + err)
    if fmt == "json":
        doc = AuditReportDoc.model_validate_json(out)
        got = {b.box: (b.audited, b.fault.kind if b.fault else None) for b in doc.boxes}
        assert got == {"orin": (True, None), "spark": (False, "malformed"), "thor": (True, None)}
        assert doc.mesh.unaudited == [VICTIM] and doc.summary.exit_code == 1
    else:
        for box in ("orin", "thor", "mesh"):
            assert box in out
        text = html.unescape(out) if fmt == "html" else out  # the page's text, as shown
        assert "malformed" in text and "a secret's value in clear text" in text


def test_lane_ports_asked_are_the_boxs_own_published_ports():
    from reconciler.audit.mesh import lane_port_targets

    found = observations()
    doc = found["orin"].collected
    assert doc is not None
    (lane,) = [c for c in doc["docker"]["containers"] if c["service"] == "vllm-embed"]
    lane["ports"] = {
        "8000/tcp": [
            {"HostIp": "", "HostPort": "18001"},
            {"HostIp": "127.0.0.1", "HostPort": "18002"},
            {"HostIp": "10.77.0.13", "HostPort": "18003-18005"},
            {"HostIp": "::", "HostPort": ""},
        ]
    }
    found["orin"] = BoxObservation("orin", doc, None, found["orin"].controller, complete=False)
    report = judge(found)
    got = lane_port_targets(list(report.rows), {"orin": "10.77.0.13", "spark": "s", "thor": "t"})
    assert [(t.box, t.url) for t in got] == [("orin", "http://10.77.0.13:18001/v1/models")]


# -- what a hostile gateway answers the controller ----------------------------------------------
def gateway_answering(body: bytes | Callable[[], Any], status: int = 200) -> Any:
    import httpx

    def handler(request: httpx.Request) -> httpx.Response:
        if callable(body):
            return httpx.Response(status, content=body())
        # A stream, as a real connection's body is (content= would be read already)
        stream = httpx.ByteStream(body)
        return httpx.Response(status, stream=stream, headers={"X-Lobes-Mesh-Member": "spark"})

    return httpx.Client(transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(
    ("body", "kept"),
    [
        pytest.param(b'{"cortex": {"ready": true}}', {"cortex": {"ready": True}}, id="a real one"),
        pytest.param(b'{"pad": "' + b"x" * (300 * 1024) + b'"}', None, id="oversized"),
        pytest.param(b'{"mesh": NaN}', None, id="NaN"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, None, id="nested past the parser"),
        pytest.param(b'{"a": 1, "a": 2}', None, id="a key twice"),
        pytest.param(b"\xff\xfe not utf-8", None, id="not UTF-8"),
    ],
)
def test_a_gateways_answer_to_the_controller_is_read_bounded(body, kept):
    from reconciler.audit.probes import _request

    with gateway_answering(body) as client:
        got = _request(client, "GET", "http://spark:8000/capabilities", keep_body=True)
        assert got["status"] == 200 and got["body"] == kept
        assert got["headers"] == {"X-Lobes-Mesh-Member": "spark"}
    # drift's mesh-side probes (http.client) read it the same way: tests/unit/test_observe_probes


def test_a_gateway_that_breaks_or_drips_fails_that_request_only(monkeypatch):
    from reconciler.audit import probes
    from reconciler.observe import probes as reading

    def chunks() -> Any:
        yield b'{"cortex": '
        yield b'{"ready": true}}'

    monkeypatch.setattr(reading, "TOTAL_S", -1.0)  # every read is past the deadline
    with gateway_answering(chunks) as client:
        got = probes._request(client, "GET", "http://spark:8000/capabilities", keep_body=True)
    assert got["status"] is None and "took over" in got["error"]

    def broken() -> Any:
        yield b"{"
        raise RuntimeError(CANARY)

    monkeypatch.setattr(reading, "TOTAL_S", 10.0)
    with gateway_answering(broken) as client:
        got = probes._request(client, "GET", "http://spark:8000/capabilities", keep_body=True)
    assert got["status"] is None and CANARY not in got["error"]


@pytest.mark.parametrize(
    "index",
    [
        "[]",
        '{"snapshot": 1}',
        '{"snapshot": 1, "boxes": "thor"}',
        '{"snapshot": 1, "boxes": [5]}',
        '{"snapshot": 1, "boxes": ["../../etc/passwd"]}',
        '{"snapshot": "' + CANARY + '", "boxes": []}',
    ],
)
def test_a_damaged_snapshot_index_is_the_runs_error_not_a_traceback(tmp_path, capsys, index):
    from reconciler.cli import main

    directory = tmp_path / "snapshot"
    shutil.copytree(FIXTURES / SCENARIO, directory)
    (directory / "index.json").write_text(index, encoding="utf-8")
    root = str(FIXTURES.parents[2])
    code = main(["--root", root, "-i", "hosts", "audit", "--from-snapshot", str(directory)])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert "index.json" in err and "Traceback" not in err and CANARY not in err


@pytest.mark.parametrize(
    ("craft", "probe"),
    [
        (
            in_controller("capabilities")(
                {"status": 200, "body": {"cortex": {"member": 5, "proxied": True}}}
            ),
            "capabilities",
        ),
        (in_controller("audit", "mesh_detect")({"status": 200, "body": {"mesh": "yes"}}), None),
    ],
    ids=["capabilities name a member that is not a string", "mesh/detect says 'yes'"],
)
def test_an_odd_gateway_answer_is_that_probes_error_not_the_boxs(
    craft: Craft, probe: str | None
) -> None:
    """The gateway answered the controller with a body lobes never sends: that probe failed,
    and says why; the box's own answer (its containers, keys, shell) is still audited, never
    thrown away as "the collector's answer is malformed"."""
    found = crafted(craft)
    report = judge(found)
    assert report.verdict_of(VICTIM).audited and report.row_of(VICTIM).fault is None
    probes = found[VICTIM].probes
    odd = probes.capabilities if probe else (probes.audit and probes.audit.mesh_detect)
    assert odd is not None and odd.error is not None
    assert odd.error.startswith("the gateway's answer is not what lobes sends (controller.")
    if probe is not None:  # shown in the report's evidence of the mesh side
        doc = json.loads(render_json(report))
        (victim,) = [b for b in doc["boxes"] if b["box"] == VICTIM]
        assert "the gateway's answer is not what lobes sends" in json.dumps(victim["evidence"])
