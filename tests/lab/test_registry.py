"""Every lab image comes from the lab registry, by digest, and the lanes run those digests."""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.lab

REF = re.compile(r"^10\.77\.0\.1:5000/(?P<repo>[a-z0-9./-]+)@(?P<digest>sha256:[0-9a-f]{64})$")
ACCEPT = ", ".join([
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
])  # fmt: skip


def test_images_yaml_names_digests_in_the_lab_registry(lab):
    images = lab["images"]
    for name in ("vllm_nightly", "vllm_nightly_alt", "gateway"):
        assert REF.match(images[name]), images[name]
    assert images["vllm_nightly"] != images["vllm_nightly_alt"]


def test_registry_serves_each_image_by_digest(lab, http):
    for ref in lab["images"].values():
        m = REF.match(ref)
        assert m
        r = http.get(f"http://{lab['registry']}/v2/{m['repo']}/manifests/{m['digest']}",
                     headers={"Accept": ACCEPT})  # fmt: skip
        assert r.status_code == 200
        assert r.headers["Docker-Content-Digest"] == m["digest"]


def test_unknown_digest_is_not_served(lab, http):
    r = http.get(f"http://{lab['registry']}/v2/vllm/vllm-openai/manifests/sha256:{'0' * 64}",
                 headers={"Accept": ACCEPT})  # fmt: skip
    assert r.status_code == 404


def test_a_box_pulls_by_digest(lab, on_box):
    ref = lab["images"]["vllm_nightly_alt"]
    out = on_box("spark", f"docker pull -q {ref}").stdout.strip()
    assert out == ref


def test_lanes_run_registry_digests(lab, on_box):
    images = set(lab["images"].values())
    for name in lab["boxes"]:
        out = on_box(
            name, "docker inspect $(docker ps -q) --format '{{json .Config.Image}}'"
        ).stdout
        running = {json.loads(line) for line in out.splitlines()}
        assert running <= images, running - images
    gw = on_box("thor", "docker inspect model-gear-gateway --format '{{.Config.Image}}'").stdout
    assert gw.strip() == lab["images"]["gateway"]


def test_boxes_have_no_route_beyond_the_lab(lab, on_box):
    # Asked of the routing table, not by sending anything: no packet leaves for the test.
    for name in lab["boxes"]:
        proc = on_box(name, "ip route get 192.0.2.1", check=False)
        assert proc.returncode != 0
        assert "unreachable" in proc.stderr.lower()
        assert on_box(name, f"ip route get {lab['bridge']['address']}").returncode == 0
