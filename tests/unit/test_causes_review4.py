"""Causes (review 4): a value match links an entry only to entries of what it is about.

Windows (8192, 32768, 131072) and image references recur across lanes, so a `contract`, `argv`
or `image` entry whose (desired, observed) pair merely equals another lane's `.env` entry was
reported as that key's symptom. Replayed from examples/lab-incidents' captured snapshot, with
one box's observation edited as the reviewer did (the edit is named in each case).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.compare.causes import Link, link_box
from reconciler.compare.drift import Action, Drift, Kind
from tests.unit.example_replay import replay_edited

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lab-incidents"
# The running embed lane's image on orin in the example (its catalog digest is 0e295fa0...).
ORIN_EMBED_IMAGE = (
    "10.77.0.1:5000/vllm/vllm-openai@sha256:"
    "be8937ce9015861b50911bfbc00991c79b8dc2b066c02d19823bba80f94573eb"
)


def _replay(
    tmp: Path, box: str, edit: Callable[[dict[str, Any]], None]
) -> dict[tuple[str, str, str], Link]:
    """The example replayed with `box`'s collected observation edited: (kind, subject, path)
    of each of that box's entries -> its link."""
    _, run = replay_edited(tmp, box, edit)
    (result,) = [b for b in run.report.boxes if b.box == box]
    return {
        (d.kind.value, d.subject, d.path): link
        for d, link in zip(result.drifts, link_box(result.drifts), strict=True)
    }


def _set_env(collected: dict[str, Any], key: str, value: str) -> None:
    entries = collected["envfile"]
    found = [e for e in entries if e["key"] == key]
    if found:
        found[0]["value"] = value
    else:
        entries.append({"key": key, "line": max(e["line"] for e in entries) + 1, "value": value})


def _embed_window(collected: dict[str, Any], window: int) -> None:
    """The embed lane runs with another --max-model-len (docker inspect's Config.Cmd)."""
    (embed,) = [c for c in collected["docker"]["containers"] if c["name"].endswith("vllm-embed")]
    embed["cmd"] = [
        f"--max-model-len={window}" if a.startswith("--max-model-len=") else a for a in embed["cmd"]
    ]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_a_contract_window_is_not_the_symptom_of_another_roles_key(
    tmp_path: Path, cache: None
) -> None:
    # Reviewer's h6: thor's .env RERANK_MAX_MODEL_LEN 8192 -> 131072, and the gateway
    # advertises 131072 for the embedder (its lane serves 8192): the same pair, but the
    # embedder's window follows EMBED_MAX_MODEL_LEN, which is as desired.
    def edit(c: dict[str, Any]) -> None:
        _set_env(c, "RERANK_MAX_MODEL_LEN", "131072")
        c["gateway"]["capabilities"]["body"]["embedder"]["context"] = 131072

    links = _replay(tmp_path, "thor", edit)
    assert links[("envfile", "file:.env", "RERANK_MAX_MODEL_LEN")] == Link(
        "envfile:RERANK_MAX_MODEL_LEN", False
    )
    contract = links[("contract", "gateway", "capabilities.embedder.context")]
    assert contract == Link("contract:capabilities.embedder.context", False)
    # The real linkage beside it still holds: the worker's window follows WORKER_MAX_MODEL_LEN.
    worker = links[("contract", "gateway", "capabilities.worker.context")]
    assert worker == Link("envfile:WORKER_MAX_MODEL_LEN", True)


def test_a_lanes_flag_is_not_the_symptom_of_another_lanes_key(tmp_path: Path, cache: None) -> None:
    # thor's embed lane started with --max-model-len=131072 while .env's RERANK_MAX_MODEL_LEN
    # went 8192 -> 131072: the embed lane never reads RERANK_*, so its flag is its own cause,
    # and the gateway's stale embedder window and the lane's /v1/models follow that flag.
    def edit(c: dict[str, Any]) -> None:
        _set_env(c, "RERANK_MAX_MODEL_LEN", "131072")
        _embed_window(c, 131072)

    links = _replay(tmp_path, "thor", edit)
    assert links[("argv", "lane:vllm-embed", "--max-model-len")] == Link("argv:vllm-embed", False)
    assert links[("contract", "gateway", "capabilities.embedder.context")] == Link(
        "argv:vllm-embed", True
    )
    assert links[("contract", "lane:vllm-embed", "v1/models.max_model_len")] == Link(
        "argv:vllm-embed", True
    )
    # The lane that does read the key still follows it (the worker's flag, in the example).
    assert links[("argv", "lane:vllm-worker", "--max-model-len")] == Link(
        "envfile:WORKER_MAX_MODEL_LEN", True
    )


def test_a_lanes_image_is_not_the_symptom_of_another_lanes_image_variable(
    tmp_path: Path, cache: None
) -> None:
    # orin's embed lane runs another image (the example's incident); .env HAND_IMAGE names
    # that same image: the embed lane's image comes from VLLM_NIGHTLY_IMAGE, not HAND_IMAGE.
    links = _replay(tmp_path, "orin", lambda c: _set_env(c, "HAND_IMAGE", ORIN_EMBED_IMAGE))
    assert links[("envfile", "file:.env", "HAND_IMAGE")] == Link("envfile:HAND_IMAGE", False)
    assert links[("image", "lane:vllm-embed", "digest")] == Link("image:vllm-embed", False)


# -- the linkages lobes' tables do prove still hold (and only those) ------------------------------


def _d(kind: Kind, subject: str, path: str, want: Any, got: Any) -> Drift:
    return Drift("thor", kind, subject, path, want, got, Action.RECREATE)


def _env(key: str, want: str, got: str) -> Drift:
    return _d(Kind.ENVFILE, "file:.env", key, want, got)


IMAGE_A = "10.77.0.1:5000/vllm/vllm-openai@sha256:" + "a" * 64
IMAGE_B = "10.77.0.1:5000/vllm/vllm-openai@sha256:" + "b" * 64


@pytest.mark.parametrize(
    ("explaining", "entry", "linked"),
    [
        # The gateway advertises a role's window from <PREFIX>_MAX_MODEL_LEN.
        (
            _env("EMBED_MAX_MODEL_LEN", "8192", "131072"),
            _d(Kind.CONTRACT, "gateway", "capabilities.embedder.context", "8192", 131072),
            True,
        ),
        # Reversed: the lane serves the new window, the gateway its start-time one.
        (
            _d(Kind.ARGV, "lane:vllm-primary", "--max-model-len", "262144", "131072"),
            _d(Kind.CONTRACT, "gateway", "capabilities.cortex.context", 131072, 262144),
            True,
        ),
        (
            _d(Kind.ARGV, "lane:vllm-worker", "--max-model-len", "262144", "131072"),
            _d(Kind.CONTRACT, "gateway", "capabilities.cortex.context", 131072, 262144),
            False,
        ),
        (
            _env("VLLM_NIGHTLY_IMAGE", IMAGE_A, IMAGE_B),
            _d(Kind.IMAGE, "lane:vllm-embed", "digest", IMAGE_A, IMAGE_B),
            True,
        ),
        (
            _env("WORKER_IMAGE", IMAGE_A, IMAGE_B),
            _d(Kind.IMAGE, "lane:vllm-embed", "digest", IMAGE_A, IMAGE_B),
            False,
        ),
        (
            _env("GATEWAY_IMAGE", IMAGE_A, IMAGE_B),
            _d(Kind.IMAGE, "gateway", "digest", IMAGE_A, IMAGE_B),
            True,
        ),
        # The gateway is built with `pip install lobes-cli==${MODEL_GEAR_VERSION}`.
        (
            _env("MODEL_GEAR_VERSION", "0.91.0", "0.90.0"),
            _d(Kind.CONTRACT, "gateway", "health.version", "0.91.0", "0.90.0"),
            True,
        ),
        (
            _env("LOBES_SHAPE", "0.91.0", "0.90.0"),
            _d(Kind.CONTRACT, "gateway", "health.version", "0.91.0", "0.90.0"),
            False,
        ),
        # A flag follows its own lane's knobs only.
        (
            _env("WORKER_MAX_MODEL_LEN", "262144", "131072"),
            _d(Kind.ARGV, "lane:vllm-worker", "--max-model-len", "262144", "131072"),
            True,
        ),
        (
            _env("PRIMARY_MAX_MODEL_LEN", "262144", "131072"),
            _d(Kind.ARGV, "lane:vllm-worker", "--max-model-len", "262144", "131072"),
            False,
        ),
    ],
    ids=lambda v: f"{v.kind.value}:{v.subject}:{v.path}" if isinstance(v, Drift) else str(v),
)
def test_a_value_links_only_what_the_entry_is_about(
    explaining: Drift, entry: Drift, linked: bool
) -> None:
    cause = link_box([explaining, entry])
    assert cause[0].symptom is False
    if linked:
        assert cause[1] == Link(cause[0].cause, True)
    else:
        assert cause[1].symptom is False and cause[1].cause != cause[0].cause
