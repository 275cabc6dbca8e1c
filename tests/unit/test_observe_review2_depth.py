"""Review 2, item 2: one box's deeply nested JSON never aborts a run or its snapshot.

What a box sends and this reconciler does not read (an unknown key, a gateway's body) is kept
as received, and a snapshot writes it again with json.dumps, whose indenting encoder fails from
~500 levels (json.loads takes ~990): thor's `controller.health.body` nested 600 deep made
`drift --from-snapshot X --save-snapshot Y` end with a traceback and no report for any box.
Now a box's answer, a gateway's body and a snapshot file nested past their bound are that
box's (that probe's) fault, read the same by json and by the msgspec fast path, and a box
whose observation cannot be written is saved as its fault, the other boxes as they were.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from reconciler.desired.load import load_fleet
from reconciler.drift import run_drift
from reconciler.observe import document, probes
from reconciler.observe.document import (
    MAX_DEPTH,
    Fault,
    FaultKind,
    Observed,
    load_json,
    parse_collected,
)
from reconciler.observe.document_c import read_snapshot_file
from reconciler.observe.observe import (
    BoxObservation,
    load_snapshot,
    save_snapshot,
    snapshot_observation,
)
from tests.unit.test_document_c import _both
from tests.unit.test_observation_document import Answered, collected, observe_one
from tests.unit.test_observe_probes import _url, gateway  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"


def nested(depth: int, inner: Any = "x") -> Any:
    """`inner` inside `depth` levels of lists and objects, alternating."""
    value = inner
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def nested_text(depth: int) -> str:
    """`json.dumps(nested(depth))`, without json.dumps' own recursion limit."""
    opening = "".join("[" if level % 2 else '{"k": ' for level in range(depth))
    closing = "".join("]" if level % 2 else "}" for level in reversed(range(depth)))
    return opening + '"x"' + closing


def deepest(value: Any) -> int:
    level, depth = [value], 0
    while level := [v for v in level if isinstance(v, dict | list)]:
        depth += 1
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v)]
    return depth


# -- the bound -------------------------------------------------------------------------------------
def test_json_nested_past_the_bound_is_not_usable_and_at_it_is() -> None:
    assert load_json(json.dumps(nested(MAX_DEPTH))) == nested(MAX_DEPTH)
    for depth in (MAX_DEPTH + 1, 100, 500):
        got = load_json(nested_text(depth))
        assert isinstance(got, Fault) and got.kind is FaultKind.NOT_JSON
        assert got.message.endswith(f"nested deeper than {MAX_DEPTH} levels")
    fine = load_json(json.dumps(nested(MAX_DEPTH + 1)), depth=document.SNAPSHOT_DEPTH)
    assert fine == nested(MAX_DEPTH + 1)


@pytest.mark.parametrize("in_c", [False, True])
def test_json_and_msgspec_refuse_the_same_depth(in_c: bool) -> None:
    for depth in (document.SNAPSHOT_DEPTH, document.SNAPSHOT_DEPTH + 1, 600, 995, 5000):
        data = nested_text(depth).encode()
        got = load_json(data, keys_unique=True, in_c=in_c, depth=document.SNAPSHOT_DEPTH)
        want = load_json(data.decode(), depth=document.SNAPSHOT_DEPTH)
        assert got == want or (isinstance(got, Fault) and str(got) == str(want)), depth
        assert isinstance(got, Fault) is (depth > document.SNAPSHOT_DEPTH)


# -- a live answer ---------------------------------------------------------------------------------
def test_a_live_answer_with_a_deep_unknown_key_is_that_boxs_fault() -> None:
    answer = collected()
    answer["x"] = nested(500)  # 1 KB more than a real answer: json.loads takes it
    obs = observe_one(Answered("thor", json.dumps(answer)))
    assert obs.document is None and obs.failure is not None
    assert obs.failure.kind is FaultKind.NOT_JSON
    assert f"nested deeper than {MAX_DEPTH} levels" in str(obs.failure)


def test_a_gateways_deep_body_is_that_probes_fault(gateway: Any) -> None:  # noqa: F811
    body = nested_text(600).encode()
    gateway.answer = (200, [body], False, 0.0)
    got = probes._get(_url(gateway, "/health"), keep_body=True)
    assert got["status"] == 200 and got["body"] is None
    assert got["body_error"].endswith(f"nested deeper than {MAX_DEPTH} levels")
    json.dumps(got, indent=1)  # what a snapshot writes of it


def test_a_gateways_real_body_has_no_fault(gateway: Any) -> None:  # noqa: F811
    gateway.answer = (200, [b'{"version": "0.91.0"}'], False, 0.0)
    got = probes._get(_url(gateway, "/health"), keep_body=True)
    assert got["body"] == {"version": "0.91.0"} and "body_error" not in got
    assert probes.read_body(json.dumps(nested(MAX_DEPTH + 1)).encode())[0] is None


# -- saving a snapshot -----------------------------------------------------------------------------
def test_a_box_that_cannot_be_written_is_saved_as_its_fault(tmp_path: Path) -> None:
    raw = collected()
    doc = parse_collected(raw)
    assert isinstance(doc, Observed)
    raw["x"] = nested(600)  # as if read by something other than load_json
    deep = BoxObservation("thor", raw, None, {}, 1.5, parsed=doc)
    spark = collected("spark")
    fine = BoxObservation("spark", spark, None, {}, 2.0)
    save_snapshot(tmp_path / "snap", {"thor": deep, "spark": fine}, {"run_id": "r"})
    _, saved = load_snapshot(tmp_path / "snap")
    assert saved["spark"].document is not None and saved["spark"].collected == spark
    assert saved["thor"].document is None
    assert "could not be saved in the snapshot (RecursionError)" in str(saved["thor"].error)
    assert saved["thor"].elapsed_s == 1.5


def _deep_snapshot(tmp_path: Path, depth: int) -> Path:
    """The lab's snapshot, thor's `controller.health.body` nested `depth` deep."""
    snap = tmp_path / f"deep{depth}"
    shutil.copytree(EXAMPLE / "snapshot", snap)
    thor = json.loads((snap / "thor.json").read_text("utf-8"))
    thor["controller"]["health"]["body"] = nested(depth)
    (snap / "thor.json").write_text(json.dumps(thor, indent=1, sort_keys=True), "utf-8")
    return snap


def test_a_deep_snapshot_file_is_that_boxs_fault_and_the_run_saves_the_rest(
    tmp_path: Path,
) -> None:
    fleet = load_fleet(EXAMPLE, "lab")
    run = run_drift(
        fleet,
        ["thor", "spark", "orin"],
        save_to=tmp_path / "resave",
        from_snapshot=_deep_snapshot(tmp_path, 600),
    )
    by_box = {b.box: b for b in run.report.boxes}
    assert not by_box["thor"].reachable
    assert f"nested deeper than {document.SNAPSHOT_DEPTH} levels" in by_box["thor"].errors[0]
    assert by_box["spark"].reachable and by_box["orin"].reachable
    _, saved = load_snapshot(tmp_path / "resave")
    assert saved["spark"].document is not None and saved["orin"].document is not None
    assert saved["thor"].document is None and "nested deeper" in str(saved["thor"].error)


# -- the fast path reads the same ------------------------------------------------------------------
def _thor() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((EXAMPLE / "snapshot" / "thor.json").read_text("utf-8"))
    return raw


def _container(raw: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = raw["collected"]["docker"]["containers"][0]
    return found


# Where the fast path keeps plain JSON (`Any`), and how many objects and lists are around it.
PLACES = {
    "the file's box field": (1, lambda raw, v: raw.update(box=v)),
    "the controller's body": (3, lambda raw, v: raw["controller"]["health"].update(body=v)),
    "a file fact's unknown key": (4, lambda raw, v: raw["collected"]["files"][".env"].update(x=v)),
    "a gateway probe's body": (4, lambda raw, v: raw["collected"]["gateway"]["health"].update(x=v)),
    "a container's binding": (
        8,
        lambda raw, v: _container(raw).update(ports={"8000/tcp": [{"HostPort": "8000", "x": v}]}),
    ),
    "a compose port entry": (
        6,
        lambda raw, v: raw["collected"]["render"]["services"]["gateway"].update(ports=[v]),
    ),
}


@pytest.mark.parametrize("place", sorted(PLACES))
def test_the_fast_path_refuses_the_depth_document_py_refuses(tmp_path: Path, place: str) -> None:
    around, put = PLACES[place]
    for depth in (document.SNAPSHOT_DEPTH - around, document.SNAPSHOT_DEPTH - around + 1, 600):
        raw = _thor()
        put(raw, nested(depth, 1))
        assert deepest(raw) == around + depth
        path = tmp_path / "thor.json"
        path.write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        typed, c_path, two_steps = _both(path)
        assert c_path == two_steps, (place, depth)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        plain = snapshot_observation("thor", path, digest).failure
        assert str(plain) == c_path[2], (place, depth)
        too_deep = around + depth > document.SNAPSHOT_DEPTH
        assert typed is (read_snapshot_file(path.read_bytes()) is not None)
        if too_deep:
            assert not typed and f"nested deeper than {document.SNAPSHOT_DEPTH} levels" in c_path[2]
        elif place != "a compose port entry":  # its own bound is MAX_DEPTH (document._port_entry)
            assert typed and c_path[2] == "None", (place, depth)
