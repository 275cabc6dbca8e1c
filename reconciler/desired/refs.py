"""Image references: Docker's grammar, and what "pinned by digest" means (stdlib only: compare
uses it too)."""

from __future__ import annotations

import re

# distribution/reference's grammar (reference/regexp.go), spelled in ASCII: `\w` there is
# [A-Za-z0-9_]. A reference never starts with `-`, holds no whitespace or shell characters,
# and its path components are lowercase.
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"

REFERENCE = re.compile(rf"{_NAME}(?::{_TAG})?(?:@{_DIGEST})?")
DIGEST_REF = re.compile(rf"{_NAME}(?::{_TAG})?@sha256:[0-9a-f]{{64}}")


def is_image_ref(ref: str) -> bool:
    """Any reference Docker accepts: `[registry[:port]/]path[:tag][@digest]`."""
    return len(ref) <= 512 and bool(REFERENCE.fullmatch(ref))


def is_digest_ref(ref: str) -> bool:
    """`repo@sha256:<64 hex>`, optionally with a registry host:port in the repo and a tag."""
    return len(ref) <= 512 and bool(DIGEST_REF.fullmatch(ref))


def looks_like_image_ref(value: str) -> bool:
    """A lane's `image:` is either a catalog name (`vllm_nightly`) or a literal reference."""
    return any(ch in value for ch in "/:@.")
