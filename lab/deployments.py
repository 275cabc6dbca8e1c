"""Each box's lobes deployment: rendered by the real `lobes init`, adapted, started by compose.

What `lab up` guarantees for ~/.lobes (and ~/.bashrc, ~/.profile) of every box user is the
*pristine* deployment: lobes' own render, plus exactly these lab edits and nothing else:
- `.env`: the image variables point at the lab registry by digest, the mesh keys, the box's
  own origin and seeds, a fast heartbeat, spark's inbound key, and COMPOSE_FILE = lobes' own
  `-f` chain (`lobes fleet files`) so a plain `docker compose` resolves the same files;
- `docker-compose.override.yml`: what a GPU-less VM cannot do (see `render_override`).
Anything else found there (an incident's edit, an extra file) is put back or removed, and
compose then recreates what differs. That is how tests stay independent: `lab up` == reset.

lobes renders once per home (the first `lab up` after `lab down`); its raw output is kept in
.lab/pristine/<box>/render and every later `lab up` rebuilds the pristine files from it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from . import envfile, overlay, users
from .config import (
    BOXES,
    DOCKER,
    LOBES_BIN,
    PRISTINE_DIR,
    SCRUBBED_PATH,
    Box,
)
from .proc import LabError, log, run

OVERRIDE = "docker-compose.override.yml"
GATEWAY_UID = 10001  # the `gateway` user of lobes' Dockerfile.gateway
# Bytes. lobes lanes ask for unlimited memlock; runc needs CAP_SYS_RESOURCE to raise the
# limit above the engine's own, which this VM does not grant. 64 KiB fits under any default.
MEMLOCK = 65536
HEARTBEAT_S = "5"


def as_user(box: Box, argv: list[str], extra_env: dict[str, str] | None = None) -> list[str]:
    """argv run as the box user with a scrubbed environment (what cron or CI would have)."""
    env = [f"PATH={SCRUBBED_PATH}", f"HOME={box.home}", f"USER={box.user}", f"LOGNAME={box.user}"]
    env += [f"{k}={v}" for k, v in (extra_env or {}).items()]
    return ["runuser", "-u", box.user, "--", "env", "-i", *env, *argv]


def compose(box: Box, *args: str, timeout: float = 300) -> str:
    proc = run(as_user(box, [DOCKER, "compose", *args]), cwd=box.lobes_dir, timeout=timeout)
    return proc.stdout


def _render_dir(box: Box) -> Path:
    return PRISTINE_DIR / box.name / "render"


def _manifest_path(box: Box) -> Path:
    return PRISTINE_DIR / box.name / "manifest.json"


def manifest(box: Box) -> dict[str, Any]:
    return json.loads(_manifest_path(box).read_text())


def _top_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.is_file() and not p.is_symlink())


def rendered(box: Box) -> bool:
    return (
        _manifest_path(box).exists()
        and (box.lobes_dir / "docker-compose.yml").exists()
        and _render_dir(box).is_dir()
    )


def _remove_all_containers(box: Box) -> None:
    ids = run(as_user(box, [DOCKER, "ps", "-aq"])).stdout.split()
    if ids:
        log(f"{box.name}: removing {len(ids)} container(s) left from an earlier lab")
        run(as_user(box, [DOCKER, "rm", "-f", *ids]), timeout=120)


def lobes_init(box: Box) -> None:
    """Run the real `lobes init` as the box user and keep its raw output as the base."""
    log(f"lobes init --profile {box.name} --shape {box.shape} --apply ({box.user})")
    if box.lobes_dir.exists():
        # A home left by another checkout's lab (or a machine image taken with the lab up)
        # still has containers; the engine restarts them and the gateway keeps writing to
        # ~/.lobes/logs while it is being removed. Stop them first.
        _remove_all_containers(box)
        shutil.rmtree(box.lobes_dir)
    proc = run(
        as_user(
            box,
            [str(LOBES_BIN), "init", "--profile", box.name, "--shape", box.shape, "--apply"],
        ),
        cwd=box.home,
        timeout=120,
    )
    render = _render_dir(box)
    if render.exists():
        shutil.rmtree(render)
    render.mkdir(parents=True)
    uid, gid = users.uid_gid(box)
    with users.home_dir(box.home, ".lobes", uid, gid) as lobes:
        # Read without following a link: a file of the user's linked to one only root may
        # read would otherwise land in the pristine render and so in the user's ~/.lobes.
        for name in users.plain_files(lobes):
            content = users.read_at(lobes, name)
            if content is not None:
                (render / name).write_bytes(content)
    (render.parent / "lobes-init.log").write_text(proc.stdout + proc.stderr)
    # The services this shape really starts (profiles from the rendered COMPOSE_PROFILES),
    # resolved by compose itself over lobes' own chain.
    chain = _fleet_files(box)
    services = compose_services(box, chain)
    _manifest_path(box).write_text(
        json.dumps({"services": services, "base_chain": chain}, indent=1) + "\n"
    )


def _fleet_files(box: Box) -> list[str]:
    out = run(as_user(box, [str(LOBES_BIN), "fleet", "files"]), cwd=box.lobes_dir).stdout
    return [tok for tok in out.split() if tok != "-f"]


def compose_services(box: Box, chain: list[str]) -> list[str]:
    out = run(
        as_user(
            box, [DOCKER, "compose", "config", "--services"], {"COMPOSE_FILE": ":".join(chain)}
        ),
        cwd=box.lobes_dir,
    ).stdout
    return sorted(out.split())


def render_override(box: Box, services: list[str], images: dict[str, str]) -> str:
    """What a GPU-less lab cannot do, one reason per line; everything else is lobes' own."""
    lines = [
        "# Fleet lab override (written by lab/deployments.py; `lab up` restores it).",
        "# What a GPU-less VM cannot do, and nothing else:",
        "# - no GPU: the device reservations go (lobes' own gpu overlay uses the same !reset);",
        "# - no CAP_SYS_RESOURCE: runc cannot raise memlock to unlimited, so clamp it;",
        "# - mg-logwrap's boot delay, start counter and memory gate hold lanes for minutes and",
        "#   freeze a lane the lab recreates often: switched off for every lane;",
        "# - the stand-in loads in a second: health is probed every 5 s instead of every 30 s,",
        "#   so depends_on (worker -> embed, rerank) and readiness do not wait for nothing;",
        "# - images come from the lab registry by digest: no `build:` (gateway, gemma lanes);",
        "# - the gateway needs an init to reap its children (it stops in 10 s without one).",
        "services:",
    ]
    for svc in services:
        lines.append(f"  {svc}:")
        if svc == "gateway":
            # The fleet pins the gateway image by digest in .env (GATEWAY_IMAGE), like every
            # lane image; lobes' template has no variable for it, so the override reads it.
            lines += [
                "    build: !reset null",
                "    image: ${GATEWAY_IMAGE:?GATEWAY_IMAGE must pin the gateway image by digest}",
                "    init: true",
            ]
        else:
            lines += [
                "    deploy: !reset null",
                "    ulimits:",
                f"      memlock: {{soft: {MEMLOCK}, hard: {MEMLOCK}}}",
            ]
            if svc.startswith("vllm-multimodal") or svc == "vllm-muse":
                lines.append("    build: !reset null")
        lines += [
            "    environment:",
            '      LOBES_BOOT_DELAY_S: "0"',
            '      LOBES_START_MAX: "0"',
            '      LOBES_MEM_GATE: "0"',
            # 5 s, not lobes' 30 s: the stand-in is ready in a second and the gateway waits for
            # its lanes. Not 2 s either: every check is a `runc exec`, and 15 containers
            # checked every 2 s kept most of a core of this 2-core machine busy.
            "    healthcheck:",
            "      interval: 5s",
            "      timeout: 5s",
            "      start_period: 60s",
        ]
    return "\n".join(lines) + "\n"


def env_values(
    box: Box, images: dict[str, str], secrets: dict[str, str], chain: list[str]
) -> dict[str, str]:
    seeds = [b.gateway_origin for b in BOXES if b.name != box.name]
    return mesh_env(box.name, box.name, box.gateway_origin, seeds, images, secrets, chain)


def mesh_env(
    kind: str,
    name: str,
    origin: str,
    seeds: list[str],
    images: dict[str, str],
    secrets: dict[str, str],
    chain: list[str],
) -> dict[str, str]:
    """The lab's `.env` edits for a member of `kind` (thor, spark, orin) called `name`: a lab
    box, or a scale box copied from one (lab/scale.py)."""
    values = {
        "VLLM_NIGHTLY_IMAGE": images["vllm_nightly"],
        "GATEWAY_IMAGE": images["gateway"],
        "LOBES_MESH_KEY": secrets["mesh_key"],
        "LOBES_MESH_NAME": name,
        "GATEWAY_SELF_ORIGIN": origin,
        "LOBES_MESH_SEEDS": ",".join(seeds),
        "LOBES_MESH_HEARTBEAT_S": HEARTBEAT_S,
        "COMPOSE_FILE": ":".join(chain),
    }
    if kind == "thor":
        values["WORKER_IMAGE"] = images["vllm_nightly"]
    if kind == "orin":
        values["MULTIMODAL_IMAGE"] = images.get("vllm_gemma4", images["vllm_nightly"])
    if kind == "spark":
        # The keyed member: every /v1/* call without this bearer gets 401.
        values["GATEWAY_API_KEY"] = secrets["spark_gateway_key"]
    return values


def secrets_env(box: Box, secrets: dict[str, str]) -> str:
    """The operator's secrets file: where the desired state's box_file secrets live."""
    return (
        "# secrets of this box (lab-generated); never committed, never copied off the box\n"
        f"GATEWAY_API_KEY={secrets[f'{box.name}_gateway_key']}\n"
        f"LOBES_MESH_KEY={secrets['mesh_key']}\n"
        f"HF_TOKEN={secrets['hf_token']}\n"
    )


def pristine_files(
    box: Box, images: dict[str, str], secrets: dict[str, str]
) -> dict[str, tuple[bytes, int]]:
    """Home-relative path -> (content, mode) of everything `lab up` owns in the box home."""
    m = manifest(box)
    services = list(m["services"])
    chain = [*m["base_chain"], OVERRIDE]
    files: dict[str, tuple[bytes, int]] = {}
    for f in _top_files(_render_dir(box)):
        mode = 0o600 if f.name == ".env" else 0o644
        files[f".lobes/{f.name}"] = (f.read_bytes(), mode)
    env_text = files[".lobes/.env"][0].decode()
    env_text = envfile.set_keys(env_text, env_values(box, images, secrets, chain))
    files[".lobes/.env"] = (env_text.encode(), 0o600)
    files[f".lobes/{OVERRIDE}"] = (render_override(box, services, images).encode(), 0o644)
    files[".lobes/.secrets.env"] = (secrets_env(box, secrets).encode(), 0o600)
    for name, text in users.login_files(box).items():
        files[name] = (text.encode(), 0o644)
    return files


def restore(box: Box, images: dict[str, str], secrets: dict[str, str]) -> list[str]:
    """Make the box home match the pristine deployment. Returns what had to change."""
    uid, gid = users.uid_gid(box)
    files = pristine_files(box, images, secrets)
    overlay.write(box, OVERRIDE, files[f".lobes/{OVERRIDE}"][0])
    changed = []
    # Root writes into directories the box user owns: through users.write_file, which never
    # follows a link there (a symlink in ~/.lobes is replaced by the file, not written through).
    for rel, (content, mode) in files.items():
        if users.write_file(box.home, rel, content, uid, gid, mode):
            changed.append(rel)
    wanted = {rel for rel in files if rel.startswith(".lobes/")}
    with users.home_dir(box.home, ".lobes", uid, gid) as lobes:
        for name in users.plain_files(lobes):
            if f".lobes/{name}" not in wanted:
                os.unlink(name, dir_fd=lobes)
                changed.append(f"-.lobes/{name}")
        # The gateway (uid 10001 in its image) writes the mesh state here.
        with users.subdir(lobes, "mesh", GATEWAY_UID, GATEWAY_UID, 0o755, where=box.lobes_dir):
            pass
    if changed:
        log(f"{box.name}: restored {', '.join(changed)}")
    return changed


def expected_images(box: Box) -> dict[str, str]:
    """service -> image as compose renders it now (scrubbed env, the box's own chain)."""
    out = compose(box, "config", "--format", "json")
    return {name: svc.get("image", "") for name, svc in json.loads(out)["services"].items()}


def up(box: Box) -> None:
    """`docker compose up -d` as the box user, scrubbed env, in ~/.lobes (chain from .env).

    One retry: on a loaded machine a first pull or a dependency's health wait can fail
    transiently; a second failure is real and raised.
    """
    try:
        compose(box, "--progress", "plain", "up", "-d", "--remove-orphans")
    except LabError as e:
        log(f"{box.name}: compose up failed, retrying once: {str(e).splitlines()[-1]}")
        time.sleep(2)
        compose(box, "--progress", "plain", "up", "-d", "--remove-orphans")


def force_recreate(box: Box, services: list[str]) -> None:
    compose(box, "--progress", "plain", "up", "-d", "--no-deps", "--force-recreate", *services)


def remove_pristine(box: Box) -> None:
    shutil.rmtree(PRISTINE_DIR / box.name, ignore_errors=True)
