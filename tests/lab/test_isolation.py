"""Three boxes on one machine must not be one box: separate engines, homes, sockets, netns."""

from __future__ import annotations

import json
import secrets

import pytest

pytestmark = pytest.mark.lab

SCRUBBED = "env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=$HOME"


def test_each_box_has_its_own_engine(lab, on_box):
    ids = {}
    for name, box in lab["boxes"].items():
        out = on_box(name, f"{SCRUBBED} docker info --format '{{{{json .}}}}'").stdout
        info = json.loads(out)
        assert info["DockerRootDir"] == box["data_root"]
        ids[name] = info["ID"]
    assert len(set(ids.values())) == 3


def test_container_on_thor_is_invisible_on_spark(lab, on_box):
    name = f"probe-{secrets.token_hex(4)}"
    image = lab["images"]["vllm_nightly"]
    on_box("thor", f"{SCRUBBED} docker run -d --name {name} --entrypoint sleep {image} 120")
    try:
        assert name in on_box("thor", f"{SCRUBBED} docker ps --format '{{{{.Names}}}}'").stdout
        for other in ("spark", "orin"):
            listed = on_box(other, f"{SCRUBBED} docker ps -a --format '{{{{.Names}}}}'").stdout
            assert name not in listed.split()
            assert on_box(other, f"docker inspect {name}", check=False).returncode != 0
    finally:
        on_box("thor", f"docker rm -f {name}", check=False)


def test_box_user_cannot_use_another_boxs_socket(lab, on_box):
    spark_sock = lab["boxes"]["spark"]["docker_socket"]
    proc = on_box("thor", f"docker -H unix://{spark_sock} ps", check=False)
    assert proc.returncode != 0
    assert "permission denied" in proc.stderr.lower()


def test_scrubbed_docker_reaches_the_own_engine_through_the_context(lab, on_box):
    for name, box in lab["boxes"].items():
        out = on_box(name, f"{SCRUBBED} docker context show").stdout.strip()
        assert out == box["docker_context"]
        ps = on_box(name, f"{SCRUBBED} docker ps --format '{{{{.Names}}}}'").stdout.split()
        assert "model-gear-gateway" in ps


def test_homes_are_separate(lab, on_box):
    for name, box in lab["boxes"].items():
        assert on_box(name, "echo $HOME").stdout.strip() == box["home"]
        env = on_box(name, "grep -E '^LOBES_PROFILE=' ~/.lobes/.env").stdout
        assert env.strip().split("=", 1)[1].split()[0] == box["profile"]
        for other, obox in lab["boxes"].items():
            if other != name:
                assert on_box(name, f"ls {obox['home']}", check=False).returncode != 0


def test_each_box_sits_in_its_own_namespace(lab, on_box):
    for name, box in lab["boxes"].items():
        addrs = on_box(name, "ip -o -4 addr show").stdout
        assert f" {box['address']}/24 " in addrs
        for other, obox in lab["boxes"].items():
            if other != name:
                assert f" {obox['address']}/" not in addrs
        # No default route: nothing beyond the lab subnet is reachable from a box.
        assert "default" not in on_box(name, "ip route show").stdout
