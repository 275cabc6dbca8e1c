"""The stand-in lanes serve exactly the argv compose gave them."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.lab


def _flag(cmd, name):
    for token in cmd:
        if token.startswith(name + "="):
            return token.split("=", 1)[1]
    return None


@pytest.mark.parametrize("box", ["thor", "spark", "orin"])
def test_every_lane_serves_the_max_model_len_it_was_given(lab, on_box, box):
    for service in lab["boxes"][box]["services"]:
        if service == "gateway":
            continue
        name = f"model-gear-{service}"
        cmd = json.loads(
            on_box(box, f"docker inspect {name} --format '{{{{json .Config.Cmd}}}}'").stdout
        )
        given = _flag(cmd, "--max-model-len")
        assert given, (box, service, cmd)
        models = json.loads(
            on_box(box, f"docker exec {name} curl -fsS localhost:8000/v1/models").stdout
        )
        assert models["data"][0]["max_model_len"] == int(given), (box, service)


def test_spark_cortex_window_is_the_rendered_one(lab, on_box):
    cmd = json.loads(on_box("spark", "docker inspect model-gear-vllm-primary "
                                     "--format '{{json .Config.Cmd}}'").stdout)  # fmt: skip
    assert _flag(cmd, "--max-model-len") == "262144"
