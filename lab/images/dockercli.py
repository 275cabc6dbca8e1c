"""The docker CLI, as a prefix the caller chooses (which binary, which `-H` engine).

The lab runs several engines; everything here goes through the prefix so an image is always
built, inspected and pushed on the engine the caller meant.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

_DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})")


class DockerError(RuntimeError):
    """A docker command failed; the message carries its argv and stderr."""


@dataclass(frozen=True)
class Docker:
    prefix: tuple[str, ...]

    def run(
        self, *args: str, timeout: float = 600, stdin: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        # The classic builder: dockerd 20.10 has no buildx here, and its output is plain text.
        env = {**os.environ, "DOCKER_BUILDKIT": "0", "DOCKER_CLI_HINTS": "false"}
        argv = [*self.prefix, *args]
        handle = stdin.open("rb") if stdin else None
        try:
            done = subprocess.run(
                argv, stdin=handle, capture_output=True, env=env, timeout=timeout, check=False
            )
        finally:
            if handle:
                handle.close()
        out = done.stdout.decode(errors="replace")
        err = done.stderr.decode(errors="replace")
        if done.returncode != 0:
            raise DockerError(f"{' '.join(argv)} exited {done.returncode}: {err.strip()[-2000:]}")
        return subprocess.CompletedProcess(argv, done.returncode, out, err)

    def image_label(self, ref: str, label: str) -> str | None:
        """The label's value on a local image, or None when the image is not there."""
        try:
            out = self.run(
                "image", "inspect", "--format", f'{{{{index .Config.Labels "{label}"}}}}', ref
            )
        except DockerError:
            return None
        value = out.stdout.strip()
        return None if value in ("", "<no value>") else value

    def image_with_label(self, label: str, value: str) -> str | None:
        """The id of a local image carrying label=value, if any."""
        out = self.run("image", "ls", "--quiet", "--no-trunc", "--filter", f"label={label}={value}")
        ids = out.stdout.split()
        return ids[0] if ids else None

    def image_exists(self, ref: str) -> bool:
        try:
            self.run("image", "inspect", "--format", "{{.Id}}", ref)
        except DockerError:
            return False
        return True

    def push(self, ref: str) -> str:
        """Push and return the manifest digest the registry stored (`sha256:…`)."""
        out = self.run("push", ref, timeout=900).stdout
        found = _DIGEST.findall(out)
        if found:
            return found[-1]
        # Older clients print the digest elsewhere; RepoDigests has it after any push.
        repo = ref.rsplit(":", 1)[0]
        digests = self.run("image", "inspect", "--format", "{{json .RepoDigests}}", ref).stdout
        for entry in re.findall(r'"([^"]+)"', digests):
            if entry.startswith(repo + "@sha256:"):
                return entry.split("@", 1)[1]
        raise DockerError(f"push of {ref} reported no digest: {out[-500:]}")
