"""Build contexts: a directory per image holding exactly what its Dockerfile copies.

A context is rewritten on every run (it is small) and hashed together with the base image
and the build args; that hash is the image's `fleet-lab.inputs` label, so an unchanged
context means no rebuild.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from lab.images.catalog import ImageSpec
from lab.images.wheels import LOBES_VERSION, copy_into

HERE = Path(__file__).resolve().parent
STANDIN_PROGRAM = HERE / "vllm_standin.py"
NVIDIA_SMI = HERE / "nvidia-smi.sh"
DOCKERFILES = HERE  # top level, so setuptools package-data ("Dockerfile*") ships them


def prepare(spec: ImageSpec, dest: Path, wheels: list[Path]) -> dict[str, str]:
    """Write spec's context into dest (replacing it); returns the build args."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if spec.kind == "standin":
        shutil.copyfile(STANDIN_PROGRAM, dest / "vllm")
        shutil.copyfile(NVIDIA_SMI, dest / "nvidia-smi")
        for name in ("vllm", "nvidia-smi"):
            (dest / name).chmod(0o755)
        info = {"flavor": spec.name, "version": spec.version, "repo": spec.repo}
        if spec.fail:
            info["fail"] = spec.fail
        (dest / "build.json").write_text(json.dumps(info, sort_keys=True) + "\n", "utf-8")
        shutil.copyfile(DOCKERFILES / "Dockerfile.standin", dest / "Dockerfile")
        return {}
    copy_into(wheels, dest / "wheels")
    shutil.copyfile(DOCKERFILES / "Dockerfile.gateway", dest / "Dockerfile")
    return {"MODEL_GEAR_VERSION": LOBES_VERSION}


def inputs_hash(context: Path, base_ref: str, build_args: dict[str, str]) -> str:
    """sha256 over every file's path, mode and bytes, the base image and the build args."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"base": base_ref, "args": build_args}, sort_keys=True).encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        rel = path.relative_to(context).as_posix()
        digest.update(f"\0{rel}\0{path.stat().st_mode & 0o777:o}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
