"""A pending recreate: compose's config hash of the files on the box against the label of the
container it runs. `docker compose up` recreates a container whose label differs (the lane's
model loads again) for any setting of its service, most of which drift compares nowhere else
(labels, health check, devices, resources, shm_size). Drift says so, once per container and
only where no compared field already says the container is not what the files make.

The collector's reader runs on `docker compose config --hash '*'` as compose 2.40.3 printed it
on the lab's spark box; the comparison on the captured lab data (examples/lab-incidents, edited
as plain JSON: the capture predates the section, so it also shows an older snapshot compares
as before).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from reconciler.compare.box import compare_box
from reconciler.compare.containers import compare_containers
from reconciler.compare.drift import Action, Kind
from reconciler.drift_inputs import expectations
from reconciler.observe.document import Fault, Observed, parse_collected
from reconciler.observe.document_c import read_snapshot_file
from reconciler.observe.remote.collector import _hash_reader
from reconciler.plan import actionable
from tests.unit.test_compare_rules import captured, compare

__all__ = ["captured"]  # a fixture, used by name

# `docker compose config --hash '*'` on spark (compose 2.40.3), as printed.
SPARK_HASHES = """\
gateway 57ca8e30b3ab52bb777faeae94990abcfa0d3d896e12823f71294d06ec1c63ac
vllm-embed d1849416ebaafc334cd238d8d4722fc3dff20d334be5bad4b2774651d59d39f4
vllm-hand 2bf0430630492859ea0ee0774870592e3df26b29072b8b86990d9627b5153cc6
vllm-primary a75673455aeaf568361173e13cbf06899b490fd954186300092ee2ef6eee5049
vllm-rerank 9c47e1e973ba1d4d6b9bab697b4921f21b73935562fef7a5d17e1ae062005192
"""
OTHER = "e07996cb9a6fe8769081b73d24110f4ba6480f74e9f454ffe4b4e32330cbee29"


def _read(text: str) -> dict[str, str]:
    into: list[dict[str, str]] = []
    _hash_reader(into)(text)
    return into[-1]


def test_the_collector_reads_composes_hash_lines() -> None:
    hashes = _read(SPARK_HASHES)
    assert list(hashes) == ["gateway", "vllm-embed", "vllm-hand", "vllm-primary", "vllm-rerank"]
    assert hashes["gateway"] == SPARK_HASHES.split()[1]
    assert _read("") == {}  # a project with no service


@pytest.mark.parametrize(
    "text",
    [
        '{"services": {}}',  # not compose's lines (a cache entry of another command)
        "gateway\n",
        "gateway 57ca8e30\n",  # cut short
        "gateway " + "G" * 64 + "\n",
        "gateway " + SPARK_HASHES.split()[1].upper() + "\n",
        " " + SPARK_HASHES.split()[1] + "\n",  # no service name
    ],
)
def test_anything_else_is_refused_so_the_cache_never_serves_it(text: str) -> None:
    with pytest.raises(ValueError):
        _read(text)


def _labels(box: str) -> dict[str, str]:
    """Each service's label in the capture: what compose would print for files that made it."""
    raw = json.loads((_snapshot_dir() / f"{box}.json").read_text())
    return {c["service"]: c["config_hash"] for c in raw["collected"]["docker"]["containers"]}


def _snapshot_dir() -> Any:
    from tests.unit.test_restart_policy import SNAPSHOT

    return SNAPSHOT


def _hashes(box: str, **changed: str) -> Any:
    def edit(raw: dict[str, Any]) -> None:
        raw["config_hashes"] = {"services": {**_labels(box), **changed}}

    return edit


def _pending(result: Any) -> list[Any]:
    return [d for d in result.drifts if d.path == "config-hash"]


def test_files_that_made_every_container_are_no_entry(captured: Any) -> None:
    for box in ("thor", "spark", "orin"):
        assert _pending(compare(captured, box, _hashes(box))) == []


def test_a_gateway_compose_would_recreate_is_one_report_only_entry(captured: Any) -> None:
    """spark's gateway is what its render says in every compared field: only the hash says
    the next `docker compose up` recreates it."""
    result = compare(captured, "spark", _hashes("spark", gateway=OTHER))
    (d,) = _pending(result)
    assert (d.kind, d.subject, d.desired, d.observed, d.action, d.source) == (
        Kind.STATE,
        "gateway",
        OTHER,
        _labels("spark")["gateway"],
        Action.REPORT,
        "model-gear-gateway",
    )
    assert d.note is not None and "the next `docker compose up` recreates it" in d.note
    # spark's `.env` lacks managed keys (the capture's incidents): the hash is of files a
    # converge replaces, and the note says so rather than offer the recreate.
    assert any(x.kind is Kind.ENVFILE for x in result.drifts)
    assert "a converge replaces them first" in d.note and "docker compose up -d" not in d.note


def _doc(captured: Any, box: str, edit: Any) -> Observed:
    raw = json.loads(json.dumps(captured[1][box].collected))
    edit(raw)
    doc = parse_collected(raw, complete=True)
    assert isinstance(doc, Observed)
    return doc


def test_with_the_files_as_desired_the_note_gives_the_recreate_and_it_stays_a_report(
    captured: Any,
) -> None:
    """Never a converge's recreate, and never a converge's verification failure: a person
    chooses when the model reloads."""
    doc = _doc(captured, "spark", _hashes("spark", gateway=OTHER))
    exp = expectations(captured[0], ["spark"])["spark"]
    (d,) = [d for d in compare_containers(exp, doc, True) if d.path == "config-hash"]
    assert d.action is Action.REPORT and d not in actionable([d])
    assert d.note is not None and "`docker compose up -d gateway` there" in d.note
    assert "converge replaces" not in d.note


def test_a_container_a_compared_field_already_recreates_is_not_said_twice(captured: Any) -> None:
    """thor's lanes carry another environment than their render (the capture's incidents):
    each is already recreated for that, and compose's hash of course differs too."""
    changed = {s: OTHER for s in _labels("thor")}
    result = compare(captured, "thor", _hashes("thor", **changed))
    recreated = {d.subject for d in result.drifts if d.kind is Kind.ENV}
    assert recreated and {d.subject for d in _pending(result)}.isdisjoint(recreated)


def test_a_restart_policy_changed_by_hand_does_not_hide_it(captured: Any) -> None:
    """`docker update --restart` leaves the label as it was: a pending recreate is its own."""

    def edit(raw: dict[str, Any]) -> None:
        _hashes("spark", gateway=OTHER)(raw)
        raw["render"]["services"]["gateway"]["restart"] = "unless-stopped"
        gateway = next(c for c in raw["docker"]["containers"] if c["service"] == "gateway")
        gateway["restart_policy"] = "no"

    result = compare(captured, "spark", edit)
    assert {d.path for d in result.drifts if d.subject == "gateway"} >= {"restart", "config-hash"}


@pytest.mark.parametrize(
    "section",
    [
        None,  # an older snapshot: not recorded
        {"error": "docker compose config exited 1"},  # compose could not say
        {"services": {}},  # the service is not in the files' project
    ],
)
def test_no_hash_of_the_files_is_no_comparison(captured: Any, section: Any) -> None:
    def edit(raw: dict[str, Any]) -> None:
        if section is not None:
            raw["config_hashes"] = section

    assert _pending(compare(captured, "spark", edit)) == []


def test_a_container_without_the_label_is_not_compared(captured: Any) -> None:
    def edit(raw: dict[str, Any]) -> None:
        _hashes("spark", gateway=OTHER)(raw)
        gateway = next(c for c in raw["docker"]["containers"] if c["service"] == "gateway")
        gateway["config_hash"] = None  # created by something other than compose

    assert _pending(compare(captured, "spark", edit)) == []


@pytest.mark.parametrize(
    ("section", "where"),
    [
        ({"services": {"gateway": "57ca8e30"}}, "config_hashes.services.gateway"),
        ({"services": {"gateway": None}}, "config_hashes.services.gateway"),
        ({"services": ["gateway"]}, "config_hashes.services"),
        ("57ca8e30", "config_hashes"),
    ],
)
def test_a_malformed_section_is_the_boxs_fault_in_both_readers(
    captured: Any, section: Any, where: str
) -> None:
    raw = json.loads(json.dumps(captured[1]["spark"].collected))
    raw["config_hashes"] = section
    fault = parse_collected(raw, complete=True)
    assert isinstance(fault, Fault) and where in str(fault)
    # The C reader leaves such a file to document.py (None), which says where.
    assert read_snapshot_file(json.dumps({"collected": raw}).encode()) is None


def test_both_readers_read_the_section_alike(captured: Any) -> None:
    raw = json.loads(json.dumps(captured[1]["spark"].collected))
    raw["config_hashes"] = {"services": _read(SPARK_HASHES)}
    typed = read_snapshot_file(json.dumps({"collected": raw}).encode())
    walked = parse_collected(raw, complete=False)
    assert typed is not None and isinstance(walked, Observed)
    for doc in (typed.document, walked):
        assert doc.config_hashes is not None
        assert dict(doc.config_hashes.services or {}) == _read(SPARK_HASHES)
    exp = expectations(captured[0], ["spark"])["spark"]
    assert [d.path for d in compare_box(exp, typed.document).drifts] == [
        d.path for d in compare_box(exp, walked).drifts
    ]


NO_HASH = "docker compose config exited 1: unknown flag: --hash"


def _faulted(captured: Any, box: str, **changed: Any) -> Observed:
    def edit(raw: dict[str, Any]) -> None:
        raw["config_hashes"] = {"error": NO_HASH}
        raw.update(changed)

    return _doc(captured, box, edit)


def test_hashes_compose_could_not_give_are_a_fault_of_a_box_whose_files_are_desired(
    captured: Any,
) -> None:
    """A compose that cannot hash (one without `config --hash`, a timeout) leaves every
    pending recreate unjudged: said as a fault of the box (exit 1, as a login shell that could
    not be traced), never as "none pending". Report-only, as the entry it stands for: a
    converge is planned as before, its verification passes over it, and every column of the
    box was compared."""
    from reconciler.apply.engine import UNFIXABLE
    from reconciler.compare.box import unhashed
    from reconciler.compare.drift import DriftReport, Part
    from reconciler.history.parts import part_of
    from reconciler.plan import plan_box
    from reconciler.records import replace
    from reconciler.report.html import unobserved

    (error,) = unhashed(_faulted(captured, "spark"), True)
    assert error.part is Part.CONFIG_HASH
    assert str(error) == f"config hashes: {NO_HASH}: no container's pending recreate judged"
    assert part_of(str(error)) == "config-hash"  # as an old run's text is read back

    before = compare(captured, "spark")
    result = replace(before, errors=(*before.errors, error))
    when = ("inventory/lab.yaml", "2026-12-07T00:00:00Z", "r")
    assert DriftReport((before,), *when).exit_code == 2
    assert DriftReport((result,), *when).exit_code == 1
    exp = expectations(captured[0], ["spark"])["spark"]
    plan = plan_box(result, exp)
    assert plan.blocked == plan_box(before, exp).blocked == ()
    assert plan.steps == plan_box(before, exp).steps
    assert Part.CONFIG_HASH in UNFIXABLE
    assert unobserved(result) == {}


def test_no_fault_where_the_render_failed_or_the_files_are_not_the_desired_ones(
    captured: Any,
) -> None:
    """compose's render failing fails the hash's own `config` too, and its error says why.
    And on a box whose `.env` or a compose file is not the desired one (the capture's spark:
    its `.env` lacks managed keys), compose refusing those files (a key a compose file
    requires, as before any first converge) is what their entries say, and a converge
    replaces them: the drift, and its exit code, are as before."""
    from reconciler.compare.box import unhashed
    from reconciler.compare.drift import Part

    render_failed = {"error": "service gateway: invalid interpolation"}
    assert unhashed(_faulted(captured, "spark", render=render_failed), True) == []
    assert unhashed(_faulted(captured, "spark"), False) == []
    before = compare(captured, "spark")
    result = compare(captured, "spark", lambda raw: raw.update(config_hashes={"error": NO_HASH}))
    assert Part.CONFIG_HASH not in [e.part for e in result.errors]
    assert (result.errors, result.drifts) == (before.errors, before.drifts)


def test_a_diff_leaves_out_the_pending_recreates_a_run_could_not_judge(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run 1 finds spark's gateway pending a recreate; in run 2 compose gave no hashes (its
    fault recorded as a run records it: the box's fault parts). The entry did not clear: it
    was not judged, and `reconcile diff` says so rather than list it as cleared. Hashes that
    match the label again do clear it."""
    import sqlite3

    from tests.unit.history_helpers import edited_snapshot, reconcile, replay, unvouched

    def spark(section: dict[str, Any]) -> Any:
        def edit(docs: dict[str, Any]) -> None:
            docs["spark"]["collected"]["config_hashes"] = section

        return edit

    runs = {
        "pending": {"services": {**_labels("spark"), "gateway": OTHER}},
        "no-hash": {"error": NO_HASH},
        "matching": {"services": _labels("spark")},
    }
    snapshots = {}
    for name, section in runs.items():
        snapshots[name] = edited_snapshot(tmp_path, name, spark(section))
        unvouched(snapshots[name])

    def diff(second: str) -> tuple[int, dict[str, Any]]:
        db = tmp_path / f"{second}.sqlite3"
        replay(capsys, db, snapshots["pending"])
        replay(capsys, db, snapshots[second])
        if second == "no-hash":  # spark's files as desired, as this capture's are not
            with sqlite3.connect(db) as conn:
                conn.execute(
                    "UPDATE boxes SET faults = ?, errors = errors + 1 WHERE run = 2 AND box = ?",
                    (json.dumps(["config-hash"]), "spark"),
                )
            conn.close()
        code, out, err = reconcile(capsys, "diff", "--history", str(db), "--format", "json")
        assert "Traceback" not in err, err
        doc: dict[str, Any] = json.loads(out)
        return code, doc

    _, unjudged = diff("no-hash")
    # What changed is what spark answered (the observed section, compared as any is)...
    assert [(c["box"], c["path"]) for c in unjudged["changes"]] == [("spark", "config_hashes")]
    # ... not its drift: no entry appeared or cleared
    assert unjudged["cleared"] == unjudged["appeared"] == []
    assert unjudged["notes"] == [
        "spark: compose gave no config hashes in run 2: its pending recreates "
        "(config-hash entries) not compared"
    ]
    code, cleared = diff("matching")
    assert code == 2
    assert [(e["box"], e["subject"]) for e in cleared["cleared"]] == [("spark", "gateway")]
    assert cleared["notes"] == []
