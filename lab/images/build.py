r"""Build the lab's images on one engine and push them to the lab registry, by digest.

    build_and_push(docker, registry, cache_dir) -> {catalog name: "registry/repo@sha256:…"}

`docker` is the CLI prefix of the engine to build on (e.g. ["docker", "-H", "unix:///…"]),
`registry` a host:port the engine can push to, `cache_dir` where the debootstrap tarball,
the wheels and the build contexts persist between runs. A warm run (same inputs) builds
nothing: each image carries a `fleet-lab.inputs` label with the hash of its inputs, and only a
missing or different label triggers `docker build`. Every run pushes (cheap when the registry
has the layers), so a fresh registry is refilled and the digests returned are the registry's.

Manual use:
    python -m lab.images.build --docker-host unix:///run/x.sock --registry 10.77.0.1:5000 \
        --cache /var/cache/fleet-lab
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from lab.images import contexts, rootfs, wheels
from lab.images.catalog import CATALOG, ImageSpec
from lab.images.dockercli import Docker

INPUTS_LABEL = "fleet-lab.inputs"


def build_and_push(docker: list[str], registry: str, cache_dir: Path) -> dict[str, str]:
    engine = Docker(tuple(docker))
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(cache_dir / "images.lock"):
        base = rootfs.import_base(engine, rootfs.ensure_tarball(cache_dir))
        lobes_wheels = wheels.fetch_wheels(cache_dir)
        # Builds run one after another; each image is pushed as soon as it exists, so the
        # first push (gzip of the ~130 MB base layer, one core) overlaps the later builds.
        with ThreadPoolExecutor(max_workers=len(CATALOG)) as pushes:
            pending = {
                spec.name: pushes.submit(
                    _push, engine, spec, registry,
                    _ensure_local(engine, spec, registry, base, lobes_wheels, cache_dir),
                )
                for spec in CATALOG
            }  # fmt: skip
            return {name: future.result() for name, future in pending.items()}


def _ensure_local(
    engine: Docker,
    spec: ImageSpec,
    registry: str,
    base: str,
    lobes_wheels: list[Path],
    cache_dir: Path,
) -> str:
    """Make `registry/repo:tag` a local image built from the current inputs; returns it."""
    context = cache_dir / "contexts" / spec.name
    build_args = contexts.prepare(spec, context, lobes_wheels)
    inputs = contexts.inputs_hash(context, base, build_args)
    ref = f"{registry}/{spec.repo}:{spec.tag}"
    if engine.image_label(ref, INPUTS_LABEL) != inputs:
        found = engine.image_with_label(INPUTS_LABEL, inputs)
        if found:  # same inputs built before under another name (another registry address)
            engine.run("tag", found, ref)
        else:
            _build(engine, spec, ref, context, base, build_args, inputs)
    return ref


def _push(engine: Docker, spec: ImageSpec, registry: str, ref: str) -> str:
    return f"{registry}/{spec.repo}@{engine.push(ref)}"


def _build(
    engine: Docker,
    spec: ImageSpec,
    ref: str,
    context: Path,
    base: str,
    build_args: dict[str, str],
    inputs: str,
) -> None:
    args = [arg for key, val in build_args.items() for arg in ("--build-arg", f"{key}={val}")]
    engine.run(
        "build", "--pull=false", "--rm", "--force-rm",
        "--build-arg", f"BASE={base}", *args,
        "--label", f"{INPUTS_LABEL}={inputs}",
        "--label", f"fleet-lab.catalog={spec.name}",
        "--tag", ref, str(context),
        timeout=1200,
    )  # fmt: skip
    # The previous build of this image is now untagged: drop it so rebuilds do not pile up.
    engine.run("image", "prune", "--force", "--filter", f"label=fleet-lab.catalog={spec.name}")


def source_fingerprint() -> str:
    """A hash of everything in lab/images that shapes an image (code, Dockerfiles, recipe).

    Cheap (no docker): a caller that caches the refs this module returned can compare it to
    the one it stored and call build_and_push again only when the sources moved.
    """
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256(rootfs.recipe_key().encode())
    for path in sorted(here.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(f"\0{path.relative_to(here).as_posix()}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One build per cache dir at a time: two labs sharing a cache must not race debootstrap."""
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.images.build",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--docker-host", help="engine address for `docker -H` (default: env)")
    parser.add_argument("--docker", default="docker", help="docker client binary")
    parser.add_argument("--registry", required=True, help="host:port to push to")
    parser.add_argument("--cache", type=Path, required=True, help="cache directory")
    ns = parser.parse_args(argv)
    prefix = [ns.docker, *(["-H", ns.docker_host] if ns.docker_host else [])]
    started = time.monotonic()
    refs = build_and_push(prefix, ns.registry, ns.cache)
    print(json.dumps(refs, indent=2))
    print(f"built and pushed {len(refs)} images in {time.monotonic() - started:.1f}s",
          file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
