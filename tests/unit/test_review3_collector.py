"""Review 3 of the box-side collector: its compose render cache, `.env` reading and a converge
under way.

- The render cache keyed only `.env`, the `-f` chain and top-level `.env*`/`docker-compose*`
  names: an `env_file:` of another name, an `extends:`/`include:` file in a subdirectory, a file
  outside the deployment were not keyed, and drift reported "in sync" from a stale render (the
  real `docker compose` renders here, as on a box).
- A damaged cache entry (empty, cut short) was served for ever; entries were written through
  one shared temp name, unsynced.
- The docker CLI's compose plugin was keyed by size and mtime, and only in ~/.docker and the
  system directories: one in $DOCKER_CONFIG or `cliPluginsExtraDirs` was not keyed at all.
- The desired `.env` a render reads lay on disk, secrets in clear, wherever a killed collector
  left it.
- `.env`: a file compose refuses read as one of no entries; a line of two statements
  (`V="a" W=3`) lost its second when the first was managed; the audit numbered lines off after
  a value spanning lines and saw only a line's first statement; CRLF was read as LF inside a
  quoted value.
- A drift taken while a converge held the box's lock did not say so.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from reconciler.compare.box import observation_errors
from reconciler.compare.drift import Part
from reconciler.observe import document_c
from reconciler.observe.document import Observed, parse_answer, parse_collected
from reconciler.records import asdict
from tests.unit.conftest import ROOT, load_box_program, packed_program

collector = load_box_program("box_collector_review3", "reconciler/observe/remote/collector.py")
PROGRAM = packed_program("reconciler/observe/remote/collector.py")
CAPTURE = ROOT / "tests" / "fixtures" / "import" / "pristine" / "thor.json"


def payload(deploy: Path, **extra: Any) -> dict[str, Any]:
    return {
        "run_key": "k" * 32, "secret_patterns": [], "directory": str(deploy),
        "project": "lobes", "compose_files": ["docker-compose.yml"], "managed_env": {},
        "box_secrets": {},
    } | extra  # fmt: skip


# -- the render cache follows every file compose reads (real docker compose) -----------------------
@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "cache"
    where.mkdir(mode=0o700)
    monkeypatch.setattr(collector, "_cache_dir", lambda: str(where))
    return where


@pytest.fixture
def compose_runs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every `docker compose` the collector runs (the real one still runs)."""
    calls: list[list[str]] = []
    real = collector.Run.run

    def counted(self: Any, argv: list[str], env: Any = None, **kw: Any) -> Any:
        calls.append(argv)
        return real(self, argv, env=env, **kw)

    monkeypatch.setattr(collector.Run, "run", counted)
    return calls


ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}


def render(deploy: Path, project: Any = None) -> dict[str, Any]:
    run = collector.Run(payload(deploy))
    env = dict(ENV, HOME=str(deploy.parent))
    result = collector.render(run, project or collector.Existing(str(deploy)), env)
    assert "services" in result, result
    return dict(result["services"])


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


INCLUDE = "include:\n  - parts/extra.yml\nservices:\n  a:\n    image: busybox\n"
# Each case: the deployment's files, the file edited after the first render, its new text, and
# where the edit shows in the render (service, field, before, after).
CASES = {
    "env_file of another name": (
        {"docker-compose.yml": "services:\n  lane:\n    image: busybox\n    env_file: [lane.env]\n",
         "lane.env": "MODEL_LEN=131072\n"},
        "lane.env", "MODEL_LEN=262144\n",
        ("lane", "environment", {"MODEL_LEN": "131072"}, {"MODEL_LEN": "262144"}),
    ),
    "extends file in a subdirectory": (
        {"docker-compose.yml": "services:\n  inc:\n    extends:\n      file: common/base.yml\n"
                               "      service: base\n",
         "common/base.yml": "services:\n  base:\n    image: alpine:3.19\n"},
        "common/base.yml", "services:\n  base:\n    image: alpine:3.20\n",
        ("inc", "image", "alpine:3.19", "alpine:3.20"),
    ),
    "include": (
        {"docker-compose.yml": INCLUDE,
         "parts/extra.yml": "services:\n  extra:\n    image: nginx:1\n"},
        "parts/extra.yml", "services:\n  extra:\n    image: nginx:2\n",
        ("extra", "image", "nginx:1", "nginx:2"),
    ),
    "the included project's own .env": (
        {"docker-compose.yml": INCLUDE,
         "parts/extra.yml": "services:\n  extra:\n    image: nginx:${TAG:-1}\n",
         "parts/.env": "TAG=5\n"},
        "parts/.env", "TAG=6\n",
        ("extra", "image", "nginx:5", "nginx:6"),
    ),
    "env_file named through the .env": (
        {"docker-compose.yml": "services:\n  lane:\n    image: busybox\n"
                               "    env_file: [\"${LANE_ENV}\"]\n",
         ".env": "LANE_ENV=envs/lane.conf\n", "envs/lane.conf": "WINDOW=1\n"},
        "envs/lane.conf", "WINDOW=2\n",
        ("lane", "environment", {"WINDOW": "1"}, {"WINDOW": "2"}),
    ),
    "an optional env_file created later": (
        {"docker-compose.yml": "services:\n  lane:\n    image: busybox\n    env_file:\n"
                               "      - path: local.env\n        required: false\n"},
        "local.env", "EXTRA=1\n",
        ("lane", "environment", {}, {"EXTRA": "1"}),
    ),
    "a file outside the deployment": (
        {"docker-compose.yml": "services:\n  lane:\n    image: busybox\n"
                               "    env_file: [../shared/common.env]\n"},
        "../shared/common.env", "SHARED=b\n",
        ("lane", "environment", {"SHARED": "a"}, {"SHARED": "b"}),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_render_follows_every_file_compose_reads(
    case: str, tmp_path: Path, cache: Path, compose_runs: list[list[str]]
) -> None:
    files, edited, new_text, (service, field, before, after) = CASES[case]
    deploy = tmp_path / "box" / "lobes"
    write(deploy / ".env", "")  # compose_argv names it (`--env-file`)
    for name, text in files.items():
        write(deploy / name, text)
    if case == "a file outside the deployment":
        write(deploy.parent / "shared" / "common.env", "SHARED=a\n")
    first = render(deploy)
    assert first[service].get(field) == before and len(compose_runs) == 1
    assert render(deploy) == first and len(compose_runs) == 1  # the control: served
    write(deploy / edited, new_text)
    again = render(deploy)
    assert again[service].get(field) == after  # what the next `compose up` applies
    assert len(compose_runs) == 2
    assert render(deploy) == again and len(compose_runs) == 2  # and served again after


def test_a_file_no_compose_file_names_does_not_cost_a_render(
    tmp_path: Path, cache: Path, compose_runs: list[list[str]]
) -> None:
    """The gateway writes ~/.lobes/logs all the time, lanes their compile caches: a change
    there must not make every drift render again (~0.25 s of the box's CPU)."""
    deploy = tmp_path / "box" / "lobes"
    write(deploy / ".env", "")
    write(deploy / "docker-compose.yml",
          "services:\n  lane:\n    image: busybox\n    volumes: [./logs:/logs]\n"
          "    healthcheck: {test: [CMD, cat, /proc/pressure/io]}\n")  # fmt: skip
    write(deploy / "logs" / "gateway.log", "a\n")
    first = render(deploy)
    write(deploy / "logs" / "gateway.log", "a\nb\n")
    write(deploy / "logs" / "new.log", "c\n")
    assert render(deploy) == first and len(compose_runs) == 1


def test_the_desired_env_renders_from_memory_through_the_real_compose(
    tmp_path: Path, cache: Path, compose_runs: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Shadow project's `.env` is never a file on disk (it holds the box's secrets and the
    controller's): compose reads it through /proc/PID/fd; a lane's `env_file: .env` too."""
    deploy = tmp_path / "box" / "lobes"
    write(deploy / "docker-compose.yml",
          "services:\n  lane:\n    image: busybox\n    env_file: [.env]\n"
          "    command: [serve, \"${WINDOW}\"]\n")  # fmt: skip
    write(deploy / ".env", "WINDOW=1\n")
    seen: list[tuple[bool, str]] = []
    real = collector.Run.run

    def look(self: Any, argv: list[str], env: Any = None, **kw: Any) -> Any:
        env_file = Path(argv[argv.index("--project-directory") + 1]) / ".env"
        seen.append((env_file.is_symlink(), os.readlink(env_file)))
        return real(self, argv, env=env, **kw)

    monkeypatch.setattr(collector.Run, "run", look)
    run = collector.Run(payload(deploy))
    workspace = collector.Workspace()
    try:
        shadow = collector.Shadow(run, workspace, "WINDOW=2\nHF_TOKEN=hf_not_on_disk\n")
        result = collector.render(run, shadow, dict(ENV, HOME=str(tmp_path)))
        on_disk = [
            p.read_bytes()
            for p in Path(workspace.path).rglob("*")
            if p.is_file() and not p.is_symlink()
        ]
    finally:
        workspace.remove()
    assert seen and seen[0][0] and seen[0][1].startswith(f"/proc/{os.getpid()}/fd/")
    lane = result["services"]["lane"]
    assert lane["command"] == ["serve", "2"]
    assert lane["environment"]["WINDOW"] == "2" and "secret" in lane["environment"]["HF_TOKEN"]
    assert not any(b"hf_not_on_disk" in data for data in on_disk)
    assert workspace.fds == []  # closed with the workspace


# -- a damaged entry, and how entries are written -------------------------------------------------
@pytest.fixture
def fake_compose(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []

    def fake(self: Any, argv: list[str], env: Any = None, **_: Any) -> tuple[int, str, str]:
        calls.append(argv)
        return 0, json.dumps({"services": {"lane": {"image": f"busybox:{len(calls)}"}}}), ""

    monkeypatch.setattr(collector.Run, "run", fake)
    return calls


def small_deploy(tmp_path: Path) -> Path:
    deploy = tmp_path / "box" / "lobes"
    write(deploy / "docker-compose.yml", "services: {lane: {image: busybox}}\n")
    write(deploy / ".env", "A=1\n")
    return deploy


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: b"",  # emptied
        lambda data: data[: len(data) // 2],  # cut short
        lambda data: data[: data.index(b"\n") + 1] + b"x" * (len(data) - data.index(b"\n") - 1),
        lambda data: b'{"services": {}}',  # a render alone, as an older collector wrote one
        lambda data: b"\xff" + data,
    ],
    ids=["empty", "cut", "garbage-of-the-same-size", "older-format", "not-utf8"],
)
def test_a_damaged_entry_is_rendered_again_and_replaced(
    damage: Any, tmp_path: Path, cache: Path, fake_compose: list[list[str]]
) -> None:
    deploy = small_deploy(tmp_path)
    assert render(deploy)["lane"]["image"] == "busybox:1"
    [entry] = cache.glob("*.json")
    entry.write_bytes(damage(entry.read_bytes()))
    again = render(deploy)  # rendered anew, never "unreadable compose config" from the cache
    assert again["lane"]["image"] == "busybox:2" and len(fake_compose) == 2
    assert render(deploy) == again and len(fake_compose) == 2  # the entry was replaced whole
    assert [p.name for p in cache.iterdir()] == [entry.name]


def test_an_entry_is_synced_under_a_name_of_its_own_before_it_is_renamed(
    tmp_path: Path, cache: Path, fake_compose: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        collector.os, "fsync", lambda fd: (events.append(("fsync", "")), real_fsync(fd))[1]
    )

    def replace(src: str, dst: str) -> None:
        events.append(("replace", os.path.basename(src)))
        real_replace(src, dst)

    monkeypatch.setattr(collector.os, "replace", replace)
    render(small_deploy(tmp_path))
    stored = [e for e in events if e[0] == "replace" and ".json." in e[1]]
    assert len(stored) == 1
    assert events.index(("fsync", "")) < events.index(stored[0])
    # pid and thread in the temporary name: two runs storing one key never share a file
    assert f".json.{os.getpid()}-" in stored[0][1] and stored[0][1].endswith(".tmp")


def test_a_temporary_file_a_killed_run_left_is_pruned(tmp_path: Path, cache: Path) -> None:
    left = cache / ("0" * 64 + ".json.4242-1.tmp")
    left.write_bytes(b"half")
    os.utime(left, (time.time() - 7200,) * 2)
    fresh = cache / ("1" * 64 + ".json.4243-1.tmp")
    fresh.write_bytes(b"being written")
    collector._prune(str(cache))
    assert not left.exists() and fresh.exists()


# -- the compose binary the docker CLI would run ---------------------------------------------------
@pytest.mark.parametrize("where", ["DOCKER_CONFIG", "~/.docker"])
def test_a_plugin_is_keyed_by_its_identity(
    where: str,
    tmp_path: Path,
    cache: Path,
    fake_compose: list[list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A compose plugin in $DOCKER_CONFIG/cli-plugins or ~/.docker/cli-plugins, replaced by
    another of the same size and mtime (a copy that keeps times): a render of the new one, not
    the cached one."""
    deploy = small_deploy(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # what `~` is, for this process too
    config = tmp_path / ("docker-config" if where == "DOCKER_CONFIG" else ".docker")
    plugin = config / "cli-plugins" / "docker-compose"
    write(plugin, "#!/bin/sh\necho v1\n")
    env = dict(ENV, HOME=str(tmp_path))
    if where == "DOCKER_CONFIG":
        env["DOCKER_CONFIG"] = str(config)
    run = collector.Run(payload(deploy))
    project = collector.Existing(str(deploy))
    assert collector.render(run, project, env)["services"]["lane"]["image"] == "busybox:1"
    stamp = plugin.stat()
    replacement = plugin.with_name("new")
    replacement.write_text("#!/bin/sh\necho v2\n", encoding="utf-8")
    os.utime(replacement, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    os.replace(replacement, plugin)
    run = collector.Run(payload(deploy))
    assert collector.render(run, project, env)["services"]["lane"]["image"] == "busybox:2"


def test_a_plugin_dir_named_by_config_json_is_keyed(
    tmp_path: Path, cache: Path, fake_compose: list[list[str]]
) -> None:
    deploy = small_deploy(tmp_path)
    extra = tmp_path / "plugins"
    write(tmp_path / ".docker" / "config.json", json.dumps({"cliPluginsExtraDirs": [str(extra)]}))
    env = dict(ENV, HOME=str(tmp_path))
    project = collector.Existing(str(deploy))
    collector.render(collector.Run(payload(deploy)), project, env)
    write(extra / "docker-compose", "#!/bin/sh\n")  # a compose plugin where docker looks first
    collector.render(collector.Run(payload(deploy)), project, env)
    assert len(fake_compose) == 2


# -- no desired .env left on disk by a killed collector --------------------------------------------
def test_workspaces_of_gone_collectors_are_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = root / f"fleet-collect-{gone.pid}-abc"  # its process is gone
    legacy = root / "fleet-collect-q1w2e3"  # an older collector's: no pid, an hour old
    live = root / f"fleet-collect-{os.getppid()}-xyz"  # a running process's, fresh
    other = root / "fleet-collect-notmine"
    for path in (dead, legacy, live):
        (path / "project").mkdir(parents=True)
        (path / "project" / ".env").write_text("HF_TOKEN=hf_left_behind\n")
    os.utime(legacy, (time.time() - 7200,) * 2)
    other.write_text("a file, not a workspace")
    workspace = collector.Workspace()
    try:
        made = Path(workspace.directory())
        assert made.name.startswith(f"fleet-collect-{os.getpid()}-")
        assert not dead.exists() and not legacy.exists()
        assert live.exists() and other.exists()
    finally:
        workspace.remove()
    assert not made.exists()


# -- .env as compose reads it ---------------------------------------------------------------------
def envfile_run(deploy: Path, text: str | bytes, **extra: Any) -> Any:
    data = text.encode() if isinstance(text, str) else text
    (deploy / ".env").write_bytes(data)
    return collector.Run(payload(deploy, **extra))


def test_an_env_compose_refuses_is_said_not_read_as_empty(tmp_path: Path) -> None:
    deploy = tmp_path / "lobes"
    deploy.mkdir()
    run = envfile_run(deploy, 'A=1\nGATEWAY_API_KEY="sk-secret-value-1\nB=2\n')
    shown, values = collector.envfile_fact(run)
    assert shown is None and values == {}
    why = run.file_errors[".env"]
    assert why == "docker compose refuses .env at line 2: a quoted value never ends"
    assert "sk-secret" not in json.dumps(run.file_errors)


def test_a_secret_file_compose_refuses_is_unreadable_not_missing_a_key(tmp_path: Path) -> None:
    deploy = tmp_path / "lobes"
    deploy.mkdir()
    (tmp_path / "secrets.env").write_text("GW='never closed\n")
    run = collector.Run(
        payload(deploy, box_secrets={"gw": {"path": str(tmp_path / "secrets.env"), "key": "GW"}})
    )
    shown, values = collector.secret_sources(run)
    assert shown["gw"]["status"] == "file-unreadable" and values == {}
    assert "docker compose refuses" in run.file_errors[str(tmp_path / "secrets.env")]


@pytest.mark.parametrize(
    ("current", "managed", "expected"),
    [
        # writing the first statement of a line keeps the second
        ('V="a" W=3\n', {"V": "5"}, {"V": "5", "W": "3"}),
        # writing the second keeps the first
        ('V="a" W=3\n', {"W": "4"}, {"V": "a", "W": "4"}),
        # a key managed as absent takes only its own statement
        ('V="a" W=3\n', {"V": None}, {"W": "3"}),
        # a value spanning lines before the key, and an inline comment after it
        ('M="x\ny"\nK=old   # why\n', {"K": "new"}, {"M": "x\ny", "K": "new"}),
        # the assignment compose keeps is the last one: it is the one written
        ("K=1\nK=2\n", {"K": "3"}, {"K": "3"}),
        # a value that would run into what follows on its line is quoted
        ("K='a' # c\n", {"K": ""}, {"K": ""}),
    ],
)
def test_the_desired_env_is_what_a_converge_writes_read_as_compose_reads_it(
    current: str, managed: dict[str, str | None], expected: dict[str, str]
) -> None:
    run = collector.Run({"run_key": "k" * 32, "directory": "/nonexistent", "managed_env": managed})
    text = collector.desired_envfile(run, current, {})
    assert {e["key"]: e["value"] for e in collector.parse_dotenv(text)} == expected


def test_the_desired_env_keeps_every_other_byte(tmp_path: Path) -> None:
    current = 'A="x\r\ny"\r\n# note\r\nK=old # why\r\nV="a" W=3\r\n'
    run = collector.Run({"run_key": "k" * 32, "directory": "/x", "managed_env": {"K": "new"}})
    assert collector.desired_envfile(run, current, {}) == current.replace("old", "new")


def test_crlf_inside_a_quoted_value_is_kept_as_compose_keeps_it(tmp_path: Path) -> None:
    deploy = tmp_path / "lobes"
    deploy.mkdir()
    run = envfile_run(deploy, b'SPLIT="a\r\nb"\r\nPLAIN=c\r\n')
    _, values = collector.envfile_fact(run)
    assert values == {"SPLIT": "a\r\nb", "PLAIN": "c"}


def test_the_audit_numbers_physical_lines_and_reads_every_statement(tmp_path: Path) -> None:
    deploy = tmp_path / "lobes"
    deploy.mkdir()
    run = envfile_run(
        deploy,
        'BANNER="one\ntwo\nthree"\n'  # lines 1-3
        'V="a" GATEWAY_API_KEY=sk-gw-1\n'  # line 4: the key is the second statement
        "# LOBES_MESH_KEY=old-mesh\n"  # line 5
        'NOTE="\n# HF_TOKEN=inside-a-value\n"\n',  # lines 6-8: not a comment
    )
    states, active = collector.audit_envfile_keys(
        run, ["GATEWAY_API_KEY", "LOBES_MESH_KEY", "HF_TOKEN"]
    )
    assert states["GATEWAY_API_KEY"]["state"] == "set" and states["GATEWAY_API_KEY"]["line"] == 4
    assert states["LOBES_MESH_KEY"] == {
        "state": "commented-out", "line": 5, "digest": run.digest("old-mesh")
    }  # fmt: skip
    assert states["HF_TOKEN"] == {"state": "absent"}
    assert active == {"GATEWAY_API_KEY": "sk-gw-1"}


# -- a converge under way ------------------------------------------------------------------------
@pytest.fixture
def held_lock(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A deployment whose converge lock is held as a converge holds it: an exclusive flock and
    its record. Yields the deployment and the lock's fd."""
    deploy = tmp_path / "lobes"
    (deploy / ".fleet").mkdir(parents=True, mode=0o700)
    fd = os.open(deploy / ".fleet" / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    record = {"holder": "ops@ctl", "pid": 4242, "host": "ctl", "since": "2025-01-02T03:04:05Z"}
    os.write(fd, json.dumps(record).encode())
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield deploy, fd
    finally:
        os.close(fd)


def test_a_held_converge_lock_is_seen_and_a_released_one_is_not(
    held_lock: tuple[Path, int],
) -> None:
    deploy, fd = held_lock
    run = collector.Run(payload(deploy))
    assert collector.converge_holder(run) == {
        "pid": 4242, "holder": "ops@ctl", "since": "2025-01-02T03:04:05Z"
    }  # fmt: skip
    fcntl.flock(fd, fcntl.LOCK_UN)  # a killed converge: its record stays, its lock does not
    assert collector.converge_holder(run) is None
    fcntl.flock(fd, fcntl.LOCK_SH)  # a listing's moment of a shared lock is no converge
    assert collector.converge_holder(run) is None


def run_collector(home: Path, deploy: Path) -> dict[str, Any]:
    sent = json.dumps({"payload": payload(deploy, timeout_s=2, probe_timeout_s=1, gateway_port=9)})
    env = {"HOME": str(home), "PATH": "/nonexistent", "USER": "lobes"}  # no docker: fast
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(PROGRAM), "-"], input=sent, capture_output=True,
        text=True, env=env, cwd=home, timeout=60, check=True,
    )  # fmt: skip
    return dict(json.loads(proc.stdout))


def test_a_drift_during_a_converge_is_an_error_of_the_box(held_lock: tuple[Path, int]) -> None:
    deploy, fd = held_lock
    write(deploy / "docker-compose.yml", "services: {}\n")
    write(deploy / ".env", "A=1\n")
    raw = run_collector(deploy.parent, deploy)
    assert raw["converge"] == {"pid": 4242, "holder": "ops@ctl", "since": "2025-01-02T03:04:05Z"}
    doc = parse_answer(json.dumps(raw))
    assert isinstance(doc, Observed) and doc.converge is not None
    [error] = [e for e in observation_errors(NO_LANES, doc) if e.where == "converge"]
    assert error.part is Part.DEPLOYMENT  # every column not observed, and a plan refused
    assert "a converge of this box was running while it was observed" in error
    assert "pid 4242, by ops@ctl, since 2025-01-02T03:04:05Z" in error
    fcntl.flock(fd, fcntl.LOCK_UN)
    assert "converge" not in run_collector(deploy.parent, deploy)


class _NoLanes:
    """All observation_errors reads of an expectation: no lane, no managed key."""

    lanes: ClassVar[dict[str, Any]] = {}
    env: ClassVar[tuple[Any, ...]] = ()


NO_LANES: Any = _NoLanes()


def test_both_snapshot_readers_read_the_converge_alike(tmp_path: Path) -> None:
    collected = json.loads(CAPTURE.read_text())["collected"]
    collected["converge"] = {"pid": 4242, "holder": "ops@ctl", "since": None}
    slow = parse_collected(collected, complete=False)
    fast = document_c.read_snapshot_file(json.dumps({"collected": collected}).encode())
    assert isinstance(slow, Observed) and fast is not None
    assert slow.converge is not None and fast.document.converge is not None
    assert asdict(fast.document.converge) == asdict(slow.converge)
    assert tuple(asdict(slow.converge).values()) == (4242, "ops@ctl", None)
    collected.pop("converge")
    assert parse_collected(collected, complete=False).converge is None  # type: ignore[union-attr]


def test_a_malformed_converge_record_is_the_boxes_fault() -> None:
    collected = json.loads(CAPTURE.read_text())["collected"]
    collected["converge"] = {"pid": "4242", "holder": None, "since": None}
    doc = parse_collected(collected, complete=False)
    assert not isinstance(doc, Observed) and "converge.pid" in str(doc)
