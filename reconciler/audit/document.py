"""The JSON audit report as pydantic models: the source of its JSON Schema
(schema/audit-report.schema.json) and the validator tests run rendered documents through.

Only the schema command and tests import this module; rendering builds plain dicts.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_ID = "fleet-reconciler/audit-report"
# 2: each box's `observation` and `partial` (a box seen from the mesh side); 3: a `.env` line
# and a carried key's origin may be `unknown` (.env not read), mixed members are `open`, the
# mesh's `not_in_run`; 4: `published.stray`, `stray_host_network`, `running` (containers
# outside the compose project), lane_probes also asks extra gateway and stray ports; 5:
# `stray[*].expected_by` and `expected_host_network` (audit.expected_containers); 6: a box
# whose gateway answered no gated request is observation `full` with its `evidence`, not
# audited, fault `not-observed` at `gateway` (was `unreachable`, evidence null); later, no
# meaning changed: `published.host_network_error` (docs/audit-report.md).
VERSION = 6

Count = Annotated[int, Field(ge=0)]
Severity = Literal["ok", "warn", "fail"]
Posture = Literal["keyed", "open", "mixed", "unknown"]
Status = int | None


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Secret(_Doc):
    """A secret, never in clear: 12 hex of SHA-256 over the collector's per-run HMAC. Equal
    digests within one run are equal values ("same as spark"); across runs they differ."""

    secret: Literal[True]
    digest: Annotated[str, Field(pattern=r"^[0-9a-f]{12}$")]


class FindingDoc(_Doc):
    code: str = Field(description="stable rule code, e.g. mesh.weakest-link (verdict.py)")
    severity: Literal["warn", "fail"]
    message: str = Field(description="one line for a person; secrets only as digests")


class VerdictFields(_Doc):
    verdict: Severity = Field(description="the worst finding's severity; ok without findings")
    audited: bool = Field(description="false: the subject could not be audited (exit 1)")
    findings: list[FindingDoc] = Field(description="worst first")
    reasons: list[str] = Field(description="what the evidence proves, finding or not")


class ApiKeyIntent(_Doc):
    secret: str | None = Field(description="the desired secret's name (gateway.api_key)")
    source: str | None = Field(description="where the box holds it, e.g. ~/.lobes/.secrets.env")
    status: str | None = Field(
        description="ok | file-missing | file-unreadable | key-missing | not-sent"
    )
    digest: Secret | None
    one_per_box: bool = Field(description="true: each box has its own value (box_file source)")


class MeshIntent(_Doc):
    enabled: bool
    secret: str | None
    status: str | None
    digest: Secret | None


class IntentDoc(_Doc):
    auth: Literal["keyed", "open"]
    api_key: ApiKeyIntent
    mesh: MeshIntent
    bind: str
    port: int


class EnvLineDoc(_Doc):
    state: Literal["set", "empty", "commented-out", "absent", "no-file", "unknown"] = Field(
        description="unknown: .env could not be read, or the audit section failed (version 3)"
    )
    line: int | None
    digest: Secret | None = Field(description="also for a commented-out value")


class CarriedDoc(_Doc):
    digest: Secret | None = Field(description="null: empty in the running container")
    origin: Literal["env", "shell", "env+shell", "none", "unexplained", "unknown"] = Field(
        description="where the running value came from; unexplained = neither .env nor the "
        "login shell (stale, or started by hand); unknown = .env was not read (version 3)"
    )
    where: str | None = Field(description='".env:1193" or "~/.bashrc:7"')


class GatewayDoc(_Doc):
    container: str | None
    status: str | None
    inbound_key: str | None = Field(description="the variable whose value the gate enforces")
    carries: dict[str, CarriedDoc]
    mesh_name: str | None


class ShellExportDoc(_Doc):
    name: str
    source: str | None = Field(description='"~/.bashrc:7"')
    digest: Secret | None = Field(description="null: exported empty")


class ProbeDoc(_Doc):
    status: Status
    error: str | None


class ChatProbeDoc(ProbeDoc):
    model: str | None


class SideDoc(_Doc):
    health: ProbeDoc
    capabilities: ProbeDoc
    models: ProbeDoc = Field(description="GET /v1/models without credentials")
    chat: ChatProbeDoc = Field(description="POST /v1/chat/completions without credentials")


class KeyedDoc(_Doc):
    status: Status
    key_from: str | None = Field(description='"secret:gateway_api_key" or ".env:GATEWAY_API_KEY"')
    digest: Secret | None
    note: str | None


class ProbesDoc(_Doc):
    loopback: SideDoc | None = Field(description="from the box itself")
    mesh_side: SideDoc | None = Field(description="from the controller, as a mesh caller")
    keyed: KeyedDoc | None = Field(description="GET /v1/models with the right key, on the box")
    mesh_keyed: KeyedDoc | None = Field(description="GET /v1/models with the mesh key, on the box")


class BindingDoc(_Doc):
    container: str
    service: str | None
    address: str = Field(description="host address:port; 0.0.0.0 = every interface")
    container_port: str


class StrayBindingDoc(BindingDoc):
    expected_by: str | None = Field(
        description="the desired audit.expected_containers entry (name or pattern) declaring "
        "this port: expected, no finding unless it answers as an open LLM API; null: a stray"
    )


class LaneProbeDoc(_Doc):
    container: str
    url: str
    status: Status
    error: str | None


class PublishedDoc(_Doc):
    gateway: list[BindingDoc]
    lanes: list[BindingDoc] = Field(description="should be empty: lanes only via the gateway")
    host_network: list[str] = Field(
        description="the project's containers on the host network, not stopped; empty with "
        "host_network_error set: not listed, never none"
    )
    host_network_error: str | None = Field(
        description="why the project's containers on the host network could not be listed "
        "(the box's words, scrubbed); null: listed"
    )
    lane_probes: list[LaneProbeDoc] = Field(
        description="GET /v1/models without a key from the controller, at the box's own "
        "inventory address only: each published lane, extra gateway and stray port"
    )
    stray: list[StrayBindingDoc] = Field(
        description="ports published by running containers outside the compose project "
        "(service: their project/service, else their image)"
    )
    stray_host_network: list[str] = Field(
        description="running containers outside the compose project on the host network"
    )
    expected_host_network: list[str] = Field(
        description="those of stray_host_network a desired audit.expected_containers entry "
        "names: expected"
    )
    running: str | None = Field(
        description="why the box's other running containers are not (all) known; null: listed"
    )


class KeyUseDoc(_Doc):
    digest: Secret | None
    matches_desired: bool | None
    same_as: list[str]


class BoxMeshDoc(_Doc):
    on: bool
    detect: bool | None = Field(description="GET /mesh/detect from the mesh side")
    proxied: dict[str, str] = Field(description="role -> member, from /capabilities")


class EvidenceDoc(_Doc):
    posture: Posture
    envfile: dict[str, EnvLineDoc]
    gateway: GatewayDoc
    shell_exports: list[ShellExportDoc]
    probes: ProbesDoc
    published: PublishedDoc
    keys: dict[Literal["inbound", "mesh"], KeyUseDoc]
    mesh: BoxMeshDoc


class FaultDoc(_Doc):
    """Why a box could not be audited, as a value (observe/document.py's Fault)."""

    kind: Literal[
        "unreachable",
        "collector-failed",
        "not-json",
        "too-large",
        "malformed",
        "unsupported-version",
        "not-observed",
        "recorded",
    ] = Field(
        description="unreachable: no answer; collector-failed; not-json: truncated or not "
        "UTF-8; too-large: over the size limit; malformed: a field of the wrong type or range; "
        "unsupported-version; not-observed: nothing to read (no audit section, not in the "
        "snapshot), or, at path `gateway`, the box answered but its gateway answered no gated "
        "request from either side (version 6: `evidence` is there); recorded: a snapshot's box "
        "that was not observed then"
    )
    path: str | None = Field(description="the field of the box's answer, for malformed")
    what: str = Field(description="what was wrong, never the value")


class PartialDoc(_Doc):
    """A box not audited (SSH failed) whose gateway answered the controller (version 2)."""

    posture: Posture = Field(description="from the mesh side's unauthenticated requests only")
    mesh_side: SideDoc = Field(description="from the controller, as a mesh caller")
    mesh: BoxMeshDoc = Field(description="`on`: GET /mesh/detect's answer")


class BoxDoc(VerdictFields):
    box: str
    errors: list[str]
    fault: FaultDoc | None = Field(description="why the box could not be audited; null if it was")
    intent: IntentDoc
    evidence: EvidenceDoc | None = Field(
        description="the box's own answer, for a full observation (audited or not); else null"
    )
    observation: Literal["full", "partial", "none"] = Field(
        description="full: the box's own answer was read (`evidence`): audited, unless its "
        "gateway answered no gated request (version 6; fault not-observed at `gateway`); "
        "partial: not audited, but its gateway answered the controller (see `partial`); none "
        "(version 2)"
    )
    partial: PartialDoc | None = Field(description="for a partial observation; else null")


class ProofDoc(_Doc):
    via: str = Field(description="the open member the request was sent to")
    role: str
    host: str = Field(description="the keyed member whose contract serves the role")
    url: str
    status: Status
    mesh_member: str | None = Field(description="X-Lobes-Mesh-Member")
    proxied_by: str | None = Field(description="X-Lobes-Proxied-By")
    error: str | None
    proven: bool


class MeshDoc(VerdictFields):
    members: list[str] = Field(description="desired members, over the whole fleet")
    live_members: list[str]
    open: list[str] = Field(
        description="live members answering a gated route without a key: posture open, or "
        "mixed (version 3)"
    )
    keyed: list[str]
    mesh_keys: dict[str, Secret | None]
    proofs: list[ProofDoc]
    unaudited: list[str]
    not_in_run: list[str] = Field(
        description="desired members this run did not audit (a subset of the boxes; version 3)"
    )


class SummaryDoc(_Doc):
    boxes: Count
    audited: Count
    ok: Count
    warn: Count
    fail: Count
    mesh: Severity
    findings: Count
    exit_code: Literal[0, 1, 2] = Field(
        description="0 every verdict ok, 2 any finding, 1 a box not audited (worst wins)"
    )


class AuditReportDoc(_Doc):
    """fleet-reconciler audit: who can call what on the mesh, and why."""

    schema_: Literal["fleet-reconciler/audit-report"] = Field(alias="schema")
    version: Literal[6]
    run_id: str
    generated_at: str = Field(json_schema_extra={"format": "date-time"})
    inventory: str
    summary: SummaryDoc
    boxes: list[BoxDoc] = Field(description="in inventory order")
    mesh: MeshDoc


def json_schema() -> dict[str, Any]:
    schema = AuditReportDoc.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"fleet-reconciler audit report, version {VERSION}"
    return schema
