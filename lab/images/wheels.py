"""lobes-cli and pip wheels, fetched on the host and copied into the gateway image.

Image builds have no network, so the wheels come from the host's pip (configured for the
reachable index). lobes-cli declares Python >= 3.12 while Debian 12 ships 3.11 (lobes'
gateway is stdlib-only and runs on 3.11), hence `--python-version 3.12` here and
`--ignore-requires-python` at install time. pip itself comes as a wheel because Debian's
python3 has no pip and a wheel of pip can run straight from its zip.

The machine set-up fetches them (.ci/setup-machine.sh runs this file:
`python3 lab/images/wheels.py /var/cache/fleet-lab`), so the tests that read lobes' own files
from the wheel (`cached_wheels`) never need a package index while they run. Stdlib only: the
set-up runs it before the project's venv exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

LOBES_VERSION = "0.91.0"
PIP_VERSION = "24.3.1"
TEMPLATE_MEMBER = "lobes/templates/fleet/docker-compose.yml"
MG_LOGWRAP_MEMBER = "lobes/templates/mg-logwrap.sh"


def wheel_names(lobes_version: str = LOBES_VERSION) -> tuple[str, str]:
    return (f"lobes_cli-{lobes_version}-py3-none-any.whl", f"pip-{PIP_VERSION}-py3-none-any.whl")


def fetch_wheels(cache_dir: Path, lobes_version: str = LOBES_VERSION) -> list[Path]:
    """The lobes-cli and pip wheels under cache_dir, downloaded once."""
    dest = cache_dir / "wheels"
    wanted = [dest / name for name in wheel_names(lobes_version)]
    if all(path.exists() for path in wanted):
        return wanted
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix="download-") as scratch:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary", ":all:", "--python-version", "3.12", "--dest", scratch,
             f"lobes-cli=={lobes_version}", f"pip=={PIP_VERSION}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"pip download failed: {done.stderr.strip()[-2000:]}")
        for path in wanted:
            # Each wheel lands whole or not at all, so a crash never leaves a torn file.
            os.replace(Path(scratch) / path.name, path)
    return wanted


# What makes the wheels appear under the cache: the README's set-up (it runs
# .ci/setup-machine.sh, which runs this file).
SETUP_COMMAND = "bash scripts/setup.sh"


def cached_wheels(cache_dir: Path, lobes_version: str = LOBES_VERSION) -> list[Path]:
    """The lobes-cli and pip wheels the machine set-up fetched into cache_dir/wheels; never
    downloads. FileNotFoundError naming the set-up command when one is missing."""
    wanted = [cache_dir / "wheels" / name for name in wheel_names(lobes_version)]
    missing = [str(path) for path in wanted if not path.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{', '.join(missing)} missing: the machine set-up fetches the lobes-cli and pip "
            f"wheels there; run `{SETUP_COMMAND}` (as root; it runs .ci/setup-machine.sh)"
        )
    return wanted


def read_member(wheel: Path, member: str) -> str:
    """A text file from inside a wheel (e.g. lobes' compose template)."""
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(member).decode("utf-8")


def copy_into(paths: list[Path], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for path in paths:
        shutil.copy2(path, dest / path.name)


if __name__ == "__main__":  # .ci/setup-machine.sh: python3 lab/images/wheels.py CACHE_DIR
    for fetched in fetch_wheels(Path(sys.argv[1])):
        print(fetched)
