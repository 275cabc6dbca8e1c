"""The box-side converge: lock, snapshot, files, images, lanes, gateway, rollback.

Shipped over SSH like the collector and run by the box's python3 (stdlib only, Python >= 3.8);
never imported by the controller. It reads ONE JSON payload on stdin (so a controller_env
secret never appears in a process list) and prints JSON-lines events on stdout, the last one
`{"event": "result", ...}`. Values are never printed: events carry key and service names only.

Why one process does the whole converge: the per-box lock is an flock held for the life of
this process, so a converge that is killed (SIGKILL, a lost box) releases it by itself and
the next run starts cleanly, and a failure anywhere is rolled back by the same process that
took the snapshot, under the same lock. A dropped SSH connection does not stop it halfway:
events that cannot be written are dropped, the work (or its rollback) completes.

Compose always runs as `env -i PATH=... HOME=$HOME docker compose ...` in the deployment
directory, so nothing in the deploy user's environment can change what it renders.
"""
# Runs under the box's python3 (>= 3.8): %-formatting and list concatenation stay.

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

SCRUBBED_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FLEET_DIR = ".fleet"
GATEWAY = "gateway"
GIB_KIB = 1024 * 1024
_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$")


class Failed(Exception):
    """A step that did not work; the message is for the operator and holds no values."""


# -- events --------------------------------------------------------------------------------------
_STDOUT_OK = [True]


def emit(event, **fields):
    if not _STDOUT_OK[0]:
        return
    fields["event"] = event
    fields["t"] = round(time.time(), 3)
    try:
        sys.stdout.write(json.dumps(fields, sort_keys=True) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        _STDOUT_OK[0] = False  # the controller went away: finish the work silently


# -- processes -----------------------------------------------------------------------------------
class Box:
    def __init__(self, payload):
        self.p = payload
        self.home = os.path.expanduser("~")
        self.deploy = os.path.expanduser(payload["directory"])
        self.fleet = os.path.join(self.deploy, FLEET_DIR)
        self.project = payload["project"]

    def scrubbed(self, argv):
        return ["env", "-i", "PATH=" + SCRUBBED_PATH, "HOME=" + self.home] + list(argv)

    def run(self, argv, timeout=120):
        try:
            proc = subprocess.run(
                self.scrubbed(argv),
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=self.deploy,
                stdin=subprocess.DEVNULL,
            )
            return proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired:
            return 124, "", "timed out after %ss" % timeout

    def compose(self, *args, **kw):
        # The -f chain comes from COMPOSE_FILE in .env, as for an operator in the directory.
        return self.run(["docker", "compose"] + list(args), **kw)

    def must(self, argv, what, timeout=300):
        code, out, err = self.run(argv, timeout=timeout)
        if code != 0:
            raise Failed("%s failed: %s" % (what, last_line(err) or "exit %d" % code))
        return out

    def path(self, name):
        return os.path.join(self.deploy, name)

    def managed_files(self):
        names = [".env"] + list(self.p["compose_files"])
        for entry in sorted(os.listdir(self.deploy)):
            if entry.startswith("docker-compose") and entry.endswith((".yml", ".yaml")):
                names.append(entry)
        return list(dict.fromkeys(names))


def last_line(text):
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def sha256_file(path):
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except FileNotFoundError:
        return None


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def private_dir(path):
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def atomic_write(path, data, mode):
    """Same directory, fsync, rename: a reader sees the old file or the new one, never half."""
    tmp = "%s.fleet-tmp-%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


# -- lock ----------------------------------------------------------------------------------------
class Lock:
    """`~/.lobes/.fleet/lock`: an flock held while this process lives, plus who and since when."""

    def __init__(self, box):
        self.path = os.path.join(private_dir(box.fleet), "lock")
        self.fd = None

    def holder(self):
        try:
            with open(self.path, encoding="utf-8") as handle:
                return json.loads(handle.read() or "{}")
        except (OSError, ValueError):
            return {}

    def acquire(self, holder):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            who = self.holder()
            raise Failed(
                "locked: another converge of this box is running, held by %s (pid %s on %s) "
                "since %s"
                % (
                    who.get("holder", "?"),
                    who.get("pid", "?"),
                    who.get("host", "?"),
                    who.get("since", "?"),
                )
            ) from None
        stale = self.holder()
        info = {
            "holder": holder,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": now_iso(),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        os.fsync(fd)
        self.fd = fd
        return stale  # what a killed run left behind, if anything

    def release(self):
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def is_held(self):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except OSError:
            return True
        finally:
            os.close(fd)


# -- containers ----------------------------------------------------------------------------------
def containers(box):
    """{service: inspect} of the compose project's containers."""
    out = box.must(
        [
            "docker",
            "ps",
            "-aq",
            "--no-trunc",
            "--filter",
            "label=com.docker.compose.project=" + box.project,
        ],
        "docker ps",
    )
    ids = out.split()
    if not ids:
        return {}
    found = {}
    for c in json.loads(box.must(["docker", "inspect"] + ids, "docker inspect")):
        service = ((c.get("Config") or {}).get("Labels") or {}).get("com.docker.compose.service")
        if service:
            found[service] = c
    return found


def label_hash(inspect):
    return ((inspect.get("Config") or {}).get("Labels") or {}).get("com.docker.compose.config-hash")


def config_hashes(box):
    """What compose would create each service with now: `docker compose config --hash`."""
    out = box.must(["docker", "compose", "config", "--hash", "*"], "docker compose config --hash")
    hashes = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2:
            hashes[parts[0]] = parts[1]
    return hashes


def changed_by_files(box, before, wanted):
    """Services of `wanted` whose rendered config changed since the hashes `before`.

    Compared render to render, never to the container's label: for a lane with env_file the
    label compose writes at `up` differs from what `config --hash` prints for the same files,
    so only two renders of the same kind tell what a file change did."""
    try:
        after = config_hashes(box)
    except Failed:
        after = {}
    return [s for s in wanted if before.get(s) != after.get(s)]


def hashes_or_empty(box):
    try:
        return config_hashes(box)
    except Failed:
        return {}  # files compose cannot read: every service counts as changed


# -- .env ----------------------------------------------------------------------------------------
def dotenv_value(rest):
    """Compose's dotenv reading of one value: quotes, escapes in "", inline `#` comments."""
    rest = rest.strip()
    if rest[:1] in ("'", '"'):
        quote, out, i = rest[0], [], 1
        while i < len(rest):
            ch = rest[i]
            if quote == '"' and ch == "\\" and i + 1 < len(rest):
                nxt = rest[i + 1]
                out.append({"n": "\n", "t": "\t", "r": "\r"}.get(nxt, nxt))
                i += 2
                continue
            if ch == quote:
                return "".join(out), i + 1
            out.append(ch)
            i += 1
        return rest, len(rest)
    hash_at = re.search(r"\s#", rest)
    return (rest[: hash_at.start()].rstrip() if hash_at else rest), None


def parse_env(text):
    """{key: (value, line index)} for the active assignments; the last one wins, as in compose."""
    found = {}
    for index, raw in enumerate(text.splitlines()):
        match = _LINE.match(raw)
        if match and not raw.lstrip().startswith("#"):
            found[match.group(1)] = (dotenv_value(match.group(2))[0], index)
    return found


def quote(value):
    """A value compose's dotenv reads back unchanged."""
    if "\n" in value or "\r" in value:
        raise Failed("a managed .env value spans lines; lobes' .env cannot hold it")
    if value == "" or re.match(r"^[A-Za-z0-9_./:,@+=%-]+$", value):
        return value
    if "'" not in value:
        return "'%s'" % value  # single quotes: literal, no interpolation, no escapes
    if "$" in value:
        raise Failed("a managed .env value holds both ' and $; write it by hand")
    return '"%s"' % value.replace("\\", "\\\\").replace('"', '\\"')


def replace_value(raw, key, value):
    """`KEY=old   # why` -> `KEY=new   # why`: the prefix and the inline comment stay."""
    match = _LINE.match(raw)
    assert match is not None  # only called for lines parse_env matched
    start = match.start(2)
    rest = raw[start:]
    stripped = rest.lstrip()
    lead = rest[: len(rest) - len(stripped)]
    if stripped[:1] in ("'", '"'):
        end = dotenv_value(stripped)[1] or len(stripped)
        tail = stripped[end:]
    else:
        hash_at = re.search(r"\s+#.*$", stripped)
        tail = stripped[hash_at.start() :] if hash_at else ""
    return raw[:start] + lead + quote(value) + tail


def secret_values(box):
    """Every box_file secret the payload names, read here; values never leave this process."""
    values, cache = {}, {}  # type: dict, dict
    for name, src in sorted((box.p.get("box_secrets") or {}).items()):
        path = os.path.expanduser(src["path"])
        if path not in cache:
            try:
                with open(path, encoding="utf-8") as handle:
                    cache[path] = {k: v for k, (v, _) in parse_env(handle.read()).items()}
            except FileNotFoundError:
                cache[path] = None
        found = cache[path]
        if found is not None and found.get(src["key"]):
            values[name] = found[src["key"]]
    return values


def desired_values(box):
    """Managed key -> desired value, secrets resolved; fails naming a missing source."""
    secrets = secret_values(box)
    out, missing = {}, []
    for key, spec in box.p["managed_env"].items():
        if not isinstance(spec, dict):
            out[key] = spec
        elif "value" in spec:
            out[key] = spec["value"]  # a controller_env secret, sent on stdin for this run
        elif spec["secret"] in secrets:
            out[key] = secrets[spec["secret"]]
        else:
            src = (box.p.get("box_secrets") or {}).get(spec["secret"]) or {}
            missing.append("%s (%s in %s)" % (spec["secret"], src.get("key"), src.get("path")))
    if missing:
        raise Failed("secret source missing: " + ", ".join(sorted(set(missing))))
    return out


def differs(key, want, current):
    # An absent key is appended even when empty: `KEY=` is what the drift engine renders
    # from, and lanes read `.env` whole through env_file, so absent and empty differ there.
    return key not in current or current[key][0] != want


def write_env(box, keys, desired):
    """Write the managed `keys` whose value differs; every other line stays byte for byte."""
    path = box.path(".env")
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8")
    except FileNotFoundError:
        text = ""
    current = parse_env(text)
    lines = text.splitlines(True)
    changed = []
    for key in keys:
        want = desired[key]
        if not differs(key, want, current):
            continue
        changed.append(key)
        if key in current:
            index = current[key][1]
            raw = lines[index]
            ending = raw[len(raw.rstrip("\r\n")) :]
            lines[index] = replace_value(raw.rstrip("\r\n"), key, want) + ending
        else:
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n"
            lines.append("%s=%s\n" % (key, quote(want)))
    mode_ok = os.path.exists(path) and (os.stat(path).st_mode & 0o777) == 0o600
    if changed or not mode_ok:
        atomic_write(path, "".join(lines).encode("utf-8"), 0o600)
    return changed


# -- snapshots -----------------------------------------------------------------------------------
def snapshots_dir(box):
    return private_dir(os.path.join(private_dir(box.fleet), "snapshots"))


def new_snapshot_id(root):
    base = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    sid, n = base, 1
    while os.path.exists(os.path.join(root, sid)):
        n += 1
        sid = "%s-%d" % (base, n)
    return sid


def take_snapshot(box, meta):
    root = snapshots_dir(box)
    sid = new_snapshot_id(root)
    tmp = private_dir(os.path.join(root, "." + sid + ".partial"))
    files = {}  # type: dict
    for name in box.managed_files():
        src = box.path(name)
        if os.path.isfile(src):
            shutil.copy2(src, os.path.join(tmp, name))
            files[name] = {"sha256": sha256_file(src), "mode": os.stat(src).st_mode & 0o777}
        else:
            files[name] = None  # did not exist: a rollback removes it again
    found = containers(box)
    # The running config of every service: a rollback proves it restored these exactly.
    with open(
        os.open(os.path.join(tmp, "containers.json"), os.O_WRONLY | os.O_CREAT, 0o600), "w"
    ) as handle:
        json.dump(found, handle)
    meta = dict(
        meta,
        id=sid,
        taken_at=now_iso(),
        files=files,
        containers={
            s: {"id": c.get("Id", "")[:12], "config_hash": label_hash(c)} for s, c in found.items()
        },
        status="running",
    )
    write_meta(tmp, meta)
    os.rename(tmp, os.path.join(root, sid))  # a snapshot is complete or absent
    return sid, meta


def write_meta(directory, meta):
    atomic_write(
        os.path.join(directory, "meta.json"),
        json.dumps(meta, indent=1, sort_keys=True).encode(),
        0o600,
    )


def read_meta(box, sid):
    with open(os.path.join(snapshots_dir(box), sid, "meta.json"), encoding="utf-8") as handle:
        return json.load(handle)


def set_status(box, sid, status, **more):
    meta = read_meta(box, sid)
    meta.update(more, status=status, updated_at=now_iso())
    write_meta(os.path.join(snapshots_dir(box), sid), meta)


def list_snapshots(box):
    root = snapshots_dir(box)
    return sorted(n for n in os.listdir(root) if not n.startswith("."))


def prune(box, keep):
    root = snapshots_dir(box)
    for sid in list_snapshots(box)[:-keep] if keep > 0 else []:
        shutil.rmtree(os.path.join(root, sid), ignore_errors=True)
    for name in os.listdir(root):
        if name.startswith(".") and name.endswith(".partial"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)  # a killed snapshot


# -- files ---------------------------------------------------------------------------------------
def known_good_dir(box):
    return os.path.join(box.fleet, "known-good")


def find_copy(box, name, sha):
    """A stored copy of compose file `name`: by digest (any snapshot, known-good), or the
    last known-good one when the desired state pins no digest for it."""
    candidates = [os.path.join(known_good_dir(box), name)]
    if sha is not None:
        root = snapshots_dir(box)
        candidates += [os.path.join(root, s, name) for s in reversed(list_snapshots(box))]
    for path in candidates:
        if os.path.isfile(path) and (sha is None or sha256_file(path) == sha):
            return path
    return None


def restore_files(box, files):
    restored = []
    for item in files:
        name, sha = item["name"], item.get("sha256")
        target = box.path(name)
        src = find_copy(box, name, sha)
        if src is None:
            want = "sha256 %s" % sha[:12] if sha else "a known-good copy"
            raise Failed(
                "cannot restore %s: no stored copy with %s (a verified converge "
                "keeps one)" % (name, want)
            )
        if sha256_file(src) == sha256_file(target):
            continue
        mode = os.stat(target).st_mode & 0o777 if os.path.exists(target) else 0o644
        with open(src, "rb") as handle:
            atomic_write(target, handle.read(), mode)
        restored.append(name)
    return restored


# -- images, memory, lanes -----------------------------------------------------------------------
def pull(box, refs):
    for ref in refs:
        code, _, _ = box.run(["docker", "image", "inspect", ref], timeout=60)
        if code == 0:
            emit("step", step="pull", subject=ref, status="present")
            continue
        emit("step", step="pull", subject=ref, status="start")
        box.must(["docker", "pull", "--quiet", ref], "docker pull %s" % ref, timeout=3600)
        emit("step", step="pull", subject=ref, status="done")


def meminfo():
    out = {}
    with open("/proc/meminfo", encoding="utf-8") as handle:
        for line in handle:
            name, _, rest = line.partition(":")
            out[name] = int(rest.split()[0])
    return out


def drop_caches(box):
    """`sync`, then drop the page cache: directly if this user may, else through sudo -n."""
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
        return "direct"
    except OSError:
        pass
    code, _, _ = box.run(["sudo", "-n", "/usr/sbin/sysctl", "-w", "vm.drop_caches=3"], timeout=60)
    return "sudo" if code == 0 else None


def memory_gate(box, service, util):
    """Unified memory: MemAvailable must cover util x MemTotal + the floor before a boot."""
    mem = box.p["memory"]
    info = meminfo()
    need = int(util * info["MemTotal"] + mem["floor_gib"] * GIB_KIB)
    have = info.get("MemAvailable", 0)
    if have >= need:
        return
    how = drop_caches(box) if mem.get("drop_caches", True) else None
    have = meminfo().get("MemAvailable", 0)
    emit("memory", service=service, need_kib=need, available_kib=have, dropped=how)
    if have < need:
        raise Failed(
            "%s needs %.1f GiB available (%.2f x MemTotal + %g GiB) but only %.1f GiB is, "
            "after %s"
            % (
                service,
                need / GIB_KIB,
                util,
                mem["floor_gib"],
                have / GIB_KIB,
                "dropping the page cache" if how else "failing to drop the page cache",
            )
        )


def container_state(box, service):
    found = containers(box).get(service)
    if found is None:
        return None, None, 0
    state = found.get("State") or {}
    return (
        state.get("Status"),
        (state.get("Health") or {}).get("Status"),
        found.get("RestartCount", 0),
    )


def wait_healthy(box, service, timeout):
    started = time.monotonic()
    while True:
        status, health, restarts = container_state(box, service)
        elapsed = time.monotonic() - started
        shown = "%s/%s" % (status, health or "-")
        emit("wait", service=service, elapsed=round(elapsed, 1), timeout=timeout, state=shown)
        if status == "running" and health in (None, "healthy"):
            emit("healthy", service=service, elapsed=round(elapsed, 1))
            return
        if status in ("exited", "dead") or restarts > 2:
            raise Failed("%s stopped while booting (%s, %d restarts)" % (service, shown, restarts))
        if elapsed >= timeout:
            raise Failed("%s not healthy after %ds (%s)" % (service, timeout, shown))
        time.sleep(1.0)


def recreate(box, service, lane):
    """One service: stop it (its memory comes back first), gate, recreate scrubbed, wait."""
    emit("step", step="recreate", subject=service, status="start")
    if lane is not None:
        # `docker stop` of this one container, not `compose stop`, which would also stop the
        # services that depend on it (the gateway, the worker) and leave them down.
        running = containers(box).get(service)
        if running is not None and (running.get("State") or {}).get("Running"):
            box.run(["docker", "stop", running["Id"]], timeout=300)
        memory_gate(box, service, float(lane["util"]))
    box.must(
        ["docker", "compose", "up", "-d", "--no-deps", "--force-recreate", service],
        "docker compose up %s" % service,
        timeout=600,
    )
    wait_healthy(box, service, int((lane or box.p["gateway"])["timeout_s"]))
    emit("step", step="recreate", subject=service, status="done")


def http_status(url, timeout=3.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read(262144).decode() or "null")
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except Exception:  # a gateway still booting: not an answer yet
        return None, None


def gateway_problems(box):
    """/health version, /capabilities against the lanes, auth posture: what is still wrong."""
    v = box.p["verify"]
    base = "http://127.0.0.1:%d" % v["port"]
    problems = []
    status, health = http_status(base + "/health")
    if status != 200 or not isinstance(health, dict) or health.get("version") != v["version"]:
        problems.append(
            "/health version %r, want %s"
            % ((health or {}).get("version") if isinstance(health, dict) else status, v["version"])
        )
    status, caps = http_status(base + "/capabilities")
    caps = caps if isinstance(caps, dict) else {}
    for role, window in sorted(v["windows"].items()):
        got = (caps.get(role) or {}).get("context")
        if got != window:
            problems.append("/capabilities %s.context %s, want %s" % (role, got, window))
    for role in v.get("infeasible", []):
        if (caps.get(role) or {}).get("feasible"):
            problems.append("/capabilities %s is feasible, want infeasible" % role)
    want = 401 if v["auth"] == "keyed" else 200
    status, _ = http_status(base + "/v1/models")
    if status != want:
        problems.append("GET /v1/models without a key gave %s, want %s" % (status, want))
    return problems


def verify_gateway(box, timeout):
    deadline = time.monotonic() + timeout
    while True:
        problems = gateway_problems(box)
        if not problems:
            emit("step", step="verify-gateway", subject=GATEWAY, status="done")
            return
        if time.monotonic() >= deadline:
            raise Failed("gateway verification failed: " + "; ".join(problems))
        time.sleep(1.0)


# -- converge ------------------------------------------------------------------------------------
def check_fingerprint(box):
    """The plan was made from an observation; refuse if the box changed since then."""
    fp = box.p.get("fingerprint") or {}
    moved = [
        n for n, sha in sorted((fp.get("files") or {}).items()) if sha256_file(box.path(n)) != sha
    ]
    if fp.get("containers") is not None:
        now = {s: c.get("Id", "")[:12] for s, c in containers(box).items()}
        moved += [
            "container " + s
            for s in sorted(set(now) | set(fp["containers"]))
            if now.get(s) != fp["containers"].get(s)
        ]
    if moved:
        raise Failed(
            "the box changed since it was observed (%s); observe and plan again" % ", ".join(moved)
        )


def lane_order(box, services):
    order = [lane["service"] for lane in box.p["lane_specs"]]
    return [s for s in order if s in services]


def converge(box, lock):
    p = box.p
    stale = lock.acquire(p["holder"])
    if stale.get("pid"):
        emit(
            "note",
            message="took over the lock left by %s (pid %s, since %s)"
            % (stale.get("holder"), stale.get("pid"), stale.get("since")),
        )
    check_fingerprint(box)
    desired = desired_values(box)  # before anything changes: a missing secret stops here
    sid, _ = take_snapshot(
        box, {"holder": p["holder"], "plan": p.get("titles", []), "services": p["services"]}
    )
    emit("snapshot", id=sid)
    prune(box, int(p.get("keep", 10)))
    touched = []  # services recreated, in order: what a rollback must put back
    created = []  # services that had no container before
    try:
        hashes = hashes_or_empty(box)
        if p.get("env_keys"):
            emit("step", step="write-env", subject=".env", status="start")
            changed = write_env(box, p["env_keys"], desired)
            emit("step", step="write-env", subject=".env", status="done", keys=changed)
        if p.get("restore"):
            emit("step", step="restore-files", subject="files", status="start")
            restored = restore_files(box, p["restore"])
            emit("step", step="restore-files", subject="files", status="done", files=restored)
        lanes = {lane["service"]: lane for lane in p["lane_specs"]}
        todo = list(p["services"])
        if p.get("env_keys") or p.get("restore"):
            # Safety net after the files changed: compose's own config hash finds any service
            # whose container would now differ (a variable the gateway reads, a restored file).
            present = containers(box)
            wanted = [s for s in [*lanes, GATEWAY] if s in present and s not in todo]
            extra = changed_by_files(box, hashes, wanted)
            if extra:
                emit("note", message="config changed with the files: " + ", ".join(extra))
                todo += extra
        # The planned pulls, then every image a service about to be recreated runs: by digest,
        # pulled only when the engine does not have it.
        refs = list(p.get("pulls", [])) + [p["images"][s] for s in todo if p["images"].get(s)]
        pull(box, list(dict.fromkeys(refs)))
        before = containers(box)
        for service in lane_order(box, todo):
            touched.append(service)
            if service not in before:
                created.append(service)
            recreate(box, service, lanes.get(service))
        strays = containers(box)
        for service in p.get("removes", []):
            # By container: a stray is often a service no active profile renders any more.
            if service in strays:
                emit("step", step="remove", subject=service, status="start")
                box.must(["docker", "rm", "-f", strays[service]["Id"]], "remove " + service)
                emit("step", step="remove", subject=service, status="done")
        if GATEWAY in todo:
            touched.append(GATEWAY)
            recreate(box, GATEWAY, None)
            verify_gateway(box, int(p["gateway"]["timeout_s"]))
    except Exception as exc:  # anything after the snapshot is rolled back, not left half done
        message = str(exc) if isinstance(exc, Failed) else "%s: %s" % (type(exc).__name__, exc)
        emit("failed", message=message)
        rolled = rollback(box, sid, touched, created, reason=message)
        return {"ok": False, "snapshot": sid, "failed": message, "rollback": rolled}
    set_status(box, sid, "applied", touched=touched)
    return {"ok": True, "snapshot": sid, "touched": touched}


# -- rollback ------------------------------------------------------------------------------------
def restore_snapshot_files(box, sid):
    meta = read_meta(box, sid)
    src = os.path.join(snapshots_dir(box), sid)
    restored = []
    for name, info in sorted(meta["files"].items()):
        target = box.path(name)
        if info is None:
            if os.path.exists(target):
                os.unlink(target)
                restored.append(name)
            continue
        if (
            sha256_file(target) == info["sha256"]
            and (os.stat(target).st_mode & 0o777) == info["mode"]
        ):
            continue
        with open(os.path.join(src, name), "rb") as handle:
            atomic_write(target, handle.read(), info["mode"])
        restored.append(name)
    return meta, restored


def rollback(box, sid, touched=None, created=None, reason="requested"):
    """Files back byte for byte, then every service whose config differs recreated from them."""
    emit("step", step="rollback", subject=sid, status="start", reason=reason)
    try:
        hashes = hashes_or_empty(box)
        meta, restored = restore_snapshot_files(box, sid)
        lanes = {lane["service"]: lane for lane in box.p["lane_specs"]}
        before = meta.get("containers") or {}
        for service in created or []:
            if service not in before:
                box.compose("rm", "-s", "-f", service, timeout=300)
        differ = changed_by_files(box, hashes, [*lanes, GATEWAY])
        order = [s for s in list(lanes) + [GATEWAY] if s in set(differ) | set(touched or [])]
        for service in order:
            if service in before:
                recreate(box, service, lanes.get(service))
        now = containers(box)
        unequal = sorted(
            s for s, c in before.items() if s in now and label_hash(now[s]) != c.get("config_hash")
        )
        result = {
            "ok": True,
            "snapshot": sid,
            "files": restored,
            "recreated": order,
            "config_equal": not unequal,
            "unequal": unequal,
        }
        set_status(box, sid, "rolled-back", reason=reason, rollback=result)
    except Failed as exc:
        result = {"ok": False, "snapshot": sid, "failed": str(exc)}
        set_status(box, sid, "rollback-failed", reason=reason, rollback=result)
    emit("step", step="rollback", subject=sid, status="done" if result["ok"] else "failed")
    return result


def mark_good(box, sid):
    """After the controller verified zero drift: keep this chain as the known-good copy."""
    root = private_dir(known_good_dir(box))
    manifest = {}
    for name in box.p["compose_files"]:
        if os.path.isfile(box.path(name)):
            with open(box.path(name), "rb") as handle:
                data = handle.read()
            atomic_write(os.path.join(root, name), data, 0o600)
            manifest[name] = hashlib.sha256(data).hexdigest()
    write_meta(root, {"snapshot": sid, "files": manifest, "at": now_iso()})
    if sid:
        set_status(box, sid, "verified")
    return {"ok": True, "known_good": manifest}


def snapshots(box, lock):
    out = []
    for sid in list_snapshots(box):
        try:
            meta = read_meta(box, sid)
        except (OSError, ValueError):
            continue
        out.append(
            {
                k: meta.get(k)
                for k in ("id", "taken_at", "holder", "status", "services", "plan", "reason")
            }
        )
    held = lock.is_held()
    return {"ok": True, "snapshots": out, "lock": lock.holder() if held else None}


def main():
    # A dropped connection must not stop a step halfway (SIGPIPE is already ignored by Python;
    # emit() swallows the write errors).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    payload = json.loads(sys.stdin.read())
    box = Box(payload)
    if not os.path.isdir(box.deploy):
        emit("result", ok=False, failed="deployment directory %s does not exist" % box.deploy)
        return 1
    lock = Lock(box)
    action = payload["action"]
    try:
        if action == "snapshots":
            result = snapshots(box, lock)
        elif action == "converge":
            result = converge(box, lock)
        else:
            lock.acquire(payload["holder"])
            if action == "rollback":
                sid = payload.get("snapshot") or (list_snapshots(box) or [None])[-1]
                if sid is None:
                    raise Failed("no snapshot on this box")
                meta = read_meta(box, sid)
                result = rollback(
                    box,
                    sid,
                    meta.get("touched") or meta.get("services"),
                    reason=payload.get("reason") or "operator rollback",
                )
            elif action == "mark-good":
                result = mark_good(box, payload.get("snapshot"))
            else:
                raise Failed("unknown action %r" % action)
    except Failed as exc:
        result = {"ok": False, "failed": str(exc)}
    except Exception as exc:  # still one result line, never a traceback with values in it
        result = {"ok": False, "failed": "%s: %s" % (type(exc).__name__, exc)}
    finally:
        lock.release()
    emit("result", **result)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
