"""Secrets become references to where their value was found, never values.

The observation holds only keyed digests (`hmac:...`, one key per run): the digest of the value
in use (a `.env` line, or what the running gateway carries) is matched against the secret
sources the collector read (`~/.lobes/.secrets.env`), each read on the box exactly as a
converge reads it. A match names that file and key; with none, the reference points at the
`.env` line itself, only if that line holds the same value. A key in use that no such file
holds (a gateway started by hand, a `.env` edited since) has nowhere to point: `.env`'s other
value would rotate the live key on the next converge, a missing line fail it. It becomes a
placeholder instead, a file that is not on the box (`unfound`): the repository still
validates, drift names the missing file and a converge refuses before it writes anything,
until the operator puts the key in use there or points the reference elsewhere.

A key only the deploy user's login shell exports (`~/.bashrc:6`, incident #209) is such a key
too. A converge reads the rc file's last assignment of the key, while bash may have run
another (`if ...; then export K=a; else export K=b; fi`), and the observation holds only the
line bash ran (the trace's last assignment, document.Export.source), never whether the file
assigns the key elsewhere: so the import cannot know that pointing at the file gives a
converge the key in use. It writes the placeholder, and the note names the line
(`traced`), for the operator who can read the file.
Nothing here can see or print a value.
"""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.importer.sourced import Sourced
from reconciler.observe.document import EnvLine, Observed, SecretValue

# Secret name in group_vars -> the `.env` variable lobes reads it from.
SECRET_KEYS = {
    "gateway_api_key": "GATEWAY_API_KEY",
    "mesh_key": "LOBES_MESH_KEY",
    "hf_token": "HF_TOKEN",
}
# Where a placeholder reference points, beside `.env`: a name no lobes deployment has.
UNFOUND_FILE = ".secrets.unfound.env"
UNFOUND = "placeholder"  # how a placeholder's comment starts (adopt.summary reads it)


@dataclass(frozen=True)
class Candidate:
    """A file on the box that holds a secret: where, under which key, its digest, and what
    the comment says about it. `read`: the collector read the file as a converge reads it
    (a secret source), so a reference to it gives a converge this value; a login-shell
    export's file was not read, only the line bash ran is known."""

    path: str  # ~/...
    key: str
    digest: str
    origin: str
    read: bool = True


def candidates(doc: Observed) -> list[Candidate]:
    """Secret files first (a live import names its sources as SECRET_KEYS does; a snapshot's
    were named by the state it was taken against, by the same convention), then the login
    shell's exports of secrets, each under the home (a box_file path is `~/...`)."""
    out = []
    for name, src in sorted(doc.secret_sources.items()):
        if src.status == "ok" and src.digest is not None and src.path is not None:
            key = SECRET_KEYS.get(name)
            if key is not None:
                out.append(Candidate(src.path, key, src.digest.digest, f"in {src.path}"))
    for name, export in sorted(doc.login_shell.exports.items()):
        where = export.source or ""
        path, _, line = where.rpartition(":")
        if isinstance(export.value, SecretValue) and path.startswith("~/") and line.isdigit():
            out.append(Candidate(path, name, export.value.digest, where, read=False))
    return out


def source_for(
    value: SecretValue,
    env_key: str,
    origin: str,
    deploy_dir: str,
    found: list[Candidate],
    env_line: EnvLine | None,
) -> Sourced | None:
    """A box_file source for the secret `value` in use under `env_key` (seen at `origin`), or
    None when no file the import read holds it (`env_line`: `.env`'s line of `env_key`)."""
    same = [c for c in found if c.read and c.digest == value.digest]
    match = [c for c in same if c.key == env_key] + [c for c in same if c.key != env_key]
    if match:
        c = match[0]
        where = f"{c.origin}, same digest as {origin}"
        return Sourced({"source": "box_file", "path": c.path, "key": c.key}, where)
    if _holds(env_line, value):
        return Sourced(
            {"source": "box_file", "path": f"{deploy_dir}/.env", "key": env_key},
            f"{origin} (no other file holds it)",
        )
    return None


def traced(value: SecretValue, env_key: str, found: list[Candidate]) -> Candidate | None:
    """The login-shell export whose digest is the value in use (`env_key`'s first), if any:
    where bash assigned it (`~/.bashrc:6`), which no reference points at (the module says
    why)."""
    same = [c for c in found if not c.read and c.digest == value.digest]
    return next((c for c in same if c.key == env_key), same[0] if same else None)


def _holds(line: EnvLine | None, value: SecretValue) -> bool:
    return (
        line is not None
        and isinstance(line.value, SecretValue)
        and line.value.digest == value.digest
    )


def unfound_path(deploy_dir: str) -> str:
    return f"{deploy_dir}/{UNFOUND_FILE}"


def unfound(
    env_key: str, deploy_dir: str, exported: Candidate | None = None, clear: bool = False
) -> Sourced:
    """The placeholder for a key in use that no file holds (see the module's docstring);
    `exported`: the login-shell line that assigned it, named in the comment; `clear`: the
    snapshot holds the key in use in clear (older or edited), so no file could be matched."""
    if exported is not None:
        why = f"the {env_key} in use is exported at {exported.origin}"
    elif clear:
        why = f"the {env_key} in use is in clear in the snapshot, matched with no file"
    else:
        why = f"no file on the box holds the {env_key} in use"
    return Sourced(
        {"source": "box_file", "path": unfound_path(deploy_dir), "key": env_key},
        f"{UNFOUND}: {why}; put it here",
    )
