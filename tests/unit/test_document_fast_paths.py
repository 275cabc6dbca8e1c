"""The observation document checks well-formed values in bulk and builds a field path only
when something is wrong: every malformed value must still be a located fault of that box."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.observe.document import Fault, Observed, SecretValue, parse_collected

SNAPSHOT = Path(__file__).resolve().parents[2] / "examples" / "lab-incidents" / "snapshot"
DIGEST = "hmac:" + "ab" * 32


def _thor() -> dict[str, Any]:
    return json.loads((SNAPSHOT / "thor.json").read_text(encoding="utf-8"))["collected"]


def test_the_captured_answer_parses_with_its_secrets_typed() -> None:
    doc = parse_collected(_thor())
    assert isinstance(doc, Observed)
    secrets = [e for e in doc.envfile or () if isinstance(e.value, SecretValue)]
    assert secrets and all(str(e.value) == "***" for e in secrets)
    env_secrets = [v for c in doc.containers for v in c.env.values() if isinstance(v, SecretValue)]
    assert env_secrets


def _first_container_with_secret_env(raw: dict[str, Any]) -> tuple[int, str]:
    for i, c in enumerate(raw["docker"]["containers"]):
        for key, value in c["env"].items():
            if isinstance(value, dict):
                return i, key
    raise AssertionError("the capture has no hashed container variable")


def _secret_line(raw: dict[str, Any]) -> int:
    return next(i for i, e in enumerate(raw["envfile"]) if isinstance(e["value"], dict))


@pytest.mark.parametrize(
    ("name", "mutate", "where"),
    [
        ("line zero", lambda r: r["envfile"][3].update(line=0), "envfile[3].line"),
        ("line as text", lambda r: r["envfile"][3].update(line="7"), "envfile[3].line"),
        ("key with LF", lambda r: r["envfile"][2].update(key="A\nB"), "envfile[2].key"),
        ("surrogate", lambda r: r["envfile"][1].update(value="\ud800"), "envfile[1].value"),
        ("short digest",
         lambda r: r["envfile"][_secret_line(r)].update(value={"secret": "hmac:ab"}),
         "envfile[{secret_line}].value.secret"),
        ("digest with extra key",
         lambda r: r["envfile"][_secret_line(r)].update(value={"secret": DIGEST, "value": "x"}),
         "envfile[{secret_line}].value"),
        ("env secret upper-case hex",
         lambda r: r["docker"]["containers"][_first_container_with_secret_env(r)[0]]["env"].update(
             {_first_container_with_secret_env(r)[1]: {"secret": DIGEST.upper()}}),
         "docker.containers[{c}].env"),
        ("argv number", lambda r: r["docker"]["containers"][0].update(cmd=["serve", 8000]),
         "docker.containers[0].cmd[1]"),
        ("argv bad secret", lambda r: r["docker"]["containers"][0].update(cmd=[{"secret": 1}]),
         "docker.containers[0].cmd[0].secret"),
    ],
)  # fmt: skip
def test_a_malformed_value_is_a_located_fault(name: str, mutate: Any, where: str) -> None:
    raw = copy.deepcopy(_thor())
    fill = {"secret_line": _secret_line(raw), "c": _first_container_with_secret_env(raw)[0]}
    mutate(raw)
    doc = parse_collected(raw)
    assert isinstance(doc, Fault), name
    assert where.format(**fill) in doc.message, (name, doc.message)
    assert DIGEST not in doc.message and DIGEST.upper() not in doc.message
