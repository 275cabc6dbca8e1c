"""The lab's images: catalog name -> repository, tag and how each is built.

Catalog names are what the rest of the project asks for (`images.yaml`, tests that swap a
lane's digest). Repositories copy the real ones the lobes template names, so an image
reference in a rendered `.env` reads like production with only the registry changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lab.images.wheels import LOBES_VERSION


@dataclass(frozen=True)
class ImageSpec:
    name: str  # catalog name
    repo: str  # repository inside the registry
    tag: str  # the tag pushed (the digest is what callers use)
    kind: Literal["standin", "gateway"]
    # Stand-ins only: what /version and `vllm --version` report. Two flavours of the same
    # program with different versions give two digests in one repository, so a test can swap
    # a lane to "another build" and see which one serves.
    version: str = ""
    # Stand-ins only: a failure mode baked into the build (see vllm_standin's STANDIN_FAIL).
    fail: str = ""


CATALOG: tuple[ImageSpec, ...] = (
    ImageSpec("vllm_nightly", "vllm/vllm-openai", "nightly", "standin",
              "0.23.1rc1.dev672+standin.nightly"),
    ImageSpec("vllm_nightly_alt", "vllm/vllm-openai", "nightly-alt", "standin",
              "0.23.1rc1.dev701+standin.alt"),
    # A new digest that never comes healthy: what a rollback test deploys to see it undone.
    ImageSpec("vllm_nightly_broken", "vllm/vllm-openai", "nightly-broken", "standin",
              "0.23.1rc1.dev702+standin.broken", fail="never-healthy"),
    # orin's senses lane: `${MULTIMODAL_IMAGE:-lobes/vllm-gemma4:local}` in the template.
    ImageSpec("vllm_gemma4", "lobes/vllm-gemma4", "local", "standin",
              "0.23.1rc1.dev672+standin.gemma4"),
    ImageSpec("gateway", "lobes/gateway", LOBES_VERSION, "gateway"),
)  # fmt: skip
