"""The image catalog: every digest a box runs gets one name, shared by every box.

A container's image is read from `docker inspect`: its reference when it was created by digest,
else the image's RepoDigests (the same repository first). A name is the repository's last path
component (`vllm/vllm-openai` -> `vllm_openai`); two digests of one repository get the short
digest appended, so no name ever stands for two images.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from reconciler.desired.refs import is_digest_ref
from reconciler.observe.document import Container, Observed


def running_digest(doc: Observed, c: Container) -> str | None:
    """The repo@sha256 reference this container runs, or None (a tag with no RepoDigest)."""
    ref = c.image_ref or ""
    if is_digest_ref(ref):
        return ref
    image = doc.docker.images.get(c.image_id or "")
    digests = image.repo_digests if image is not None else ()
    repo = ref.rsplit(":", 1)[0] if ref else ""
    same_repo = [d for d in digests if d.split("@", 1)[0] == repo]
    found = same_repo or list(digests)
    return found[0] if found and is_digest_ref(found[0]) else None


def _base(ref: str) -> str:
    repo = ref.split("@", 1)[0].rsplit("/", 1)[-1]
    name = re.sub(r"[^a-z0-9_]+", "_", repo.lower()).strip("_")
    return name if name and name[0].isalpha() else f"image_{name}".rstrip("_")


def catalog(refs: Iterable[str]) -> dict[str, str]:
    """digest reference -> catalog name, stable for the same set of references."""
    by_base: dict[str, list[str]] = {}
    for ref in sorted(set(refs)):
        by_base.setdefault(_base(ref), []).append(ref)
    names: dict[str, str] = {}
    for base, group in by_base.items():
        for ref in group:
            short = ref.rsplit(":", 1)[-1][:12]
            names[ref] = base if len(group) == 1 else f"{base}_{short}"
    return names
