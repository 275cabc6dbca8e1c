"""The JSON drift report as pydantic models: the single source of its JSON Schema, and the
validator the tests (and any consumer in Python) run rendered documents through.

Only `json_report.drift_report_schema()` and tests import this module, so `reconcile drift`
does not pay for building these models on every run.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from typing_extensions import TypeAliasType

from reconciler.compare.drift import Action, Kind

SCHEMA_ID = "fleet-reconciler/drift-report"
VERSION = 2

Count = Annotated[int, Field(ge=0)]


class _Doc(BaseModel):
    # strict + forbid: a consumer relying on this schema must not meet a "2" for 2 or an extra key
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Secret(_Doc):
    """A secret value, never in clear: the first 12 hex of SHA-256 over the collector's keyed
    digest. Equal secrets within one run have equal digests ("same key on thor and spark");
    digests are only promised to compare within one run."""

    secret: Literal[True]
    digest: Annotated[str, Field(pattern=r"^[0-9a-f]{12}$")]


def _not_secret_shaped(value: dict[str, Any]) -> dict[str, Any]:
    # So a consumer can rely on it: an object with a "secret" key IS a Secret, never a look-alike
    # carrying a full digest (or worse). json_schema() says the same in the schema.
    if "secret" in value:
        raise ValueError("an object with a 'secret' key must be {secret: true, digest: 12 hex}")
    return value


# Drift values and facts: JSON values, with tuples as arrays and any secret as a Secret object.
Value = TypeAliasType(
    "Value",
    "Secret | list[Value] | Annotated[dict[str, Value], AfterValidator(_not_secret_shaped)]"
    " | str | int | float | bool | None",
)


class DriftDoc(_Doc):
    """One difference; the box is the enclosing box entry's."""

    kind: Kind
    subject: str = Field(description='"lane:vllm-worker", "gateway", "file:.env", "shell", "host"')
    path: str = Field(description='"WORKER_MAX_MODEL_LEN", "--max-model-len", "8000/tcp", ...')
    desired: Value
    observed: Value
    action: Action = Field(description="what a converge would do about it")
    source: str | None = Field(description='where the observed value came from: "~/.bashrc:6"')
    note: str | None = Field(description="one line for a person: why this matters")
    secret: bool = Field(description="desired or observed is a secret")
    changed: bool | None = Field(description="for a secret: do the digests differ; else null")
    cause: str = Field(
        description="what fixes it, the same id on every entry it explains and on every box: "
        '"envfile:HAND_IMAGE", "compose-file:docker-compose.override.yml", "shell:VAR", '
        '"image:vllm-embed", ...; an entry nothing else explains is its own cause (version 2)'
    )
    symptom: bool = Field(
        description="true: the entry follows from its cause's change (a container carrying a "
        "missing .env key); false: it is that change, or part of it (version 2)"
    )

    @model_validator(mode="after")
    def _changed_only_for_secrets(self) -> DriftDoc:
        # JSON Schema could say this with if/then; the test validator says it more plainly.
        if (self.changed is None) == self.secret:
            raise ValueError("changed must be a bool for a secret drift and null otherwise")
        return self


class BoxDoc(_Doc):
    """One box: why it could not be observed (errors), small facts, and its drifts in order."""

    box: str
    reachable: bool
    observation: Literal["full", "partial", "none"] = Field(
        description="full: the box's own answer; partial: SSH failed (reachable is false, the "
        "errors say why) but the gateway answered the controller, and what that shows is "
        "compared; none: nothing was observed"
    )
    partial: str | None = Field(
        description="for a partial observation: what was seen, e.g. 'GET /v1/models without a "
        "key 401 (keyed)'; else null"
    )
    errors: list[str]
    facts: dict[str, Value]
    drifts: list[DriftDoc]


class SummaryDoc(_Doc):
    boxes: Count
    reachable: Count
    unreachable: Count
    with_errors: Count = Field(description="boxes with at least one error, reachable or not")
    drifted_boxes: Count = Field(description="boxes with at least one drift")
    drifts: Count
    causes: Count = Field(description="distinct causes; one cause on many boxes counts once")
    by_kind: dict[Kind, Count] = Field(description="drifts per kind; kinds without drift absent")
    exit_code: Literal[0, 1, 2] = Field(
        description="0 no drift, 2 drift, 1 a box unreachable or with errors (worst wins)"
    )


class DriftReportDoc(_Doc):
    """fleet-reconciler drift report: what differs between the desired state and the boxes.

    Version 2 added each drift's `cause` and `symptom`, `summary.causes`, and each box's
    `observation` and `partial`; a version-1 reader can ignore them (docs/drift-report.md)."""

    schema_: Literal["fleet-reconciler/drift-report"] = Field(alias="schema")
    version: Literal[2] = Field(description="bumped on any change a consumer must know about")
    run_id: str
    generated_at: str = Field(json_schema_extra={"format": "date-time"})
    inventory: str
    summary: SummaryDoc
    boxes: list[BoxDoc] = Field(description="in inventory order")


def json_schema() -> dict[str, Any]:
    """The document's JSON Schema (draft 2020-12), generated from the models above."""
    schema = DriftReportDoc.model_json_schema(by_alias=True)
    # pydantic cannot express the validator on Value's object branch; add it by hand.
    for branch in schema["$defs"]["Value"]["anyOf"]:
        if branch.get("type") == "object":
            branch["not"] = {"required": ["secret"]}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"fleet-reconciler drift report, version {VERSION}"
    return schema
