"""The audit's pure parts on hand-built evidence: where a running key came from, the live
posture, the proof of a weakest link, key reuse, exposure, exit codes, and that no renderer
ever shows more of a secret than a short digest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.audit.evidence import (
    Binding,
    BoxEvidence,
    Carried,
    EnvLine,
    Intent,
    KeyedProbe,
    Probe,
    Proof,
    Published,
    ShellExport,
    Side,
    _carried,
    live_posture,
)
from reconciler.audit.mesh import mesh_evidence, proof_attempts
from reconciler.audit.report import AuditReport
from reconciler.audit.report_json import render_json
from reconciler.audit.report_md import render_markdown
from reconciler.audit.report_text import render_text
from reconciler.audit.verdict import Severity, box_verdict, mesh_verdict
from reconciler.compare.drift import SecretValue
from reconciler.records import replace

K1, K2, MESH = (
    SecretValue("hmac:" + "1" * 64),
    SecretValue("hmac:" + "2" * 64),
    SecretValue("hmac:" + "3" * 64),
)


def side(models: int | None, chat: int | None = None) -> Side:
    return Side(Probe(200), Probe(200), Probe(models), Probe(models if chat is None else chat))


def intent(auth: str = "keyed", key: SecretValue | None = K1) -> Intent:
    return Intent(
        auth=auth,  # type: ignore[arg-type]
        api_key_secret="gateway_api_key" if auth == "keyed" else None,
        api_key_where="~/.lobes/.secrets.env GATEWAY_API_KEY",
        api_key=key if auth == "keyed" else None,
        api_key_status="ok",
        api_key_shared=False,
        mesh=True,
        mesh_key_secret="mesh_key",
        mesh_key=MESH,
        mesh_key_status="ok",
        bind="0.0.0.0",
        port=8000,
    )


def row(
    box: str = "thor",
    auth: str = "keyed",
    live: int = 401,
    key: SecretValue | None = K1,
    env_key: SecretValue | None = K1,
    **changes: object,
) -> BoxEvidence:
    env = {
        "GATEWAY_API_KEY": EnvLine("GATEWAY_API_KEY", "set", 12, env_key)
        if env_key
        else EnvLine("GATEWAY_API_KEY", "commented-out", 839),
        "CULTURE_VLLM_API_KEY": EnvLine("CULTURE_VLLM_API_KEY", "absent"),
        "LOBES_MESH_KEY": EnvLine("LOBES_MESH_KEY", "set", 40, MESH),
    }
    carried = {
        "GATEWAY_API_KEY": Carried("GATEWAY_API_KEY", key, "env" if key else "none", ".env:12"),
        "CULTURE_VLLM_API_KEY": Carried("CULTURE_VLLM_API_KEY", None, "none"),
        "LOBES_MESH_KEY": Carried("LOBES_MESH_KEY", MESH, "env", ".env:40"),
    }
    base = BoxEvidence(
        box=box,
        audited=True,
        errors=(),
        intent=intent(auth, K1 if key is None else key),
        envfile=env,
        gateway_container="model-gear-gateway",
        gateway_status="running",
        carried=carried,
        loopback=side(live),
        mesh_side=side(live),
        keyed=KeyedProbe(200, "secret:gateway_api_key", key) if live == 401 else None,
        published=Published(
            (Binding("model-gear-gateway", "gateway", "", "8000", "8000/tcp"),), (), ()
        ),
        mesh_name=box,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def report(rows: list[BoxEvidence]) -> AuditReport:
    verdicts = tuple(box_verdict(r, [o for o in rows if o is not r]) for r in rows)
    mesh = mesh_evidence({}, rows)
    return AuditReport(tuple(rows), verdicts, mesh, mesh_verdict(mesh), "inv", "now", "r1")


def codes(rows: list[BoxEvidence], box: str) -> set[str]:
    return {f.code for f in report(rows).verdict_of(box).findings}


# -- where the running key came from -----------------------------------------------------------
def carried_origin(container: object, env: EnvLine, shell: ShellExport | None) -> Carried:
    # The container's value as the typed document holds it: the wire's {"secret": digest} is a
    # SecretValue there, an empty value stays "".
    value = SecretValue(container["secret"]) if isinstance(container, dict) else container
    exports = {shell.name: shell} if shell else {}
    return _carried({"GATEWAY_API_KEY": value}, {"GATEWAY_API_KEY": env}, exports)[
        "GATEWAY_API_KEY"
    ]


@pytest.mark.parametrize(
    ("container", "env", "shell", "origin", "where"),
    [
        ({"secret": K1.digest}, EnvLine("GATEWAY_API_KEY", "set", 7, K1), None, "env", ".env:7"),
        (
            {"secret": K1.digest},
            EnvLine("GATEWAY_API_KEY", "commented-out", 839),
            ShellExport("GATEWAY_API_KEY", "~/.bashrc:6", K1),
            "shell",
            "~/.bashrc:6",
        ),
        (
            {"secret": K1.digest},
            EnvLine("GATEWAY_API_KEY", "set", 7, K1),
            ShellExport("GATEWAY_API_KEY", "~/.bashrc:6", K1),
            "env+shell",
            ".env:7",
        ),
        ("", EnvLine("GATEWAY_API_KEY", "commented-out", 839), None, "none", None),
        # .env sets a key, the container has none, no shell explains it: stale
        ("", EnvLine("GATEWAY_API_KEY", "set", 7, K1), None, "unexplained", None),
        # the container's key is neither .env's nor the shell's
        (
            {"secret": K2.digest},
            EnvLine("GATEWAY_API_KEY", "set", 7, K1),
            None,
            "unexplained",
            None,
        ),
        # the shell exports it empty and so disarms .env's key
        (
            "",
            EnvLine("GATEWAY_API_KEY", "set", 7, K1),
            ShellExport("GATEWAY_API_KEY", "~/.profile:3", None),
            "shell",
            "~/.profile:3",
        ),
    ],
)
def test_the_origin_of_a_running_key(container, env, shell, origin, where):
    got = carried_origin(container, env, shell)
    assert (got.origin, got.where) == (origin, where)


# -- posture -------------------------------------------------------------------------------------
def test_live_posture_is_the_gate_not_the_health_check():
    assert live_posture(side(401), side(401)) == "keyed"
    assert live_posture(side(200), side(200)) == "open"
    # past the gate: a 503 from a dead backend is still no gate
    assert live_posture(side(200, 503)) == "open"
    assert live_posture(side(401), side(200)) == "mixed"
    assert live_posture(side(None), None) == "unknown"


def test_a_keyed_box_that_answers_anyone_fails():
    got = report([row(live=200, key=None, env_key=None)]).verdict_of("thor")
    assert got.verdict == Severity.FAIL
    assert {f.code for f in got.findings} >= {"posture.keyed-but-open", "envfile.other-posture"}


def test_a_fully_keyed_box_as_desired_is_ok():
    got = report([row(), row("spark", key=K2, env_key=K2)])
    assert [v.verdict for v in got.verdicts] == [Severity.OK, Severity.OK]
    assert got.mesh_verdict.verdict == Severity.OK
    assert got.exit_code == 0


def test_a_stale_key_fails_and_says_so():
    stale = row(live=200, key=None, env_key=K1)
    stale.carried["GATEWAY_API_KEY"] = Carried("GATEWAY_API_KEY", None, "unexplained")
    assert {"posture.keyed-but-open", "key.stale"} <= codes([stale], "thor")


def test_a_key_armed_from_the_shell_against_an_open_intent_fails():
    armed = row(auth="open", live=401, env_key=None)
    armed.carried["GATEWAY_API_KEY"] = Carried("GATEWAY_API_KEY", K1, "shell", "~/.bashrc:6")
    armed = replace(armed, shell=(ShellExport("GATEWAY_API_KEY", "~/.bashrc:6", K1),))
    got = report([armed]).verdict_of("thor")
    assert got.verdict == Severity.FAIL
    messages = " ".join(f.message for f in got.findings)
    assert {"posture.open-but-keyed", "key.from-login-shell", "shell.secret-export"} <= {
        f.code for f in got.findings
    }
    assert "~/.bashrc:6" in messages


def test_the_wrong_key_and_a_refused_right_key_fail():
    wrong = row(key=K2, env_key=K2)
    wrong = replace(
        wrong, intent=intent(key=K1), keyed=KeyedProbe(401, "secret:gateway_api_key", K1)
    )
    assert {"key.not-desired", "envfile.key-not-desired", "key.right-key-refused"} <= codes(
        [wrong], "thor"
    )


def test_key_reuse_and_the_mesh_key_as_an_api_key():
    a, b = row("thor"), row("spark")  # both carry K1, while each box should have its own
    assert "key.reused" in codes([a, b], "thor")
    assert "same as spark" in " ".join(
        f.message for f in report([a, b]).verdict_of("thor").findings
    )
    meshy = row(key=MESH, env_key=MESH)
    meshy = replace(meshy, intent=intent(key=MESH))
    assert "key.is-mesh-key" in codes([meshy], "thor")


def test_a_published_lane_fails_and_a_loopback_one_warns():
    lanes = (
        Binding("model-gear-vllm-embed", "vllm-embed", "", "18001", "8000/tcp"),
        Binding("model-gear-vllm-hand", "vllm-hand", "127.0.0.1", "18002", "8000/tcp"),
    )
    r = row()
    r = replace(r, published=replace(r.published, lanes=lanes))  # type: ignore[arg-type]
    found = [f for f in report([r]).verdict_of("thor").findings if f.code == "publish.lane"]
    assert [(f.severity, "0.0.0.0:18001" in f.message) for f in found] == [
        (Severity.FAIL, True),
        (Severity.WARN, False),
    ]


def test_a_gateway_published_wider_than_desired_fails():
    r = row()
    r = replace(r, intent=replace(r.intent, bind="10.0.0.5"))
    got = [f for f in report([r]).verdict_of("thor").findings if f.code == "publish.gateway"]
    assert [f.severity for f in got] == [Severity.FAIL]


# -- the mesh ------------------------------------------------------------------------------------
def proof(**kw: object) -> Proof:
    base = Proof("thor", "cortex", "spark", "http://t/v1/chat/completions", 200, "spark",
                 "http://spark:8000", None)  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def test_a_proof_needs_the_mesh_headers_of_the_keyed_member():
    assert proof().proven
    assert not proof(proxied_by=None).proven  # lobes stamps Mesh-Member on local answers too
    assert not proof(mesh_member="thor").proven
    assert not proof(status=503).proven


def test_weakest_link_fails_the_mesh_even_when_every_box_is_as_desired():
    open_thor = row(auth="open", live=200, key=None, env_key=None, proofs=(proof(),))
    keyed_spark = row("spark", key=K2, env_key=K2)
    got = report([open_thor, keyed_spark])
    assert [v.verdict for v in got.verdicts] == [Severity.OK, Severity.OK]
    assert got.mesh_verdict.verdict == Severity.FAIL
    (finding,) = got.mesh_verdict.findings
    assert finding.code == "mesh.weakest-link" and "proven: POST" in finding.message
    assert got.exit_code == 2


def test_weakest_link_without_proof_still_fails_and_says_not_proven():
    got = report([row(auth="open", live=200, key=None, env_key=None), row("spark", key=K2)])
    (finding,) = got.mesh_verdict.findings
    assert finding.severity == Severity.FAIL and "not proven live" in finding.message


def test_an_open_mesh_by_intent_is_ok():
    rows = [row(b, auth="open", live=200, key=None, env_key=None) for b in ("thor", "spark")]
    got = report(rows)
    assert got.exit_code == 0
    assert any("every live member is open" in r for r in got.mesh_verdict.reasons)


def test_mesh_keys_that_differ_fail():
    other = row("spark", key=K2, env_key=K2)
    other.carried["LOBES_MESH_KEY"] = Carried("LOBES_MESH_KEY", K1, "env", ".env:40")
    got = report([row(), other]).mesh_verdict
    assert [f.code for f in got.findings] == ["mesh.keys-differ"]


def test_proof_attempts_go_through_open_members_for_keyed_members_roles():
    from reconciler.desired.load import load_fleet

    fleet = load_fleet(Path(__file__).resolve().parents[2], "hosts")
    rows = [
        row("thor", auth="open", live=200, key=None, env_key=None),
        row("spark", key=K2),
        row("orin", auth="open", live=200, key=None, env_key=None),
    ]
    bases = {b: f"http://{b}:8000" for b in fleet.boxes}
    got = proof_attempts(dict(fleet.boxes), rows, bases)
    # thor and orin proxy cortex to spark (group_vars/{thor,orin}.yaml); nothing else is keyed
    assert [(a.via, a.role, a.host) for a in got] == [
        ("thor", "cortex", "spark"),
        ("orin", "cortex", "spark"),
    ]


def test_a_box_that_cannot_be_audited_exits_1():
    lost = BoxEvidence("orin", False, ("ssh: connect to host orin.lan port 22: timed out",),
                       intent())  # fmt: skip
    got = report([row(), lost])
    assert got.verdict_of("orin").verdict == Severity.FAIL and not got.verdict_of("orin").audited
    assert got.exit_code == 1


# -- no renderer shows a secret ------------------------------------------------------------------
def test_renderers_show_short_digests_never_the_collector_digest():
    armed = row(auth="open", live=401, env_key=None)
    armed = replace(armed, shell=(ShellExport("GATEWAY_API_KEY", "~/.bashrc:6", K1),))
    got = report([armed, row("spark", key=K2, env_key=K2)])
    outputs = [render_text(got), render_markdown(got), render_json(got)]
    for out in outputs:
        for secret in (K1, K2, MESH):
            assert secret.digest not in out and secret.digest[5:20] not in out
    doc = json.loads(outputs[2])
    digest = doc["boxes"][0]["evidence"]["gateway"]["carries"]["GATEWAY_API_KEY"]["digest"]
    assert set(digest) == {"secret", "digest"} and len(digest["digest"]) == 12
    assert f"{digest['digest'][:6]}…" in outputs[0]  # the text shows 6 hex of the same digest
