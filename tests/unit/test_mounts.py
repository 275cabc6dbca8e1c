"""What a lane mounts against what its render mounts. lobes' bind sources are interpolated
(`${HF_CACHE:-${HOME:-/root}/.cache/huggingface}`), so a lane `docker compose up`-ed from
another environment (a shell's HF_CACHE, sudo's or cron's HOME) reads its models from another
directory, and nothing else in its inspect says so (the brief: "HOME leaks in from the shell").

The collector's inputs are real outputs, captured here: `docker compose config --format json`
of a service with a bind, a relative bind, a read-only bind, a named volume and a tmpfs
(compose v2, project `proj`), and `docker inspect`'s Mounts of the lab's rerank lane brought
up with HF_CACHE from the shell. The comparison runs on the captured lab data
(examples/lab-incidents, edited as plain JSON: the capture predates these fields, so it also
shows that an older snapshot compares as before).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from reconciler.compare.drift import Action, Kind
from reconciler.observe.document import Observed, parse_collected
from reconciler.observe.document_c import read_snapshot_file
from reconciler.observe.remote.collector import container_mounts, deployed_path, render_mounts
from tests.unit.test_compare_rules import captured, compare, find

__all__ = ["captured"]  # a fixture, used by name

SNAPSHOT = Path(__file__).resolve().parents[2] / "examples/lab-incidents/snapshot"
RERANK = "model-gear-vllm-rerank"
DEPLOY = "/home/fl-thor/.lobes"
SHADOW = "/tmp/fleet-collect-4242-ab12cd/project"  # a run's render view (collector.Shadow)

# docker compose config --format json (compose v2), the service's `volumes` and the top level's.
RENDERED = [
    {
        "type": "bind",
        "source": "/home/fl-thor/.cache/huggingface",
        "target": "/root/.cache/huggingface",
        "bind": {"create_host_path": True},
    },
    {
        "type": "bind",
        "source": f"{SHADOW}/logs",
        "target": "/logs/model-gear",
        "bind": {"create_host_path": True},
    },
    {
        "type": "bind",
        "source": f"{SHADOW}/mg-logwrap.sh",
        "target": "/usr/local/bin/mg-logwrap",
        "read_only": True,
        "bind": {"create_host_path": True},
    },
    {"type": "volume", "source": "named", "target": "/data", "volume": {}},
    {"type": "tmpfs", "target": "/tmp/t"},
]
TOP_LEVEL = {"named": {"name": "proj_named"}}

# docker inspect's Mounts of the lab's rerank lane, up with HF_CACHE from the shell.
INSPECTED = [
    {
        "Type": "bind",
        "Source": "/tmp/fleet-lab-mount-probe",
        "Destination": "/root/.cache/huggingface",
        "Mode": "rw",
        "RW": True,
        "Propagation": "rprivate",
    },
    {
        "Type": "bind",
        "Source": "/home/fl-thor/.lobes/logs",
        "Destination": "/logs/model-gear",
        "Mode": "rw",
        "RW": True,
        "Propagation": "rprivate",
    },
    {
        "Type": "bind",
        "Source": "/home/fl-thor/.lobes/mg-logwrap.sh",
        "Destination": "/usr/local/bin/mg-logwrap",
        "Mode": "ro",
        "RW": False,
        "Propagation": "rprivate",
    },
]


def _run() -> Any:
    return SimpleNamespace(deploy=DEPLOY)


def test_the_render_is_recorded_as_the_deployment_mounts_it() -> None:
    """A relative bind names the render's view of whichever run rendered it (the render is
    cached): recorded as the deployment's path, where `compose up` mounts it from."""
    assert render_mounts(_run(), RENDERED, TOP_LEVEL) == [
        {"type": "volume", "source": "proj_named", "target": "/data", "read_only": False},
        {
            "type": "bind",
            "source": f"{DEPLOY}/logs",
            "target": "/logs/model-gear",
            "read_only": False,
        },
        {
            "type": "bind",
            "source": "/home/fl-thor/.cache/huggingface",
            "target": "/root/.cache/huggingface",
            "read_only": False,
        },
        {"type": "tmpfs", "source": None, "target": "/tmp/t", "read_only": False},
        {
            "type": "bind",
            "source": f"{DEPLOY}/mg-logwrap.sh",
            "target": "/usr/local/bin/mg-logwrap",
            "read_only": True,
        },
    ]
    assert render_mounts(_run(), None, None) == []  # a service without volumes mounts nothing
    assert render_mounts(_run(), "hf:/x", None) is None  # not compose's form: not compared


@pytest.mark.parametrize(
    ("path", "deployed"),
    [
        (f"{SHADOW}/logs", f"{DEPLOY}/logs"),
        ("/var/tmp/fleet-collect-1-x/current/a/b", f"{DEPLOY}/a/b"),
        ("/srv/models/project/logs", "/srv/models/project/logs"),  # no view: as written
        ("/tmp/fleet-collect-1-x/other/logs", "/tmp/fleet-collect-1-x/other/logs"),
    ],
)
def test_only_a_render_views_path_is_the_deployments(path: str, deployed: str) -> None:
    assert deployed_path(_run(), path) == deployed


def test_the_engines_mounts_are_recorded_alike() -> None:
    recorded = container_mounts(INSPECTED)
    assert recorded is not None
    assert [(m["target"], m["source"], m["read_only"]) for m in recorded] == [
        ("/logs/model-gear", f"{DEPLOY}/logs", False),
        ("/root/.cache/huggingface", "/tmp/fleet-lab-mount-probe", False),
        ("/usr/local/bin/mg-logwrap", f"{DEPLOY}/mg-logwrap.sh", True),
    ]
    volume = {"Type": "volume", "Name": "proj_named", "Source": "/var/lib/docker/volumes/x"}
    assert container_mounts([{**volume, "Destination": "/data", "RW": True}]) == [
        {"type": "volume", "source": "proj_named", "target": "/data", "read_only": False}
    ]
    assert container_mounts(None) is None


def _mounts(render: list[dict[str, Any]] | None, container: list[dict[str, Any]] | None) -> Any:
    def edit(raw: dict[str, Any]) -> None:
        if render is not None:
            raw["render"]["services"]["vllm-rerank"]["volumes"] = render
        if container is not None:
            rerank = next(c for c in raw["docker"]["containers"] if c["name"] == RERANK)
            rerank["mounts"] = container

    return edit


DESIRED = render_mounts(_run(), RENDERED[:3], None)
AS_UP_FROM_A_SHELL = container_mounts(INSPECTED)


def test_a_lane_mounting_another_models_directory_is_recreated(captured: Any) -> None:
    result = compare(captured, "thor", _mounts(DESIRED, AS_UP_FROM_A_SHELL))
    d = find(result, Kind.STATE, "lane:vllm-rerank", "mounts[/root/.cache/huggingface]")
    assert (d.desired, d.observed, d.action, d.source) == (
        "bind /home/fl-thor/.cache/huggingface",
        "bind /tmp/fleet-lab-mount-probe",
        Action.RECREATE,
        RERANK,
    )
    assert [x.path for x in result.drifts if x.path.startswith("mounts[")] == [d.path]


def test_a_mount_missing_added_or_made_writable_is_named_by_its_target(captured: Any) -> None:
    assert DESIRED is not None
    running = [*DESIRED[:2], {**DESIRED[2], "read_only": False}]  # the script made writable
    running += [{"type": "bind", "source": "/srv/x", "target": "/x", "read_only": False}]
    result = compare(captured, "thor", _mounts([*DESIRED, RENDERED_TMPFS], running))
    found = {x.path: x for x in result.drifts if x.path.startswith("mounts[")}
    assert sorted(found) == ["mounts[/tmp/t]", "mounts[/usr/local/bin/mg-logwrap]", "mounts[/x]"]
    assert found["mounts[/tmp/t]"].note == "missing from the running container"
    assert found["mounts[/x]"].note == "not in the render: mounted in the running container"
    writable = found["mounts[/usr/local/bin/mg-logwrap]"]
    assert (writable.desired, writable.observed) == (
        f"bind {DEPLOY}/mg-logwrap.sh (read-only)",
        f"bind {DEPLOY}/mg-logwrap.sh",
    )


RENDERED_TMPFS = {"type": "tmpfs", "source": None, "target": "/tmp/t", "read_only": False}
ANONYMOUS = "0" * 63 + "f"  # a name docker chose itself


@pytest.mark.parametrize(
    ("render", "container"),
    [
        ("desired", "desired"),  # as deployed
        ("desired", None),  # a container of an older collector: not recorded
        (None, "shell"),  # a render of an older collector: not recorded
        # An image's VOLUME (or an anonymous one): docker names it; the render does not.
        ("desired", "desired+anonymous"),
        # A volume the render leaves anonymous: any name docker gave it.
        ("anonymous", "anonymous"),
    ],
)
def test_no_entry_where_the_mounts_agree_or_one_side_is_not_known(
    captured: Any, render: str | None, container: str | None
) -> None:
    assert DESIRED is not None and AS_UP_FROM_A_SHELL is not None
    unnamed = {"type": "volume", "source": None, "target": "/data", "read_only": False}
    sides: dict[str | None, Any] = {
        None: None,
        "desired": DESIRED,
        "shell": AS_UP_FROM_A_SHELL,
        "desired+anonymous": [*DESIRED, {**unnamed, "source": ANONYMOUS, "target": "/v"}],
        "anonymous": [unnamed],
    }
    if container == "anonymous":
        sides["anonymous-running"] = [{**unnamed, "source": ANONYMOUS}]
        container = "anonymous-running"
    result = compare(captured, "thor", _mounts(sides[render], sides[container]))
    assert not [d for d in result.drifts if d.path.startswith("mounts[")]


def test_both_readers_read_the_two_fields_alike() -> None:
    """document.py (a live answer) and document_c.py (a large replay's snapshot file)."""
    raw = json.loads((SNAPSHOT / "thor.json").read_bytes())
    _mounts(DESIRED, AS_UP_FROM_A_SHELL)(raw["collected"])
    typed = read_snapshot_file(json.dumps(raw).encode())
    plain = parse_collected(raw["collected"], complete=False)
    assert typed is not None and isinstance(plain, Observed)
    read = []
    for doc in (typed.document, plain):
        assert doc.render.services is not None and doc.docker.containers is not None
        volumes = doc.render.services["vllm-rerank"].volumes
        rerank = next(c for c in doc.docker.containers if c.name == RERANK)
        assert volumes is not None and rerank.mounts is not None
        read.append([(m.type, m.source, m.target, m.read_only) for m in (*volumes, *rerank.mounts)])
        others = [c.mounts for c in doc.docker.containers if c.name != RERANK]
        assert others == [None] * len(others)  # not recorded in the capture
    assert read[0] == read[1] and len(read[0]) == 6


def test_a_mount_of_the_wrong_shape_is_a_fault_of_the_answer() -> None:
    raw = json.loads((SNAPSHOT / "thor.json").read_bytes())
    _mounts(None, [{"type": "bind", "source": "/x", "read_only": False}])(raw["collected"])
    parsed = parse_collected(raw["collected"], complete=False)
    assert not isinstance(parsed, Observed)
    assert "mounts[0].target" in str(parsed)


@pytest.mark.parametrize(
    ("mount", "read"),
    [
        ({"type": "bind", "source": "/x", "target": "/y", "read_only": None}, "both"),
        ({"type": "bind", "target": "/y"}, "both"),  # no source, no read_only
        ({"type": "bind", "source": "/x", "target": "/y", "extra": 1}, "document.py"),
        ({"type": "bi\u0007nd", "source": "/x", "target": "/y"}, "fault"),
        ({"type": "bind", "source": "/x", "target": "/y", "read_only": "yes"}, "fault"),
    ],
    ids=["null read_only", "bare", "an unknown key", "a control character", "not a boolean"],
)
def test_the_c_reader_gives_document_pys_answer_or_leaves_the_file_to_it(
    mount: dict[str, Any], read: str
) -> None:
    """document_c reads a mount as document.py does, or refuses the file (None: the caller
    reads it with document.py, whose fault names the place)."""
    raw = json.loads((SNAPSHOT / "thor.json").read_bytes())
    _mounts([mount], [mount])(raw["collected"])
    typed = read_snapshot_file(json.dumps(raw).encode())
    plain = parse_collected(raw["collected"], complete=False)
    if read == "fault":
        assert typed is None and not isinstance(plain, Observed)
        return
    assert isinstance(plain, Observed)
    assert plain.render.services is not None and plain.docker.containers is not None
    want = plain.render.services["vllm-rerank"].volumes
    assert want is not None and want[0].read_only is False  # null or absent: writable
    if read == "document.py":
        assert typed is None  # msgspec forbids the key; document.py reads past it
        return
    assert typed is not None and typed.document.render.services is not None
    got = typed.document.render.services["vllm-rerank"].volumes
    assert got is not None
    assert [(m.type, m.source, m.target, m.read_only) for m in got] == [
        (m.type, m.source, m.target, m.read_only) for m in want
    ]
