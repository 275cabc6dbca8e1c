"""The controller side of observation after review (reconciler/observe/, audit/probes.py,
metrics.py, history/hooks.py). Every test stays on loopback: gateways are local listeners on
127.0.0.1, "boxes" local processes (test_fanout.py) or a fake `spawn` that fails the test if a
box would be contacted; each test takes seconds, and one that the old code would hang on waits
in a thread with a bound and fails.

1. the mesh-side probes (drift's and the audit's) end by the box's timeout, every box at once:
   a gateway that accepts and never answers delays no other box, and `gather` waits for the
   probes only until the run's deadline;
2. a published port's HostIp with an IPv6 scope id (`::1%]@host:port#`) is refused by both
   readers (the audit would have requested that host);
3. `--save-snapshot DIR` is built beside DIR and renamed into place (a failed save keeps the
   previous snapshot whole), and DIR is checked before any box is contacted;
4. a snapshot's index or box file that is a FIFO is refused by name, never waited on;
5. a box named `index` is refused by the snapshot saver (its file would be the index);
6. `1e400` (read as inf) is refused like NaN, by both readers; a save never writes Infinity;
7. metrics and the history take collector times and observations only from what the report
   judged observed in full (`+Inf` for a box called not observed);
8. a bad $FLEET_MAX_PARALLEL / $FLEET_BOX_TIMEOUT is refused before any box is contacted.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from reconciler.audit import probes as audit_probes
from reconciler.audit.probes import Endpoint, mesh_side
from reconciler.history.store import observations_of, opened
from reconciler.metrics import collector_seconds
from reconciler.observe import collectors, early, fanout
from reconciler.observe import probes as drift_probes
from reconciler.observe.document import FaultKind, load_json
from reconciler.observe.observe import (
    BoxObservation,
    gather,
    load_snapshot,
    save_snapshot,
    snapshot_box_bytes,
    snapshot_index,
    snapshot_observation,
    snapshot_target_problem,
)
from reconciler.observe.transport import Background
from tests.unit.history_helpers import (
    INCIDENTS,
    SNAPSHOT,
    edited_snapshot,
    reconcile,
    unvouched,
)
from tests.unit.test_document_c import THOR, _both
from tests.unit.test_fanout import _fleet
from tests.unit.test_snapshot_bounds import stored_observations

BOUND_S = 6.0  # what a test waits for a call the old code would hang on (then it fails)


def bounded(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """fn(*args) and the seconds it took; fails the test if it takes more than BOUND_S."""
    started = time.monotonic()
    job = Background(fn, *args)
    try:
        value = job.result(BOUND_S)
    except TimeoutError:
        pytest.fail(f"still waiting after {BOUND_S} s")
    return value, time.monotonic() - started


@pytest.fixture
def run_timeout(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """`--timeout S` for this test (what the probes read when not told)."""
    monkeypatch.setattr(fanout, "_configured", {})
    return lambda seconds: fanout.configure(timeout=seconds)


# -- gateways on loopback --------------------------------------------------------------------------
@pytest.fixture
def silent() -> Iterator[str]:
    """A gateway that accepts every connection and never answers: its base URL."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    server.close()
    for conn in held:
        conn.close()


class _Answers(BaseHTTPRequestHandler):
    """200 `{}` at once, to anything; or (`drip`) a byte every 0.2 s of a body never done."""

    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        drip = self.server.drip  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Length", "100000" if drip else "2")
        self.end_headers()
        try:
            if not drip:
                self.wfile.write(b"{}")
                return
            for _ in range(100):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def _server(drip: bool) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    server.daemon_threads = True
    server.drip = drip  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def answering() -> Iterator[str]:
    yield from _server(drip=False)


@pytest.fixture
def dripping() -> Iterator[str]:
    yield from _server(drip=True)


# -- 1. probes end by the box's timeout, every box at once ----------------------------------------
def test_the_audits_probes_of_hanging_gateways_end_by_the_timeout_and_delay_no_other_box(
    silent: str, answering: str, run_timeout: Callable[[float], None]
) -> None:
    # Before: one box after another, five requests each, ~5 s a request: 3 boxes = 75 s.
    run_timeout(1.0)
    endpoints = [Endpoint(f"hang{i}", silent, None) for i in range(3)]
    endpoints.append(Endpoint("fine", answering, "chat"))
    found, took = bounded(mesh_side, endpoints)
    assert took < 2.5
    assert found["fine"]["health"]["status"] == 200  # answered, not held behind the others
    assert found["fine"]["audit"]["chat_noauth"]["status"] == 200
    for box in ("hang0", "hang1", "hang2"):
        probes = found[box]
        assert probes["health"]["status"] is None and probes["health"]["error"]
        assert probes["audit"]["mesh_detect"]["status"] is None


def test_an_audit_run_with_hanging_gateways_takes_its_timeout_not_their_sum(
    silent: str, answering: str, run_timeout: Callable[[float], None]
) -> None:
    """The README's promise, as an audit gathers: the boxes' collectors (local processes here)
    and the mesh side at once; each box's controller probes say what happened to them."""
    run_timeout(1.0)
    handles, _ = _fleet({"b0": 0.1, "b1": 0.1, "b2": 0.1}, size=3)
    endpoints = [Endpoint("b0", silent, None), Endpoint("b1", silent, None)]
    endpoints.append(Endpoint("b2", answering, None))
    found, took = bounded(gather, handles, Background(mesh_side, endpoints), 1.0)
    assert took < 3.0
    assert list(found) == ["b0", "b1", "b2"]
    for box in ("b0", "b1"):
        health = found[box].probes.health
        assert health is not None and health.status is None and health.error
    assert found["b2"].probes.health is not None and found["b2"].probes.health.status == 200


def test_drifts_probes_of_a_dripping_gateway_end_by_the_timeout(
    dripping: str, run_timeout: Callable[[float], None]
) -> None:
    run_timeout(1.0)  # before: each GET read on for TOTAL_S, 10 s
    found, took = bounded(drift_probes.probe_gateways, {"thor": dripping})
    assert took < 2.0
    assert found["thor"]["health"]["status"] is None
    assert "took over 1 s" in found["thor"]["health"]["error"]


def test_gather_waits_for_the_probes_only_until_the_runs_deadline() -> None:
    """Probes that never finish (a resolver that hangs, say): each box's controller probes say
    they gave no answer, and the boxes' own answers are read as always."""
    handles, _ = _fleet({"b0": 0.1, "b1": 0.1}, size=2)
    never = Background(threading.Event().wait)
    found, took = bounded(gather, handles, never, 1.0)
    assert took < 1.0 + 2 * drift_probes.GRACE_S + 1.0
    for obs in found.values():
        assert obs.failure is not None and obs.failure.kind is not FaultKind.UNREACHABLE
        for probe in (obs.probes.health, obs.probes.capabilities, obs.probes.models_noauth):
            assert probe is not None and probe.error == "no answer within 1 s"


def test_phase_twos_requests_are_sent_at_once_within_the_timeout(
    silent: str, run_timeout: Callable[[float], None]
) -> None:
    run_timeout(1.0)
    lanes = [audit_probes.LanePort("b", f"lane{i}", f"{silent}/v1/models") for i in range(3)]
    attempts = [audit_probes.ProofAttempt("b", silent, "chat", "c") for _ in range(2)]
    found, took = bounded(audit_probes.prove, attempts, lanes)
    assert took < 2.5
    assert [p["status"] for p in found["lane_ports"] + found["weakest_link"]] == [None] * 5


# -- 2. an IPv6 scope id in a published port ------------------------------------------------------
def _thor_with(tmp_path: Path, edit: Callable[[dict[str, Any]], None], big: bool = False) -> Path:
    """thor's capture with `edit` applied, as save_snapshot writes a file; `"__BIG__"` in it
    becomes the number 1e400 when `big`."""
    raw = json.loads(THOR.read_text(encoding="utf-8"))
    edit(raw)
    text = json.dumps(raw, indent=1, sort_keys=True)
    if big:
        text = text.replace('"__BIG__"', "1e400")
    path = tmp_path / "thor.json"
    path.write_text(text, encoding="utf-8")
    return path


def _gateway_container(raw: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in raw["collected"]["docker"]["containers"] if c["service"] == "gateway")


@pytest.mark.parametrize(
    "host_ip", ["2001:db8::1%]@127.0.0.1:9999#", "fe80::1%eth0", "::1%25", "fe80::1%"]
)
def test_a_host_ip_with_a_scope_id_is_refused_by_both_readers(tmp_path: Path, host_ip: str) -> None:
    def scoped(raw: dict[str, Any]) -> None:
        _gateway_container(raw)["ports"] = {"8000/tcp": [{"HostIp": host_ip, "HostPort": "8000"}]}

    path = _thor_with(tmp_path, scoped)
    typed, c_path, two_steps = _both(path)
    assert c_path == two_steps and not typed  # document_c leaves the refusal to document.py
    obs = snapshot_observation("thor", path)
    assert obs.failure is not None and obs.failure.kind is FaultKind.MALFORMED
    assert obs.failure.path is not None and obs.failure.path.endswith(".HostIp")
    assert "scope id" in obs.failure.what and "127.0.0.1" not in str(obs.failure)


def test_a_plain_ipv6_host_ip_is_still_read(tmp_path: Path) -> None:
    def v6(raw: dict[str, Any]) -> None:
        _gateway_container(raw)["ports"] = {"8000/tcp": [{"HostIp": "::1", "HostPort": "8000"}]}

    path = _thor_with(tmp_path, v6)
    typed, c_path, two_steps = _both(path)
    assert typed and c_path == two_steps
    assert snapshot_observation("thor", path).failure is None


# -- 3. --save-snapshot: built aside, renamed into place, checked first ---------------------------
def _observations() -> dict[str, BoxObservation]:
    return load_snapshot(SNAPSHOT)[1]


def _later(obs: BoxObservation) -> BoxObservation:
    """The same box as a later run saw it (it took a second longer)."""
    kept = (obs.collected, obs.error, obs.controller, obs.elapsed_s + 1.0, obs.connection)
    return BoxObservation(obs.box, *kept, complete=False)


def _tree(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def test_a_save_that_fails_keeps_the_previous_snapshot_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "snap"
    found = _observations()
    save_snapshot(target, found, {"run_id": "first"})
    before = _tree(target)
    writes = []
    real_write = Path.write_bytes

    def disk_full_on_the_second(self: Path, data: bytes) -> int:  # type: ignore[override]
        writes.append(self.name)
        if len(writes) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(Path, "write_bytes", disk_full_on_the_second)
    later = {b: _later(obs) for b, obs in found.items()}  # another run: other files
    with pytest.raises(OSError):
        save_snapshot(target, later, {"run_id": "second"})
    monkeypatch.undo()
    assert _tree(target) == before  # not a file of the failed run in it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap"]  # nothing left aside
    index, again = load_snapshot(target)
    assert index["run_id"] == "first" and sorted(again) == sorted(found)


def test_a_save_replaces_the_previous_snapshot_whole(tmp_path: Path) -> None:
    target = tmp_path / "snap"
    found = _observations()
    save_snapshot(target, found, {"run_id": "first"})
    save_snapshot(target, {"thor": found["thor"]}, {"run_id": "second"})
    assert sorted(p.name for p in target.iterdir()) == ["index.json", "thor.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap"]
    assert snapshot_index(target)["run_id"] == "second"


def _a_file(parent: Path) -> Path:
    (parent / "snap").write_text("a file")
    return parent / "snap"


def _other_things(parent: Path) -> Path:
    shutil.copytree(SNAPSHOT, parent / "snap")  # a snapshot, and something of the operator's
    (parent / "snap" / "notes.txt").write_text("mine")
    return parent / "snap"


def _json_without_an_index(parent: Path) -> Path:
    (parent / "snap").mkdir()
    (parent / "snap" / "a.json").write_text("{}")
    return parent / "snap"


def _under_a_file(parent: Path) -> Path:
    (parent / "afile").write_text("")
    return parent / "afile" / "snap"


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (_a_file, "not a directory"),
        (_other_things, "'notes.txt', which is not a snapshot's"),
        (_json_without_an_index, "no snapshot index"),
        (_under_a_file, "Not a directory"),
    ],
    ids=["a file", "a directory of other things", "json without an index", "under a file"],
)
def test_a_save_target_that_cannot_take_a_snapshot_is_refused_before_any_box_is_contacted(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[Path], Path],
    said: str,
) -> None:
    no_box_contacted(monkeypatch)
    parent = tmp_path / "out"
    parent.mkdir()
    target = make(parent)
    before = _tree(parent)
    for command in ("drift", "audit"):
        code, out, err = reconcile(capsys, command, "--save-snapshot", str(target))
        assert (code, out) == (1, ""), err
        assert err.startswith(f"error: --save-snapshot {target}: ") and said in err
        assert "Traceback" not in err
    assert _tree(parent) == before


def no_box_contacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any collector spawned, or any drift probe started, fails the test (nothing leaves)."""

    def contacted(*_a: Any, **_k: Any) -> Any:
        pytest.fail("a box was contacted")

    monkeypatch.setattr(collectors, "spawn", contacted)
    monkeypatch.setattr(early, "probe_gateways", contacted)
    monkeypatch.setattr("reconciler.audit.observe.MeshSide", contacted)


# -- 4. a FIFO in a snapshot ----------------------------------------------------------------------
def _with_fifo(tmp_path: Path, name: str) -> Path:
    snapshot = tmp_path / "snapshot"
    shutil.copytree(SNAPSHOT, snapshot)
    (snapshot / name).unlink()
    os.mkfifo(snapshot / name)
    return snapshot


def test_a_fifo_index_is_the_runs_error_naming_it(tmp_path: Path) -> None:
    snapshot = _with_fifo(tmp_path, "index.json")

    def read() -> str:
        try:
            snapshot_index(snapshot)
        except ValueError as exc:
            return str(exc)
        return "read"

    said, _ = bounded(read)
    assert said == f"{snapshot}/index.json: not a regular file (fifo)"


def test_a_fifo_box_file_is_that_boxs_fault_for_every_reader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = _with_fifo(tmp_path, "orin.json")
    obs, _ = bounded(snapshot_observation, "orin", snapshot / "orin.json")
    assert obs.failure is not None and str(obs.failure).endswith(
        "orin.json is not a regular file (fifo)"
    )

    def box_bytes() -> str:
        try:
            snapshot_box_bytes(snapshot, "orin")
        except ValueError as exc:
            return str(exc)
        return "read"

    assert bounded(box_bytes)[0] == "not a regular file (fifo)"
    # A recorded replay with metrics (history/hooks.py read the box files again) and diff.
    db, prom = tmp_path / "h.sqlite3", tmp_path / "m.prom"
    argv = ("drift", "--from-snapshot", str(snapshot), "--history", str(db), "--metrics", str(prom))
    (code, out, err), _ = bounded(reconcile, capsys, *argv)
    assert code == 1 and "not a regular file (fifo)" in out and "Traceback" not in err
    assert sorted(stored_observations(db)) == ["spark", "thor"]
    (code, out, err), _ = bounded(
        reconcile, capsys, "diff", "--from-snapshot", str(SNAPSHOT), str(snapshot)
    )
    assert code == 1 and f"{snapshot}/orin.json: not a regular file (fifo)" in err


def test_a_regular_file_is_still_read_whole_and_within_its_bound(tmp_path: Path) -> None:
    from reconciler.observe.observe import SNAPSHOT_FILE_LIMIT, _read_limited

    for size in (0, 1, 150_000):
        path = tmp_path / f"f{size}"
        path.write_bytes(b"x" * size)
        assert _read_limited(path) == b"x" * size
    big = tmp_path / "big"
    big.write_bytes(b"y" * (SNAPSHOT_FILE_LIMIT + 10))
    assert len(_read_limited(big)) == SNAPSHOT_FILE_LIMIT + 1  # one past: refused as too large


# -- 5. a box named `index` ----------------------------------------------------------------------
def test_a_box_named_index_is_refused_by_the_saver_and_nothing_is_written(tmp_path: Path) -> None:
    found = _observations()
    target = tmp_path / "snap"
    save_snapshot(target, found, {"run_id": "first"})
    before = _tree(target)
    index_box = BoxObservation("index", found["thor"].collected, None, found["thor"].controller)
    with pytest.raises(ValueError, match="a box named 'index'"):
        save_snapshot(target, {**found, "index": index_box}, {"run_id": "second"})
    assert _tree(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap"]


# -- 6. numbers past a float's range -------------------------------------------------------------
@pytest.mark.parametrize("text", ["1e400", "-1e400", "1E+309"])
def test_a_number_read_as_infinite_is_refused_like_nan(text: str) -> None:
    fault = load_json(f'{{"x": [1, {text}]}}')
    assert getattr(fault, "kind", None) is FaultKind.NOT_JSON
    assert load_json(b'{"x": 1e-400, "y": 1.5e300}') == {"x": 0.0, "y": 1.5e300}


def test_a_file_with_1e400_is_refused_by_both_readers(tmp_path: Path) -> None:
    def big_port(raw: dict[str, Any]) -> None:  # a compose port entry: any JSON is kept
        raw["collected"]["render"]["services"]["gateway"]["ports"][0]["x"] = "__BIG__"

    path = _thor_with(tmp_path, big_port, big=True)
    typed, c_path, two_steps = _both(path)
    assert c_path == two_steps and not typed
    obs = snapshot_observation("thor", path)
    assert obs.failure is not None and obs.failure.kind is FaultKind.NOT_JSON


def test_a_save_never_writes_infinity(tmp_path: Path) -> None:
    found = _observations()
    target = tmp_path / "snap"
    save_snapshot(target, found, {"run_id": "first"})
    before = _tree(target)
    bad = BoxObservation("thor", found["thor"].collected, None, {}, float("inf"))
    with pytest.raises(ValueError):
        save_snapshot(target, {**found, "thor": bad}, {"run_id": "second"})
    assert _tree(target) == before


# -- 7. metrics and history: only what the report took -----------------------------------------
@pytest.mark.parametrize("total", [float("inf"), float("nan"), -1, 10**400, True, "12"])
def test_a_collector_time_that_is_not_a_finite_duration_is_none(total: Any) -> None:
    assert collector_seconds({"collected": {"timings_ms": {"total": total}}}) is None
    assert collector_seconds({"collected": {"timings_ms": {"total": 1500}}}) == 1.5


def test_a_replay_records_no_time_or_observation_of_a_file_it_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def infinite_time(docs: dict[str, Any]) -> None:
        docs["orin"]["collected"]["timings_ms"]["total"] = "__BIG__"

    snapshot = edited_snapshot(tmp_path, "big", infinite_time)
    orin = snapshot / "orin.json"
    orin.write_text(orin.read_text().replace('"__BIG__"', "1e400"))
    unvouched(snapshot)
    db, prom = tmp_path / "h.sqlite3", tmp_path / "m.prom"
    argv = ["--from-snapshot", str(snapshot), "--history", str(db), "--metrics", str(prom)]
    for run, command in enumerate(("drift", "audit"), start=1):
        code, out, err = reconcile(capsys, command, *argv, "--format", "json")
        assert code == 1 and "Traceback" not in err, err
        orin_row = next(b for b in json.loads(out)["boxes"] if b["box"] == "orin")
        assert orin_row["observation"] == "none"
        metrics = prom.read_text()
        assert "+Inf" not in metrics and 'collect_duration_seconds{box="orin"}' not in metrics
        assert 'collect_duration_seconds{box="thor"}' in metrics
        with opened(db, create=False) as conn:
            stored = observations_of(conn, run)
        # drift's replay keeps no observation and reads the files the report took again;
        # the audit keeps its observations: orin's is its fault, without the refused answer.
        assert stored.keys() in ({"spark", "thor"}, {"orin", "spark", "thor"})
        assert stored.get("orin", {}).get("collected") is None
        assert stored["thor"]["collected"] is not None


# -- 8. the fan-out's environment, before any box is contacted ------------------------------------
@pytest.fixture
def warm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A copy of the incidents example whose drift inputs are remembered (its replay stores
    them): a live drift then starts its collectors from them at once (observe/early.py)."""
    from reconciler.desired.locate import inventory_file
    from reconciler.drift_inputs import cached_inputs

    root = tmp_path / "fleet"
    shutil.copytree(INCIDENTS, root)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    code, _, err = reconcile(capsys, "drift", "--from-snapshot", str(root / "snapshot"), root=root)
    assert code == 2, err
    assert cached_inputs(root, inventory_file(root, "lab")) is not None
    return root


@pytest.mark.parametrize(
    ("variable", "said", "option"),
    [
        ("FLEET_MAX_PARALLEL", "not a whole number of boxes", {"max_parallel": 2}),
        ("FLEET_BOX_TIMEOUT", "not a number of seconds", {"timeout": 2.0}),
    ],
)
@pytest.mark.parametrize("command", ["drift", "audit"])
def test_a_bad_fanout_variable_is_refused_before_any_box_is_contacted(
    warm: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    said: str,
    option: dict[str, float],
    command: str,
) -> None:
    no_box_contacted(monkeypatch)
    monkeypatch.setattr(fanout, "_configured", {})
    monkeypatch.setenv(variable, "abc")
    code, out, err = reconcile(capsys, command, root=warm)
    assert (code, out) == (1, "")
    assert err.startswith(f"error: ${variable}: ") and said in err and "Traceback" not in err
    fanout.configure(**option)  # the command line's value wins over the environment's
    assert fanout.settings_problem() is None


def test_a_replay_does_not_read_the_fanout_variables(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_MAX_PARALLEL", "abc")
    code, _, err = reconcile(capsys, "drift", "--from-snapshot", str(SNAPSHOT))
    assert code == 2 and "FLEET_MAX_PARALLEL" not in err


# -- review of 2026-12-12: --save-snapshot into a DIR that cannot be renamed; interrupted saves --
def _unwritable(monkeypatch: pytest.MonkeyPatch, *directories: Path) -> None:
    """`directories` not writable, as for a user who does not own them (the tests run as root,
    which os.access says may write anything)."""
    real_access = os.access
    refused = {os.path.realpath(d) for d in directories}

    def access(path: Any, mode: int, *args: Any, **kwargs: Any) -> bool:
        if mode & os.W_OK and os.path.realpath(path) in refused:
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


def test_a_writable_dir_under_an_unwritable_directory_is_saved_into(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = tmp_path / "root-owned"
    parent.mkdir()
    target = parent / "snap"
    found = _observations()
    facts = tmp_path / "images.yaml"
    facts.write_text("images: {}\n")
    save_snapshot(target, found, {"run_id": "first"}, {"images.yaml": str(facts)})
    os.chmod(parent, 0o555)
    _unwritable(monkeypatch, parent)
    try:
        save_snapshot(target, {"thor": found["thor"]}, {"run_id": "second"})
        assert sorted(p.name for p in target.iterdir()) == ["index.json", "thor.json"]
        assert sorted(p.name for p in parent.iterdir()) == ["snap"]  # nothing built beside
        index, again = load_snapshot(target)
        assert index["run_id"] == "second" and list(again) == ["thor"]
        # the whole command too: checked early, saved into DIR
        code, _, err = reconcile(
            capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--save-snapshot", str(target)
        )
        assert code == 2 and "error" not in err, err
        assert snapshot_index(target)["boxes"] == ["orin", "spark", "thor"]
        assert sorted(p.name for p in parent.iterdir()) == ["snap"]
        # a new DIR there cannot be made; nor is an unwritable DIR there written
        new = snapshot_target_problem(parent / "new")
        assert new is not None and "is not writable" in new
        _unwritable(monkeypatch, parent, target)
        said = snapshot_target_problem(target)
        assert said is not None and "neither it nor" in said
    finally:
        os.chmod(parent, 0o755)


def test_a_mount_point_is_saved_into_never_renamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "mnt"
    target.mkdir()
    (target / "lost+found").mkdir()  # a file system's own directory: kept
    real_ismount, real_rename = os.path.ismount, os.rename
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == target or real_ismount(p))

    def rename(src: Any, dst: Any) -> None:  # what the kernel says of a mount point
        if target in (Path(src), Path(dst)):
            raise OSError(errno.EBUSY, "Device or resource busy", str(src))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    found = _observations()
    assert snapshot_target_problem(target) is None
    save_snapshot(target, found, {"run_id": "first"})
    save_snapshot(target, {"spark": found["spark"]}, {"run_id": "second"})
    assert sorted(p.name for p in target.iterdir()) == ["index.json", "lost+found", "spark.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnt"]
    index, again = load_snapshot(target)
    assert index["run_id"] == "second" and list(again) == ["spark"]


def test_a_mount_point_told_by_its_device_is_saved_into(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "mnt"
    save_snapshot(target, _observations(), {"run_id": "first"})
    real_stat = os.stat

    def stat(path: Any, *args: Any, **kwargs: Any) -> Any:  # `target` on another device
        info = real_stat(path, *args, **kwargs)
        if Path(path) == target:
            fields = list(info)
            fields[2] = info.st_dev + 1  # st_dev
            return os.stat_result(fields)
        return info

    monkeypatch.setattr(os, "stat", stat)
    renamed: list[Any] = []
    real_rename = os.rename
    monkeypatch.setattr(os, "rename", lambda s, d: renamed.append(s) or real_rename(s, d))
    save_snapshot(target, _observations(), {"run_id": "second"})
    assert target not in [Path(s) for s in renamed]
    assert snapshot_index(target)["run_id"] == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnt"]


def _interrupted_between_the_renames(
    monkeypatch: pytest.MonkeyPatch, then: BaseException, killed: bool = False
) -> None:
    """os.rename raising `then` once the previous snapshot was moved aside; `killed`: and no
    rename working after it (the process is gone: nothing puts it back)."""
    real_rename = os.rename

    def rename(src: Any, dst: Any) -> None:
        if str(dst).endswith(".old"):
            real_rename(src, dst)
            if killed:
                monkeypatch.setattr(os, "rename", _gone)
            raise then
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)


def _gone(*_a: Any) -> None:
    raise OSError(errno.EIO, "the process was killed")


def _dead_pid() -> int:
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_an_interrupted_save_puts_the_previous_snapshot_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "snap"
    found = _observations()
    save_snapshot(target, found, {"run_id": "first"})
    before = _tree(target)
    _interrupted_between_the_renames(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        save_snapshot(target, {b: _later(o) for b, o in found.items()}, {"run_id": "second"})
    monkeypatch.undo()
    assert _tree(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap"]


def test_a_save_killed_between_its_renames_is_recovered_by_the_next_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "snap"
    found = _observations()
    save_snapshot(target, found, {"run_id": "first"})
    before = _tree(target)
    dead = _dead_pid()
    monkeypatch.setattr(os, "getpid", lambda: dead)  # the saver: a process now gone
    _interrupted_between_the_renames(monkeypatch, KeyboardInterrupt(), killed=True)
    with pytest.raises(BaseException):  # noqa: B017 - whatever the interrupted save raised
        save_snapshot(target, {b: _later(o) for b, o in found.items()}, {"run_id": "second"})
    monkeypatch.undo()
    assert not target.exists()  # what a kill there leaves: the old snapshot aside
    (aside,) = [p for p in tmp_path.iterdir() if p.name.endswith(".old")]
    stale = tmp_path / f".snap.saving-{dead}-0badc0de"  # a build the kill left
    shutil.copytree(aside, stale)
    running = tmp_path / f".snap.saving-{os.getpid()}-00000000"  # a live process's: kept
    running.mkdir()
    capsys.readouterr()
    assert snapshot_target_problem(target) is None  # the early check recovers it
    assert "it was put back" in capsys.readouterr().err
    assert _tree(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [running.name, "snap"]
    save_snapshot(target, found, {"run_id": "third"})  # and the next save goes on
    assert snapshot_index(target)["run_id"] == "third"


def test_a_save_killed_in_a_mount_point_leaves_nothing_the_next_save_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "mnt"
    save_snapshot(target, _observations(), {"run_id": "first"})
    (target / f".saving-{_dead_pid()}-0badc0de").mkdir()  # a save in place, killed
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == target)
    assert snapshot_target_problem(target) is None
    assert sorted(p.name for p in target.iterdir()) == sorted(_tree(target))


@pytest.mark.parametrize("command", ["drift", "audit"])
def test_a_box_named_index_is_refused_before_any_box_is_contacted(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    no_box_contacted(monkeypatch)
    target = tmp_path / "snap"
    code, out, err = reconcile(capsys, command, "thor", "index", "--save-snapshot", str(target))
    assert (code, out) == (1, "")
    assert err.startswith(f"error: --save-snapshot {target}: a box named 'index' cannot be saved")
    assert not target.exists()
