"""The field incidents, reproduced by hand: what the seed reports say operators did.

Every helper acts over SSH as the box user with plain shell, docker and compose commands,
never through the reconciler's code, and returns what it did (the commands, the values
before and after) so a test can assert the reconciler finds exactly that. `reset(box)` (or
any `lab up`) puts the box back to its pristine deployment.

    window_change_lane_only(box, key, value)   #208: .env window edited, lane recreated alone
    shell_exported_key(box, name, value)       #209: key exported in ~/.bashrc, gateway
                                                      recreated from a login shell
    hardcoded_flag(box, service, flag)         a flag hard-coded into the override's command
    other_image_digest(box, service, ref)      a lane run from another image digest
    gateway_published_on(box, address)         the gateway published on another address
"""

from __future__ import annotations

import json
import re
import secrets as _secrets
import shlex
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import deployments, imageset, readiness, ssh
from .config import BOXES
from .config import box as _box
from .proc import wait_for

# The lane each window/serve key belongs to (lobes' role prefixes -> compose services).
_PREFIX_SERVICE = {
    "PRIMARY": "vllm-primary",
    "WORKER": "vllm-worker",
    "MULTIMODAL": "vllm-multimodal",
    "EMBED": "vllm-embed",
    "RERANK": "vllm-rerank",
    "HAND": "vllm-hand",
    "ASSOCIATE": "vllm-associate",
    "MUSE": "vllm-muse",
}
# The variable a service's `image:` reads first (template: `${WORKER_IMAGE:-${VLLM_NIGHTLY…}}`).
_IMAGE_VAR = {
    "vllm-worker": "WORKER_IMAGE",
    "vllm-hand": "HAND_IMAGE",
    "vllm-associate": "ASSOCIATE_IMAGE",
    "vllm-multimodal": "MULTIMODAL_IMAGE",
}

OVERRIDE = deployments.OVERRIDE


def _wait_healthy(box_name: str, service: str, timeout: float = 90) -> None:
    """Not part of the incident: return only once the touched container is healthy again."""
    b = _box(box_name)

    def healthy() -> bool:
        return any(
            lane.service == service and lane.state == "running" and lane.health == "healthy"
            for lane in readiness.lanes(b)
        )

    wait_for(healthy, timeout=timeout, interval=0.3, what=f"{service} healthy on {box_name}")
    if service == "gateway":
        return  # some incidents publish it elsewhere: its roles are judged by the caller
    # The gateway polls its lanes on its own schedule, so a lane Docker already calls healthy
    # can still be unready in /capabilities for a moment. An incident ends settled (seed 000
    # §8: the role ready again, with its stale window), never halfway through that poll.

    def local_roles_ready() -> bool:
        h = readiness.check(b)
        return bool(h.roles) and not any(
            p.startswith("role ") and p.endswith("(local)") for p in h.problems
        )

    wait_for(local_roles_ready, timeout=timeout, interval=0.3, what=f"roles ready on {box_name}")


def _sh(box_name: str, script: str, *, input: str | None = None) -> str:
    return ssh.run(_box(box_name), script, input=input).stdout


def _sed_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("|", "\\|").replace("&", "\\&")


def service_for_key(key: str) -> str:
    for prefix, service in sorted(_PREFIX_SERVICE.items(), key=lambda kv: -len(kv[0])):
        if key.startswith(prefix + "_"):
            return service
    raise ValueError(f"no lane owns {key}")


def window_change_lane_only(
    box: str, key: str, value: str | int, service: str | None = None
) -> dict[str, Any]:
    """Seed #208: edit a window in .env, recreate only its lane; the gateway keeps the old one."""
    service = service or service_for_key(key)
    value = str(value)
    k = shlex.quote(key)
    script = (
        "set -e; cd ~/.lobes; "
        f"old=$(grep -E '^'{k}'=' .env | tail -n 1 | cut -d= -f2- "
        "| sed -E 's/[[:space:]]+#.*$//'); "
        f"if grep -qE '^'{k}'=' .env; then "
        f"sed -i -E {shlex.quote(f's|^{key}=[^[:space:]]*|{key}={_sed_escape(value)}|')} .env; "
        f"else printf '%s\\n' {shlex.quote(f'{key}={value}')} >> .env; fi; "
        'printf "%s\\n" "$old"; '
        f"docker compose up -d --no-deps {shlex.quote(service)} >/dev/null 2>&1"
    )
    old = _sh(box, script).strip()
    _wait_healthy(box, service)
    return {
        "incident": "window_change_lane_only",
        "box": box,
        "key": key,
        "old": old or None,
        "new": value,
        "service": service,
        "commands": [
            f"edit ~/.lobes/.env: {key}={value}",
            f"docker compose up -d --no-deps {service}",
        ],
    }


def shell_exported_key(
    box: str, name: str = "GATEWAY_API_KEY", value: str | None = None
) -> dict[str, Any]:
    """Seed #209: `export NAME=value` in ~/.bashrc, gateway recreated from a login shell."""
    value = value or f"shell-{_secrets.token_hex(8)}"
    line = f"export {name}={value}"
    recreate = "cd ~/.lobes && docker compose up -d --force-recreate --no-deps gateway"
    script = (
        "set -e; "
        f"printf '%s\\n' {shlex.quote(line)} >> ~/.bashrc; "
        "wc -l < ~/.bashrc; "
        f"bash -lc {shlex.quote(recreate)} >/dev/null 2>&1"
    )
    lineno = int(_sh(box, script).strip())
    _wait_healthy(box, "gateway")
    return {
        "incident": "shell_exported_key",
        "box": box,
        "name": name,
        "value": value,
        "file": f"{_box(box).home}/.bashrc",
        "line": lineno,
        "commands": [f"echo {line!r} >> ~/.bashrc", f"bash -lc '{recreate}'"],
    }


def _read_override(box: str) -> str:
    return _sh(box, f"cat ~/.lobes/{OVERRIDE}")


def _write_override(box: str, text: str) -> None:
    _sh(box, f"cat > ~/.lobes/{OVERRIDE}", input=text)


def _set_service_key(text: str, service: str, key: str, yaml_value: str) -> str:
    """Set `key: value` under `  service:` in our override (a text edit, as an operator would)."""
    lines = text.splitlines()
    header = f"  {service}:"
    if header not in lines:
        lines += [header, f"    {key}: {yaml_value}"]
        return "\n".join(lines) + "\n"
    start = lines.index(header) + 1
    end = start
    while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
        end += 1
    block = lines[start:end]
    # Drop an earlier value of the key (and its indented continuation lines).
    kept: list[str] = []
    skipping = False
    for ln in block:
        if ln.startswith(f"    {key}:"):
            skipping = True
            continue
        if skipping and ln.startswith("      "):
            continue
        skipping = False
        kept.append(ln)
    lines[start:end] = [f"    {key}: {yaml_value}", *kept]
    return "\n".join(lines) + "\n"


def raw_command(box: str, service: str) -> str | list[str]:
    """The service's `command:` as written in the compose chain, before interpolation."""
    out = _sh(box, "cd ~/.lobes && docker compose config --no-interpolate --format json")
    return json.loads(out)["services"][service]["command"]


def hardcoded_flag(box: str, service: str, flag: str) -> dict[str, Any]:
    """A hand edit of the override that spells one flag literally into the lane's command.

    `--max-model-len=65536` replaces the `--max-model-len=${WORKER_MAX_MODEL_LEN:-…}` slot, so
    the `.env` knob goes dead while every other interpolation still works.
    """
    name = flag.split("=", 1)[0]
    before = raw_command(box, service)
    after: str | list[str]
    if isinstance(before, str):
        # lobes' folded command strings are shell-lexed by compose AFTER interpolation; edit
        # the one token in place and leave every other `${…}` slot as it is.
        slot = re.compile(rf"(?<!\S){re.escape(name)}(=\S*)?(?=\s|$)")
        after = slot.sub(flag, before, count=1) if slot.search(before) else f"{before} {flag}"
    else:
        tokens = list(before)
        hits = [i for i, t in enumerate(tokens) if t == name or t.startswith(name + "=")]
        if hits:
            i = hits[0]
            # `--flag value` form: drop the separate value too.
            if "=" not in tokens[i] and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
                del tokens[i + 1]
            tokens[i] = flag
        else:
            tokens.append(flag)
        after = tokens
    text = _set_service_key(_read_override(box), service, "command", json.dumps(after))
    _write_override(box, text)
    _sh(
        box, f"cd ~/.lobes && docker compose up -d --no-deps {shlex.quote(service)} >/dev/null 2>&1"
    )
    _wait_healthy(box, service)
    return {
        "incident": "hardcoded_flag",
        "box": box,
        "service": service,
        "flag": flag,
        "file": f"{_box(box).lobes_dir}/{OVERRIDE}",
        "command_before": before,
        "command_after": after,
        "commands": [
            f"edit ~/.lobes/{OVERRIDE}: {service}.command",
            f"docker compose up -d --no-deps {service}",
        ],
    }


def _seconds(ns: int | None) -> str | None:
    return f"{ns / 1e9:g}s" if ns else None


def docker_run_argv(inspect: dict[str, Any], image: str) -> list[str]:
    """A `docker run` that recreates a compose container from its inspect, on another image.

    As close as the CLI allows: every label (compose's config-hash included, so compose
    believes the container is current), env, mounts, network and aliases, ulimits, ipc,
    restart policy, runtime, init, ports. What the CLI cannot say: `--entrypoint` takes one
    word (the rest of it moves in front of the command) and the healthcheck becomes shell
    form. Those two differences are visible in `docker inspect`, as they would be on a box.
    """
    cfg, host = inspect["Config"], inspect["HostConfig"]
    name = inspect["Name"].lstrip("/")
    argv = ["docker", "run", "--detach", "--name", name]
    for key, value in sorted((cfg.get("Labels") or {}).items()):
        argv += ["--label", f"{key}={value}"]
    for item in cfg.get("Env") or []:
        argv += ["--env", item]
    for bind in host.get("Binds") or []:
        argv += ["--volume", bind]
    network = host.get("NetworkMode", "")
    if network and network not in ("default", "bridge"):
        argv += ["--network", network]
        aliases = (inspect["NetworkSettings"]["Networks"].get(network) or {}).get("Aliases") or []
        for alias in aliases:
            if alias != name and not re.fullmatch(r"[0-9a-f]{12}", alias):
                argv += ["--network-alias", alias]
    restart = (host.get("RestartPolicy") or {}).get("Name")
    if restart and restart != "no":
        argv += ["--restart", restart]
    if host.get("IpcMode") in ("host", "shareable", "private"):
        argv += ["--ipc", host["IpcMode"]]
    for ul in host.get("Ulimits") or []:
        argv += ["--ulimit", f"{ul['Name']}={ul['Soft']}:{ul['Hard']}"]
    if host.get("Runtime") and host["Runtime"] != "runc":
        argv += ["--runtime", host["Runtime"]]
    if host.get("Init"):
        argv.append("--init")
    for port, bindings in sorted((host.get("PortBindings") or {}).items()):
        for b in bindings or []:
            ip = f"{b['HostIp']}:" if b.get("HostIp") else ""
            argv += ["--publish", f"{ip}{b.get('HostPort', '')}:{port}"]
    for port in sorted(cfg.get("ExposedPorts") or {}):
        argv += ["--expose", port]
    if cfg.get("WorkingDir"):
        argv += ["--workdir", cfg["WorkingDir"]]
    if cfg.get("User"):
        argv += ["--user", cfg["User"]]
    hc = cfg.get("Healthcheck") or {}
    test = hc.get("Test") or []
    if test and test[0] in ("CMD", "CMD-SHELL"):
        cmd = test[1] if test[0] == "CMD-SHELL" else shlex.join(test[1:])
        argv += ["--health-cmd", cmd]
        for flag, key in (("--health-interval", "Interval"), ("--health-timeout", "Timeout"),
                          ("--health-start-period", "StartPeriod")):  # fmt: skip
            duration = _seconds(hc.get(key))
            if duration:
                argv += [flag, duration]
        if hc.get("Retries"):
            argv += ["--health-retries", str(hc["Retries"])]
    entrypoint = cfg.get("Entrypoint") or []
    if entrypoint:
        argv += ["--entrypoint", entrypoint[0]]
    argv.append(image)
    argv += [*entrypoint[1:], *(cfg.get("Cmd") or [])]
    return argv


def other_image_digest(
    box: str, service: str, ref: str | None = None, method: str = "compose"
) -> dict[str, Any]:
    """Run one lane from another image digest; `.env` still names the pinned one.

    method="compose": the lane's image variable exported for one compose call (compose labels
    the container with the config it really used). method="docker-run": the container is
    replaced by a hand-written `docker run` that copies compose's labels, config-hash
    included, so compose itself believes the lane is current; only `docker inspect` tells.
    """
    ref = ref or imageset.load()["vllm_nightly_alt"]
    if method == "compose":
        var = _IMAGE_VAR.get(service, "VLLM_NIGHTLY_IMAGE")
        up = f"docker compose up -d --no-deps {shlex.quote(service)}"
        commands = [f"cd ~/.lobes && {var}={shlex.quote(ref)} {up}"]
        _sh(box, f"{commands[0]} >/dev/null 2>&1")
    elif method == "docker-run":
        container = f"model-gear-{service}"
        inspect = json.loads(_sh(box, f"docker inspect {container}"))[0]
        var = None
        commands = [f"docker rm -f {container}", shlex.join(docker_run_argv(inspect, ref))]
        _sh(box, " && ".join(f"{c} >/dev/null" for c in commands))
    else:
        raise ValueError(f"method must be compose or docker-run, not {method!r}")
    _wait_healthy(box, service)
    return {
        "incident": "other_image_digest",
        "box": box,
        "service": service,
        "method": method,
        "variable": var,
        "ref": ref,
        "commands": commands,
    }


def gateway_published_on(box: str, address: str) -> dict[str, Any]:
    """The gateway's port published on another host address (the template binds all)."""
    port = f"{address}:8000:8000"
    text = _set_service_key(_read_override(box), "gateway", "ports", f'!override ["{port}"]')
    _write_override(box, text)
    _sh(box, "cd ~/.lobes && docker compose up -d --no-deps gateway >/dev/null 2>&1")
    _wait_healthy(box, "gateway")
    return {
        "incident": "gateway_published_on",
        "box": box,
        "address": address,
        "ports": [port],
        "file": f"{_box(box).lobes_dir}/{OVERRIDE}",
        "commands": [
            f"edit ~/.lobes/{OVERRIDE}: gateway.ports = [{port}]",
            "docker compose up -d --no-deps gateway",
        ],
    }


def reset(box: str | None = None, *, timeout: float = 120) -> dict[str, Any]:
    """Put one box (default: all) back to pristine and wait until the whole lab is ready."""
    from . import labfacts
    from .lifecycle import _converge, locked

    images = imageset.load()
    secrets = labfacts.lab_secrets()
    targets = [_box(box)] if box else list(BOXES)
    with locked(), ThreadPoolExecutor(len(targets)) as pool:
        # Each box has its own dockerd and files: resetting them at once overlaps their waits.
        done = pool.map(lambda b: _converge(b, images, secrets), targets)
        changed = {b.name: result for b, result in zip(targets, done, strict=True)}
    services = {b.name: list(deployments.manifest(b)["services"]) for b in BOXES}
    readiness.wait_all(services, timeout=timeout)
    return {"reset": [b.name for b in targets], "changed": changed}


INCIDENTS: dict[str, Callable[..., dict[str, Any]]] = {
    "window_change_lane_only": window_change_lane_only,
    "shell_exported_key": shell_exported_key,
    "hardcoded_flag": hardcoded_flag,
    "other_image_digest": other_image_digest,
    "gateway_published_on": gateway_published_on,
}
