"""Review 9 of the deploys (/tmp/rev-deploys):

1. A compose service named as compose allows (`_metrics`, `.x`: `docker compose config
   --services` lists both, compose-spec's rule is `^[a-zA-Z0-9._-]+$`) with one container in
   the project, even a `docker compose run` one-off, made the box refuse every converge
   (`fingerprint.containers: '_metrics' is not a valid name here`) while `apply --dry` promised
   a plan. The box takes compose's rule now, less a leading `-` (an option to compose) and
   bounded; a name it still refuses blocks the plan, naming the service (`--dry` exits 1).
2. An `ssh_key` / `ssh_known_hosts_file` that is a directory: the connection's own read of it
   raised IsADirectoryError (a pyinfra traceback for every box; drift said only EISDIR). The
   loader refuses it at its line, and the read no longer raises.
3. `pyinfra inventory.py deploys/orin.py` with an inventory holding no orin connected to every
   other box, converged nothing and exited 0; it is refused before any connection.

The boxes are examples/lab-incidents replayed from its captured snapshot, edited as the
reviewer did; pyinfra runs as the real CLI with its connect faked (test_review7_deploy).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import engine
from reconciler.apply.payload import BadPayload, box_rules, check, converge_payload
from reconciler.desired.load import load_fleet
from reconciler.desired.problems import DesiredStateError
from reconciler.desired.pyinfra_data import deploy_boxes
from reconciler.drift import DriftRun, run_drift_on
from reconciler.drift_inputs import drift_inputs, expectations
from reconciler.observe.transport import Target, connection_name, file_identity
from reconciler.plan import Plan, StepKind, plan_box
from tests.unit.example_replay import replay_edited
from tests.unit.test_review7_deploy import FAKE_PYINFRA, _env, _repo

# -- 1. service names as compose has them ------------------------------------------------------
# Names `docker compose config --services` (v2.40.3) listed as written, and names it refused
# ("services additional properties 'a b' not allowed"); compose took `-x` too, and `docker
# compose up -d -x` then read it as an option ("unknown shorthand flag: 'x' in -x").
COMPOSE_ACCEPTS = ["_metrics", ".x", "_", "..", "a.b", "1", "Ab", "vllm-embed"]
COMPOSE_REFUSES = ["a b", "a:b", "a/b", "é"]


@pytest.mark.parametrize("name", COMPOSE_ACCEPTS)
def test_the_box_takes_every_service_name_compose_takes(name: str) -> None:
    assert box_rules().SERVICE.match(name)


@pytest.mark.parametrize("name", [*COMPOSE_REFUSES, "-x", "--help", "a" * 129])
def test_the_box_still_refuses_an_option_an_overlong_name_and_what_compose_refuses(
    name: str,
) -> None:
    assert not box_rules().SERVICE.match(name)


def _with_container(service: str, name: str, oneoff: bool) -> Any:
    """thor's snapshot plus one container of `service` (a copy of a lane's, renamed)."""

    def edit(collected: dict[str, Any]) -> None:
        extra = json.loads(json.dumps(collected["docker"]["containers"][1]))
        extra.update(service=service, name=name, id="abcdef123456", oneoff=oneoff)
        collected["docker"]["containers"].append(extra)

    return edit


def _plan_and_payload(tmp: Path, service: str, name: str, oneoff: bool) -> tuple[Plan, dict]:
    fleet, run = replay_edited(tmp, "thor", _with_container(service, name, oneoff), ["thor"])
    exp = expectations(fleet, ["thor"])["thor"]
    plan = plan_box(run.report.boxes[0], exp)
    observed = run.observations["thor"].document
    return plan, converge_payload(exp, fleet.boxes["thor"], plan, observed, "t", environ={})


@pytest.mark.parametrize(
    ("service", "name", "oneoff"),
    [("_metrics", "lobes-metrics-1", False), (".x", "lobes-x-run-1", True)],
    ids=["stray", "run-one-off"],
)
def test_a_container_of_a_service_compose_allows_leaves_the_box_convergeable(
    tmp_path: Path, service: str, name: str, oneoff: bool
) -> None:
    plan, payload = _plan_and_payload(tmp_path, service, name, oneoff)
    assert not plan.blocked, plan.blocked
    assert payload["fingerprint"]["containers"][service] == ["abcdef123456"]
    removes = [s.subject for s in plan.steps if s.kind is StepKind.REMOVE]
    assert removes == ([] if oneoff else [service])  # a one-off is the operator's, never removed
    check(payload)  # the box program's own rules: was `'_metrics' is not a valid name here`


@pytest.mark.parametrize(
    ("service", "name", "oneoff"),
    [("-metrics", "lobes-metrics-1", False), ("m" * 129, "lobes-long-run-1", True)],
    ids=["leading-dash", "overlong-one-off"],
)
def test_a_service_name_the_box_refuses_blocks_the_plan_naming_it(
    tmp_path: Path, service: str, name: str, oneoff: bool
) -> None:
    plan, payload = _plan_and_payload(tmp_path, service, name, oneoff)
    with pytest.raises(BadPayload, match=r"fingerprint\.containers: "):
        check(payload)  # what the box would answer to the plan
    (reason,) = plan.blocked
    assert reason.startswith(f"service {service[:60]!r}")
    assert "the box's converge refuses" in reason and f"docker rm -f {name}" in reason
    assert not plan.steps


def test_dry_apply_says_cannot_converge_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from reconciler import drift
    from reconciler.cli import main

    replay_edited(tmp_path, "thor", _with_container("-metrics", "lobes-metrics-1", False))
    root = tmp_path / "fleet"

    def observed(fleet: Any, boxes: list[str], *_a: object, **_k: object) -> DriftRun:
        return run_drift_on(drift_inputs(fleet), boxes, from_snapshot=root / "snapshot")

    monkeypatch.setattr(drift, "run_drift", observed)
    monkeypatch.setattr(engine, "run_drift", observed)
    assert main(["--root", str(root), "-i", "lab", "apply", "thor", "--dry"]) == 1  # was 2
    out = capsys.readouterr().out
    assert "thor: plan: cannot converge: service '-metrics': " in out
    assert "cannot converge thor" in out


# -- 2. a key or known_hosts that is not a file ---------------------------------------------------
def _lab_inventory(tmp_path: Path) -> tuple[Path, Path]:
    repo = tmp_path / "fleet"
    shutil.copytree(Path(__file__).resolve().parents[2] / "examples" / "lab-incidents", repo)
    (repo / ".lab" / "ssh").mkdir(parents=True)
    return repo, repo / "inventory" / "lab.yaml"


def _line_of(path: Path, text: str, nth: int = 1) -> int:
    lines = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    return lines[nth - 1]


@pytest.mark.parametrize(
    ("key", "make", "kind"),
    [
        ("ssh_known_hosts_file", lambda p: p.mkdir(), "is a directory"),
        ("ssh_key", lambda p: p.mkdir(), "is a directory"),
        ("ssh_key", lambda p: os.mkfifo(p), "is a named pipe (FIFO)"),
    ],
    ids=["known_hosts-directory", "key-directory", "key-fifo"],
)
def test_a_key_or_known_hosts_that_is_not_a_file_is_refused_at_its_line(
    tmp_path: Path, key: str, make: Any, kind: str
) -> None:
    repo, inventory = _lab_inventory(tmp_path)
    text = inventory.read_text()
    make(repo / ".lab" / "ssh" / "odd")
    # spark's (the second box's) names it: the line and the box are the ones it is said at.
    at = _line_of(inventory, f"{key}:", 2)
    lines = text.splitlines(keepends=True)
    lines[at - 1] = f"    {key}: .lab/ssh/odd\n"
    inventory.write_text("".join(lines))
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(repo, "lab")
    (problem,) = caught.value.problems
    where = repo / ".lab" / "ssh" / "odd"
    assert str(problem) == (
        f"inventory/lab.yaml:{at}:5: boxes.spark.{key}: .lab/ssh/odd ({where}) {kind}: "
        "ssh needs a file here"
    )


def test_a_missing_key_and_a_link_to_a_file_still_load(tmp_path: Path) -> None:
    repo, _ = _lab_inventory(tmp_path)
    (repo / ".lab" / "ssh" / "real").write_text("")
    (repo / ".lab" / "ssh" / "known_hosts").symlink_to("real")  # ssh reads the file
    fleet = load_fleet(repo, "lab")  # .lab/ssh/id_ed25519 missing: ssh says so when it runs
    assert fleet.connection("thor").ssh_known_hosts_file == ".lab/ssh/known_hosts"


def test_the_connection_reads_a_directory_without_raising(tmp_path: Path) -> None:
    """What the loader no longer lets through, or a state that bypassed it (pyinfra's host
    data, a file replaced since): a master's name, never IsADirectoryError."""
    folder = tmp_path / "ssh"
    folder.mkdir()
    assert file_identity(str(folder)) == "not a regular file: 40000"  # was IsADirectoryError
    target = Target("thor", "10.77.0.11", "fl-thor", 22, str(folder), str(folder))
    assert len(connection_name(target)) == 40  # the master's name, as for any other file


# -- pyinfra's CLI, connect faked (nothing reaches a box) ---------------------------------------
def _pyinfra(base: Path, repo: Path, *args: str) -> tuple[int, str, list[str]]:
    fake = base / "fake_pyinfra.py"
    fake.write_text(FAKE_PYINFRA)
    done = subprocess.run(
        [sys.executable, str(fake), *args], cwd=repo,
        env=_env(base, FAKE_UNREACHABLE="", FAKE_SNAPSHOT=str(repo / "snapshot")),
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    said = done.stdout + done.stderr
    connected = [
        line[len("[connect ") : -1] for line in said.splitlines() if line.startswith("[connect ")
    ]
    return done.returncode, said, sorted(connected)


def test_a_mesh_deploy_with_a_directory_for_known_hosts_stops_before_any_box(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path)
    (repo / ".lab" / "ssh").mkdir(parents=True)
    inventory = repo / "inventory" / "lab.yaml"
    at = _line_of(inventory, "ssh_known_hosts_file:")
    inventory.write_text(inventory.read_text().replace("/known_hosts", "", 1))
    code, said, connected = _pyinfra(
        tmp_path, repo, "-y", "inventory.py", "deploys/mesh.py", "--dry"
    )
    assert code == 1, said
    assert f"inventory/lab.yaml:{at}:5: boxes.thor.ssh_known_hosts_file: .lab/ssh (" in said
    assert connected == [] and "Traceback" not in said


# -- 3. a box deploy of a box the inventory does not hold ---------------------------------------
def test_a_box_deploy_of_a_box_no_inventory_holds_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "deploys").mkdir()
    for name in ("thor", "orin", "mesh", "other"):
        (tmp_path / "deploys" / f"{name}.py").write_text("")
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "hosts.yaml").write_text("boxes:\n  thor: {}\n  orin: {}\n")
    (tmp_path / "inventory" / "broken.yaml").write_text("boxes: [\n")  # names no box
    monkeypatch.chdir(tmp_path)
    boxes = ["orin", "spark"]  # the chosen inventory's: no thor
    with pytest.raises(ValueError, match=r"^deploys/thor\.py: no box 'thor' in the inventory$"):
        deploy_boxes(["deploys/thor.py"], tmp_path, boxes)  # was None: every box
    for operations in (["deploys/thor.py"], ["deploys/orin.py", "deploys/thor.py"],
                       ["deploys/mesh.py", "deploys/thor.py"]):  # fmt: skip
        with pytest.raises(ValueError) as caught:  # pyinfra_data.NoSuchBox
            deploy_boxes(operations, tmp_path, boxes, "inventory/lab.yaml")
        assert str(caught.value) == "deploys/thor.py: no box 'thor' in inventory/lab.yaml"
    assert deploy_boxes(["deploys/orin.py"], tmp_path, boxes) == ["orin"]
    for operations in (["deploys/mesh.py"], ["deploys/other.py"], ["debug-inventory"]):
        assert deploy_boxes(operations, tmp_path, boxes) is None, operations


def test_pyinfra_with_a_box_deploy_of_a_box_the_inventory_lacks_connects_nothing(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path)
    inventory = repo / "inventory" / "lab.yaml"
    text = inventory.read_text()
    inventory.write_text(text[: text.index("  orin:\n")])  # orin, the last box, left out
    (repo / "group_vars" / "orin.yaml").unlink()  # a layer of no box is refused
    for box in ("thor", "spark"):  # and a role proxied to a box the inventory lacks
        layer = repo / "group_vars" / f"{box}.yaml"
        layer.write_text(layer.read_text().replace("  senses: {proxied_to: orin}\n", ""))
    code, said, connected = _pyinfra(
        tmp_path, repo, "-y", "inventory.py", "deploys/orin.py", "--dry"
    )
    assert code == 1, said  # was 0, having connected to thor and spark
    assert "error: deploys/orin.py: no box 'orin' in inventory/lab.yaml; nothing changed" in said
    assert connected == [] and "Traceback" not in said
