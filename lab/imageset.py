"""The lab's image set: built once on the builder engine, pushed, recorded in .lab/images.yaml.

The build itself is lab/images (debootstrap rootfs, the vLLM stand-in, the gateway with
lobes-cli 0.91.0). This module only decides *whether* to build: when .lab/images.yaml lists
every catalog name and the registry still serves each digest, nothing is built or pushed,
which is what keeps a warm `lab up` in seconds.
"""

from __future__ import annotations

from pathlib import Path

from ruamel.yaml import YAML

from . import engines, registry
from .config import BUILDER, CACHE_DIR, IMAGES_FILE, REGISTRY
from .proc import LabError, log

REQUIRED = ("vllm_nightly", "vllm_nightly_alt", "gateway")
FINGERPRINT_FILE = IMAGES_FILE.with_name("images.fingerprint")

_HEADER = """\
# Written by `lab up` (lab/imageset.py): image catalog name -> the lab registry's reference,
# always by digest. inventory/lab.yaml `image_overlay` points here.
"""


def load(path: Path = IMAGES_FILE) -> dict[str, str]:
    if not path.exists():
        return {}
    data = YAML(typ="safe").load(path.read_text()) or {}
    return {str(k): str(v) for k, v in data.items()}


def _write(refs: dict[str, str]) -> None:
    body = "".join(f"{name}: {ref}\n" for name, ref in sorted(refs.items()))
    IMAGES_FILE.parent.mkdir(parents=True, exist_ok=True)
    IMAGES_FILE.write_text(_HEADER + body)


def _fingerprint() -> str | None:
    """lab/images' hash of its own sources: a change there means the images are stale."""
    try:
        from .images.build import source_fingerprint

        return source_fingerprint()
    except Exception as e:  # a half-edited lab/images must not take a built lab down
        log(f"lab/images source fingerprint unavailable ({e}); keeping the recorded images")
        return None


def current() -> dict[str, str] | None:
    """The recorded refs if they were built from today's lab/images and the registry has them."""
    refs = load()
    if not all(name in refs for name in REQUIRED):
        return None
    fp = _fingerprint()
    if fp is not None and (not FINGERPRINT_FILE.exists() or FINGERPRINT_FILE.read_text() != fp):
        log("lab/images changed since the last build: rebuilding")
        return None
    if not all(registry.has_manifest(ref) for ref in refs.values()):
        return None
    return refs


def ensure() -> dict[str, str]:
    refs = current()
    if refs is not None:
        return refs
    from .images.build import build_and_push, source_fingerprint

    fingerprint = source_fingerprint()
    engines.start(BUILDER)
    engines.wait_ready(BUILDER)
    log(f"building lab images on the builder engine, pushing to {REGISTRY}")
    refs = build_and_push(BUILDER.docker_cli, REGISTRY, CACHE_DIR)
    missing = [n for n in REQUIRED if n not in refs]
    if missing:
        raise LabError(f"image build returned no {', '.join(missing)}")
    for name, ref in refs.items():
        if not ref.startswith(f"{REGISTRY}/") or "@sha256:" not in ref:
            raise LabError(f"image {name} is not a lab registry digest ref: {ref}")
        if not registry.has_manifest(ref):
            raise LabError(f"registry does not serve {ref}")
    _write(refs)
    FINGERPRINT_FILE.write_text(fingerprint)
    return refs
