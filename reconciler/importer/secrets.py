"""Secrets become references to where their value was found, never values.

The observation holds only keyed digests (`hmac:...`, one key per run): a `.env` line's digest
is matched against the secret sources the collector read (`~/.lobes/.secrets.env` and the
like). A match names that file and key; with none, the reference points at the `.env` line
itself, which is where the value was found. Nothing here can see or print a value.
"""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.importer.sourced import Sourced
from reconciler.observe.document import Observed, SecretValue

# Secret name in group_vars -> the `.env` variable lobes reads it from.
SECRET_KEYS = {
    "gateway_api_key": "GATEWAY_API_KEY",
    "mesh_key": "LOBES_MESH_KEY",
    "hf_token": "HF_TOKEN",
}


@dataclass(frozen=True)
class Candidate:
    """A secret source the collector read: where, which key, and the value's digest."""

    path: str  # ~/...
    key: str
    digest: str


def candidates(doc: Observed, keys: dict[str, str]) -> list[Candidate]:
    """`keys`: source name -> the key it was read under (a live import asks for these; a
    snapshot's sources were named by the state it was taken against: same convention)."""
    out = []
    for name, src in sorted(doc.secret_sources.items()):
        if src.status == "ok" and src.digest is not None and src.path is not None:
            key = keys.get(name) or SECRET_KEYS.get(name)
            if key is not None:
                out.append(Candidate(src.path, key, src.digest.digest))
    return out


def source_for(
    value: SecretValue, env_key: str, origin: str, deploy_dir: str, found: list[Candidate]
) -> Sourced:
    """A box_file source for the secret `value` that `.env` holds under `env_key`."""
    same_key = [c for c in found if c.digest == value.digest and c.key == env_key]
    match = same_key or [c for c in found if c.digest == value.digest]
    if match:
        c = match[0]
        return Sourced(
            {"source": "box_file", "path": c.path, "key": c.key},
            f"same digest as {origin}",
        )
    return Sourced(
        {"source": "box_file", "path": f"{deploy_dir}/.env", "key": env_key},
        f"{origin} (no other source holds it)",
    )
