"""A real headless Chromium (Debian's `chromium` package) driven over the DevTools protocol, for
the HTML report's tests: what the page logs, what it requests, its DOM, a screenshot.

No skip when Chromium is missing: .ci/setup-machine.sh installs it, and a test that quietly
stops testing the page would hide exactly the breakage it exists for.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websocket  # websocket-client (the project's test extras)

START_TIMEOUT_S = 30.0
LOAD_TIMEOUT_S = 20.0


def artifacts_dir(fallback: Path) -> Path:
    """Where screenshots go: $FLEET_TEST_ARTIFACTS (CI keeps it) or the test's tmp_path."""
    chosen = os.environ.get("FLEET_TEST_ARTIFACTS")
    path = Path(chosen) if chosen else fallback
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class Loaded:
    """What one navigation produced."""

    console: list[str] = field(default_factory=list)  # console.* calls, any level
    errors: list[str] = field(default_factory=list)  # exceptions and error-level log entries
    requests: list[str] = field(default_factory=list)  # every URL but the page's own


class Browser:
    def __init__(self, ws_url: str) -> None:
        self._ws = websocket.create_connection(ws_url, timeout=LOAD_TIMEOUT_S)
        self._ids = itertools.count(1)
        self._events: list[dict[str, Any]] = []

    def close(self) -> None:
        self._ws.close()

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its answer; events that arrive meanwhile are kept."""
        ident = next(self._ids)
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            msg = json.loads(self._ws.recv())
            if msg.get("id") == ident:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))
            self._events.append(msg)

    def _wait_event(self, method: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self._events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout} s")
            self._events.append(json.loads(self._ws.recv()))

    def load(
        self, page: Path, width: int = 1280, height: int = 900, mobile: bool = False
    ) -> Loaded:
        url = page.resolve().as_uri()
        self._events.clear()
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.call(f"{domain}.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=2 if mobile else 1,
            mobile=mobile,
        )
        self.call("Page.navigate", url=url)
        self._wait_event("Page.loadEventFired", LOAD_TIMEOUT_S)
        self.call("Runtime.evaluate", expression="1")  # drains events queued before the load
        out = Loaded()
        for e in self._events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled":
                args = " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
                out.console.append(f"console.{params['type']}: {args}")
            elif method == "Runtime.exceptionThrown":
                out.errors.append(f"exception: {params['exceptionDetails'].get('text')}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                out.errors.append(
                    f"log: {params['entry'].get('text')} {params['entry'].get('url')}"
                )
            elif method == "Network.requestWillBeSent":
                requested = params["request"]["url"]
                if requested != url:
                    out.requests.append(requested)
        return out

    def value(self, expression: str) -> Any:
        answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """Chromium started headless on a free DevTools port, killed (and its profile removed) in
    any case."""
    binary = shutil.which("chromium")
    assert binary, "chromium is not installed: run .ci/setup-machine.sh (Debian's chromium)"
    profile = Path(tempfile.mkdtemp(prefix="fleet-chromium-"))
    argv = [
        binary,
        "--headless=new",
        "--remote-debugging-port=0",  # any free port; Chromium writes it to DevToolsActivePort
        f"--user-data-dir={profile}",
        # Chromium's sandbox needs user namespaces or a setuid helper, neither of which a root
        # process in CI's container has: as root it refuses to start without this flag. The
        # page it loads is our own file, with no script and a CSP that forbids any.
        "--no-sandbox",
        "--disable-dev-shm-usage",  # a container's /dev/shm is often 64 MiB
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",  # no update checks etc. in the request log
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "about:blank",
    ]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: the renderers go with it
    )
    browser = None
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port_file.is_file() and port_file.read_text().strip()):
            if proc.poll() is not None:
                raise RuntimeError(f"chromium exited {proc.returncode}: {proc.stderr.read()!r}")
            if time.monotonic() > deadline:
                raise TimeoutError("chromium wrote no DevToolsActivePort")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            targets = json.load(answer)
        page = next(t for t in targets if t.get("type") == "page")
        browser = Browser(page["webSocketDebuggerUrl"])
        yield browser
    finally:
        if browser is not None:
            browser.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group we started, by its id
        proc.wait(timeout=10)
        if proc.stderr:
            proc.stderr.close()
        shutil.rmtree(profile, ignore_errors=True)
