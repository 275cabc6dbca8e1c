"""argv compared as the command line that runs (entrypoint + command), on captured real data:
examples/lab-incidents/snapshot is what the collector saw on the lab (lobes' render: Entrypoint
["bash", "/usr/local/bin/mg-logwrap"], Cmd ["vllm", "serve", MODEL, flags...]). Each test edits
one container the way a hand-made copy or a hand edit would, and reads it back through the
observation parser, as a live answer is."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.argv import desired_split, diff_argv
from reconciler.compare.box import compare_box
from reconciler.compare.drift import Action, BoxResult, Drift, DriftReport, Kind, SecretValue
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import expectations
from reconciler.observe.document import Observed, parse_collected
from reconciler.observe.observe import load_snapshot
from reconciler.plan import plan_box
from reconciler.report.markdown import render_markdown
from reconciler.report.text import render_text

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents"
WRAP = "/usr/local/bin/mg-logwrap"
Edit = Callable[[dict[str, Any]], None]


@pytest.fixture(scope="module")
def captured() -> tuple[Any, dict[str, Any]]:
    fleet = load_fleet(EXAMPLE, "lab")
    _, observations = load_snapshot(EXAMPLE / "snapshot")
    return fleet, observations


def compare(captured: tuple[Any, dict[str, Any]], box: str, edit: Edit | None = None) -> BoxResult:
    fleet, observations = captured
    obs = observations[box]
    raw = copy.deepcopy(obs.collected)
    if edit is not None:
        edit(raw)
    doc = parse_collected(raw, complete=True)
    assert isinstance(doc, Observed), doc
    return compare_box(expectations(fleet, [box])[box], doc, obs.probes)


def argv_drifts(result: BoxResult, subject: str) -> list[Drift]:
    return [d for d in result.drifts if d.kind is Kind.ARGV and d.subject == subject]


def container(doc: dict[str, Any], service: str) -> dict[str, Any]:
    (found,) = [c for c in doc["docker"]["containers"] if c["service"] == service]
    return found


def hand_made(service: str) -> Edit:
    """What `docker run --entrypoint bash IMAGE /usr/local/bin/mg-logwrap vllm serve ...` leaves
    (lab/incidents.py docker_run_argv): the wrapper moves from Entrypoint to the head of Cmd."""

    def edit(doc: dict[str, Any]) -> None:
        c = container(doc, service)
        entry = c["entrypoint"]
        c["entrypoint"], c["cmd"] = entry[:1], [*entry[1:], *c["cmd"]]

    return edit


def cmd_edit(service: str, change: Callable[[list[Any]], list[Any]]) -> Edit:
    def edit(doc: dict[str, Any]) -> None:
        c = container(doc, service)
        c["cmd"] = change(list(c["cmd"]))

    return edit


def test_the_capture_is_lobes_render_with_a_two_word_entrypoint(captured: Any) -> None:
    """The premise of the split tests: the render cuts the line after the wrapper."""
    raw = captured[1]["thor"].collected
    spec = raw["render"]["services"]["vllm-embed"]
    assert spec["entrypoint"] == ["bash", WRAP]
    assert spec["command"][:2] == ["vllm", "serve"]
    assert argv_drifts(compare(captured, "thor"), "lane:vllm-embed") == []


def test_split_differs_with_the_same_argv_is_one_report_only_finding(captured: Any) -> None:
    result = compare(captured, "thor", hand_made("vllm-embed"))
    (d,) = argv_drifts(result, "lane:vllm-embed")
    assert (d.path, d.desired, d.observed) == ("entrypoint", ("bash", WRAP), ("bash",))
    assert d.action is Action.REPORT
    assert d.note is not None and "split differs; effective command equal" in d.note
    # Nothing else about the box changed.
    before = {(x.kind, x.subject, x.path) for x in compare(captured, "thor").drifts}
    after = {(x.kind, x.subject, x.path) for x in result.drifts}
    assert after - before == {(Kind.ARGV, "lane:vllm-embed", "entrypoint")}


def test_split_alone_plans_no_recreate(captured: Any) -> None:
    fleet, _ = captured
    exp = expectations(fleet, ["thor"])["thor"]
    plain = plan_box(compare(captured, "thor"), exp)
    split = plan_box(compare(captured, "thor", hand_made("vllm-embed")), exp)
    assert split.steps == plain.steps


def test_split_of_the_gateway_is_report_only_too(captured: Any) -> None:
    (d,) = argv_drifts(compare(captured, "orin", hand_made("gateway")), "gateway")
    assert (d.path, d.action) == ("entrypoint", Action.REPORT)


def test_split_and_a_changed_window_report_the_window_only(captured: Any) -> None:
    """thor's worker runs --max-model-len=131072 (the capture's incident); a hand-made copy of
    it adds no finding of its own: the recreate that the window calls for restores the cut."""
    plain = argv_drifts(compare(captured, "thor"), "lane:vllm-worker")
    split = argv_drifts(compare(captured, "thor", hand_made("vllm-worker")), "lane:vllm-worker")
    assert [(d.path, d.desired, d.observed, d.action) for d in split] == [
        ("--max-model-len", "262144", "131072", Action.RECREATE)
    ]
    assert [(d.path, d.desired, d.observed) for d in plain] == [
        (d.path, d.desired, d.observed) for d in split
    ]


def test_an_inserted_flag_is_one_finding_naming_it(captured: Any) -> None:
    edit = cmd_edit("vllm-embed", lambda cmd: [*cmd[:4], "--enforce-eager", *cmd[4:]])
    (d,) = argv_drifts(compare(captured, "thor", edit), "lane:vllm-embed")
    assert (d.path, d.desired, d.observed, d.action) == (
        "--enforce-eager",
        None,
        True,
        Action.RECREATE,
    )


def test_a_removed_flag_is_one_finding_naming_it(captured: Any) -> None:
    edit = cmd_edit("vllm-embed", lambda cmd: [t for t in cmd if not t.startswith("--runner=")])
    (d,) = argv_drifts(compare(captured, "thor", edit), "lane:vllm-embed")
    assert (d.path, d.desired, d.observed) == ("--runner", "pooling", None)
    assert d.note == "missing from the running command"


def test_an_inserted_token_is_one_finding_not_a_shift(captured: Any) -> None:
    """`bash -x wrapper vllm serve MODEL`: one insertion, every later token still matches."""

    def edit(doc: dict[str, Any]) -> None:
        c = container(doc, "vllm-embed")
        c["entrypoint"] = ["bash", "-x", WRAP]

    (d,) = argv_drifts(compare(captured, "thor", edit), "lane:vllm-embed")
    assert (d.path, d.desired, d.observed) == ("argv[1]", None, "-x")
    assert d.note is not None and d.note.startswith("not in the render")


def test_a_removed_token_is_one_finding(captured: Any) -> None:
    edit = cmd_edit("vllm-embed", lambda cmd: [t for t in cmd if t != "serve"])
    (d,) = argv_drifts(compare(captured, "thor", edit), "lane:vllm-embed")
    assert (d.path, d.desired, d.observed) == ("argv[3]", "serve", None)


def test_a_replaced_model_is_one_finding_at_its_position(captured: Any) -> None:
    edit = cmd_edit("vllm-embed", lambda cmd: [*cmd[:2], "Qwen/Other", *cmd[3:]])
    (d,) = argv_drifts(compare(captured, "thor", edit), "lane:vllm-embed")
    assert (d.path, d.desired, d.observed) == ("argv[4]", "Qwen/Qwen3-Embedding-0.6B", "Qwen/Other")


def test_the_wrapper_dropped_is_one_finding_not_a_split(captured: Any) -> None:
    """`--entrypoint bash` without the wrapper in front of the command: the argv differs (the
    wrapper does not run), so it is a token removed, not a cut moved."""

    def edit(doc: dict[str, Any]) -> None:
        container(doc, "vllm-embed")["entrypoint"] = ["bash"]

    (d,) = argv_drifts(compare(captured, "thor", edit), "lane:vllm-embed")
    assert (d.path, d.desired, d.observed, d.action) == ("argv[1]", WRAP, None, Action.RECREATE)


def test_flags_in_another_order_are_equal(captured: Any) -> None:
    edit = cmd_edit("vllm-embed", lambda cmd: [*cmd[:3], *reversed(cmd[3:])])
    assert argv_drifts(compare(captured, "thor", edit), "lane:vllm-embed") == []


# -- the pure parts, where the capture has no example --------------------------------------------
def test_desired_split_follows_the_engine_defaults() -> None:
    # The service sets both: the render is the truth.
    assert desired_split(["e"], ["c"], ["x"], ["y"]) == (("e",), ("c",))
    # An entrypoint without a command: Cmd is empty (the image's CMD is dropped).
    assert desired_split(["e"], None, ["x"], ["y"]) == (("e",), ())
    # Neither: the image's defaults, which the observation does not carry -> as the container.
    assert desired_split(None, None, ["x"], ["y"]) == (("x",), ("y",))
    assert desired_split(None, ["c"], ["x"], ["y"]) == (("x",), ("c",))
    # `entrypoint: []` clears the image's entrypoint; the image's CMD still applies.
    assert desired_split([], None, ["x"], ["y"]) == ((), ("y",))
    assert desired_split([], ["c"], ["x"], ["y"]) == ((), ("c",))
    # The image's own defaults, when known, are what the service leaves out.
    assert desired_split(None, ["c"], ["x"], ["y"], image=(["i"], ["j"])) == (("i",), ("c",))
    assert desired_split(None, None, ["x"], ["y"], image=(["i"], ["j"])) == (("i",), ("j",))
    assert desired_split(None, None, ["x"], ["y"], image=((), ())) == ((), ())


def test_json_tokens_compare_by_content() -> None:
    assert diff_argv(["sh"], ['{"a": 1, "b": 2}'], ["sh"], ['{"b":2,"a":1}']) == []


def test_a_secret_flag_compares_by_digest_and_stays_a_digest() -> None:
    same_key = diff_argv(
        [], ["--api-key", SecretValue("hmac:aa")], [], ["--api-key", SecretValue("hmac:aa")]
    )
    assert same_key == []
    (d,) = diff_argv(
        [], ["--api-key", SecretValue("hmac:aa")], [], ["--api-key", SecretValue("hmac:bb")]
    )
    assert (d.path, d.desired, d.observed) == (
        "--api-key",
        SecretValue("hmac:aa"),
        SecretValue("hmac:bb"),
    )


def test_a_run_of_tokens_replaced_is_one_finding() -> None:
    (d,) = diff_argv(
        ["bash", WRAP], ["vllm", "serve", "m"], ["python3", "-m", "x"], ["vllm", "serve", "m"]
    )
    assert (d.path, d.desired, d.observed) == ("argv[0:2]", ("bash", WRAP), ("python3", "-m", "x"))


def test_a_secret_in_a_moved_entrypoint_is_shown_as_stars() -> None:
    """A split entry prints entrypoints whole; a hashed token inside one stays `***`."""
    key = SecretValue("hmac:" + "ab" * 32)
    (d,) = diff_argv(["vllm", "--api-key", key], ["serve"], ["vllm"], ["--api-key", key, "serve"])
    assert d.split_only and d.desired == ("vllm", "--api-key", key)
    entry = Drift("thor", Kind.ARGV, "lane:x", d.path, d.desired, d.observed, Action.REPORT)
    report = DriftReport((BoxResult("thor", True, (entry,)),), "lab", "t", "r")
    for out in (render_text(report, color=False), render_markdown(report)):
        assert "***" in out and "abab" not in out
