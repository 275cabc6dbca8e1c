"""Review 8 of lobes' gateway rules (/tmp/rev-lobes's repros):

1. The converge's gateway check asks the gateway at the desired `gateway.bind`, as the
   collector does (collector.py `_gateway_host`): Docker publishes the port on that address
   only, and a gateway bound to 127.0.0.2 or the box's mesh address answered nothing on
   127.0.0.1, so every apply that recreated it failed after health_timeout_s and rolled back.
   The payload's `verify.bind` is checked on both sides as an IPv4 address; an older payload
   without it is still asked at 127.0.0.1.
2. Import resolves the gateway's key as lobes 0.91 does (GATEWAY_API_KEY, else
   CULTURE_VLLM_API_KEY when that is blank): a gateway keyed through the fallback is adopted
   keyed, with the same key referenced where a converge reads it (never `.env`'s
   CULTURE_VLLM_API_KEY line, which that converge blanks); and a gateway any keyless request
   found keyed is never adopted `auth: open`.

The import cases are tests/fixtures/import/lab_desired (the lab captured against its desired
state) with spark's key moved as the reviewer moved it on the lab box (snapshot i1: `.env`'s
line 1194 renamed to CULTURE_VLLM_API_KEY, the containers recreated from it).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from reconciler import records
from reconciler.apply.payload import BadPayload, check, verify_spec
from reconciler.cli import main
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import expectations
from reconciler.importer.adopt import home_path
from reconciler.importer.boxview import BoxView
from reconciler.importer.gateway import adopt_gateway
from reconciler.importer.images import catalog, running_digest
from reconciler.importer.secrets import UNFOUND_FILE, candidates
from reconciler.importer.sourced import Sourced, Tree
from reconciler.observe.observe import load_snapshot
from tests.unit.conftest import load_box_program
from tests.unit.converge_helpers import base_payload

REPO = Path(__file__).resolve().parents[2]
LAB_DESIRED = REPO / "tests/fixtures/import/lab_desired"
converge = load_box_program("box_converge_lobes_review8", "reconciler/apply/remote/converge.py")
collector = load_box_program(
    "box_collector_lobes_review8", "reconciler/observe/remote/collector.py"
)
NOT_OURS = "203.0.113.1"  # TEST-NET-3 (RFC 5737): an address no machine here holds


# -- 1. the converge asks the gateway at its bind -------------------------------------------------
class _Lobes(BaseHTTPRequestHandler):
    """A keyed lobes gateway, as the reviewer's stub (r1/repro.py) answers."""

    def do_GET(self) -> None:
        body: dict[str, Any]
        if self.path == "/health":
            code, body = 200, {"status": "ok", "service": "model-gear-gateway", "version": "0.91.0"}
        elif self.path == "/capabilities":
            code, body = 200, {"worker": {"context": 262144, "feasible": True, "ready": True}}
        else:
            code, body = 401, {"error": {"type": "invalid_api_key"}}
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def gateway_on(host: str) -> Iterator[int]:
    """The stub published on `host` only (as Docker publishes `HOST:PORT:8000`): its port."""
    server = ThreadingHTTPServer((host, 0), _Lobes)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def verify_box(port: int, **more: Any) -> Any:
    spec = {"port": port, "version": "0.91.0", "auth": "keyed", "windows": {"worker": 262144}}
    box = type("Box", (), {})()
    box.p = {"verify": {**spec, **more}}
    return box


@pytest.mark.parametrize("bind", ["127.0.0.2", "127.3.4.5", "own"])
def test_the_gateway_check_asks_the_gateway_at_its_bind(bind):
    bind = _bind(bind)
    assert bind is not None
    with gateway_on(bind) as port:
        assert converge.gateway_problems(verify_box(port, bind=bind)) == []


@pytest.mark.parametrize("bind", ["0.0.0.0", None])
def test_every_interface_and_an_older_payload_are_asked_on_the_loopback(bind):
    with gateway_on("127.0.0.1") as port:
        more = {} if bind is None else {"bind": bind}  # None: a payload without the key
        assert converge.gateway_problems(verify_box(port, **more)) == []


def test_a_gateway_on_another_address_is_not_taken_for_the_desired_one():
    """Asked at its bind, not wherever something answers: a gateway left on the loopback
    while the desired bind is 127.0.0.2 is not the one the converge recreated."""
    with gateway_on("127.0.0.1") as port:
        problems = converge.gateway_problems(verify_box(port, bind="127.0.0.2"), None)
    assert problems and problems[0].startswith("/health version None")


def test_a_bind_that_is_not_the_boxs_own_fails_at_once(monkeypatch):
    monkeypatch.setattr("sys.stdout", io.StringIO())
    started = time.monotonic()
    with pytest.raises(converge.Failed, match=f"{NOT_OURS} is not an address of this box"):
        converge.verify_gateway(verify_box(8000, bind=NOT_OURS), 5)
    assert time.monotonic() - started < 2  # not the whole health timeout


def _own_address() -> str | None:
    """A non-loopback IPv4 address of this machine (the one it would send from; a UDP
    connect sends nothing), if it has a route out (a netns may have none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))
        except OSError:
            return None
        host = str(probe.getsockname()[0])
    return None if host.startswith("127.") or host == "0.0.0.0" else host


def _bind(bind: str | None) -> str | None:
    """`own`: this machine's non-loopback address (as a box's mesh address), else skipped."""
    if bind != "own":
        return bind
    own = _own_address()
    if own is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    return own


@pytest.mark.parametrize(
    "bind",
    [None, "0.0.0.0", "127.0.0.1", "127.0.0.2", "127.255.255.254", NOT_OURS, "10.77.0.250",
     "own"],
)  # fmt: skip
def test_the_converge_and_the_collector_ask_the_same_address(bind):
    """converge.py `gateway_host` is the collector's `_gateway_host` copied (the box program
    imports nothing): a drift and a converge ask the same gateway, or neither does."""
    bind = _bind(bind)
    host, why = converge.gateway_host(bind)
    twin, twin_why = collector._gateway_host(bind)
    assert host == twin
    assert (why is None) == (twin_why is None)


# -- 1. the payload carries the bind, and both sides check it -------------------------------------
def _exp(bind: str) -> Any:
    exp = expectations(load_fleet(REPO, "hosts"), ["thor"])["thor"]
    return records.replace(exp, gateway=records.replace(exp.gateway, bind=bind))


def test_the_verify_spec_carries_the_desired_bind():
    assert verify_spec(_exp("10.77.0.12"))["bind"] == "10.77.0.12"
    assert verify_spec(_exp("0.0.0.0"))["bind"] == "0.0.0.0"


def _payload(home: Path, **verify: Any) -> dict[str, Any]:
    """A converge payload that changes nothing, its `verify` the desired state's with
    `verify` over it."""
    p = base_payload("converge", "me")
    p.update(
        titles=[], fingerprint={"files": {}, "containers": None}, managed_env={}, box_secrets={},
        env_keys=[], restore=[], pulls=[], services=[], removes=[], images={}, keep=10,
        verify={**verify_spec(_exp("0.0.0.0")), **verify},
    )  # fmt: skip
    return p


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("bind", ["10.77.0.12", "127.0.0.2", "0.0.0.0"])
def test_an_address_passes_both_checks(home, bind):
    p = _payload(home, bind=bind)
    check(p)
    converge.validate_payload(p, str(home))


def test_an_older_payload_without_a_bind_passes_both_checks(home):
    p = _payload(home)
    del p["verify"]["bind"]
    check(p)
    converge.validate_payload(p, str(home))


@pytest.mark.parametrize(
    "bind",
    ["localhost", "127.0.0.01", "1.2.3", "0x7f.0.0.1", "1.2.3.256", "::1", "10.77.0.12\n",
     " 10.77.0.12", "10.77.0.12:8000", "", None, 2130706433, ["127.0.0.1"]],
)  # fmt: skip
def test_a_bind_that_is_no_ipv4_address_is_refused_by_both_sides(home, bind):
    p = _payload(home, bind=bind)
    with pytest.raises(BadPayload, match=r"verify\.bind"):
        check(p)
    with pytest.raises(converge.Failed, match=r"verify\.bind"):
        converge.validate_payload(p, str(home))


# -- 2. import: lobes' CULTURE_VLLM_API_KEY fallback ----------------------------------------------
GATEWAY_KEY = "GATEWAY_API_KEY"
FALLBACK = "CULTURE_VLLM_API_KEY"


def _move_key_to_fallback(data: dict[str, Any]) -> str:
    """spark's key moved as on the lab box (i1): `.env`'s GATEWAY_API_KEY line renamed to
    CULTURE_VLLM_API_KEY, every container recreated from it (the gateway's
    `GATEWAY_API_KEY=${GATEWAY_API_KEY:-}` now empty). The key's digest."""
    collected = data["collected"]
    line = next(e for e in collected["envfile"] if e["key"] == GATEWAY_KEY)
    line["key"] = FALLBACK
    for container in collected["docker"]["containers"]:
        if GATEWAY_KEY in container["env"]:
            container["env"][FALLBACK] = container["env"][GATEWAY_KEY]
            container["env"][GATEWAY_KEY] = ""
    return str(line["value"]["secret"])


def _loopback_timed_out(data: dict[str, Any]) -> None:
    """i2: the box's own keyless request gave no answer (the controller's still got 401)."""
    data["collected"]["gateway"]["models_noauth"] = {
        "status": None,
        "error": "timed out",
        "ms": 3000,
    }


def _snapshot(tmp_path: Path, *changes: Callable[[dict[str, Any]], Any]) -> Path:
    snap = tmp_path / "snap"
    shutil.copytree(LAB_DESIRED, snap)
    path = snap / "spark.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    for change in changes:
        change(data)
    path.write_text(json.dumps(data), encoding="utf-8")
    return snap


def _import(tmp_path: Path, snap: Path) -> tuple[int, str, dict[str, Any]]:
    out = tmp_path / "adopted"
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        code = main(["--root", str(REPO), "-i", "lab", "import", "spark", "--from-snapshot",
                     str(snap), "--output", str(out)])  # fmt: skip
    written = out / "group_vars" / "all.yaml"
    adopted = YAML(typ="safe").load(written.read_text(encoding="utf-8")) if written.exists() else {}
    return code, buffer.getvalue(), adopted


@pytest.mark.parametrize("loopback", ["answered", "timed out"])
def test_a_gateway_keyed_by_the_fallback_is_adopted_keyed_with_the_same_key(tmp_path, loopback):
    changes: list[Callable[[dict[str, Any]], Any]] = [_move_key_to_fallback]
    if loopback == "timed out":
        changes.append(_loopback_timed_out)
    code, printed, adopted = _import(tmp_path, _snapshot(tmp_path, *changes))
    assert code == 2, printed  # written, with the differences a converge removes
    assert adopted["gateway"]["auth"] == "keyed"
    assert adopted["gateway"]["api_key"] == {"secret": "gateway_api_key"}
    # ~/.lobes/.secrets.env holds the same key (same digest): a converge writes it to
    # GATEWAY_API_KEY, which lobes reads first, and the gateway stays keyed by it.
    assert adopted["secrets"]["gateway_api_key"] == {
        "source": "box_file", "path": "~/.lobes/.secrets.env", "key": GATEWAY_KEY,
    }  # fmt: skip
    assert f"keyed by {FALLBACK}" in printed
    assert "login shell export" not in printed


def test_a_key_only_the_fallback_line_holds_is_never_read_from_that_line(tmp_path):
    """A converge blanks `.env`'s CULTURE_VLLM_API_KEY (desired/envfile.py): a reference to
    that line would give the first converge the key and every later one none."""

    def other_secret_file(data: dict[str, Any]) -> None:
        data["collected"]["secret_sources"]["gateway_api_key"]["digest"] = "hmac:" + "0" * 64

    snap = _snapshot(tmp_path, _move_key_to_fallback, other_secret_file)
    code, printed, adopted = _import(tmp_path, snap)
    assert code == 2, printed
    assert adopted["gateway"]["auth"] == "keyed"
    reference = adopted["secrets"]["gateway_api_key"]
    assert reference["path"] == f"~/.lobes/{UNFOUND_FILE}", reference  # the placeholder, said
    assert f".env is blanked by a converge, which writes the key as {GATEWAY_KEY}" in printed


def _spark(tmp_path: Path, *changes: Callable[[dict[str, Any]], Any]) -> Any:
    _, observations = load_snapshot(_snapshot(tmp_path, *changes))
    return observations["spark"]


def _adopt(obs: Any, **controller: Any) -> tuple[Tree, BoxView]:
    doc = obs.document
    names = catalog(r for c in doc.containers if (r := running_digest(doc, c)))
    view, tree = BoxView("spark", doc), {}  # type: ignore[var-annotated]
    adopt_gateway(view, tree, names, home_path(doc, doc.deploy_dir), candidates(doc), **controller)
    return tree, view


def _no_key_anywhere(data: dict[str, Any]) -> None:
    """Neither variable holds a key in `.env` or any container: what gateway.py cannot see
    (a gateway keyed some other way) is left to the keyless requests."""
    collected = data["collected"]
    collected["envfile"] = [e for e in collected["envfile"] if e["key"] != GATEWAY_KEY]
    for container in collected["docker"]["containers"]:
        for key in (GATEWAY_KEY, FALLBACK):
            if key in container["env"]:
                container["env"][key] = ""


def test_the_controllers_401_keeps_a_gateway_keyed_when_the_loopback_gave_none(tmp_path):
    obs = _spark(tmp_path, _no_key_anywhere, _loopback_timed_out)
    assert obs.probes.models_noauth.status == 401  # the controller's own, captured
    tree, view = _adopt(obs, controller=obs.probes)
    auth = tree["gateway"]["auth"]
    assert isinstance(auth, Sourced)
    assert (auth.value, auth.origin) == ("keyed", "GET /v1/models without key (controller): 401")
    assert "api_key" not in tree["gateway"]  # nothing to point at: the loader refuses, said
    assert any("neither .env nor the gateway container holds" in f.what for f in view.findings)


def test_a_gateway_the_loopback_found_open_is_kept_keyed_when_the_controller_was_refused(
    tmp_path,
):
    def loopback_open(data: dict[str, Any]) -> None:
        data["collected"]["gateway"]["models_noauth"] = {"status": 200, "ms": 3}

    obs = _spark(tmp_path, loopback_open)
    tree, _ = _adopt(obs, controller=obs.probes)
    assert tree["gateway"]["auth"].value == "keyed"
    tree, _ = _adopt(copy.deepcopy(obs))  # no other request: what the box answered
    assert tree["gateway"]["auth"].value == "open"


def _key_nowhere_to_see(data: dict[str, Any]) -> None:
    """No key in the gateway's environment nor in `.env` (one armed another way, say a login
    shell's export the answer does not show), and the loopback's keyless request unanswered:
    only the controller's own probe (401) says it is keyed."""
    collected = data["collected"]
    collected["envfile"] = [
        e for e in collected["envfile"] if e["key"] not in (GATEWAY_KEY, FALLBACK)
    ]
    for container in collected["docker"]["containers"]:
        for key in (GATEWAY_KEY, FALLBACK):
            container["env"].pop(key, None)
    _loopback_timed_out(data)


def test_an_import_keeps_keyed_a_gateway_only_the_controller_found_keyed(tmp_path: Path) -> None:
    """The import passes the controller's probes to the gateway's adoption (adopt_box): before,
    with the loopback silent and no key visible, it wrote `auth: open` (a converge of it would
    open a keyed gateway)."""
    snap = _snapshot(tmp_path, _key_nowhere_to_see)
    controller = json.loads((snap / "spark.json").read_text())["controller"]
    assert controller["models_noauth"]["status"] == 401  # captured: the controller's own
    code, said, adopted = _import(tmp_path, snap)
    # Keyed, with no key to reference: refused, saying so, and nothing written.
    assert code == 1 and adopted == {}, said
    assert "the gateway refuses callers without a key, but neither .env nor" in said
