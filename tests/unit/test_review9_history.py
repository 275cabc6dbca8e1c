"""Review 9 of the history and `reconcile diff`, on captured lab data.

1. two saving runs (`drift --save-snapshot`), or a saving run and a plain one, diffed as changed:
   each render's `basis` is a digest over this run's keyed digests, and `render_current*`
   exists only in a saving run;
2. real vLLM makes each `/v1/models` card anew per request (`created`, a permission with a
   fresh `modelperm-` id): every live diff read "changed"; and the volatile keys were dropped
   at any depth (a container's variable named `time` was never compared);
3. `-o` or `--metrics` naming the history store (or each other) replaced it;
5. `diff --from-snapshot` judged a snapshot against the default inventory, not its own;
6. the controller's digests of desired secrets (`controller.inline_masks`) were printed;
7. `history --since` past every run said "no runs recorded".
"""

from __future__ import annotations

import json
import re
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from reconciler.history.diff import Side, diff_sides, render_text
from reconciler.history.observed import comparable
from tests.unit.history_helpers import INCIDENTS, ROOT, SNAPSHOT, edited_snapshot, reconcile

SAVED = ROOT / "tests" / "fixtures" / "replay_review7" / "snapshot"  # a saving run's files
HEX64 = re.compile(r"\b[0-9a-f]{64}\b")


def saved(box: str = "thor") -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SAVED / f"{box}.json").read_text())
    return doc


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The observed changes `reconcile diff` prints for one box."""
    diff = diff_sides(
        Side("a", observations={"thor": before}), Side("b", observations={"thor": after})
    )
    return [f"{c.path}: {c.change}" for c in diff.changes]


def rekeyed(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` as another saving run of the same box writes it: every render's basis another
    (its digest covers that run's keyed digests of the `.env`'s secrets)."""
    out: dict[str, Any] = json.loads(json.dumps(doc))
    for name, render in out["collected"].items():
        if name.startswith("render") and isinstance(render, dict) and "basis" in render:
            render["basis"] = render["basis"][::-1]
    return out


def plain(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` as a run without --save-snapshot writes it: no basis, no render of the box's own
    `.env`."""
    out: dict[str, Any] = json.loads(json.dumps(doc))
    collected = out["collected"]
    for name in ("render_current", "render_login_current"):
        collected.pop(name)
    for name in ("render", "render_login"):
        collected[name].pop("basis")
    return out


# -- 1. a saving run's basis and own renders ---------------------------------------------------


def test_two_saving_runs_and_a_plain_one_compare_alike() -> None:
    doc = saved()
    assert {"basis"} <= doc["collected"]["render"].keys()  # the captured data is a saving run's
    assert "render_current" in doc["collected"]
    assert changes(doc, rekeyed(doc)) == []
    assert changes(doc, plain(doc)) == []
    assert changes(plain(doc), rekeyed(doc)) == []
    bases = {r["basis"] for n, r in doc["collected"].items() if n.startswith("render")}
    assert len(bases) == 2 and not bases & set(HEX64.findall(json.dumps(comparable(doc))))
    # What a render says is still compared: another image rendered for the gateway.
    other = rekeyed(doc)
    other["collected"]["render"]["services"]["gateway"]["image"] = "registry/gateway@sha256:0"
    assert changes(doc, other) == ["render.services[gateway].image: changed"]


def test_two_saving_snapshots_diff_as_nothing_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for target, edit in ((a, lambda d: d), (b, rekeyed)):
        target.mkdir()
        (target / "index.json").write_text((SAVED / "index.json").read_text())
        for box in ("thor", "spark"):
            (target / f"{box}.json").write_text(json.dumps(edit(saved(box))))
        index = json.loads((target / "index.json").read_text())
        index.pop("sha256")  # the files were rewritten: read as any file is, with every check
        (target / "index.json").write_text(json.dumps(index))
    code, out, _ = reconcile(capsys, "diff", "--from-snapshot", str(a), str(b), root=ROOT)
    # (Their renders are not judged against today's desired state: compared in part.)
    assert code == 0 and out.splitlines()[-1].startswith("diff: nothing changed"), out
    assert "basis" not in out and "observed values that changed" not in out


# -- 2. vLLM's per-request model cards; volatile keys only where they are -----------------------


def standin_lane(monkeypatch: pytest.MonkeyPatch) -> Any:
    from lab.images import vllm_standin

    for name in ("STANDIN_FAIL", "STANDIN_START_DELAY_S", "VLLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    ns = vllm_standin.build_parser("0").parse_args(
        ["serve", "Qwen/Qwen3-0.6B", "--lora-modules", "sql=/loras/sql"]
    )
    return vllm_standin.Lane(ns, {}, {})


# vLLM's ModelPermission (vllm/entrypoints/openai protocol), its fields and defaults.
PERMISSION = {
    "object": "model_permission",
    "allow_create_engine": False,
    "allow_sampling": True,
    "allow_logprobs": True,
    "allow_search_indices": False,
    "allow_view": True,
    "allow_fine_tuning": False,
    "organization": "*",
    "group": None,
    "is_blocking": False,
}


def test_the_standin_makes_each_model_card_per_request_as_vllm_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    lane = standin_lane(monkeypatch)
    clock = iter([1_800_000_000.0] * 4 + [1_800_000_007.0] * 4)
    monkeypatch.setattr(time, "time", lambda: next(clock))
    first, second = lane.models_payload(), lane.models_payload()
    assert [c["id"] for c in first["data"]] == ["Qwen/Qwen3-0.6B", "sql"]
    for one, two in zip(first["data"], second["data"], strict=True):
        assert (one["created"], two["created"]) == (1_800_000_000, 1_800_000_007)
        [p1], [p2] = one["permission"], two["permission"]
        assert re.fullmatch(r"modelperm-[0-9a-f]{32}", p1["id"]) and p1["id"] != p2["id"]
        assert (p1["created"], p2["created"]) == (1_800_000_000, 1_800_000_007)
        assert {k: v for k, v in p1.items() if k not in ("id", "created")} == PERMISSION


def vllm_models(served: str, now: int) -> dict[str, Any]:
    """A lane's `GET /v1/models` answer as vLLM makes it at `now` (show_available_models)."""
    card = {"id": served, "object": "model", "created": now, "owned_by": "vllm", "root": served}
    permission = {"id": f"modelperm-{uuid.uuid4().hex}", "created": now, **PERMISSION}
    card |= {"parent": None, "max_model_len": 8192, "permission": [permission]}
    return {"object": "list", "data": [card]}


def test_lane_bodies_made_per_request_are_no_change_and_a_variable_named_time_is() -> None:
    before, after = saved(), saved()
    for now, doc in enumerate((before, after)):  # each probe answered as a real lane answers
        for probe in doc["collected"]["lanes"].values():
            served = probe["body"]["data"][0]["id"]
            probe["body"] = vllm_models(served, 1_800_000_000 + now)
    assert changes(before, after) == []
    # What a card says is still compared; and so is a key named like a volatile one elsewhere.
    worker = after["collected"]["lanes"]["vllm-worker"]["body"]["data"][0]
    worker["max_model_len"] = 4096
    served = worker["id"]
    gateway = next(
        c for c in after["collected"]["docker"]["containers"] if c["service"] == "gateway"
    )
    gateway["env"]["time"] = "UTC"
    gateway["env"]["ms"] = "5"
    assert changes(before, after) == [
        "docker.containers[model-gear-gateway].env[ms]: added",
        "docker.containers[model-gear-gateway].env[time]: added",
        f"lanes[vllm-worker].body.data.{served}.max_model_len: changed",
    ]
    # The run's own clocks are still not: the collector's, the probes', the controller's.
    later = json.loads(json.dumps(after))
    later["elapsed_s"] += 1
    later["collected"]["time"] = "2030-01-01T00:00:00Z"
    later["collected"]["gateway"]["health"]["ms"] += 7
    later["controller"]["health"]["ms"] += 7
    assert changes(after, later) == []


# -- 3. one file for two outputs ---------------------------------------------------------------


def test_an_output_naming_the_history_store_is_refused_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "victim.sqlite3"
    code, _, err = reconcile(
        capsys, "drift", "--from-snapshot", str(SNAPSHOT), "--history", str(db)
    )
    assert code == 2, err
    held = {p: p.read_bytes() for p in tmp_path.iterdir()}  # the store, and its -wal
    for command, output in (("drift", "-o"), ("drift", "--metrics"), ("audit", "-o")):
        for path in (str(db), f"{db}-wal", str(tmp_path / "link.sqlite3")):
            if path.endswith("link.sqlite3") and not Path(path).exists():
                Path(path).symlink_to(db)
            code, out, err = reconcile(
                capsys,
                command,
                "--from-snapshot",
                str(SNAPSHOT),
                "--history",
                str(db),
                output,
                path,
                "--format",
                "json",
            )
            assert code == 1 and out == "", (command, output, path, out)
            assert f"{output} {path} is a file of the history store {db}" in err, err
            assert {p: p.read_bytes() for p in tmp_path.iterdir() if p in held} == held
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (1,)


def test_metrics_and_the_report_in_one_file_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "out.json"
    hard = tmp_path / "hard.json"
    report.write_text("last report\n")
    hard.hardlink_to(report)
    for metrics in (report, hard):
        code, out, err = reconcile(
            capsys, "drift", "--from-snapshot", str(SNAPSHOT), "-o", str(report),
            "--metrics", str(metrics), "--format", "json",
        )  # fmt: skip
        assert code == 1 and out == "", err
        assert f"-o {report} and --metrics {metrics} are one file" in err, err
        assert report.read_text() == "last report\n"
    # A descriptor or a device is written into, never replaced: two outputs there are fine.
    code, _, err = reconcile(
        capsys, "drift", "--from-snapshot", str(SNAPSHOT), "-o", "/dev/null",
        "--metrics", "/dev/null", "--format", "json",
    )  # fmt: skip
    assert code == 2, err


# -- 5. a snapshot judged against its own inventory --------------------------------------------


def test_a_snapshot_is_judged_against_the_inventory_its_index_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler import cli

    monkeypatch.delenv("FLEET_INVENTORY", raising=False)
    other = edited_snapshot(tmp_path, "other", lambda docs: None)

    def diff(*inventory: str) -> tuple[int, str, str]:
        code = cli.main(
            [
                "--root",
                str(INCIDENTS),
                *inventory,
                "diff",
                "--from-snapshot",
                str(SNAPSHOT),
                str(other),
            ]
        )
        got = capsys.readouterr()
        return code, got.out, got.err

    code, out, err = diff()  # no -i: the default inventory is hosts, the index says lab
    assert (code, out.splitlines()[-1]) == (0, "diff: nothing changed"), out + err
    assert "not observed" not in out and "warning" not in err
    code, out, err = diff("-i", "hosts")  # chosen, and not the snapshot's: said
    assert f"warning: {SNAPSHOT}: judged against the inventory hosts" in err, err
    assert "the snapshot was taken against inventory/lab.yaml" in err
    code, out, err = diff("-i", "lab")  # the same inventory: nothing to say
    assert "warning" not in err and out.splitlines()[-1] == "diff: nothing changed"


# -- 6. the controller's digests of desired secrets --------------------------------------------

DIGEST_A, DIGEST_B = "3d09" + "a" * 60, "f34f" + "b" * 60


def with_masks(doc: dict[str, Any], digest: str) -> dict[str, Any]:
    """`doc` as a saving live run writes a box with an inline secret (snapshot_key.record)."""
    out: dict[str, Any] = json.loads(json.dumps(doc))
    out["controller"]["inline_masks"] = {"envfile": {"VLLM_ARGS": digest}}
    return out


def test_inline_mask_digests_are_never_printed_nor_kept_by_the_store() -> None:
    from reconciler.history.masking import stored
    from reconciler.observe.observe import BoxObservation, _box_file

    before, after = with_masks(saved(), DIGEST_A), with_masks(saved(), DIGEST_B)
    diff = diff_sides(
        Side("a", observations={"thor": before}), Side("b", observations={"thor": after})
    )
    printed = render_text(diff)
    text = printed + json.dumps(comparable(after))
    assert DIGEST_A not in text and DIGEST_B not in text, printed
    assert comparable(after)["controller"]["inline_masks"] == {"envfile": {"VLLM_ARGS": "***"}}
    # The history store's form masks them; a snapshot file keeps them for its replays.
    assert stored(after, history=True)["controller"]["inline_masks"] == {
        "envfile": {"VLLM_ARGS": "***"}
    }
    assert after["controller"]["inline_masks"]["envfile"]["VLLM_ARGS"] == DIGEST_B  # untouched
    obs = BoxObservation("thor", after["collected"], None, after["controller"], 1.0)
    assert json.loads(_box_file("thor", obs))["controller"]["inline_masks"] == {
        "envfile": {"VLLM_ARGS": DIGEST_B}
    }


# -- 7. --since past every run -----------------------------------------------------------------


def test_no_run_since_says_how_many_runs_the_store_holds(tmp_path: Path) -> None:
    from reconciler.history.listing import render_text as listing

    store = tmp_path / "h.sqlite3"
    assert listing([], None, store, since="2027-01-01", recorded=3) == (
        f"no runs since 2027-01-01 (3 recorded in {store})\n"
    )
    assert listing([], "thor", store, since="6h", recorded=2) == (
        f"no runs for thor since 6h (2 recorded in {store})\n"
    )
    assert listing([], None, store, since="6h", recorded=0) == f"no runs recorded in {store}\n"
