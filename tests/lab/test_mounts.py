"""A lane brought up by hand from another environment mounts another directory: lobes' bind
sources are interpolated (`${HF_CACHE:-${HOME}/.cache/huggingface}`), and a shell's HF_CACHE
(or sudo's HOME) wins over `.env`. On a real engine, the container's Mounts against the
render's `volumes` name the directory it reads its models from, and a converge recreates it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import pytest

from tests.lab.test_drift import by_path, observe

pytestmark = pytest.mark.lab

RERANK = "model-gear-vllm-rerank"
ELSEWHERE = "/tmp/fleet-lab-mount-elsewhere"  # created by dockerd (compose: create_host_path)
HF = "mounts[/root/.cache/huggingface]"


def test_a_lane_up_from_a_shell_with_its_own_hf_cache_mounts_elsewhere_and_is_recreated(
    lab: Any, on_box: Callable[..., Any], pristine: Callable[[str], None]
) -> None:
    assert not [d for d in observe("thor").drifts if d.path.startswith("mounts[")]
    pristine("thor")  # the lane is recreated below: put back as the lab made it afterwards
    try:
        on_box(
            "thor",
            f"cd ~/.lobes && HF_CACHE={ELSEWHERE} docker compose up -d --no-deps vllm-rerank",
        )
        d = by_path(observe("thor"), "state", HF)
        assert (d.subject, d.desired, d.observed, d.action.value, d.source) == (
            "lane:vllm-rerank",
            "bind /home/fl-thor/.cache/huggingface",
            f"bind {ELSEWHERE}",
            "recreate",
            RERANK,
        )
        # Only that mount: the lane's other binds (./logs, the compile cache) are the same.
        mounts = [m for m in observe("thor").drifts if m.path.startswith("mounts[")]
        assert [m.path for m in mounts] == [HF]
    finally:
        shutil.rmtree(ELSEWHERE, ignore_errors=True)  # dockerd's (root's): the lab runs as root
