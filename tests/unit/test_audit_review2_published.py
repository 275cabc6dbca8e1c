"""The second audit review's defects, each on a copy of a lab scenario edited as the box (or the
controller's probes) would have answered, plus the collector's listing on a fake Engine:

1. a running container outside the compose project that publishes a port (or runs on the host
   network) fails the box (`publish.stray`), and is asked without a key at the box's address;
4. a published port is only ever requested at the box's own inventory address: a binding on
   any other address is judged from the document and never requested;
2. the gateway is the render's (lobes') container, not a `docker compose run` copy sorting
   first; each other gateway port is asked without a key, and one answering without it fails;
3. a desired loopback gateway that answers the mesh side (or runs on the host network) fails;
5. a running mesh key other than the desired one fails on a keyed box.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

from reconciler.audit.mesh import lane_port_targets
from reconciler.audit.verdict import Severity
from tests.unit.test_audit_review_fixes import codes, judge, on, snapshot, with_gateway
from tests.unit.test_audit_snapshots import fleet
from tests.unit.test_secret_boundaries import _collector

Box = dict[str, Any]
THOR = "10.77.0.11"  # thor's inventory address in the lab (the fixtures' controller base)
ADDRESSES = {"thor": THOR, "spark": "10.77.0.12", "orin": "10.77.0.13"}


def running(doc: Box, *extra: Box) -> None:
    """The collector's `audit.running`: the project's containers as listed, and `extra`."""
    ours = [
        {
            "name": c["name"],
            "image": "10.77.0.1:5000/vllm/vllm-openai",
            "project": "lobes",
            "service": c["service"],
            "host_network": False,
            "ports": c["ports"],
        }
        for c in doc["collected"]["docker"]["containers"]
    ]
    doc["collected"]["audit"]["running"] = {"containers": [*ours, *extra]}


STRAY = {
    "name": "review-stray-lane",
    "image": "10.77.0.1:5000/vllm/vllm-openai",
    "project": None,
    "service": None,
    "host_network": False,
    "ports": {"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "18001"}]},
}


def lane_probe(doc: Box, container: str, port: str, status: int) -> None:
    audit = doc["controller"].setdefault("audit", {})
    audit.setdefault("lane_ports", []).append(
        {
            "box": "thor",
            "container": container,
            "url": f"http://{THOR}:{port}/v1/models",
            "status": status,
            "ms": 3,
        }
    )


# -- 1. a container outside the compose project ----------------------------------------------------
def test_a_stray_unkeyed_lane_fails_the_box(tmp_path):
    def stray(doc: Box) -> None:
        running(doc, STRAY)
        lane_probe(doc, "review-stray-lane", "18001", 200)

    report, doc = judge(snapshot(tmp_path, "fully_keyed_mesh", on("thor", stray)), fleet({}))
    assert codes(report, "thor")["publish.stray"] == Severity.FAIL
    assert report.verdict_of("thor").verdict == Severity.FAIL
    message = next(
        f.message for f in report.verdict_of("thor").findings if f.code == "publish.stray"
    )
    assert "review-stray-lane" in message and "0.0.0.0:18001" in message
    assert f"GET http://{THOR}:18001/v1/models without a key: 200" in message
    thor = next(b for b in doc["boxes"] if b["box"] == "thor")["evidence"]["published"]
    assert [(b["container"], b["address"]) for b in thor["stray"]] == [
        ("review-stray-lane", "0.0.0.0:18001")
    ]
    # phase 2 asks it, at the box's inventory address, without a key
    targets = lane_port_targets(list(report.rows), ADDRESSES)
    assert ("review-stray-lane", f"http://{THOR}:18001/v1/models") in {
        (t.container, t.url) for t in targets
    }


def test_a_stray_container_on_the_host_network_fails_the_box(tmp_path):
    other = {**STRAY, "name": "stray-hostnet", "host_network": True, "ports": {}}
    path = snapshot(tmp_path, "fully_keyed_mesh", on("thor", lambda d: running(d, other)))
    report, _ = judge(path, fleet({}))
    assert codes(report, "thor")["publish.stray"] == Severity.FAIL


def test_other_containers_that_could_not_be_listed_are_not_ok(tmp_path):
    def unlisted(doc: Box) -> None:
        doc["collected"]["audit"]["running"] = {"error": "docker ps exited 1"}

    report, _ = judge(snapshot(tmp_path, "fully_keyed_mesh", on("thor", unlisted)), fleet({}))
    assert report.verdict_of("thor").verdict != Severity.OK
    assert any("running containers" in e for e in report.row_of("thor").errors)


def _engine(path: str, answers: dict[str, Any], asked: list[str]) -> None:
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(5)

    def serve() -> None:
        while True:
            conn, _ = srv.accept()
            buf = b""
            while b"\r\n\r\n" not in buf:
                data = conn.recv(65536)
                if not data:
                    break
                buf += data
            target = buf.split(b" ")[1].decode() if buf else ""
            asked.append(target)
            body = json.dumps(answers.get(target.partition("?")[0], [])).encode()
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
            conn.sendall(head + body)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()


def test_the_collector_lists_every_running_container_without_a_label_filter(tmp_path, monkeypatch):
    sock = str(tmp_path / "e.sock")
    listed = [
        {
            "Names": ["/review-stray-lane"],
            "Image": "vllm/vllm-openai",
            "Labels": {},
            "HostConfig": {"NetworkMode": "bridge"},
            "Ports": [
                {"IP": "0.0.0.0", "PrivatePort": 8000, "PublicPort": 18001, "Type": "tcp"},
                {"PrivatePort": 9000, "Type": "tcp"},  # exposed, not published
            ],
        },
        {
            "Names": ["/model-gear-gateway"],
            "Image": "lobes/gateway",
            "Labels": {
                "com.docker.compose.project": "lobes",
                "com.docker.compose.service": "gateway",
            },
            "HostConfig": {"NetworkMode": "host"},
            "Ports": [],
        },
    ]
    asked: list[str] = []
    _engine(sock, {"/containers/json": listed}, asked)
    monkeypatch.setenv("DOCKER_HOST", "unix://" + sock)
    collector = _collector()
    run = collector.Run(
        {
            "directory": "/nonexistent",
            "secret_patterns": [],
            "run_key": "k" * 64,
            "project": "lobes",
            "timeout_s": 5,
        }
    )
    got = collector.audit_running(run)
    assert asked and "label" not in asked[0] and "filters" not in asked[0]
    assert got["containers"] == [
        {
            "name": "model-gear-gateway",
            "image": "lobes/gateway",
            "project": "lobes",
            "service": "gateway",
            "host_network": True,
            "ports": {},
        },
        {
            "name": "review-stray-lane",
            "image": "vllm/vllm-openai",
            "project": None,
            "service": None,
            "host_network": False,
            "ports": {"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "18001"}]},
        },
    ]
    assert "env" not in json.dumps(got)


# -- 4. only the box's own address is ever requested ---------------------------------------------
def test_a_published_address_of_the_box_s_choosing_is_never_requested(tmp_path):
    def elsewhere(doc: Box) -> None:
        lane = doc["collected"]["docker"]["containers"][1]
        lane["ports"] = {
            "8000/tcp": [
                {"HostIp": "169.254.169.254", "HostPort": "80"},
                {"HostIp": "10.77.0.12", "HostPort": "8000"},  # another box
                {"HostIp": "", "HostPort": "18002"},  # every interface: asked at THOR
            ]
        }
        running(doc, {**STRAY, "ports": {"8000/tcp": [{"HostIp": "10.0.0.9", "HostPort": "5000"}]}})

    report, _ = judge(snapshot(tmp_path, "fully_keyed_mesh", on("thor", elsewhere)), fleet({}))
    urls = [t.url for t in lane_port_targets(list(report.rows), ADDRESSES)]
    assert urls == [f"http://{THOR}:18002/v1/models"]
    found = report.verdict_of("thor").findings
    lanes = [f.message for f in found if f.code == "publish.lane" and "169.254" in f.message]
    assert lanes and "not requested" in lanes[0]
    assert codes(report, "thor")["publish.stray"] == Severity.FAIL  # judged from the document


# -- 2. the gateway, and every other gateway port ------------------------------------------------
def test_a_second_open_gateway_container_fails_and_is_probed(tmp_path):
    def copy(doc: Box) -> None:
        containers = doc["collected"]["docker"]["containers"]
        gateway = containers[0]
        run_copy = {
            **gateway,
            "name": "lobes-gateway-run-3f2a1b",  # sorts before model-gear-gateway
            "ports": {"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "8001"}]},
            "env": {**gateway["env"], "GATEWAY_API_KEY": "", "CULTURE_VLLM_API_KEY": ""},
        }
        containers.insert(0, run_copy)
        lane_probe(doc, "lobes-gateway-run-3f2a1b", "8001", 200)

    desired = with_gateway(fleet({}), "thor", bind="0.0.0.0")
    report, doc = judge(snapshot(tmp_path, "fully_keyed_mesh", on("thor", copy)), desired)
    assert report.row_of("thor").gateway_container == "model-gear-gateway"
    thor = next(b for b in doc["boxes"] if b["box"] == "thor")["evidence"]
    assert thor["gateway"]["container"] == "model-gear-gateway"
    assert thor["gateway"]["inbound_key"] == "GATEWAY_API_KEY"
    assert codes(report, "thor")["publish.gateway"] == Severity.FAIL
    message = next(
        f.message for f in report.verdict_of("thor").findings if "lobes-gateway-run" in f.message
    )
    assert "0.0.0.0:8001" in message and "without a key" in message
    urls = {t.url for t in lane_port_targets(list(report.rows), ADDRESSES)}
    assert f"http://{THOR}:8001/v1/models" in urls
    assert f"http://{THOR}:8000/v1/models" not in urls  # the mesh side probes that one


def test_an_extra_open_port_of_the_gateway_fails(tmp_path):
    def extra(doc: Box) -> None:
        gateway = doc["collected"]["docker"]["containers"][0]
        gateway["ports"] = {
            "8000/tcp": [{"HostIp": "", "HostPort": "8000"}, {"HostIp": "", "HostPort": "8001"}]
        }
        lane_probe(doc, "model-gear-gateway", "8001", 200)

    desired = with_gateway(fleet({}), "thor", bind="0.0.0.0")
    report, _ = judge(snapshot(tmp_path, "fully_keyed_mesh", on("thor", extra)), desired)
    assert codes(report, "thor")["publish.gateway"] == Severity.FAIL


# -- 3. a desired loopback gateway answering the mesh side ---------------------------------------
def test_a_host_network_gateway_with_a_loopback_bind_fails(tmp_path):
    def host_network(doc: Box) -> None:
        doc["collected"]["docker"]["containers"][0]["ports"] = {}
        doc["collected"]["audit"]["host_network"] = {"containers": ["model-gear-gateway"]}

    desired = with_gateway(fleet({}), "thor", bind="127.0.0.1")
    report, _ = judge(snapshot(tmp_path, "fully_keyed_mesh", on("thor", host_network)), desired)
    assert codes(report, "thor")["publish.gateway"] == Severity.FAIL
    messages = [f.message for f in report.verdict_of("thor").findings]
    assert not any("cannot reach" in m for m in messages), messages
    gateway = next(m for m in messages if "host network" in m and "gateway" in m)
    assert "answers the mesh side" in gateway and "401" in gateway


def test_a_loopback_gateway_answering_the_mesh_side_fails(tmp_path):
    def loopback(doc: Box) -> None:
        gateway = doc["collected"]["docker"]["containers"][0]
        gateway["ports"] = {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8000"}]}

    desired = with_gateway(fleet({}), "thor", bind="127.0.0.1")
    report, _ = judge(snapshot(tmp_path, "fully_keyed_mesh", on("thor", loopback)), desired)
    assert codes(report, "thor")["publish.gateway"] == Severity.FAIL


# -- 5. the mesh key is a data-plane bearer ------------------------------------------------------
def test_a_mesh_key_other_than_the_desired_fails_on_a_keyed_box(tmp_path):
    def other_mesh_key(doc: Box) -> None:
        gateway = doc["collected"]["docker"]["containers"][0]
        gateway["env"]["LOBES_MESH_KEY"] = {"secret": "hmac:" + "ab" * 32}

    report, _ = judge(snapshot(tmp_path, "fully_keyed_mesh", on("thor", other_mesh_key)), fleet({}))
    assert codes(report, "thor")["mesh.key-not-desired"] == Severity.FAIL
