"""A box file the collector cannot read as text is that box's own, named error, never a hung or
lost observation.

The collector reads the deploy user's files: the deployment's `.env` and its `.env*` and
`docker-compose*` files, the box_file secrets, ~/.docker's config, /proc/meminfo. Any of them
may be a FIFO (opening it waited for a writer for ever), a symlink to /dev/zero (read whole: the
memory), a directory or bytes that are not UTF-8 (raised out of the run: no answer at all).
Here the real program runs as a box runs it (`python3 collector.py PAYLOAD`, in a home of its
own) over each such file; its answer is read by the controller, compared and reported.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.box import compare_box
from reconciler.compare.drift import DriftReport, Part
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import expectations
from reconciler.observe.document import Fault, Observed, parse_answer
from reconciler.plan import plan_box
from reconciler.report.document import DriftReportDoc
from reconciler.report.json_report import render_json
from reconciler.report.markdown import render_markdown
from reconciler.report.text import render_text
from tests.unit.conftest import ROOT

PROGRAM = ROOT / "reconciler" / "observe" / "remote" / "collector.py"
EXAMPLE = ROOT / "examples" / "lab-incidents"
COMPOSE = b"services:\n  gateway:\n    image: busybox\n"
ENV = "WORKER_MAX_MODEL_LEN=4096\nGW=from-env\n"
LIMIT = 4 * 1024 * 1024  # the collector's FILE_LIMIT
RUN_S = 60  # far over a run here (~1-4 s): a FIFO held the old collector for ever


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def box(tmp_path: Path) -> Path:
    """A deploy user's home: a lobes deployment (a `.env` and a compose file) and a box_file
    secret, each a regular file to start with."""
    home = tmp_path / "home"
    deploy = home / "lobes"
    deploy.mkdir(parents=True)
    (deploy / ".env").write_text(ENV, encoding="utf-8")
    (deploy / "docker-compose.yml").write_bytes(COMPOSE)
    (home / "secrets.env").write_text("GW=from-secrets\n", encoding="utf-8")
    return home


def collect(home: Path) -> tuple[str, dict[str, Any]]:
    """The collector's stdout, run over `home` as the controller runs it, and its document."""
    payload = {
        "run_key": "k" * 32,
        "directory": "~/lobes",
        "project": "lobes",
        "compose_files": ["docker-compose.yml"],
        "managed_env": {"GW": {"secret": "gw"}},
        "box_secrets": {"gw": {"path": "~/secrets.env", "key": "GW"}},
        "secret_patterns": [],
        "gateway_port": closed_port(),
        "timeout_s": 2,  # a docker CLI that meets a FIFO config waits for it: not for long
        "probe_timeout_s": 1,
    }
    encoded = base64.b64encode(json.dumps(payload).encode()).decode()
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "USER": "lobes"}
    proc = subprocess.run(
        [sys.executable, str(PROGRAM), encoded],
        capture_output=True, text=True, env=env, cwd=home, timeout=RUN_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, json.loads(proc.stdout)


def fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def directory(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.mkdir()


def dev_zero(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


def too_big(path: Path) -> None:
    with path.open("wb") as handle:  # sparse: costs no disk
        handle.truncate(LIMIT + 1)


def not_utf8(path: Path) -> None:
    path.write_bytes(b"WORKER_MAX_MODEL_LEN=4096\nNAME=caf\xe9\n")


HOSTILE: dict[str, Callable[[Path], None]] = {
    "fifo": fifo,
    "directory": directory,
    "dev-zero": dev_zero,
    "too-big": too_big,
    "not-utf8": not_utf8,
}
WHY = {
    "fifo": "not a regular file (fifo)",
    "directory": "not a regular file (directory)",
    "dev-zero": "not a regular file (character device)",
    "too-big": f"over {LIMIT} bytes",
    "not-utf8": "not UTF-8",
}


# -- the collector: each problem named, the rest observed ---------------------------------------
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_hostile_env_is_the_boxes_named_problem_and_the_rest_is_observed(
    box: Path, kind: str
) -> None:
    HOSTILE[kind](box / "lobes" / ".env")
    _, doc = collect(box)
    assert doc["file_errors"] == {".env": WHY[kind]}
    if kind == "not-utf8":  # a file all the same: its bytes are digested as always
        assert doc["files"][".env"]["exists"] and doc["files"][".env"]["size"] == 36
    else:
        assert doc["files"][".env"] == {"exists": False, "error": WHY[kind]}
    assert doc["envfile"] is None and doc["current_env_keys"] == []
    # Not rendered from a .env it could not read (that would render an empty one)...
    assert doc["render"] == {"error": f"not rendered: file .env: {WHY[kind]}"}
    # ... and everything else observed as always.
    compose = doc["files"]["docker-compose.yml"]
    assert compose["exists"] and compose["size"] == len(COMPOSE)
    assert doc["secret_sources"]["gw"]["status"] == "ok"
    assert doc["meminfo"]["MemTotal_kib"] > 0
    assert doc["gateway"]["health"]["status"] is None  # asked: nothing listens there
    assert "exports" in doc["login_shell"] or "error" in doc["login_shell"]
    assert "docker" in doc and "variables" in doc


@pytest.mark.parametrize(
    ("relative", "shown"),
    [
        ("lobes/docker-compose.override.yml", "docker-compose.override.yml"),  # a listed one
        ("lobes/docker-compose.yml", "docker-compose.yml"),  # the -f chain's own
        ("lobes/.env.local", ".env.local"),  # read only for the render cache's key
        ("secrets.env", "~/secrets.env"),  # a box_file secret
        (".docker/config.json", "~/.docker/config.json"),  # the docker CLI's context
    ],
)
def test_any_other_fifo_the_collector_reads_is_named_too(
    box: Path, relative: str, shown: str
) -> None:
    path = box / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    fifo(path)
    _, doc = collect(box)
    assert doc["file_errors"] == {shown: "not a regular file (fifo)"}
    assert doc["envfile"] is not None  # the .env itself was read
    if shown == "~/secrets.env":
        assert doc["secret_sources"]["gw"] == {"status": "file-unreadable", "path": "~/secrets.env"}


def test_a_regular_file_reads_as_before(box: Path) -> None:
    (box / "lobes" / ".env").write_bytes(b"A=1\r\nB='two words' # note\r\n")
    _, doc = collect(box)
    assert doc["file_errors"] == {}
    assert [(e["key"], e["value"]) for e in doc["envfile"]] == [("A", "1"), ("B", "two words")]
    assert doc["secret_sources"]["gw"]["status"] == "ok"


# -- the controller: parsed, an error of the box, in every report -------------------------------
@pytest.fixture(scope="module")
def thor() -> Any:
    return expectations(load_fleet(EXAMPLE, "lab"), ["thor"])["thor"]


def test_the_controller_reports_the_boxes_own_file_error(box: Path, thor: Any) -> None:
    fifo(box / "lobes" / ".env")
    (box / "lobes" / "docker-compose.override.yml").mkdir()
    stdout, _ = collect(box)
    doc = parse_answer(stdout)
    assert isinstance(doc, Observed), doc
    assert dict(doc.file_errors) == {
        ".env": "not a regular file (fifo)",
        "docker-compose.override.yml": "not a regular file (directory)",
    }
    result = compare_box(thor, doc)
    assert result.reachable and result.observation == "full"
    named = [e for e in result.errors if e.part is Part.BOX_FILE]
    assert named == [
        "file .env: not a regular file (fifo)",
        "file docker-compose.override.yml: not a regular file (directory)",
    ]
    # The .env is there: its drift says it could not be read, not that it is missing.
    (missing,) = [d for d in result.drifts if d.subject == "file:.env" and d.path == "(file)"]
    assert missing.note == "the deployment's .env could not be read: not a regular file (fifo)"
    assert plan_box(result, thor).blocked  # a converge would meet the same FIFO

    report = DriftReport((result,), "lab", "2026-11-30T18:00:00Z", "r1")
    assert report.exit_code == 1
    parsed = DriftReportDoc.model_validate_json(render_json(report))
    assert "file .env: not a regular file (fifo)" in parsed.boxes[0].errors
    assert "error: file .env: not a regular file (fifo)" in render_text(report, color=False)
    assert "file .env: not a regular file (fifo)" in render_markdown(report)


def test_an_older_answer_without_file_errors_reads_as_none(box: Path, thor: Any) -> None:
    _, raw = collect(box)
    raw.pop("file_errors")
    doc = parse_answer(json.dumps(raw))
    assert isinstance(doc, Observed) and dict(doc.file_errors) == {}
    assert not [e for e in compare_box(thor, doc).errors if e.part is Part.BOX_FILE]


@pytest.mark.parametrize("bad", [["x"], {"a": 1}, {"a\x1b[31m": "x"}])
def test_file_errors_of_the_wrong_shape_are_the_boxes_fault(box: Path, bad: Any) -> None:
    _, raw = collect(box)
    raw["file_errors"] = bad
    fault = parse_answer(json.dumps(raw))
    assert isinstance(fault, Fault) and fault.path.startswith("file_errors")


def test_a_large_replay_reads_the_file_errors_alike(box: Path) -> None:
    from reconciler.observe.document_c import read_snapshot_file  # msgspec: a large replay's

    fifo(box / "lobes" / ".env")
    _, raw = collect(box)
    typed = read_snapshot_file(json.dumps({"box": "thor", "collected": raw}).encode())
    assert typed is not None
    assert dict(typed.document.file_errors) == {".env": "not a regular file (fifo)"}
