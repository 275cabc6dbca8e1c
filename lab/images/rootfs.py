"""The lab's base image: a Debian minbase rootfs from debootstrap, cached as a tarball.

Nothing is pulled from a registry (there is no Docker Hub here): the rootfs comes from the
Debian mirror this machine's apt already uses, and `docker import` turns it into an image on
each engine. debootstrap takes about a minute, so the tarball is kept under the cache dir and
keyed by the recipe; the image tag is keyed by the tarball's own hash, so an engine imports it
once and every image built FROM it is invalidated when the rootfs really changes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from lab.images.dockercli import Docker, DockerError

SUITE = "bookworm"  # Debian 12: the same python3 (3.11) the project targets
VARIANT = "minbase"
# python-is-python3: the gateway's compose command and healthcheck call `python`.
INCLUDE = ("python3", "python-is-python3", "curl", "ca-certificates")
RECIPE = 1  # bump when the trimming or import settings change
FALLBACK_MIRROR = "http://deb.debian.org/debian"
BASE_REPO = "fleet-lab/debian"
# What python:3.12-slim and vllm/vllm-openai set and the lanes rely on (PATH, a UTF-8 locale).
IMPORT_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["bash"]',
)
# Package caches, indexes, docs and translations: a third of the tree and useless in a lane.
_TRIM = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
         "usr/share/locale", "usr/share/info")  # fmt: skip


def recipe_key() -> str:
    spec = {"suite": SUITE, "variant": VARIANT, "include": INCLUDE, "recipe": RECIPE}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def debian_mirror(sources: tuple[Path, ...] | None = None) -> str:
    """The URI this machine's apt uses for the Debian main archive (not security)."""
    override = os.environ.get("FLEET_LAB_DEBIAN_MIRROR")
    if override:
        return override
    if sources is None:
        apt = Path("/etc/apt")
        sources = (apt / "sources.list", *sorted((apt / "sources.list.d").glob("*")))
    for path in sources:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for uri, suites in _entries(text, deb822=path.suffix == ".sources"):
            if SUITE in suites and not uri.rstrip("/").endswith("-security"):
                return uri.rstrip("/")
    return FALLBACK_MIRROR


def _entries(text: str, deb822: bool) -> list[tuple[str, list[str]]]:
    """(uri, suites) of each `deb` source in one-line or deb822 format."""
    found: list[tuple[str, list[str]]] = []
    if deb822:
        for block in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            for line in block.splitlines():
                key, sep, value = line.partition(":")
                if sep and not line.startswith(("#", " ", "\t")):
                    fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled") != "no":
                found += [(uri, fields.get("suites", "").split()) for uri in fields["uris"].split()]
        return found
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
        if len(words) >= 3 and words[0] == "deb":
            found.append((words[1], [words[2]]))
    return found


def ensure_debootstrap() -> str:
    tool = shutil.which("debootstrap")
    if tool:
        return tool
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, capture_output=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "debootstrap"], check=True, env=env, capture_output=True
    )
    return shutil.which("debootstrap") or "/usr/sbin/debootstrap"


def ensure_tarball(cache_dir: Path) -> Path:
    """The cached rootfs tarball, built with debootstrap on first use."""
    out_dir = cache_dir / "rootfs"
    tarball = out_dir / f"debian-{SUITE}-{VARIANT}-{recipe_key()}.tar"
    if tarball.exists() and _sidecar(tarball).exists():
        return tarball
    out_dir.mkdir(parents=True, exist_ok=True)
    tool = ensure_debootstrap()
    with tempfile.TemporaryDirectory(dir=out_dir, prefix="build-") as scratch:
        root = _debootstrap(tool, Path(scratch))
        for rel in _TRIM:
            target = root / rel
            if target.is_dir():
                shutil.rmtree(target)
                target.mkdir()
        partial = Path(scratch) / "rootfs.tar"
        subprocess.run(
            ["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(partial), "."],
            check=True,
            capture_output=True,
        )
        digest = _sha256(partial)
        os.replace(partial, tarball)
        # The sidecar goes last: a tarball without one is treated as torn and rebuilt.
        sidecar_tmp = Path(scratch) / "sha256"
        sidecar_tmp.write_text(digest + "\n", encoding="utf-8")
        os.replace(sidecar_tmp, _sidecar(tarball))
    return tarball


DEBOOTSTRAP_TIMEOUT = 900  # s per attempt; a healthy run takes about a minute


def _debootstrap(tool: str, scratch: Path, attempts: int = 2) -> Path:
    """Run debootstrap into a fresh directory; one retry, since a mirror hiccup is common.

    Each attempt gets DEBOOTSTRAP_TIMEOUT seconds; a stuck one (a mirror that stops sending)
    is killed with its whole process group and counts as a failed attempt.
    """
    tail = ""
    for attempt in range(1, attempts + 1):
        root = scratch / f"root-{attempt}"
        argv = [tool, f"--variant={VARIANT}", f"--include={','.join(INCLUDE)}", SUITE, str(root),
                debian_mirror()]  # fmt: skip
        returncode, output = _run_bounded(argv, DEBOOTSTRAP_TIMEOUT)
        if returncode == 0:
            return root
        if returncode is None:
            tail = f"timed out after {DEBOOTSTRAP_TIMEOUT}s (killed); output so far:\n"
            tail += output[-3000:]
        else:
            tail = output[-3000:]
        # A killed debootstrap leaves its /proc, /sys (and in a container /dev bind) mounts in
        # the target: detach them first, or the rmtree would walk into the host's.
        _unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)
    raise RuntimeError(
        f"debootstrap failed {attempts} times ({DEBOOTSTRAP_TIMEOUT}s allowed each); "
        f"last output:\n{tail}"
    )


def _run_bounded(argv: list[str], timeout: float) -> tuple[int | None, str]:
    """(returncode, stdout+stderr); returncode None when it ran out of time and was killed.

    A session of its own, so the kill reaches debootstrap's children (wget, dpkg, chroot)
    too: killing only the shell script would leave them holding the output pipe.
    """
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # something left the group and holds the pipe
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            out = ""
        return None, out or ""


def _unmount_under(root: Path) -> None:
    """Lazily unmount every mount point at or below `root`, deepest first."""
    prefix = os.path.realpath(root)  # mountinfo shows resolved paths
    points = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            if len(fields) < 5:
                continue
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    for point in sorted(points, key=len, reverse=True):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False, timeout=60)


def import_base(docker: Docker, tarball: Path) -> str:
    """Import the tarball into the engine once; returns the base image reference."""
    digest = _sidecar(tarball).read_text(encoding="utf-8").strip()
    ref = f"{BASE_REPO}:{SUITE}-{digest[:16]}"
    if not docker.image_exists(ref):
        changes = [arg for change in IMPORT_CHANGES for arg in ("--change", change)]
        message = f"debootstrap {VARIANT} {SUITE} + {' '.join(INCLUDE)}"
        docker.run("import", *changes, "--message", message, str(tarball), ref, timeout=900)
        # An older rootfs is only a tag now: untag it (its layers go once no image uses them).
        tags = docker.run("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", BASE_REPO)
        for old in set(tags.stdout.split()) - {ref}:
            with contextlib.suppress(DockerError):
                docker.run("rmi", old)
    return ref


def _sidecar(tarball: Path) -> Path:
    return tarball.with_name(tarball.name + ".sha256")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
