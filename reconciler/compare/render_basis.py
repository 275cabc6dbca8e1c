"""Which of a box's compose renders a comparison reads: the one made from the `.env` that the
desired state would leave on the box.

The collector renders the desired `.env` (the box's own with the managed keys written, as a
converge writes it). A snapshot saved by `drift --save-snapshot` also holds the render of the
box's own `.env` where the two differ (`render_current`, `render_login_current`), so that the
snapshot replays against another desired state, such as one `reconcile import` adopted from
that very `.env`. Each render of such a run records its basis: the sha256 of the `.env`'s
assignments as the answer's `envfile` shows them (secrets as the run's keyed digests), which
the controller computes here from `envfile` and the managed keys alone. The render whose
basis is the desired `.env`'s is read, else the box's own where the desired `.env` reads
alike (`reads_alike`); otherwise (and in an answer without bases) the desired render, as
before. Pure: no I/O.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import replace

from reconciler.compare import inline
from reconciler.compare.envfile import EMPTY_IS_OFF
from reconciler.desired.entries import EnvEntry, SecretName
from reconciler.observe.document import EnvValue, Observed, Render, SecretValue


def env_basis(pairs: Mapping[str, EnvValue]) -> str:
    """The collector's `env_basis` of a `.env` whose assignments are `pairs` (in order): the
    same canonical JSON, byte for byte."""
    canonical = json.dumps(
        [[key, _shown(value)] for key, value in pairs.items()],
        separators=(",", ":"),
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _shown(value: EnvValue) -> str | dict[str, str]:
    return {"secret": value.digest} if isinstance(value, SecretValue) else value


def current_pairs(doc: Observed) -> dict[str, EnvValue] | None:
    """The box's `.env` as compose reads it: the last assignment of a key, at its first place.
    None: the deployment has no `.env`."""
    if doc.envfile is None:
        return None
    return {line.key: line.value for line in doc.envfile}


def desired_pairs(doc: Observed, env: Iterable[EnvEntry]) -> dict[str, EnvValue]:
    """The `.env` the collector renders for a desired state (its `desired_envfile`): each
    managed key written in place or appended, a null key's lines dropped, and a secret whose
    source could not be read left as the box has it."""
    pairs = current_pairs(doc) or {}
    for entry in env:
        if entry.value is None:
            pairs.pop(entry.key, None)
        elif isinstance(entry.value, SecretName):
            source = doc.secret_sources.get(entry.value.secret)
            if source is not None and source.digest is not None:
                pairs[entry.key] = source.digest
        else:
            # As the box wrote it in its basis: a secret the value carries hashed inline.
            pairs[entry.key] = inline.desired_value(doc, entry.key, entry.value)
    return pairs


def renders_of(doc: Observed, basis: str | None) -> tuple[Render, Render | None] | None:
    """The (scrubbed, login-shell) renders made from the `.env` with this basis, if any."""
    if basis is None:
        return None
    if doc.render.basis == basis:
        return doc.render, doc.render_login
    own = doc.render_current
    if own is not None and own.basis == basis:
        return own, doc.render_login_current
    return None


def for_desired(doc: Observed, env: Iterable[EnvEntry]) -> Observed:
    """`doc` with the renders of the desired state's `.env` in `render` and `render_login`.
    An answer with one render (every live drift: the collector renders the box's own `.env`
    only for a snapshot, and only where it differs) is returned as it is, at no cost."""
    if doc.render_current is None:
        return doc
    desired = desired_pairs(doc, env)
    found = renders_of(doc, env_basis(desired))
    if found is None and reads_alike(desired, current_pairs(doc)):
        found = doc.render_current, doc.render_login_current
    if found is None or found[0] is doc.render:
        return doc
    return replace(doc, render=found[0], render_login=found[1])


def reads_alike(desired: Mapping[str, EnvValue], current: Mapping[str, EnvValue] | None) -> bool:
    """The two `.env` differ at most by keys set empty in one and absent from the other, which
    compose reads alike (`${KEY:-}`) and `envfile` does not report either (compare/envfile.py):
    an adopted open gateway pins `GATEWAY_API_KEY=` where lobes' `.env` has no line. Keys of
    lobes' `${KEY-default}` idiom (EMPTY_IS_OFF) differ, as there."""
    if current is None:
        return False
    for key in desired.keys() | current.keys():
        want, have = desired.get(key), current.get(key)
        if want == have:
            continue
        if want not in ("", None) or have not in ("", None) or _empty_is_off(key):
            return False
    return True


def _empty_is_off(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in EMPTY_IS_OFF)


def current_render(doc: Observed) -> Render:
    """compose's render of the `.env` on the box (what an import adopts), else `render`."""
    pairs = current_pairs(doc)
    found = renders_of(doc, None if pairs is None else env_basis(pairs))
    return found[0] if found is not None else doc.render
