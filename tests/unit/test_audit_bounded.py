"""The audit's controller-side probes at scale: at most the collectors' limit of boxes (or of
phase 2's requests) at once, as drift's probes (observe/probes.py ProbeRun). All at once, a
1,000-box audit opened a socket and a thread for every box together (and for every published
lane in phase 2: five a box), past the controller's 1,024 open files."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from reconciler.audit.probes import Endpoint, LanePort, MeshSide, ProofAttempt, prove
from tests.unit.counting_gateway import CountingGateway


class _Counting(CountingGateway):
    delay = 0.1


@pytest.fixture
def gateway() -> Iterator[str]:
    _Counting.reset()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_mesh_side_probes_at_most_the_limit_of_boxes_at_once(gateway: str) -> None:
    endpoints = [Endpoint(f"b{i}", gateway, "worker") for i in range(6)]
    found = MeshSide(endpoints, 5.0, 2).result(0.1)  # waited for past it: boxes took turns
    assert list(found) == [ep.box for ep in endpoints]
    for probes in found.values():
        assert probes["health"]["status"] == probes["models_noauth"]["status"] == 200
        assert probes["audit"]["chat_noauth"]["status"] == 200
        assert probes["audit"]["chat_noauth"]["model"] == "worker"
    assert 0 < _Counting.peak <= 2  # each box's requests one after another


def test_a_box_not_probed_in_time_says_so_in_the_audits_shape(gateway: str) -> None:
    """A box whose turn never came within the wait: every probe unanswered, the chat's model
    kept, as mesh_side says of a box it gave up."""
    endpoints = [Endpoint(f"b{i}", gateway, "worker") for i in range(4)]
    run = MeshSide(endpoints, 0.05, 1)
    run.bound = lambda: 0.0  # type: ignore[method-assign]  # the caller waits no longer
    found = run.result(0.0)
    late = [box for box, p in found.items() if p["health"]["status"] is None]
    assert late, found
    for box in late:
        assert found[box]["audit"]["chat_noauth"]["model"] == "worker"
        assert found[box]["audit"]["mesh_detect"]["status"] is None


def test_phase_two_makes_at_most_the_limit_of_requests_at_once(gateway: str) -> None:
    attempts = [ProofAttempt(f"b{i}", gateway, "worker", "b0") for i in range(3)]
    lanes = [LanePort(f"b{i}", f"lane-{i}", gateway + "/v1/models") for i in range(5)]
    found = prove(attempts, lanes, 5.0, 2)
    assert [p["via"] for p in found["weakest_link"]] == [a.via for a in attempts]
    assert [p["container"] for p in found["lane_ports"]] == [lane.container for lane in lanes]
    assert {p["status"] for p in found["weakest_link"] + found["lane_ports"]} == {200}
    assert 0 < _Counting.peak <= 2
