"""Image references: what "pinned by digest" means (stdlib only: compare uses it too)."""

from __future__ import annotations

import re

DIGEST_REF = re.compile(r"^[a-z0-9][a-z0-9._\-/:]*@sha256:[0-9a-f]{64}$")


def is_digest_ref(ref: str) -> bool:
    """`repo@sha256:<64 hex>`, optionally with a registry host:port in the repo."""
    return bool(DIGEST_REF.match(ref))


def looks_like_image_ref(value: str) -> bool:
    """A lane's `image:` is either a catalog name (`vllm_nightly`) or a literal reference."""
    return any(ch in value for ch in "/:@.")
