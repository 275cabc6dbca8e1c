"""Auth scenarios for `reconcile audit`, set up by hand on the lab boxes.

Like lab/incidents.py, every helper acts over SSH as the box user with plain shell, docker and
compose commands (never through the reconciler), and a test restores each box it touched with
`lab.incidents.reset(box)`. Key values travel on stdin, never in an argv (`ps` on either side
would show them), and each helper returns what it did so a test can assert the audit saw it.

    keyed(box, key, mesh_key)      .secrets.env + .env carry the key; gateway recreated scrubbed
    opened(box, mesh_key)          .env's key commented out; gateway recreated scrubbed
    stale_key(box, key, mesh_key)  .env (and .secrets.env) get a key; the gateway is NOT recreated
    publish_lane(box, service, p)  a lane's port published on the host by an override edit
    desired_state(dir, auth)       an inventory whose per-box overlay sets gateway.auth
"""

from __future__ import annotations

import json
import secrets
import shlex
import shutil
from pathlib import Path
from typing import Any, Literal

from ruamel.yaml import YAML

from lab import deployments, incidents, readiness, ssh
from lab.config import BOXES, REPO, SECRETS_FILE
from lab.config import box as lab_box

SCRUBBED = 'env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$HOME" USER="$USER" LOGNAME="$USER"'

# Runs on the box: set (value on stdin) or comment out (empty stdin) NAME's active .env lines.
_EDIT_ENV = r"""
import re, sys
name, value = sys.argv[1], sys.stdin.read().strip()
path = sys.argv[2]
lines = open(path).read().splitlines()
active = [i for i, l in enumerate(lines) if re.match(r"^%s=" % re.escape(name), l)]
if value:
    if active:
        lines[active[-1]] = "%s=%s" % (name, value)
    else:
        lines.append("%s=%s" % (name, value))
else:
    for i in active:
        lines[i] = "# " + lines[i]
open(path, "w").write("\n".join(lines) + "\n")
print(active[-1] + 1 if active else len(lines))
"""


def new_key(box: str) -> str:
    return f"audit-{box}-{secrets.token_urlsafe(12)}"


def lab_secrets() -> dict[str, str]:
    return json.loads(SECRETS_FILE.read_text())


def _sh(box: str, script: str, *, input: str | None = None) -> str:
    return ssh.run(lab_box(box), script, input=input).stdout


def write_secrets(box: str, values: dict[str, str]) -> None:
    """~/.lobes/.secrets.env (0600), where the desired state's box_file secrets live."""
    text = "".join(f"{k}={v}\n" for k, v in values.items())
    _sh(box, "umask 077 && cat > ~/.lobes/.secrets.env", input=text)


def set_env_key(box: str, name: str, value: str | None) -> int:
    """Set NAME in ~/.lobes/.env (or comment its active lines out); returns the line."""
    script = f"python3 -c {shlex.quote(_EDIT_ENV)} {shlex.quote(name)} ~/.lobes/.env"
    return int(_sh(box, script, input=value or "").strip())


def recreate_gateway(box: str) -> None:
    """As a converge (or cron) would: compose with a scrubbed environment, gateway only."""
    _sh(
        box,
        f"cd ~/.lobes && {SCRUBBED} docker compose up -d --force-recreate --no-deps gateway "
        ">/dev/null 2>&1",
    )
    incidents._wait_healthy(box, "gateway")


def wait_mesh(timeout: float = 150) -> None:
    """Until every box's gateway is healthy and every proxied role verified again (a recreated
    member is re-probed by the others within a few heartbeats)."""
    services = {b.name: list(deployments.manifest(b)["services"]) for b in BOXES}  # type: ignore[call-overload]
    readiness.wait_all(services, timeout=timeout)


def keyed(box: str, key: str, mesh_key: str) -> dict[str, Any]:
    write_secrets(box, {"GATEWAY_API_KEY": key, "LOBES_MESH_KEY": mesh_key})
    line = set_env_key(box, "GATEWAY_API_KEY", key)
    recreate_gateway(box)
    return {"scenario": "keyed", "box": box, "env_line": line}


def opened(box: str, mesh_key: str) -> dict[str, Any]:
    write_secrets(box, {"LOBES_MESH_KEY": mesh_key})
    line = set_env_key(box, "GATEWAY_API_KEY", None)
    recreate_gateway(box)
    return {"scenario": "opened", "box": box, "env_line": line}


def stale_key(box: str, key: str, mesh_key: str) -> dict[str, Any]:
    """The key lands in .env (and the desired source), but nobody recreates the gateway."""
    write_secrets(box, {"GATEWAY_API_KEY": key, "LOBES_MESH_KEY": mesh_key})
    line = set_env_key(box, "GATEWAY_API_KEY", key)
    return {"scenario": "stale_key", "box": box, "env_line": line}


def publish_lane(box: str, service: str, host_port: int) -> dict[str, Any]:
    """An override edit publishing a lane's port on every host interface, lane recreated."""
    override = f"~/.lobes/{deployments.OVERRIDE}"
    text = _sh(box, f"cat {override}")
    edited = incidents._set_service_key(text, service, "ports", f'["{host_port}:8000"]')
    _sh(box, f"cat > {override}", input=edited)
    _sh(
        box, f"cd ~/.lobes && docker compose up -d --no-deps {shlex.quote(service)} >/dev/null 2>&1"
    )
    incidents._wait_healthy(box, service)
    return {"scenario": "publish_lane", "box": box, "service": service, "port": host_port}


def desired_state(directory: Path, auth: dict[str, Literal["keyed", "open"]]) -> Path:
    """inventory/lab.yaml with one more last layer per box setting gateway.auth (on top of the
    lab's own box overlay, if it has one); returns its path, for `reconcile -i PATH`."""
    yaml = YAML()
    directory.mkdir(parents=True, exist_ok=True)
    inventory = yaml.load((REPO / "inventory" / "lab.yaml").read_text())
    base = inventory.get("box_overlay")
    for b in BOXES:
        layer: dict[str, Any] = {}
        if base:
            path = Path(base.replace("{box}", b.name))
            path = path if path.is_absolute() else REPO / path
            layer = dict(yaml.load(path.read_text()) or {})
        gateway = dict(layer.get("gateway") or {})
        gateway["auth"] = auth.get(b.name, "keyed")
        if gateway["auth"] == "open":
            gateway["api_key"] = None
        layer["gateway"] = gateway
        with (directory / f"{b.name}.yaml").open("w") as handle:
            yaml.dump(layer, handle)
    inventory["box_overlay"] = f"{directory}/{{box}}.yaml"
    path = directory / "inventory.yaml"
    with path.open("w") as handle:
        yaml.dump(inventory, handle)
    return path


def unreachable(inventory: Path, box: str, port: int = 2) -> Path:
    """The same inventory with `box` reached on an SSH port nothing listens on: the box cannot
    be observed (its gateway still answers the controller)."""
    yaml = YAML()
    data = yaml.load(inventory.read_text())
    data["boxes"][box]["ssh_port"] = port
    path = inventory.with_name(f"unreachable-{box}.yaml")
    with path.open("w") as handle:
        yaml.dump(data, handle)
    return path


# -- fixtures for the unit tests -----------------------------------------------------------------
_KEEP_ENV = ("GATEWAY_API_KEY", "CULTURE_VLLM_API_KEY", "LOBES_MESH_KEY", "LOBES_MESH_NAME")


def trim_snapshot(src: Path, dst: Path) -> None:
    """A saved audit snapshot cut to what the audit reads (the renders, images and lane
    bodies go), so a scenario's observations can live in tests/fixtures/audit/ as a few KB."""
    dst.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.glob("*.json")):
        raw = json.loads(path.read_text())
        if path.name != "index.json":
            raw = _trim_observation(raw)
        else:  # the saved files' digests do not hold for the cut ones
            raw.pop("sha256", None)
        (dst / path.name).write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n")
    # The desired-state facts it was judged against (the scenario's gateway.auth is one): the
    # fixture replays with `reconcile -i lab audit --from-snapshot DST` where no lab runs.
    if (src / "facts").is_dir():
        shutil.rmtree(dst / "facts", ignore_errors=True)
        shutil.copytree(src / "facts", dst / "facts")


def _trim_observation(obs: dict[str, Any]) -> dict[str, Any]:
    doc = obs.get("collected")
    if isinstance(doc, dict):
        containers = []
        for c in (doc.get("docker") or {}).get("containers") or []:
            env = {k: v for k, v in (c.get("env") or {}).items() if k in _KEEP_ENV}
            keep = ("name", "service", "status", "ports")
            containers.append({**{k: c.get(k) for k in keep}, "env": env})
        gateway = dict(doc.get("gateway") or {})
        gateway["capabilities"] = _trim_caps(gateway.get("capabilities"))
        names = (doc.get("variables") or {}).get("names") or []
        obs["collected"] = {
            "deploy_dir": doc.get("deploy_dir"),
            "deploy_dir_exists": doc.get("deploy_dir_exists"),
            "docker": {"containers": containers},
            "login_shell": doc.get("login_shell"),
            "variables": {"names": [n for n in names if "KEY" in n or "TOKEN" in n]},
            "gateway": gateway,
            "secret_sources": doc.get("secret_sources"),
            "audit": doc.get("audit"),
        }
    controller = dict(obs.get("controller") or {})
    controller["capabilities"] = _trim_caps(controller.get("capabilities"))
    obs["controller"] = controller
    return obs


def _trim_caps(probe: Any) -> Any:
    if not isinstance(probe, dict) or not isinstance(probe.get("body"), dict):
        return probe
    body = {
        role: {k: entry[k] for k in ("member", "proxied", "ready") if k in entry}
        for role, entry in probe["body"].items()
        if isinstance(entry, dict)
    }
    return {**probe, "body": body}
