"""Converge in the lab, against the real engines: `pyinfra inventory.py deploys/<box>.py` and
`reconcile apply` take a drifted box (pristine lab render, or a field incident reproduced by
hand) to zero drift; a lane that never comes healthy is rolled back exactly; a second converge
is a no-op; a concurrent one is refused; a login shell cannot leak into it; a converge killed
mid-way is said by the next, which refuses until --accept-interrupted completes it; no secret
value appears in any output.

Every test touches one box and resets it (`pristine`). The box's secrets are the lab's
`~/.lobes/.secrets.env`, where the desired state's box_file secrets point.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import lab as labpkg
import lab.lifecycle
from lab import config, ssh
from reconciler.apply.engine import UNFIXABLE
from reconciler.compare.drift import BoxResult, Kind
from reconciler.desired.envfile import box_env
from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from reconciler.plan import actionable

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv" / "bin"
EVIDENCE = Path(tempfile.mkdtemp(prefix="fleet-evidence-"))  # kept out of the repository


@pytest.fixture(scope="module", autouse=True)
def _drop_evidence() -> Iterator[None]:
    yield
    shutil.rmtree(EVIDENCE, ignore_errors=True)


# -- helpers ---------------------------------------------------------------------------------------
def sh(box: str, command: str, *, input: str | None = None, check: bool = True) -> str:
    return ssh.run(config.box(box), command, input=input, check=check).stdout


def box_secrets(box: str) -> dict[str, str]:
    """The box's own secrets (`lab up` writes ~/.lobes/.secrets.env as an operator would)."""
    text = sh(box, "cat ~/.lobes/.secrets.env")
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and line[:1] != "#")
    return {k: v for k, v in pairs if v}


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 900) -> Any:
    full = {**os.environ, "FLEET_INVENTORY": "lab", **(env or {})}
    return subprocess.run(
        argv, cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout, check=False
    )


def pyinfra(box: str, *flags: str) -> Any:
    return run([str(VENV / "pyinfra"), *flags, "inventory.py", f"deploys/{box}.py"])


def reconcile(*args: str, root: Path | None = None, env: dict[str, str] | None = None) -> Any:
    extra = ["--root", str(root)] if root else []
    return run([str(VENV / "reconcile"), *extra, "-i", "lab", *args], env=env)


def drift(box: str, root: Path = ROOT) -> BoxResult:
    return run_drift(load_fleet(root, "lab"), [box]).report.boxes[0]


def left(box: str) -> list[str]:
    # Errors counted as apply's own verification counts them (engine.settle): a login-shell
    # trace or variable list that failed is no drift a converge could have left behind.
    result = drift(box)
    errors = [e for e in result.errors if e.part not in UNFIXABLE]
    return [f"{d.subject} {d.path}" for d in actionable(result.drifts)] + errors


def env_bytes(box: str) -> bytes:
    return (config.box(box).home / ".lobes" / ".env").read_bytes()


def config_hashes(box: str) -> dict[str, str]:
    fmt = '{{index .Config.Labels "com.docker.compose.service"}} '
    fmt += '{{index .Config.Labels "com.docker.compose.config-hash"}} {{.Id}}'
    out = sh(box, f"docker ps -aq | xargs -r docker inspect --format '{fmt}'")
    return {line.split()[0]: line.split()[1] for line in out.splitlines() if line.strip()}


def container_ids(box: str) -> dict[str, str]:
    out = sh(box, "docker ps -aq --no-trunc | xargs -r docker inspect --format "
                  "'{{index .Config.Labels \"com.docker.compose.service\"}} {{.Id}}'")  # fmt: skip
    return dict(line.split() for line in out.splitlines() if line.strip())


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def assert_no_secrets(text: str, values: list[str]) -> None:
    for value in values:
        assert value not in text, "a secret value appeared in the output"


def lab_secret_values(box_secrets: dict[str, str]) -> list[str]:
    lab_secrets = json.loads((ROOT / ".lab" / "secrets.json").read_text())
    return [*box_secrets.values(), *lab_secrets.values()]


@pytest.fixture
def box_ready(pristine: Callable[[str], None]) -> Iterator[Callable[[str], dict[str, str]]]:
    """Register `box` for a reset at the end, keep other lab resets away until the test ends
    (released before the reset); returns the box's secret values (for no-leak checks)."""
    held = contextlib.ExitStack()

    def ready(box: str) -> dict[str, str]:
        pristine(box)
        # lab.lifecycle's lock: no `lab up`/reset (of any session) while a converge runs and
        # is checked; released before our own reset (which takes the same lock).
        held.enter_context(labpkg.lifecycle.locked())
        return box_secrets(box)

    with held:
        yield ready


def apply(box: str, *more: str, root: Path | None = None, env: dict[str, str] | None = None) -> Any:
    """`reconcile apply BOX --yes`, evidence kept out of the repository."""
    return reconcile("apply", box, "--yes", "--evidence", str(EVIDENCE), *more, root=root, env=env)


def converge(box: str) -> Any:
    done = apply(box)
    assert done.returncode == 0, done.stdout + done.stderr
    assert left(box) == []
    return done


# -- desired state variants ------------------------------------------------------------------------
@pytest.fixture
def failing_hand_root(tmp_path: Path) -> Path:
    """The lab's desired state, plus: thor's hand lane never comes healthy (the stand-in's
    STANDIN_FAIL knob for that lane) and may take only 20 s to try."""
    root = tmp_path / "fleet"
    root.mkdir()
    shutil.copytree(ROOT / "group_vars", root / "group_vars")
    (root / "inventory").mkdir()
    # The lab's own ssh key and known_hosts named where they are; its digests copied in, since
    # an overlay must lie inside the repository (a symlink or a path out of it is refused).
    inv = (ROOT / "inventory" / "lab.yaml").read_text().replace(" .lab/", f" {ROOT}/.lab/")
    inv = inv.replace(f"image_overlay: {ROOT}/.lab/", "image_overlay: .lab/")
    (root / ".lab").mkdir()
    shutil.copy(ROOT / ".lab" / "images.yaml", root / ".lab" / "images.yaml")
    inv = [line for line in inv.splitlines() if not line.startswith("box_overlay:")]
    inv.append("box_overlay: overlay/{box}.yaml")
    (root / "inventory" / "lab.yaml").write_text("\n".join(inv) + "\n")
    (root / "overlay").mkdir()
    extra = {
        "thor": "lanes:\n  hand:\n    boot_timeout_s: 20\n"
        "    env:\n      STANDIN_FAIL_HAND: never-healthy\n"
    }
    for name in ("thor", "spark", "orin"):
        lab_layer = ROOT / ".lab" / "overlay" / f"{name}.yaml"  # the lab's own last layer
        text = lab_layer.read_text() if lab_layer.is_file() else "env: {}\n"
        (root / "overlay" / f"{name}.yaml").write_text(text + extra.get(name, ""))
    return root


# -- tests -----------------------------------------------------------------------------------------
def test_pyinfra_converges_a_drifted_box_and_a_second_run_changes_nothing(lab, box_ready):
    values = box_ready("thor")
    before_env, before_ids = env_bytes("thor"), container_ids("thor")
    assert left("thor"), "the pristine lab box should differ from the desired state"

    dry = pyinfra("thor", "--dry")
    assert dry.returncode == 0, dry.stderr
    assert "plan: 1. write .env" in dry.stderr + dry.stdout
    assert env_bytes("thor") == before_env and container_ids("thor") == before_ids

    first = pyinfra("thor", "-y", "-vv")
    output = first.stdout + first.stderr
    assert first.returncode == 0, output
    assert "converged, verified" in output
    assert left("thor") == []
    assert_no_secrets(output, lab_secret_values(values))

    # Only managed keys changed: every line of the pristine .env is still there, in order.
    managed = {e.key for e in box_env(load_fleet(ROOT, "lab"), "thor")}
    after = env_bytes("thor").decode().splitlines()
    kept = [line for line in before_env.decode().splitlines() if line in after]
    changed = [line for line in before_env.decode().splitlines() if line not in after]
    added = [line for line in after if line not in before_env.decode().splitlines()]
    assert added, "the converge wrote no managed key"
    assert all(line.split("=", 1)[0] in managed for line in changed + added)
    assert kept == [line for line in after if line in kept]
    assert sh("thor", "stat -c %a ~/.lobes/.env").strip() == "600"

    settled_env, settled_ids = env_bytes("thor"), container_ids("thor")
    second = pyinfra("thor", "-y")
    assert second.returncode == 0, second.stderr
    assert re.search(r"\[thor\]\s+plan: no changes", second.stdout + second.stderr)
    assert env_bytes("thor") == settled_env and container_ids("thor") == settled_ids


# Each case is one converge: spark's incident alone, and thor's four field incidents together
# (each touches another part of the box: the login shell, a compose file, a lane's image, the
# gateway's port). Together they cost one reset and one converge instead of four (~3 min of the
# suite), and each must still leave drift of its own before the one `apply` takes all of it.
Incident = Callable[[], dict[str, Any]]
INCIDENTS: list[tuple[str, str, list[tuple[str, Incident]]]] = [
    (
        "window_change_lane_only",
        "spark",
        [
            (
                "window_change_lane_only",
                lambda: labpkg.incidents.window_change_lane_only(
                    "spark", "PRIMARY_MAX_MODEL_LEN", 131072
                ),
            )
        ],
    ),
    (
        "four_thor_incidents",
        "thor",
        [
            ("shell_exported_key", lambda: labpkg.incidents.shell_exported_key("thor")),
            (
                "hardcoded_flag",
                lambda: labpkg.incidents.hardcoded_flag(
                    "thor", "vllm-worker", "--max-model-len=65536"
                ),
            ),
            (
                "other_image_digest",
                lambda: labpkg.incidents.other_image_digest("thor", "vllm-hand"),
            ),
            (
                "gateway_published_on",
                lambda: labpkg.incidents.gateway_published_on("thor", "127.0.0.1"),
            ),
        ],
    ),
]


@pytest.mark.parametrize(("name", "box", "incidents"), INCIDENTS, ids=[i[0] for i in INCIDENTS])
def test_reconcile_apply_converges_field_incidents_to_zero_drift(
    lab, box_ready, tmp_path, name, box, incidents
):
    values = box_ready(box)
    converge(box)  # from the pristine render first: the incidents start from a converged box
    shell_values: list[str] = []
    for incident_name, incident in incidents:
        before = set(left(box))
        did = incident()
        assert set(left(box)) - before, f"{incident_name} left no drift of its own to converge"
        shell_values += [str(did["value"])] if did.get("value") else []
    evidence = tmp_path / "evidence"
    env = {"GATEWAY_API_KEY": "controller-shell-leak"}  # the controller's env must not leak
    done = reconcile("apply", box, "--yes", "--evidence", str(evidence), env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert left(box) == []
    records = list(evidence.glob(f"*-{box}.json"))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert record["outcome"] == "converged"
    after = [d for b in record["drift_after"]["boxes"] for d in b["drifts"]]
    assert all(d["action"].startswith("report-only") for d in after)
    assert_no_secrets(output + records[0].read_text(), [*lab_secret_values(values), *shell_values])


def test_a_login_shell_cannot_leak_into_a_converge(lab, box_ready):
    box_ready("thor")
    sh("thor", "printf '%s\\n' 'export GATEWAY_API_KEY=shell-leak' "
               "'export WORKER_MAX_MODEL_LEN=1024' >> ~/.bashrc; "
               "printf '%s\\n' 'export HAND_IMAGE=busybox:latest' >> ~/.profile")  # fmt: skip
    done = apply("thor", env={"WORKER_MAX_MODEL_LEN": "2048"})
    assert done.returncode == 0, done.stdout + done.stderr
    result = drift("thor")
    assert actionable(result.drifts) == ()
    leaks = {d.path for d in result.drifts if d.kind is Kind.SHELL_LEAK}
    assert {"GATEWAY_API_KEY", "WORKER_MAX_MODEL_LEN", "HAND_IMAGE"} <= leaks  # still reported
    env = sh("thor", "docker inspect model-gear-gateway --format '{{json .Config.Env}}'")
    assert "shell-leak" not in env
    cmd = sh("thor", "docker inspect model-gear-vllm-worker --format '{{json .Config.Cmd}}'")
    assert "--max-model-len=262144" in cmd and "1024" not in cmd and "2048" not in cmd


def test_a_lane_that_never_comes_healthy_is_rolled_back_exactly_and_holds_the_lock(
    lab, box_ready, failing_hand_root
):
    """One failing converge serves two checks, each of which would cost a converge of its own:
    while it waits for a lane that never comes healthy, a second converge of the same box
    (pyinfra's) is refused, naming when the running one started; then the first rolls back to
    exactly the state before it."""
    box_ready("thor")
    converge("thor")
    before_env, before_hashes = env_bytes("thor"), config_hashes("thor")
    started = utc_now()
    first = subprocess.Popen(
        [str(VENV / "reconcile"), "--root", str(failing_hand_root), "-i", "lab", "apply", "thor",
         "--yes", "--evidence", str(failing_hand_root / "evidence")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        holder = _wait_for_lock("thor", started)
        # The lock is taken before the .env is written: planned before that, pyinfra would
        # find nothing to converge (exit 0, no lock asked for). Plan once there is drift.
        _wait_for_env_change("thor", before_env)
        second = pyinfra("thor", "-y")
        refused = second.stdout + second.stderr
        assert second.returncode != 0
        # Refused while planning: the collector sees the converge under way (the box's lock)
        # and says so, naming when it started; the box's own lock would refuse it anyway.
        assert "a converge of this box was running while it was observed" in refused, refused
        assert holder["since"] in refused
    finally:
        output, _ = first.communicate(timeout=600)

    assert first.returncode == 1, output
    assert "vllm-hand not healthy after 20s" in output
    assert "rolled back to snapshot" in output and "containers as before" in output
    assert env_bytes("thor") == before_env
    assert config_hashes("thor") == before_hashes
    assert left("thor") == []
    snaps = reconcile("snapshots", "thor")
    assert "rolled-back" in snaps.stdout


def _wait_for_lock(box: str, since: str, timeout: float = 120) -> dict[str, Any]:
    """The lock's holder once a converge started at or after `since` holds it (a killed
    converge of an earlier test may have left its own record behind)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = sh(box, "cat ~/.lobes/.fleet/lock 2>/dev/null || true").strip()
        if text and json.loads(text).get("since", "") >= since:
            return dict(json.loads(text))
        time.sleep(0.5)
    raise AssertionError(f"no converge took the lock on {box}")


def _wait_for_env_change(box: str, before: bytes, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if env_bytes(box) != before:
            return
        time.sleep(0.1)
    raise AssertionError(f"the converge of {box} never wrote its .env")


def test_a_converge_killed_mid_way_is_said_then_completed_when_accepted(lab, box_ready):
    box_ready("thor")
    before_env = env_bytes("thor")
    started = utc_now()
    # Unbuffered: the plan lines (stdout) reach the pipe before the box program's progress
    # lines (stderr, flushed), so the line matched below is always the plan's.
    proc = subprocess.Popen(
        [str(VENV / "reconcile"), "-i", "lab", "apply", "thor", "--yes", "--evidence",
         str(EVIDENCE)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "plan:" in line and "recreate vllm-rerank" in line:
                break
        else:
            raise AssertionError("no plan line recreates vllm-rerank:\n" + "".join(seen))
        holder = _wait_for_lock("thor", started)
        # The plan names the recreate before the converge starts, and the lock is taken before
        # the .env is written: kill only once the new .env is in place, so the kill lands
        # mid-way.
        _wait_for_env_change("thor", before_env)
        # The box program first (its pid is the lock's record, converge.py Lock.acquire): killed
        # mid-way, as a lost box leaves it. Were its controller killed first, the program would
        # find its output gone and roll back before its next change (converge.py go_on). Then
        # wait (bounded, 60 s) until its process group (it leads its ssh session: sshd setsid,
        # `bash -c` execs python3) is gone: a `docker compose` child left running would go on
        # recreating a lane under the next apply. The controller goes after.
        pid = int(holder["pid"])
        sh("thor", f"pg=$(ps -o pgid= -p {pid} | tr -d ' '); kill -9 {pid} 2>/dev/null; "
                   'n=0; while [ -n "$pg" ] && pgrep -g "$pg" >/dev/null; do '
                   "n=$((n+1)); [ $n -le 300 ] || exit 1; sleep 0.2; done")  # fmt: skip
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert env_bytes("thor") != before_env  # it got past the .env write
        assert not [p for p in os.listdir(config.box("thor").home / ".lobes") if "fleet-tmp" in p]

        # The next apply says so and changes nothing (converge.py interrupted_converges).
        refused = apply("thor")
        said = refused.stdout + refused.stderr
        assert refused.returncode == 1 and "did not finish" in said, "".join(seen) + said
        assert "--accept-interrupted" in said and "reconcile rollback thor --to " in said
        done = apply("thor", "--accept-interrupted")
        assert done.returncode == 0, "".join(seen) + done.stdout + done.stderr
        assert left("thor") == []
        snaps = reconcile("snapshots", "thor").stdout
        assert "interrupted" in snaps and "verified" in snaps
    finally:
        # Whatever failed above: no converge of this test may go on under the next test (or
        # the reset). Stop ours here, then wait until the box program let go of the lock (an
        # flock: converge.py Lock), since it ignores SIGHUP and finishes without its ssh.
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        proc.stdout.close()
        # No lock file: no converge ever took it (flock(1) would create one, and fail without
        # the .fleet directory).
        lock = "~/.lobes/.fleet/lock"
        ssh.run(config.box("thor"), f"[ ! -e {lock} ] || flock -w 900 {lock} true", timeout=960)
