"""A `.env` value whose key is no secret but which carries one (`VLLM_ARGS=--api-key x`,
`EXTRA="--hf-token=x"`, `CURL_HDR=Authorization: Bearer x`): hashed inline on the box, as a
container's environment is, and still compared with the desired value in clear.

The box's `.env` is thor's as the lab captured it (tests/fixtures/import/lab_desired: every
line lobes renders, read back from its saved answer) with such lines added; the collector runs
on it with compose, docker and the login shell stubbed (their parts are not under test).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.box import compare_box
from reconciler.compare.context import BoxExpectation
from reconciler.compare.drift import BoxResult, Drift, DriftReport, Kind, SecretValue
from reconciler.compare.envfile import compare_envfile
from reconciler.compare.shell import compare_shell
from reconciler.desired.entries import EnvEntry
from reconciler.desired.facts import snapshot_facts
from reconciler.desired.load import load_fleet
from reconciler.drift_inputs import drift_inputs
from reconciler.observe.document import EnvLine, Observed, parse_collected
from reconciler.observe.document_c import read_snapshot_file
from reconciler.observe.observe import BoxObservation, load_snapshot, save_snapshot
from reconciler.records import replace
from reconciler.report import FORMATS, render
from tests.unit.conftest import import_snapshot, load_box_program

REPO = Path(__file__).resolve().parents[2]
LAB_DESIRED = REPO / "tests/fixtures/import/lab_desired"
CAPTURED = json.loads((LAB_DESIRED / "thor.json").read_text(encoding="utf-8"))["collected"]

collector = load_box_program("box_collector_inline_env", "reconciler/observe/remote/collector.py")

# Each key's value as `.env` writes it, as compose reads it, its secret and what stays readable.
INLINE = {
    "VLLM_ARGS": ("--api-key sk-live-123", "--api-key sk-live-123", "sk-live-123", "--api-key "),
    "EXTRA": ('"--hf-token=hf_abc"', "--hf-token=hf_abc", "hf_abc", "--hf-token="),
    "CURL_HDR": (
        "Authorization: Bearer xyz-7f3q",
        "Authorization: Bearer xyz-7f3q",
        "xyz-7f3q",
        "Authorization: Bearer ",
    ),
}
SECRETS = [secret for _, _, secret, _ in INLINE.values()]
OTHER = {  # the same keys with other secrets, the rest of each value as it was
    "VLLM_ARGS": "--api-key sk-old-999",
    "EXTRA": "--hf-token=hf_zzzzz",
    "CURL_HDR": "Authorization: Bearer old-bearer-1",
}
HASHED = '{"secret": "hmac:'
# How each report shows a secret (JSON: a flag and a short digest of the box's digest).
MASKED = {"text": "***", "markdown": "***", "html": "***", "json": '"secret": true'}


def captured_env(extra: dict[str, str]) -> str:
    """thor's captured `.env` (its mesh key, hashed in the capture, replaced by a stand-in),
    then `extra` as written."""
    lines = []
    for line in CAPTURED["envfile"]:
        value = line["value"] if isinstance(line["value"], str) else "mesh-key-of-the-lab-42"
        lines.append(f"{line['key']}={collector._quote(value)}")
    lines += [f"{key}={value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


def written(values: dict[str, str]) -> dict[str, str]:
    return {
        key: (INLINE[key][0] if values[key] == INLINE[key][1] else values[key]) for key in values
    }


DESIRED = {key: plain for key, (_, plain, _, _) in INLINE.items()}


def observe(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    on_box: dict[str, str],
    desired: dict[str, str],
    exported: dict[str, str] | None = None,
) -> dict[str, Any]:
    """collect() on a deployment whose `.env` is thor's with `on_box` added, for a desired state
    managing `desired`; the login shell exports `exported`, which the worker lane also carries
    (a lane started from that shell). The answer, as JSON carries it."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / ".env").write_text(captured_env(written(on_box)), encoding="utf-8")
    (deploy / ".env").chmod(0o600)  # as lobes writes it: its mode is no drift under test
    (deploy / "docker-compose.yml").write_text("services: {}\n", encoding="utf-8")
    exported = exported or {}
    worker = next(c for c in CAPTURED["docker"]["containers"] if c["service"] == "vllm-worker")

    def containers(run: Any) -> dict[str, Any]:
        carried = {**worker["env"], **run.mask_env_map(exported)}
        return {"containers": [dict(worker, env=carried)]}

    def login_shell(run: Any) -> tuple[dict[str, Any], dict[str, str]]:
        exports = {
            k: {"value": run.masked_value(k, v), "source": "~/.bashrc:9"}
            for k, v in exported.items()
        }
        return {"exports": exports}, {"PATH": "/usr/bin", **exported}

    monkeypatch.setattr(collector, "render", lambda *a: {"services": {}})
    monkeypatch.setattr(collector, "variables", lambda *a: {"names": sorted(INLINE)})
    monkeypatch.setattr(collector, "containers", containers)
    monkeypatch.setattr(collector, "gateway_probes", lambda run: {})
    monkeypatch.setattr(collector, "login_shell", login_shell)
    payload = {"run_key": "k" * 32, "secret_patterns": [], "directory": str(deploy),
               "project": "lobes", "compose_files": ["docker-compose.yml"],
               "managed_env": dict(desired), "box_secrets": {}}  # fmt: skip
    return json.loads(collector.without_known_secrets(collector.collect(payload)))


def typed(raw: dict[str, Any]) -> Observed:
    doc = parse_collected(raw, complete=False)
    assert isinstance(doc, Observed), doc
    return doc


def expectation(desired: dict[str, str]) -> BoxExpectation:
    """The lab's thor, managing only `desired` in `.env`: the drift under test is theirs."""
    fleet = load_fleet(REPO, "lab", facts=snapshot_facts(LAB_DESIRED))
    exp = drift_inputs(fleet).expectations["thor"]
    env = tuple(EnvEntry(k, v, "group_vars/test.yaml:1") for k, v in desired.items())
    return replace(exp, env=env)


def envfile_drifts(doc: Observed, desired: dict[str, str]) -> dict[str, Drift]:
    return {d.path: d for d in compare_envfile(expectation(desired), doc)}


def lines(doc: Observed) -> list[tuple[str, object, int]]:
    return [(line.key, line.value, line.line) for line in doc.envfile or ()]


def reports(drifts: list[Drift]) -> dict[str, str]:
    box = BoxResult("thor", reachable=True, drifts=tuple(drifts))
    report = DriftReport((box,), "inventory/lab.yaml", "2026-12-01T00:00:00Z", "r1")
    return {fmt: render(report, fmt) for fmt in FORMATS}


def assert_no_clear_secret(text: str) -> None:
    for secret in [*SECRETS, *(v.rsplit(" ", 1)[-1].split("=")[-1] for v in OTHER.values())]:
        assert secret not in text, secret


# -- on the box ------------------------------------------------------------------------------------
def test_a_value_carrying_a_secret_leaves_the_box_hashed_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = observe(tmp_path, monkeypatch, DESIRED, DESIRED)
    assert_no_clear_secret(json.dumps(raw))
    lines = {line["key"]: line["value"] for line in raw["envfile"]}
    for key, (_, _, _, readable) in INLINE.items():
        assert lines[key].startswith(readable + HASHED), key  # what is no secret stays readable
    # Every captured line that carries no secret is sent exactly as the lab's box sent it.
    for line in CAPTURED["envfile"]:
        if isinstance(line["value"], str):
            assert lines[line["key"]] == line["value"], line["key"]


# -- compared on the controller --------------------------------------------------------------------
def test_an_unchanged_value_is_no_drift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = observe(tmp_path, monkeypatch, DESIRED, DESIRED)
    assert_no_clear_secret(json.dumps(raw))
    assert envfile_drifts(typed(raw), DESIRED) == {}


def test_a_changed_inline_secret_is_drift_shown_as_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = observe(tmp_path, monkeypatch, OTHER, DESIRED)
    drifts = envfile_drifts(typed(raw), DESIRED)
    assert sorted(drifts) == sorted(INLINE)
    for drift in drifts.values():
        assert isinstance(drift.desired, SecretValue) and isinstance(drift.observed, SecretValue)
        assert drift.secret_changed is True
    for fmt, text in reports(list(drifts.values())).items():
        assert_no_clear_secret(text)
        assert MASKED[fmt] in text, fmt
    assert "*** (changed)" in reports(list(drifts.values()))["text"]


def test_a_change_beside_the_secret_is_shown_with_the_secret_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_box = dict(DESIRED, VLLM_ARGS="--api-key sk-live-123 --port 8001")
    raw = observe(tmp_path, monkeypatch, on_box, DESIRED)
    drifts = envfile_drifts(typed(raw), DESIRED)
    assert sorted(drifts) == ["VLLM_ARGS"]
    text = reports(list(drifts.values()))["text"]
    assert_no_clear_secret(text)
    assert "--api-key *** --port 8001" in text  # what changed beside the secret is readable


def test_a_saved_snapshot_holds_no_clear_secret_and_replays_as_the_live_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = observe(tmp_path, monkeypatch, OTHER, DESIRED)
    live = envfile_drifts(typed(raw), DESIRED)
    snapshot = tmp_path / "snapshot"
    save_snapshot(snapshot, {"thor": BoxObservation("thor", raw, None, complete=False)}, {})
    data = (snapshot / "thor.json").read_bytes()
    assert_no_clear_secret(data.decode("utf-8"))
    doc = load_snapshot(snapshot)[1]["thor"].document
    assert doc is not None and envfile_drifts(doc, DESIRED) == live
    fast = read_snapshot_file(data)  # a large replay's reader reads the new field alike
    assert fast is not None and fast.document.envfile_desired == doc.envfile_desired
    assert lines(fast.document) == lines(doc)
    assert envfile_drifts(fast.document, DESIRED) == live


def test_a_snapshot_replayed_against_another_desired_value_never_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = observe(tmp_path, monkeypatch, DESIRED, DESIRED)
    other = dict(DESIRED, VLLM_ARGS="--api-key sk-live-123 --port 9")  # edited since the save
    drifts = envfile_drifts(typed(raw), other)
    assert sorted(drifts) == ["VLLM_ARGS"]
    (drift,) = drifts.values()
    assert isinstance(drift.desired, SecretValue)
    assert drift.note is not None and "no digest of the desired value" in drift.note
    assert_no_clear_secret(repr(drift) + "".join(reports([drift]).values()))


def test_an_older_snapshots_clear_line_is_never_shown() -> None:
    """A line saved before the box hashed inline secrets holds one in clear."""
    line = {"key": "VLLM_ARGS", "value": OTHER["VLLM_ARGS"], "line": 3}
    doc = typed({"collector": 1, "envfile": [line]})
    drifts = envfile_drifts(doc, DESIRED)
    assert sorted(drifts) == sorted(INLINE)
    for fmt, text in reports(list(drifts.values())).items():
        assert_no_clear_secret(text)
        assert MASKED[fmt] in text, fmt


# -- the login shell (compare/shell.py) ----------------------------------------------------------
def test_an_export_of_the_env_value_names_no_carrier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker carries the shell's value, which is `.env`'s own: no container carries a
    value other than `.env`'s, and the leak's `.env` side is never in clear."""
    exported = {"VLLM_ARGS": DESIRED["VLLM_ARGS"]}
    raw = observe(tmp_path, monkeypatch, DESIRED, DESIRED, exported)
    (leak,) = compare_shell(expectation(DESIRED), typed(raw))
    assert leak.path == "VLLM_ARGS" and "carry the shell's value" not in (leak.note or "")
    assert leak.desired == leak.observed
    assert_no_clear_secret(repr(leak))


def test_an_older_snapshots_clear_line_beside_a_hashed_export_names_no_carrier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exported = {"VLLM_ARGS": DESIRED["VLLM_ARGS"]}
    raw = observe(tmp_path, monkeypatch, DESIRED, DESIRED, exported)
    doc = typed(raw)
    clear = [
        EnvLine(line.key, DESIRED["VLLM_ARGS"], line.line) if line.key == "VLLM_ARGS" else line
        for line in doc.envfile or ()
    ]  # as a collector that hashed no inline secret saved it
    (leak,) = compare_shell(expectation(DESIRED), replace(doc, envfile=tuple(clear)))
    assert "carry the shell's value" not in (leak.note or "")
    assert_no_clear_secret(repr(leak) + "".join(reports([leak]).values()))


def test_the_whole_box_compares_to_no_env_drift(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = observe(tmp_path, monkeypatch, DESIRED, DESIRED)
    result = compare_box(expectation(DESIRED), typed(raw))
    assert not [d for d in result.drifts if d.kind is Kind.ENVFILE and d.path in INLINE]
    assert_no_clear_secret(repr(result))


# -- the render's basis (compare/render_basis.py) -------------------------------------------------
def test_the_box_and_the_controller_agree_on_the_basis_of_both_env_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler.compare import render_basis

    deploy = tmp_path / "deploy"
    deploy.mkdir()
    current = captured_env(written(OTHER))
    (deploy / ".env").write_text(current, encoding="utf-8")
    run = collector.Run(
        {"run_key": "k" * 32, "secret_patterns": [], "directory": str(deploy),
         "managed_env": dict(DESIRED)}
    )  # fmt: skip
    envfile, _ = collector.envfile_fact(run)
    raw = {"collector": 1, "envfile": envfile, "envfile_desired": collector.envfile_desired(run)}
    doc = typed(json.loads(json.dumps(raw)))
    pairs = render_basis.current_pairs(doc)
    assert pairs is not None
    assert collector.env_basis(run, current) == render_basis.env_basis(pairs)
    desired_text = collector.desired_envfile(run, current, {})
    entries = expectation(DESIRED).env
    want = render_basis.env_basis(render_basis.desired_pairs(doc, entries))
    assert collector.env_basis(run, desired_text) == want


# -- import and audit, on saved answers holding such a line --------------------------------------
def with_hashed_line(source: Path, target: Path, box: str) -> Path:
    """The snapshot `source` copied to `target`, `box`'s answer given a `.env` pin compose does
    not interpolate, which its lanes carry (env_file), holding a secret hashed in place."""
    shutil.copytree(source, target)
    saved = json.loads((target / f"{box}.json").read_text(encoding="utf-8"))
    collected = saved["collected"]
    hashed = "Authorization: Bearer " + json.dumps({"secret": "hmac:" + "ab" * 32})
    # An audit's saved answer holds no `.env` lines (the audit reads its own section's).
    collected.setdefault("envfile", []).append({"key": "CURL_HDR", "value": hashed, "line": 2000})
    for container in collected["docker"]["containers"]:
        if container["service"] != "gateway":
            container["env"]["CURL_HDR"] = hashed
    data = (json.dumps(saved, indent=1, sort_keys=True) + "\n").encode("utf-8")
    (target / f"{box}.json").write_bytes(data)
    index = json.loads((target / "index.json").read_text(encoding="utf-8"))
    if "sha256" in index:  # the file's digest as its index records it (a newer save)
        index["sha256"][box] = hashlib.sha256(data).hexdigest()
        (target / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return target


def test_import_never_adopts_a_value_carrying_a_hashed_secret(tmp_path: Path) -> None:
    snapshot = with_hashed_line(LAB_DESIRED, tmp_path / "snapshot", "thor")
    root, code, printed = import_snapshot(snapshot, tmp_path / "adopted")
    assert code in (0, 2), printed
    written_text = "".join(
        p.read_text(encoding="utf-8") for p in sorted((root / "group_vars").rglob("*.yaml"))
    )
    assert "hmac:" not in written_text and "CURL_HDR" not in written_text
    assert "CURL_HDR carries a secret" in printed


def test_the_audit_judges_a_box_with_such_a_line_as_without_it(tmp_path: Path) -> None:
    from reconciler.audit.run import audit_report
    from tests.unit.test_audit_snapshots import fleet

    def verdicts(snapshot: Path) -> list[tuple[str, str, list[str]]]:
        observations = load_snapshot(snapshot)[1]
        report = audit_report(fleet({}), ["thor", "spark", "orin"], observations, "r1")
        return [(v.subject, v.verdict, sorted(f.code for f in v.findings)) for v in report.verdicts]

    scenario = REPO / "tests/fixtures/audit/fully_keyed_mesh"
    edited = with_hashed_line(scenario, tmp_path / "snapshot", "thor")
    thor = load_snapshot(edited)[1]["thor"].document
    assert thor is not None and "CURL_HDR" in thor.envfile_by_key()  # read, not refused
    assert verdicts(edited) == verdicts(scenario)
