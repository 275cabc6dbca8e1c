"""`python -m lab scale up|down|status [--boxes 50]`: the lab's live fan-out at fleet size.

N more SSH boxes beside the three-box lab, each one what the reconciler needs to observe a box
for real: its own network namespace (an address of the lab's own 10.77.0.0/24, joined to the
lab bridge, no default route), its own sshd (own host key, pinned in its own known_hosts), its
own deploy user with a login shell and a real lobes deployment in ~/scale-<box>.

What they share, and why (2 cores):
- The Docker engines: box `thor-3` is a thor and uses the lab thor's dockerd through a docker
  context in its ~/.docker (as every lab box user does), with its own compose project
  (`scale-thor-3`, the desired state's `deployment.project` for that box): 50 dockerd (and 50
  containerd) are not started. The user is in the engine's socket group, so on a shared engine
  a box user can see the other projects; a real box's engine is its own.
- The render: `lobes init` is deterministic for a profile and shape (the same bytes on every
  box; group_vars pins their digests), so each box's ~/scale-<box> is a copy of the lab box's own
  raw `lobes init` output for its shape (.lab/pristine/<shape box>/render), adapted as the lab
  adapts it (deployments.pristine_files' edits: registry digests, mesh name, origin and seeds,
  COMPOSE_FILE). 50 inits would cost about a minute of CPU for identical files.
- The containers are created (`docker compose up --no-start`: every service of the shape, with
  its labels, environment, mounts and published ports) but not started: 50 boxes x 5 lanes with
  health checks every 5 s (each a `runc exec`) and 50 gateways heart-beating 49 peers would
  swamp 2 cores, and 50 gateways cannot all publish :8000 on one engine's address. So drift on
  a scale box reports its lanes not running (and its gateway unreachable): the observation,
  the comparison and the report do the full work for every box; only the lanes' own HTTP
  answers are missing.
- Networks: each engine's address pool holds 8 bridge networks, so every scale project joins
  one network per engine (`fleet-scale`, external in the scale override) instead of making its
  own; containers that never start never collide on it.

The desired state is layered as the lab's: all.yaml -> the box's groups -> its kind's file
(group_vars/thor.yaml is a group `thor` for thor-1, thor-2, ...; box `thor` reads it as its
own) -> the lab's image overlay -> the box's overlay (.lab/scale/overlay/<box>.yaml: the scale
override's digest and the compose project). The inventory is generated:
`FLEET_INVENTORY=.lab/scale/lab-scale.yaml` (or `reconcile -i .lab/scale/lab-scale.yaml`).

Nothing of the three-box lab is changed: other names (users `fs-*`, namespaces `fsc-*`, veths
`fsv-*`, /run/fleet-lab/scale, .lab/scale), other addresses (10.77.0.100 and up), other compose
projects. Needs the lab up; one lab operation at a time (lifecycle.locked).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import envfile, labfacts, sshd, users
from .config import (
    BOX_BY_NAME,
    BRIDGE,
    CLIENT_KEY,
    DOCKER,
    GATEWAY_PORT,
    IMAGES_FILE,
    LAB_DIR,
    PRISTINE_DIR,
    REPO,
    RUN_ROOT,
    SCRUBBED_PATH,
    Box,
)
from .deployments import GATEWAY_UID, OVERRIDE, mesh_env, render_override
from .lifecycle import locked
from .proc import LabError, log, ok, run, running, spawn, stop_pidfile, wait_for

SCALE_DIR = LAB_DIR / "scale"
SCALE_RUN = RUN_ROOT / "scale"
INVENTORY = SCALE_DIR / "lab-scale.yaml"
KNOWN_HOSTS = SCALE_DIR / "known_hosts"
HOSTKEYS = SCALE_DIR / "hostkeys"
OVERLAYS = SCALE_DIR / "overlay"
LOGS = SCALE_DIR / "logs"
STATE = SCALE_DIR / "state.json"  # the boxes `up` made: what `down` removes
NETWORK = "fleet-scale"
KINDS = ("thor", "spark", "orin")
FIRST_OCTET = 100  # 10.77.0.100 and up; the lab boxes are .11-.13, the registry .1
MAX_BOXES = 150  # up to 10.77.0.249
GROUPS = {"thor": ["gpu", "jetson"], "spark": ["gpu", "dgx"], "orin": ["gpu", "jetson"]}


@dataclass(frozen=True)
class ScaleBox:
    name: str  # thor, spark, orin, thor-1, spark-1, ...
    index: int

    @property
    def kind(self) -> str:
        return self.name.split("-", 1)[0]

    @property
    def engine(self) -> Box:
        """The lab box whose dockerd this box uses."""
        return BOX_BY_NAME[self.kind]

    @property
    def address(self) -> str:
        return f"10.77.0.{FIRST_OCTET + self.index}"

    @property
    def user(self) -> str:
        return f"fs-{self.name}"

    @property
    def home(self) -> Path:
        return Path("/home") / self.user

    @property
    def lobes_dir(self) -> Path:
        # Named as its project: compose derives a project from the directory's name, so a
        # `docker compose` run there by hand (or by a converge) manages this box's project, not
        # `lobes`, the lab box's own on the shared engine (checks.py `_compose_project`).
        return self.home / self.project

    @property
    def project(self) -> str:
        return f"scale-{self.name}"

    @property
    def netns(self) -> str:
        return f"fsc-{self.name}"

    @property
    def veth(self) -> str:
        return f"fsv-{self.name}"

    @property
    def run_dir(self) -> Path:
        return SCALE_RUN / self.name

    @property
    def sshd_pidfile(self) -> Path:
        return self.run_dir / "sshd.pid"

    @property
    def hostkey(self) -> Path:
        return HOSTKEYS / f"{self.name}_ed25519"

    @property
    def origin(self) -> str:
        return f"http://{self.address}:{GATEWAY_PORT}"


def boxes(count: int) -> list[ScaleBox]:
    """Box k is copy k // 3 of thor, spark or orin: the names bench/scale_fleet.py uses."""
    if not 1 <= count <= MAX_BOXES:
        raise LabError(f"--boxes: 1 to {MAX_BOXES}, not {count}")
    out = []
    for i in range(count):
        kind, copy = KINDS[i % 3], i // 3
        out.append(ScaleBox(kind if copy == 0 else f"{kind}-{copy}", i))
    return out


def made() -> list[ScaleBox]:
    """The boxes the last `scale up` made (none if it never ran)."""
    if not STATE.exists():
        return []
    return boxes(int(json.loads(STATE.read_text())["boxes"]))


# -- the desired state's side ----------------------------------------------------------------------
def inventory_text(fleet: list[ScaleBox]) -> str:
    root = os.path.relpath(SCALE_DIR, REPO)
    lines = [
        "# Generated by `python -m lab scale up` (lab/scale.py): the lab at fleet size.",
        "# group_vars/thor.yaml (spark, orin) is a group for the copies: the same layering",
        "# as the three-box lab (all -> groups -> the box's kind -> lab overlays).",
        "group_order: [gpu, jetson, dgx, thor, spark, orin]",
        "image_overlay: .lab/images.yaml",
        f"box_overlay: {root}/overlay/{{box}}.yaml",
        "",
        "boxes:",
    ]
    for b in fleet:
        groups = GROUPS[b.kind] + ([b.kind] if b.name != b.kind else [])
        lines += [
            f"  {b.name}:",
            f"    groups: [{', '.join(groups)}]",
            f"    ssh_hostname: {b.address}",
            f"    ssh_user: {b.user}",
            "    ssh_port: 22",
            f"    ssh_key: {os.path.relpath(CLIENT_KEY, REPO)}",
            f"    ssh_known_hosts_file: {root}/known_hosts",
        ]
    return "\n".join(lines) + "\n"


# The secrets group_vars/all.yaml reads from the box's `.secrets.env`, by their keys there
SECRET_KEYS = {"gateway_api_key": "GATEWAY_API_KEY", "mesh_key": "LOBES_MESH_KEY",
               "hf_token": "HF_TOKEN"}  # fmt: skip


def overlay_text(b: ScaleBox, override: bytes) -> str:
    digest = hashlib.sha256(override).hexdigest()
    # Its `.secrets.env` is in its own directory (box_files), not the lab box's ~/.lobes: read
    # from elsewhere, every secret was "file-missing" and no converge could be planned.
    path = f"~/{b.project}/.secrets.env"
    secrets = "".join(
        f"  {name}:\n    source: box_file\n    path: {path}\n    key: {key}\n"
        for name, key in SECRET_KEYS.items()
    )
    return (
        "# Written by `lab scale up` (lab/scale.py): this box's directory and compose\n"
        "# project on its shared engine, the digest of the scale override, and where its\n"
        "# secrets are.\n"
        "deployment:\n"
        f"  directory: ~/{b.project}\n"
        f"  project: {b.project}\n"
        "  file_digests:\n"
        f"    {OVERRIDE}: {digest}\n"
        f"secrets:\n{secrets}"
    )


def scale_override(project: str, services: list[str], images: dict[str, str]) -> str:
    """The lab's own override for this shape, plus what sharing an engine needs: lobes names
    its containers (`container_name: model-gear-...`), so each box's get its project's
    prefix; and every scale project joins the engine's one network (its address pool holds 8)."""
    lines = render_override(BOX_BY_NAME["thor"], services, images).splitlines()
    out = []
    for line in lines:
        out.append(line)
        svc = line.strip()[:-1]
        if line.startswith("  ") and not line.startswith("   ") and svc in services:
            out.append(f"    container_name: {project}-{svc}")
    out += [
        "# Scale lab (lab/scale.py): one engine runs many boxes' projects.",
        "networks:",
        "  default:",
        f"    name: {NETWORK}",
        "    external: true",
    ]
    return "\n".join(out) + "\n"


def env_values(
    b: ScaleBox, fleet: list[ScaleBox], images: dict[str, str], secrets: dict[str, str]
) -> dict[str, str]:
    """deployments.env_values for a scale box: its own name, origin and the other members."""
    chain = [*_manifest(b.kind)["base_chain"], OVERRIDE]
    seeds = [o.origin for o in fleet if o.name != b.name]
    return mesh_env(b.kind, b.name, b.origin, seeds, images, secrets, chain)


def _manifest(kind: str) -> dict[str, list[str]]:
    path = PRISTINE_DIR / kind / "manifest.json"
    if not path.exists():
        raise LabError(f"{path} is missing: run `python -m lab up` first")
    data: dict[str, list[str]] = json.loads(path.read_text())
    return data


def _images() -> dict[str, str]:
    from ruamel.yaml import YAML

    if not IMAGES_FILE.exists():
        raise LabError(f"{IMAGES_FILE} is missing: run `python -m lab up` first")
    data: dict[str, str] = YAML(typ="safe").load(IMAGES_FILE.read_text())
    return data


# -- one box ---------------------------------------------------------------------------------------
def _user(b: ScaleBox) -> None:
    try:
        pwd.getpwnam(b.user)
    except KeyError:
        run(
            ["useradd", "--create-home", "--home-dir", b.home, "--shell", "/bin/bash",
             "--user-group", "--comment", f"fleet scale lab box {b.name}", b.user]
        )  # fmt: skip
        run(["usermod", "--password", "*", b.user])  # key only; see lab/users.py
    # The shared engine's socket is root:<engine user> 0660: the box user joins that group.
    run(["usermod", "--append", "--groups", b.engine.docker_group, b.user])
    if not os.path.lexists(b.home):  # a user left without its home (a scale down cut short)
        pw = pwd.getpwnam(b.user)
        os.mkdir(b.home, 0o750)
        os.chown(b.home, pw.pw_uid, pw.pw_gid)
    os.chmod(b.home, 0o750)


def _home(b: ScaleBox, files: dict[str, tuple[bytes, int]]) -> None:
    # As root in directories the box user owns: nothing there is followed (see users.write_at).
    pw = pwd.getpwnam(b.user)
    uid, gid = pw.pw_uid, pw.pw_gid
    for d, mode in ((".ssh", 0o700), (".docker", 0o700), (b.project, 0o755)):
        with users.home_dir(b.home, d, uid, gid, mode):
            pass
    context = f"flab-scale-{b.kind}"
    meta_dir = (
        b.home / ".docker" / "contexts" / "meta" / hashlib.sha256(context.encode()).hexdigest()
    )
    meta = {
        "Name": context,
        "Metadata": {"Description": f"fleet scale box {b.name}: lab {b.kind}'s shared dockerd"},
        "Endpoints": {"docker": {"Host": b.engine.docker_host, "SkipTLSVerify": False}},
    }
    files[".docker/config.json"] = (json.dumps({"currentContext": context}).encode(), 0o600)
    files[str(meta_dir.relative_to(b.home) / "meta.json")] = (json.dumps(meta).encode(), 0o600)
    files[".ssh/authorized_keys"] = (CLIENT_KEY.with_suffix(".pub").read_bytes(), 0o600)
    for rel, (content, mode) in files.items():
        users.write_file(b.home, rel, content, uid, gid, mode)  # missing parents: 0700
    with (
        users.home_dir(b.home, b.project, uid, gid) as project,
        users.subdir(project, "mesh", GATEWAY_UID, GATEWAY_UID, 0o755, where=b.lobes_dir),
    ):
        pass


def box_files(
    b: ScaleBox, fleet: list[ScaleBox], images: dict[str, str], secrets: dict[str, str]
) -> tuple[dict[str, tuple[bytes, int]], bytes]:
    """Home-relative path -> (content, mode), and the override's bytes."""
    render = PRISTINE_DIR / b.kind / "render"
    files: dict[str, tuple[bytes, int]] = {}
    for f in sorted(p for p in render.iterdir() if p.is_file()):
        files[f"{b.project}/{f.name}"] = (f.read_bytes(), 0o600 if f.name == ".env" else 0o644)
    dotenv = f"{b.project}/.env"
    env = envfile.set_keys(files[dotenv][0].decode(), env_values(b, fleet, images, secrets))
    files[dotenv] = (env.encode(), 0o600)
    services = list(_manifest(b.kind)["services"])
    override = scale_override(b.project, services, images).encode()
    files[f"{b.project}/{OVERRIDE}"] = (override, 0o644)
    secrets_env = (
        "# secrets of this box (lab-generated); never committed, never copied off the box\n"
        f"GATEWAY_API_KEY={secrets[f'{b.kind}_gateway_key']}\n"
        f"LOBES_MESH_KEY={secrets['mesh_key']}\n"
        f"HF_TOKEN={secrets['hf_token']}\n"
    )
    files[f"{b.project}/.secrets.env"] = (secrets_env.encode(), 0o600)
    fmt = {"user": b.user, "box": b.name}
    files[".bashrc"] = (users.BASHRC.format(**fmt).encode(), 0o644)
    files[".profile"] = (users.PROFILE.format(**fmt).encode(), 0o644)
    return files, override


def _netns(b: ScaleBox) -> None:
    if not Path("/run/netns", b.netns).exists():
        run(["ip", "netns", "add", b.netns])
    ns = ["ip", "-n", b.netns]
    if not ok([*ns, "link", "show", "dev", "eth0"]):
        if ok(["ip", "link", "show", "dev", b.veth]):
            run(["ip", "link", "del", b.veth])
        peer = f"fsp-{b.index}"
        run(["ip", "link", "add", b.veth, "type", "veth", "peer", "name", peer])
        run(["ip", "link", "set", peer, "netns", b.netns])
        run([*ns, "link", "set", peer, "name", "eth0"])
    run(["ip", "link", "set", b.veth, "master", BRIDGE, "up"])
    if f" {b.address}/24 " not in run([*ns, "-o", "-4", "addr", "show", "dev", "eth0"]).stdout:
        run([*ns, "addr", "add", f"{b.address}/24", "dev", "eth0"])
    run([*ns, "link", "set", "eth0", "up"])
    run([*ns, "link", "set", "lo", "up"])


def _sshd_config(b: ScaleBox, hang: bool = False) -> str:
    # A hanging box (hang=True, for the fan-out's tests): sshd accepts, authenticates and runs
    # every command as `sleep`, so a collector sent there never answers.
    return sshd.config_text(
        [
            f"# sshd of scale lab box {b.name} (written by lab/scale.py)",
            *(["ForceCommand /bin/sleep 3600"] if hang else []),
        ],
        address=b.address,
        hostkey=b.hostkey,
        pidfile=b.sshd_pidfile,
        user=b.user,
    )


def _sshd_identity(b: ScaleBox) -> dict[str, str]:
    """What the pid in a scale box's sshd pidfile must be to count as its sshd (pids are
    reused; proc.is_program): sshd with this box's config on its command line."""
    return {"program": "/usr/sbin/sshd", "argv_has": str(b.run_dir / "sshd_config")}


def _sshd(b: ScaleBox, hang: bool = False) -> None:
    b.run_dir.mkdir(parents=True, exist_ok=True)
    cfg = b.run_dir / "sshd_config"
    text = _sshd_config(b, hang)
    changed = not cfg.exists() or cfg.read_text() != text
    cfg.write_text(text)
    if running(b.sshd_pidfile, **_sshd_identity(b)) and not changed:
        return
    stop_pidfile(b.sshd_pidfile, **_sshd_identity(b))
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    spawn(
        ["nsenter", f"--net=/run/netns/{b.netns}", "--", "/usr/sbin/sshd", "-D", "-f", str(cfg),
         "-E", str(LOGS / f"sshd-{b.name}.log")],
        LOGS / f"sshd-{b.name}.out",
    )  # fmt: skip


def set_hanging(name: str, hang: bool) -> None:
    """Make box `name` hang on every command (or answer again); its sessions end either way.
    A master connection opened before keeps the old behaviour: close it first."""
    b = next(x for x in made() if x.name == name)
    _sshd(b, hang)
    # The sleeping sessions, or the ones before.
    users.kill_processes_of(pwd.getpwnam(b.user).pw_uid)
    wait_for(lambda: listening(b), timeout=20, what=f"sshd of scale box {b.name}")


def listening(b: ScaleBox) -> bool:
    try:
        with socket.create_connection((b.address, 22), timeout=0.5):
            return True
    except OSError:
        return False


def _as_user(b: ScaleBox, argv: list[str]) -> list[str]:
    env = [f"PATH={SCRUBBED_PATH}", f"HOME={b.home}", f"USER={b.user}", f"LOGNAME={b.user}"]
    return ["runuser", "-u", b.user, "--", "env", "-i", *env, *argv]


def _create_containers(b: ScaleBox) -> None:
    """Every service of the shape created as the box user (scrubbed env, the box's chain from
    .env), none started: see the module's docstring."""
    argv = [DOCKER, "compose", "-p", b.project, "--progress", "plain", "up", "--no-start"]
    run(_as_user(b, argv), cwd=b.lobes_dir, timeout=300)


def _engine_network(engine: Box) -> None:
    if not ok([*engine.docker_cli, "network", "inspect", NETWORK]):
        run([*engine.docker_cli, "network", "create", NETWORK])


# -- up / down / status ----------------------------------------------------------------------------
def up(count: int) -> dict[str, float]:
    with locked():
        return _up(count)


def _up(count: int) -> dict[str, float]:
    t0 = time.monotonic()
    fleet = boxes(count)
    images, secrets = _images(), labfacts.lab_secrets()
    if not Path("/sys/class/net", BRIDGE).exists():
        raise LabError(f"the lab bridge {BRIDGE} is missing: run `python -m lab up` first")
    earlier = made()
    if len(earlier) > count:  # fewer boxes than last time: the extra ones go first
        _remove([b for b in earlier if b.name not in {f.name for f in fleet}])
    for d in (SCALE_DIR, HOSTKEYS, OVERLAYS, LOGS, SCALE_RUN):
        d.mkdir(parents=True, exist_ok=True)
    os.chmod(SCALE_DIR, 0o700)
    STATE.write_text(json.dumps({"boxes": count}) + "\n")
    phases: dict[str, float] = {}
    for b in fleet:
        if not b.hostkey.exists():
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"scale {b.name}",
                 "-f", b.hostkey])  # fmt: skip
    KNOWN_HOSTS.write_text(
        "".join(
            f"{b.address} {' '.join(b.hostkey.with_suffix('.pub').read_text().split()[:2])}\n"
            for b in fleet
        )
    )
    for kind in KINDS:
        _engine_network(BOX_BY_NAME[kind])
    phases["keys, networks"] = time.monotonic() - t0

    def base(b: ScaleBox) -> None:
        _user(b)
        files, override = box_files(b, fleet, images, secrets)
        _home(b, files)
        (OVERLAYS / f"{b.name}.yaml").write_text(overlay_text(b, override))
        _netns(b)
        _sshd(b)

    # useradd/usermod take /etc/passwd's lock: one at a time.
    for b in fleet:
        base(b)
    INVENTORY.write_text(inventory_text(fleet))
    phases["users, homes, netns, sshd"] = time.monotonic() - t0 - sum(phases.values())
    for b in fleet:
        wait_for(lambda b=b: listening(b), timeout=20, what=f"sshd of scale box {b.name}")
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(_create_containers, fleet))
    phases["containers created"] = time.monotonic() - t0 - sum(phases.values())
    log(f"scale up: {count} boxes in {time.monotonic() - t0:.1f}s {_rounded(phases)}")
    log(f"inventory: FLEET_INVENTORY={os.path.relpath(INVENTORY, REPO)}")
    return phases


def down() -> None:
    with locked():
        _down()


def _down() -> None:
    """`down` for a caller that holds the lab lock already (`lab down` takes the scale lab
    down first: lifecycle._down)."""
    try:
        fleet = made()
    except (ValueError, KeyError, TypeError, LabError):  # a torn or edited state file
        fleet = []
    fleet = fleet or boxes(MAX_BOXES)  # no state: sweep every name a scale lab could use
    _remove(fleet)
    for kind in KINDS:
        engine = BOX_BY_NAME[kind]
        if engine.docker_socket.exists():
            run([*engine.docker_cli, "network", "rm", NETWORK], check=False)
    shutil.rmtree(SCALE_RUN, ignore_errors=True)
    shutil.rmtree(SCALE_DIR, ignore_errors=True)
    log("scale down: done")


def _remove(fleet: list[ScaleBox]) -> None:
    for b in fleet:
        engine = b.engine
        if engine.docker_socket.exists():
            label = f"label=com.docker.compose.project={b.project}"
            ids = run([*engine.docker_cli, "ps", "-aq", "--filter", label], check=False)
            if ids.stdout.split():
                run([*engine.docker_cli, "rm", "-f", *ids.stdout.split()], check=False)
        stop_pidfile(b.sshd_pidfile, **_sshd_identity(b))
        if Path("/run/netns", b.netns).exists():
            run(["ip", "netns", "del", b.netns], check=False)
        if ok(["ip", "link", "show", "dev", b.veth]):
            run(["ip", "link", "del", b.veth], check=False)
        users.remove_account(b.user, b.home)
        shutil.rmtree(b.run_dir, ignore_errors=True)


def status() -> dict[str, dict[str, object]]:
    """Per box: sshd listening, containers of its project on its engine (created/running)."""
    fleet = made()
    counts: dict[str, dict[str, int]] = {}
    for kind in KINDS:
        engine = BOX_BY_NAME[kind]
        if not engine.docker_socket.exists():
            continue
        fmt = '{{.Label "com.docker.compose.project"}} {{.State}}'
        out = run([*engine.docker_cli, "ps", "-a", "--format", fmt], check=False).stdout
        for row in out.splitlines():
            project, _, state = row.partition(" ")
            counts.setdefault(project, {}).setdefault(state, 0)
            counts[project][state] += 1
    with ThreadPoolExecutor(max_workers=16) as pool:
        up_ = dict(zip([b.name for b in fleet], pool.map(listening, fleet), strict=True))
    return {
        b.name: {
            "address": b.address,
            "user": b.user,
            "engine": b.kind,
            "project": b.project,
            "sshd": up_[b.name],
            "containers": counts.get(b.project, {}),
        }
        for b in fleet
    }


def ready(report: dict[str, dict[str, object]]) -> bool:
    """Every box's sshd listens and every service of its shape has a container."""
    for name, row in report.items():
        containers = row["containers"]
        want = len(_manifest(name.split("-", 1)[0])["services"])
        if not row["sshd"] or not isinstance(containers, dict) or sum(containers.values()) < want:
            return False
    return bool(report)


def _rounded(phases: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 1) for k, v in phases.items()}
