"""The image catalog: every image reference a box runs gets one name, shared by every box.

A container's image is read from `docker inspect`: its reference when it was created by digest,
else the image's RepoDigests (the same repository first). A name is the repository's last path
component (`vllm/vllm-openai` -> `vllm_openai`); two digests of one repository get the short
digest appended, one digest pulled from two registries (or paths) where it came from too, and a
name that would still stand for two references a counter: no name ever stands for two.
"""

from __future__ import annotations

import re
from collections import Counter
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


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_")


def _base(ref: str) -> str:
    name = _slug(ref.split("@", 1)[0].rsplit("/", 1)[-1])
    return name if name and name[0].isalpha() else f"image_{name}".rstrip("_")


def _short(ref: str) -> str:
    return ref.rsplit(":", 1)[-1][:12]


def _where(ref: str) -> str:
    """What precedes the repository's last component (`mirror.example:5000/vllm`): where two
    references of one digest differ."""
    path = ref.split("@", 1)[0]
    return (_slug(path.rsplit("/", 1)[0]) if "/" in path else "") or "library"


def _wanted(ref: str, group: list[str], base: str) -> str:
    """The name `ref` asks for among the references sharing its `base`: the base alone, else
    with the short digest, else (one digest pulled from two places) with where from too."""
    if len(group) == 1:
        return base
    named = f"{base}_{_short(ref)}"
    if sum(1 for other in group if _short(other) == _short(ref)) == 1:
        return named
    return f"{named}_{_where(ref)}"


def catalog(refs: Iterable[str]) -> dict[str, str]:
    """digest reference -> catalog name, one name per reference, stable for the same set of
    references. A name two references would still ask for (`a.b/x` and `a-b/x` read alike, a
    repository named like another's name with its digest) takes a counter: a name standing
    for two references sends a box to pull from the other one."""
    by_base: dict[str, list[str]] = {}
    for ref in sorted(set(refs)):
        by_base.setdefault(_base(ref), []).append(ref)
    wanted = {ref: _wanted(ref, group, base) for base, group in by_base.items() for ref in group}
    asked = Counter(wanted.values())
    taken = {name for name, count in asked.items() if count == 1}
    names: dict[str, str] = {}
    for ref in sorted(wanted):
        name = wanted[ref]
        if asked[name] > 1:
            name = _free(name, taken)
            taken.add(name)
        names[ref] = name
    return names


def _free(name: str, taken: set[str]) -> str:
    """`name_2`, `name_3`, ...: the first no other reference has."""
    count = 2
    while f"{name}_{count}" in taken:
        count += 1
    return f"{name}_{count}"
