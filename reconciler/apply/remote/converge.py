"""The box-side converge: lock, snapshot, files, images, lanes, gateway, rollback.

Shipped over SSH like the collector (one text, the shared code written in) and run by the
box's python3 (stdlib only, Python >= 3.8); the controller only loads it for its payload rules
(validate_payload), nothing runs on load.
It reads ONE JSON payload on stdin (so a controller_env secret never appears in a process
list), checks all of it before anything else, and prints JSON-lines events on stdout, the last
one `{"event": "result", ...}`. Values are never printed: events carry key and service names.

Why one process does the whole converge: the per-box lock is an flock held for the life of
this process, so a converge that is killed (SIGKILL, a lost box) releases it by itself, and
a failure anywhere is rolled back by the same process that took the snapshot, under the same
lock. A killed converge leaves its snapshot `running`: the next one refuses, naming it, until
the operator rolls back to it or says --accept-interrupted (interrupted_converges). A dropped
SSH connection never stops a step halfway (SIGHUP is ignored): the first event, `started`,
is written right after the lock, and a program that cannot write it changes nothing; a
converge that finds its output gone later stops before its next change and rolls back
(go_on), and a rollback, once begun, completes.
No change is left behind that no controller could see, verify or mark good.

Compose always runs as `env -i PATH=... HOME=$HOME docker compose ...` in the deployment
directory, so nothing in the deploy user's environment can change what it renders.

Every file of the box is read through one bounded reader (read_regular): a regular file of at
most READ_LIMIT bytes, or a refusal naming it. A managed file that is anything else (a FIFO, a
device, a directory, a link to one, a link out of the deployment directory) stops a converge
under the lock before anything changes.
"""
# Runs under the box's python3 (>= 3.8): %-formatting and list concatenation stay.

import contextlib
import errno
import fcntl
import fnmatch
import hashlib
import http.client
import io
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.parse

# Shared with the other box program. On a box each of these statements is its module's own
# text (reconciler/box_program.py packs it in): the program still runs alone, stdlib only.
from reconciler.box_shared.dotenv import (
    _SPACE,
    SCRUBBED_PATH,
    _compose_env,
    _dotenv_joins,
    _dotenv_line_index,
    _dotenv_lines,
    _dotenv_read,
    _removal,
    _secret_file_values,
)
from reconciler.box_shared.secret_floor import FLOOR

FLEET_DIR = ".fleet"
GATEWAY = "gateway"
GIB_KIB = 1024 * 1024


class Failed(Exception):
    """A step that did not work; the message is for the operator and holds no values."""


class Stopped(Exception):
    """SIGTERM or SIGINT (on_stop), raised where the program is: not a Failed, so no `except
    Failed` on the way swallows it; the converge's own `except Exception` rolls back."""


# -- payload: checked whole before the lock, the snapshot or any container is touched --------------
# The controller runs this same check before it sends (reconciler/apply/payload.py loads these
# functions from this file), so one set of rules holds on both sides. Messages name the field,
# never an env value: a refused value may be a secret.
SNAPSHOT_ID = re.compile(r"^[0-9]{8}T[0-9]{6}Z(?:-[0-9]{1,4})?\Z")  # new_snapshot_id()'s names
COMPOSE_NAME = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*\.ya?ml\Z")
SNAPSHOT_FILE = re.compile(r"^\.env\Z|" + COMPOSE_NAME.pattern)  # what managed_files() copies
# Any docker-compose*.yml the directory listing may hold (`docker-compose copy.yml`): a name
# without `/` or a control character, so it stays inside the deployment directory. The collector
# observes every one (the plan's fingerprint names them, and the box only digests them); a
# converge never writes one that is not a COMPOSE_NAME, and a snapshot copies none of those.
LISTED_COMPOSE = re.compile(r"^docker-compose[^/\x00-\x1f\x7f\ud800-\udfff]*\.ya?ml\Z")
# compose's own service-name rule (compose-spec's `^[a-zA-Z0-9._-]+$`: `_metrics`, `.x` are
# services `docker compose config` accepts, and a container of one, even a `run` one-off, is in
# every plan's fingerprint), less a leading `-` (never read as an option) and bounded. The
# controller's plan blocks a box holding a name refused here (reconciler/plan.py).
SERVICE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,127}\Z")
PROJECT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,127}\Z")  # compose's project-name rule
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}\Z")
SECRET_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
SHA256 = re.compile(r"^[0-9a-f]{64}\Z")
CONTAINER_ID = re.compile(r"^[0-9a-f]{1,64}\Z")
# Docker's reference grammar (distribution/reference): [domain/]path[:tag][@digest].
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = r"(?:%s(?:\.%s)*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?" % (_LABEL, _LABEL)
IMAGE_REF = re.compile(
    r"^(?:%s/)?%s(?:/%s)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9A-Fa-f]{32,})?\Z" % (_DOMAIN, _COMPONENT, _COMPONENT)
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# One IPv4 address as four decimal numbers 0-255 without leading zeros: the desired model's
# rule (ipaddress.IPv4Address, desired/types.py check_ipv4), which this box's python3 cannot be
# trusted to keep (>= 3.8: ipaddress took leading zeros until 3.8.12 and 3.9.5).
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = re.compile(r"^%s(?:\.%s){3}\Z" % (_OCTET, _OCTET))
ACTIONS = ("converge", "rollback", "snapshots", "mark-good")
MAX_TIMEOUT_S = 7 * 24 * 3600


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return (_is_int(value) or isinstance(value, float)) and value == value  # not NaN


def _text(where, value, limit=4096):
    """A free text (a holder, a reason, a title): a string, one line, bounded."""
    if not isinstance(value, str) or len(value) > limit or _CONTROL.search(value):
        raise Failed(
            "%s: must be one line of text of at most %d characters (no control characters)"
            % (where, limit)
        )


def _named(where, value, pattern):
    if not isinstance(value, str) or not pattern.match(value):
        shown = repr(value)[:80] if isinstance(value, str) and not _CONTROL.search(value) else ""
        raise Failed("%s: %s is not a valid name here" % (where, shown or "the value"))


def _env_value(where, value):
    # One line of .env: compose's dotenv reader would split a value at CR/LF, and a NUL ends
    # it in every C consumer. Never echoed: the value may be a secret.
    if not isinstance(value, str) or len(value) > 65536 or re.search(r"[\x00\r\n]", value):
        raise Failed("%s: an env value must be one line without NUL, CR or LF" % where)


def _home_path(where, value, home):
    """A path under the deploy user's home, `~/...` or absolute, without `..`. The controller
    does not know the box's home (`home` None): there the shape only, the box checks the rest."""
    if not isinstance(value, str) or not value or _CONTROL.search(value):
        raise Failed("%s: must be a path without control characters" % where)
    inside = value.startswith(("~/", "/")) and ".." not in value.split("/")
    if inside and home is not None:
        expanded = os.path.normpath(os.path.expanduser(value))
        inside = expanded.startswith(os.path.normpath(home).rstrip("/") + "/")
    if not inside:
        raise Failed("%s: must be a path inside the deploy user's home, without '..'" % where)


def _timeout(where, value):
    if not _is_int(value) or not 0 < value <= MAX_TIMEOUT_S:
        raise Failed("%s: must be a whole number of seconds, 1 to %d" % (where, MAX_TIMEOUT_S))


def _dict(where, value):
    if not isinstance(value, dict):
        raise Failed("%s: must be a mapping" % where)
    return value


def _list(where, value):
    if not isinstance(value, list):
        raise Failed("%s: must be a list" % where)
    return value


def check_snapshot_id(where, value):
    """A snapshot is named by its UTC time: no `/`, no `..`, no leading `-`, nothing else."""
    if not isinstance(value, str) or not SNAPSHOT_ID.match(value):
        raise Failed(
            "%s: not a snapshot id (YYYYMMDDTHHMMSSZ[-N], as `reconcile snapshots` lists)" % where
        )


def validate_payload(p, home=None):
    """Refuse a payload with any value that is not what it claims to be, before anything runs.
    `home`: the deploy user's home on the box; None on the controller (see _home_path)."""
    _dict("payload", p)
    if p.get("action") not in ACTIONS:
        raise Failed("action: must be one of %s" % ", ".join(ACTIONS))
    _text("holder", p.get("holder"), 300)
    _home_path("directory", p.get("directory"), home)
    _named("project", p.get("project"), PROJECT)
    for i, name in enumerate(_list("compose_files", p.get("compose_files"))):
        _named("compose_files[%d]" % i, name, COMPOSE_NAME)
    for i, lane in enumerate(_list("lane_specs", p.get("lane_specs"))):
        lane = _dict("lane_specs[%d]" % i, lane)
        _named("lane_specs[%d].service" % i, lane.get("service"), SERVICE)
        _timeout("lane_specs[%d].timeout_s" % i, lane.get("timeout_s"))
        util = lane.get("util")
        if not _is_number(util) or not 0 < util <= 1:
            raise Failed("lane_specs[%d].util: must be a fraction in (0, 1]" % i)
    _timeout("gateway.timeout_s", _dict("gateway", p.get("gateway")).get("timeout_s"))
    memory = _dict("memory", p.get("memory"))
    if not _is_number(memory.get("floor_gib")) or not 0 <= memory["floor_gib"] <= 1 << 20:
        raise Failed("memory.floor_gib: must be a number of GiB >= 0")
    if not isinstance(memory.get("drop_caches", True), bool):
        raise Failed("memory.drop_caches: must be true or false")
    action = p["action"]
    if action in ("rollback", "mark-good") and p.get("snapshot") is not None:
        check_snapshot_id("snapshot", p["snapshot"])
    if action == "rollback" and p.get("reason") is not None:
        _text("reason", p["reason"])
    if action == "converge":
        _validate_converge(p, home)


def _validate_converge(p, home):
    for i, title in enumerate(_list("titles", p.get("titles", []))):
        _text("titles[%d]" % i, title)
    fp = _dict("fingerprint", p.get("fingerprint", {}))
    for name, sha in _dict("fingerprint.files", fp.get("files") or {}).items():
        if not (isinstance(name, str) and LISTED_COMPOSE.match(name)):
            _named("fingerprint.files", name, SNAPSHOT_FILE)
        if sha is not None and not (isinstance(sha, str) and SHA256.match(sha)):
            raise Failed("fingerprint.files.%s: must be a sha256 or null" % name)
    if fp.get("containers") is not None:
        # {service: [id, ...]}: every container of the service the observation listed
        for service, ids in _dict("fingerprint.containers", fp["containers"]).items():
            _named("fingerprint.containers", service, SERVICE)
            for i, cid in enumerate(_list("fingerprint.containers.%s" % service, ids)):
                _named("fingerprint.containers.%s[%d]" % (service, i), cid, CONTAINER_ID)
    managed = _dict("managed_env", p.get("managed_env"))
    for key, spec in managed.items():
        _named("managed_env", key, ENV_KEY)
        if isinstance(spec, dict):
            if set(spec) - {"secret", "value"}:
                raise Failed("managed_env.%s: a secret is {secret, value?}" % key)
            _named("managed_env.%s.secret" % key, spec.get("secret"), SECRET_NAME)
            if "value" in spec:
                _env_value("managed_env.%s" % key, spec["value"])
        elif spec is not None:  # None: the key must be absent (its lines are removed)
            _env_value("managed_env.%s" % key, spec)
    for name, src in _dict("box_secrets", p.get("box_secrets") or {}).items():
        _named("box_secrets", name, SECRET_NAME)
        src = _dict("box_secrets.%s" % name, src)
        _home_path("box_secrets.%s.path" % name, src.get("path"), home)
        _named("box_secrets.%s.key" % name, src.get("key"), ENV_KEY)
    env_keys = _list("env_keys", p.get("env_keys", []))
    for i, key in enumerate(env_keys):
        if key not in managed:
            raise Failed("env_keys[%d]: not a key of managed_env" % i)
        if key in env_keys[:i]:  # written twice, an absent key was appended twice
            raise Failed("env_keys[%d]: %s is listed twice" % (i, key))
    for i, item in enumerate(_list("restore", p.get("restore", []))):
        item = _dict("restore[%d]" % i, item)
        _named("restore[%d].name" % i, item.get("name"), COMPOSE_NAME)
        sha = item.get("sha256")
        if sha is not None and not (isinstance(sha, str) and SHA256.match(sha)):
            raise Failed("restore[%d].sha256: must be a sha256 or null" % i)
    for i, ref in enumerate(_list("pulls", p.get("pulls", []))):
        _image("pulls[%d]" % i, ref)
    for field in ("services", "removes"):
        for i, service in enumerate(_list(field, p.get(field, []))):
            _named("%s[%d]" % (field, i), service, SERVICE)
    for service, ref in _dict("images", p.get("images") or {}).items():
        _named("images", service, SERVICE)
        if ref is not None:
            _image("images.%s" % service, ref)
    verify = _dict("verify", p.get("verify"))
    if "bind" in verify:  # absent from an older controller's payload: asked at 127.0.0.1
        _ipv4("verify.bind", verify["bind"])
    if not _is_int(verify.get("port")) or not 0 < verify["port"] < 65536:
        raise Failed("verify.port: must be a TCP port")
    _text("verify.version", verify.get("version"), 64)
    if verify.get("auth") not in ("keyed", "open"):
        raise Failed("verify.auth: must be keyed or open")
    for role, window in _dict("verify.windows", verify.get("windows") or {}).items():
        _named("verify.windows", role, SERVICE)
        if not _is_int(window) or window <= 0:
            raise Failed("verify.windows.%s: must be a positive whole number" % role)
    for i, role in enumerate(_list("verify.infeasible", verify.get("infeasible", []))):
        _named("verify.infeasible[%d]" % i, role, SERVICE)
    keep = p.get("keep", 10)
    if not _is_int(keep) or not 1 <= keep <= 1000:
        raise Failed("keep: must be a whole number from 1 to 1000")
    if not isinstance(p.get("accept_interrupted", False), bool):
        raise Failed("accept_interrupted: must be true or false")


def _ipv4(where, value):
    """An address the gateway is asked at (and a socket is bound to): IPV4, nothing else."""
    if not isinstance(value, str) or not IPV4.match(value):
        shown = repr(value)[:80] if isinstance(value, str) and not _CONTROL.search(value) else ""
        raise Failed("%s: %s is not an IPv4 address (a.b.c.d)" % (where, shown or "the value"))


def _image(where, ref):
    if not isinstance(ref, str) or len(ref) > 512 or not IMAGE_REF.match(ref):
        _named(where, ref, IMAGE_REF)  # the same refusal, naming the reference when printable


# Secret names whatever the payload says: the floor (FLOOR, reconciler/box_shared/secret_floor.py);
# and what a credential follows in a message, as reconciler/scrub.py (test_secret_boundaries.py
# keeps the copies in step).
_CREDENTIAL = re.compile(
    r"(?i:\bbearer\b|\b(?:proxy-)?authorization\b|\bx-api-key\b|--api-key\b|\bset-cookie\b"
    r"|\bcookie\s*[:=])|\bBasic\s+[A-Za-z0-9+/=]{8,}"
)
_BREAK = re.compile(r"[\r\n]|\\r|\\n")
# `NAME=value` first, then `NAME: value` (so `error: HF_TOKEN=x` reaches the HF_TOKEN), the
# name possibly a quoted mapping key (`{'HF_TOKEN': 'x'}`); each a name and its separator, then
# the value. A name that holds no secret is passed over up to its separator only: its value is
# read too (`failed: {'HF_TOKEN': 'x'}`).
_ASSIGNMENTS = tuple(
    re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)([\"']?\s*%s\s*)" % sep) for sep in ("=", ":")
)
_VALUE = re.compile(r"\"[^\"]*\"|'[^']*'|[^\s,;)}]+")

# A flag whose last word names a credential (`--hf-token x`, `--password=x`, `'--token', 'x'`
# in a printed list), and a URL's password (`http://user:pw@host`).
_FLAG_NAME = (
    r"(?<![\w-])(--?(?:[A-Za-z0-9]+[-_])*(?i:token|secret|password|passwd|credentials?|key))"
)
_SECRET_FLAG = re.compile(_FLAG_NAME + r"(=|\s+)(\"[^\"]*\"|'[^']*'|\S+)")
_SECRET_ITEM = re.compile(_FLAG_NAME + r"([\"']\s*,\s*)([\"'])(.*?)\3")
_USERINFO = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://[^\s/?#:]*):[^\s/?#]+@")
# What a message says of a secret rather than its value (`--token set`): nothing to mask.
_STATE_WORDS = frozenset(("set", "empty", "absent", "unset", "missing", "commented", "***"))


def floor_secret(name):
    return any(fnmatch.fnmatchcase(str(name).upper(), p) for p in FLOOR)


def scrub(text, secrets=()):
    """A reason fit for a report: known secret values masked, nothing after a credential
    marker or a line break (an injected header line), `SECRET_NAME=value` without its value,
    one line, bounded."""
    text = str(text)
    for value in sorted(secrets, key=len, reverse=True):
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    for pattern in (_CREDENTIAL, _BREAK):
        cut = pattern.search(text)
        if cut:
            text = text[: cut.start()].rstrip() + " [redacted]"

    def assignments(pattern, text):
        pieces = []  # type: list
        done = at = 0
        found = pattern.search(text)
        while found is not None:
            at = found.end()  # after the separator: a value not masked is read on
            taken = _VALUE.match(text, at) if floor_secret(found.group(1)) else None
            if taken:
                pieces += (text[done:at], "***")
                done = at = taken.end()
            found = pattern.search(text, at)
        return "".join(pieces) + text[done:] if pieces else text

    def flag(match):
        groups = match.groups()
        if len(groups) == 4:  # a printed list's next item: `'--token', 'x'`
            name, sep, quote, value = groups
            sep, end = sep + quote, quote
        else:
            (name, sep, value), end = groups, ""
        if value in _STATE_WORDS or value.startswith("-"):
            return match.group(0)
        return name + sep + "***" + end

    for pattern in _ASSIGNMENTS:
        text = assignments(pattern, text)
    text = _SECRET_FLAG.sub(flag, text)
    text = _SECRET_ITEM.sub(flag, text)
    text = _USERINFO.sub(r"\1:***@", text)
    return _CONTROL.sub(" ", text)[:500]


def reason_of(exc, secrets=()):
    """What went wrong, never what a file or a value held: our own messages are written to hold
    names only; an OSError gives its errno text and file name; anything else only its type."""
    if isinstance(exc, (Failed, Stopped)):
        text = str(exc)
    elif isinstance(exc, OSError):
        name = os.path.basename(str(exc.filename)) if exc.filename else ""
        text = "%s: %s%s" % (
            type(exc).__name__,
            exc.strerror or "error",
            " (%s)" % name if name else "",
        )
    else:
        text = "unexpected %s" % type(exc).__name__
    return scrub(text, secrets)


# -- events --------------------------------------------------------------------------------------
_STDOUT_OK = [True]  # False once a write failed: the controller can no longer read us


def emit(event, **fields):
    if not _STDOUT_OK[0]:
        return
    fields["event"] = event
    fields["t"] = round(time.time(), 3)
    try:
        sys.stdout.write(json.dumps(fields, sort_keys=True) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        # The controller went away: the events are dropped from here on. A converge stops
        # before its next change and rolls back (go_on); a rollback, once begun, completes.
        _STDOUT_OK[0] = False


def announce_start(action):
    """The first event, right after the lock is taken and before anything is looked at or
    changed: the controller's proof that the program runs (and holds the lock). When even this
    cannot be written the controller is gone already (its connection dropped after the payload
    was delivered), so nothing is done: no one could be told what changed, nor verify or roll
    it back. (A network that went silent is not seen here: the write lands in a buffer. The
    controller counts any payload delivered without a result as STATE UNKNOWN, boxcall.py.)"""
    emit("started", action=action, pid=os.getpid())
    if not _STDOUT_OK[0]:
        raise Failed("the controller's connection is gone (output closed): nothing was changed")


def go_on(before):
    """Called by a converge right after announcing a change (its step event), before making
    it: once the controller cannot read us, the converge stops there, as a stop signal would
    (on_stop), and its rollback puts the snapshot back: a box is never changed unseen,
    unverified and never marked good. Not once the rollback or the applied state is reached
    (disarm_stop): those complete whatever the output does."""
    if _STOP["armed"] and not _STDOUT_OK[0]:
        _STOP["armed"] = False
        raise Stopped(
            "the controller's connection is gone (output closed): stopped before " + before
        )


# -- processes -----------------------------------------------------------------------------------
class Box:
    def __init__(self, payload):
        self.p = payload
        self.home = os.path.expanduser("~")
        self.deploy = os.path.expanduser(payload["directory"])
        self.fleet = os.path.join(self.deploy, FLEET_DIR)
        self.project = payload["project"]
        self.secrets = []  # values to mask in any message: controller_env and box_file secrets
        # The snapshot this converge took, once taken: every write of a managed file is first
        # recorded in it (record_write), so a rollback can tell the converge's file from another's.
        self.snapshot = None

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
        # The files a converge may write: `.env`, the compose chain, and any compose file the
        # plan restores (snapshotted like the rest, so a rollback undoes that write too).
        names = [".env"] + list(self.p["compose_files"])
        names += [item["name"] for item in self.p.get("restore") or []]
        # Of the listing, plain names only (COMPOSE_NAME, what a rollback accepts): a converge
        # writes nothing but the payload's names, all plain, so a `docker-compose copy.yml`
        # beside them is never changed and needs no copy. Recorded, it made every rollback of
        # that snapshot refuse (snapshot_files), the one after a failed converge too.
        for entry in sorted(os.listdir(self.deploy)):
            if entry.startswith("docker-compose") and COMPOSE_NAME.match(entry):
                names.append(entry)
        return list(dict.fromkeys(names))


def last_line(text):
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def sha256_file(path):
    """The sha256 of a managed file's bytes (a symlink's target's, as the collector digests
    them), None when there is none; refused as read_regular refuses."""
    data = read_managed(path)
    return None if data is None else hashlib.sha256(data).hexdigest()


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def private_dir(path):
    """A directory of ours, 0700: never a symlink (it could point anywhere), never another's."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    if stat.S_IMODE(own_dir(path).st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def own_dir(path):
    """lstat of `path`, refused unless it is a real directory of this user."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise Failed("%s is not a directory of this user (a symlink?); refusing to use it" % path)
    return st


def fsync_dir(path):
    dfd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def temp_name(path):
    """A fresh temporary name beside `path`, of the shape sweep_temp_files removes."""
    return "%s.fleet-tmp-%s" % (path, os.urandom(6).hex())


KEEP = "keep"  # atomic_write's owner by default: the one of the regular file at the path now


def atomic_write(path, data, mode, owner=KEEP):
    """Same directory, fsync, rename: a reader sees the old file or the new one, never half.
    `owner`: the (uid, gid) the new file gets (keep_owner): by default the owner and group of
    the regular file it replaces (none for a new file, or one replacing a symlink: this
    user's); a rollback gives the ones its snapshot recorded.

    The temporary file is created 0600 and exclusively (O_EXCL|O_NOFOLLOW: a planted file or
    symlink of that name is never written through), gets its final mode only once complete, and
    is removed on any failure: no partial copy of a secrets file stays behind. A symlink at
    `path` is replaced (the rename swaps the directory entry), never written through."""
    directory = os.path.dirname(path) or "."
    if owner == KEEP:
        owner = owner_at(path)
    while True:
        tmp = temp_name(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            break
        except FileExistsError:
            continue
    done = False
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            keep_owner(fd, path, owner)  # before the mode: a chown clears setuid and setgid
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        done = True
    finally:
        if not done:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    fsync_dir(directory)


def owner_at(path):
    """(uid, gid) of the regular file at `path` (never followed), None when there is none."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_uid, st.st_gid) if stat.S_ISREG(st.st_mode) else None


def keep_owner(fd, path, owner):
    """The temporary file `fd`, about to replace `path`, given the owner and group (uid, gid)
    the file had: made by this process it is this user's and group's, and the rename dropped a
    group the operator had given the file (a monitoring agent of group adm reading the compose
    file). Where that is not permitted (a user not root gives no file away, nor a group it is
    not in), the group alone is tried, and what could not be kept is said in a note: the write
    goes on, its bytes are what matters."""
    if owner is None:
        return
    st = os.fstat(fd)
    uid = owner[0] if owner[0] != st.st_uid else -1
    gid = owner[1] if owner[1] != st.st_gid else -1
    if uid == -1 and gid == -1:
        return
    try:
        os.fchown(fd, uid, gid)
        return
    except OSError as exc:
        why = exc.strerror or "error"
    if uid != -1 and gid != -1:
        with contextlib.suppress(OSError):
            os.fchown(fd, -1, gid)
            gid = -1
    lost = " and ".join(
        "%s %d" % (what, n) for what, n in (("owner uid", uid), ("group gid", gid)) if n != -1
    )
    emit("note", message="%s: could not keep its %s (%s)" % (shown(path), lost, why))


def atomic_symlink(path, link):
    """Make `path` the symlink `link`, atomically: made under a temporary name, then renamed
    over whatever is at `path` (a rollback puts back a link that apply replaced)."""
    while True:
        tmp = temp_name(path)
        try:
            os.symlink(link, tmp)
            break
        except FileExistsError:
            continue
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(path))


_TEMP_NAME = re.compile(r"\.fleet-tmp-[0-9a-f]+\Z")


def sweep_temp_files(box):
    """Remove the temporary files a killed run left (SIGKILL skips every `finally`). Called
    under the lock: no write of ours is in flight, so any such file is a leftover.

    Through directory fds: `.fleet` and `known-good` are opened O_NOFOLLOW, so a known-good
    that is a symlink to elsewhere is not swept (its matching names are not ours), and each
    name is removed from the directory that was listed, never from a path resolved again."""
    deploy = open_dir(box.deploy)
    good = open_known_good(box, deploy)
    try:
        for dfd in (deploy, good):
            if dfd is not None:
                sweep_dir(dfd)
    finally:
        for dfd in (deploy, good):
            if dfd is not None:
                os.close(dfd)


def open_known_good(box, deploy=None):
    """`.fleet/known-good`'s fd, None when there is none: both opened O_NOFOLLOW below the
    deployment directory (its fd `deploy`, else opened here), so never one reached by a link."""
    own = deploy is None
    if own:
        deploy = open_dir(box.deploy)
    fleet = open_dir(FLEET_DIR, deploy) if deploy is not None else None
    try:
        return open_dir("known-good", fleet) if fleet is not None else None
    finally:
        for dfd in (fleet, deploy if own else None):
            if dfd is not None:
                os.close(dfd)


def open_dir(name, parent=None):
    """A directory's fd, None when there is none. `name` below the fd `parent` is opened
    O_NOFOLLOW: a directory of ours is never a symlink. (The deployment directory itself may
    be one: the operator chose it.)"""
    flags = os.O_RDONLY | os.O_DIRECTORY
    if parent is not None:
        flags |= os.O_NOFOLLOW
    try:
        return os.open(name, flags, dir_fd=parent)
    except OSError:
        return None


def sweep_dir(dfd):
    for name in os.listdir(dfd):
        if not _TEMP_NAME.search(name):
            continue
        with contextlib.suppress(OSError):
            mode = os.lstat(name, dir_fd=dfd).st_mode
            # A leftover temp file, or a temp symlink of atomic_symlink: unlinking a symlink
            # removes the link only.
            if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
                os.unlink(name, dir_fd=dfd)


# -- reading box files: one bounded reader ---------------------------------------------------------
READ_LIMIT = 64 << 20  # the most a box file may hold: what a snapshot copies, a rollback restores
HOLDER_LIMIT = 64 << 10  # the lock file's record
_KINDS = (
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISLNK, "symlink"),
)


def shown(path):
    """`path` as the operator knows it: `~/.lobes/.env`, not the home's absolute path."""
    home = os.path.expanduser("~").rstrip("/") + "/"
    return "~/" + path[len(home) :] if path.startswith(home) else path


def size_text(limit):
    return "%d MiB" % (limit >> 20) if limit % (1 << 20) == 0 else "%d bytes" % limit


def check_regular(path, st, limit=None, via_link=False):
    """Refuse, naming `path`, unless `st` is a regular file (of at most `limit` bytes)."""
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "unknown type")
        raise Failed(
            "%s is not a regular file (%s%s)"
            % (shown(path), "symlink to a " if via_link else "", kind)
        )
    if limit is not None and st.st_size > limit:
        raise too_large(path, limit)


def too_large(path, limit):
    return Failed(
        "%s is larger than %s, the most a converge reads" % (shown(path), size_text(limit))
    )


def read_regular(path, limit=READ_LIMIT, follow=False, dir_fd=None, ident=None, owner=None):
    """(bytes, mode) of a regular file of at most `limit` bytes: the one way this program reads
    a box file. Anything else is refused by name, never read: a FIFO would block (the open
    waiting for a writer, the read for data) with the lock held; a device like /dev/zero never
    ends. So: stat first (a device is not even opened), open O_NONBLOCK (a FIFO swapped in
    meanwhile opens at once and is then refused) and O_NOCTTY, fstat what was opened, and read
    at most limit + 1 bytes (a file that grew past the limit is refused, never held whole).

    `follow`: a managed file may be a symlink, and its target is read; a file of ours (a
    snapshot copy, meta.json, the lock) never is (lstat, O_NOFOLLOW). `dir_fd`: `path` is
    relative to that open directory, not resolved from the root again. `ident`: a list, given
    the (st_dev, st_ino) of the file read, from the descriptor that read it (a caller that then
    renames the path checks it moved that very file, not one swapped in after the read).
    `owner`: a list, given the (st_uid, st_gid) of the file read (keep_owner)."""
    via_link = follow and stat.S_ISLNK(os.lstat(path, dir_fd=dir_fd).st_mode)
    check_regular(path, os.stat(path, dir_fd=dir_fd, follow_symlinks=follow), limit, via_link)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        check_regular(path, st, limit, via_link)
        data = read_at_most(fd, limit + 1)
        if ident is not None:
            ident.append((st.st_dev, st.st_ino))
        if owner is not None:
            owner.append((st.st_uid, st.st_gid))
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew since the fstat: still refused, never held whole
        raise too_large(path, limit)
    return data, stat.S_IMODE(st.st_mode)


def read_at_most(fd, count):
    chunks = []
    while count > 0:
        chunk = os.read(fd, min(count, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def read_managed(path):
    """The bytes of a managed file (a symlink's target's), None when there is none."""
    try:
        return read_regular(path, follow=True)[0]
    except FileNotFoundError:
        return None


def managed_state(path):
    """What is at a managed path, refused unless a converge can snapshot and restore it
    exactly: None when nothing is, else (link, stat of the file): `link` the symlink's text
    when the path is a symlink (to a regular file), else None. A FIFO, a device, a socket, a
    directory, a link to one or to nothing, or a file over READ_LIMIT is refused by name."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    link = None
    if stat.S_ISLNK(st.st_mode):
        link = os.readlink(path)
        try:
            st = os.stat(path)
        except OSError as exc:
            raise Failed(
                "%s is a symlink that leads to no file (%s)" % (shown(path), exc.strerror)
            ) from None
    check_regular(path, st, READ_LIMIT, link is not None)
    return link, st


def check_managed_files(box):
    """Every file a converge may write is a regular file (or a symlink to one inside the
    deployment directory, check_link_inside) within READ_LIMIT, or absent: checked under the
    lock before anything changes, so that what the snapshot copies, a rollback can restore, no
    read of one can hang or fill memory, and none is read from outside the deployment."""
    for name in box.managed_files():
        check_managed(box, name)


def check_managed(box, name):
    """managed_state of one managed file, and a symlink's target checked (check_link_inside)."""
    path = box.path(name)
    state = managed_state(path)
    if state is not None and state[0] is not None:
        check_link_inside(box, path, state[0])
    return state


def check_link_inside(box, path, link):
    """A managed file that is a symlink must lead to a file inside the deployment directory,
    and not into its `.fleet` (the converge's own snapshots, lock and known-good copies).

    Why: a converge reads a managed file through its link (write_env keeps every other line
    of `.env`, mark_good copies the compose chain into known-good), so a `.env` linked to
    /etc/..., to another deployment's or another user's file, would have that file's lines,
    secrets too, copied into this deployment and its snapshots, and the link replaced by that
    copy (write_managed): the shared file silently stops being what this box runs from. A link
    inside the directory is the operator's own layout (a compose variant switched by a link):
    the same deployment's file, read as compose reads it, never written (the link is replaced
    by a regular file and a rollback puts the link back). Refused by name, with where the link
    leads, under the lock before anything changes."""
    target = os.path.realpath(path)
    deploy = os.path.realpath(box.deploy)
    fleet = os.path.join(deploy, FLEET_DIR)
    ours = target == fleet or target.startswith(fleet + "/")
    if target.startswith(deploy.rstrip("/") + "/") and not ours:
        return
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), link))
    where = shown(link) if resolved == target else "%s, that is %s" % (shown(link), shown(target))
    outside = "into the converge's own %s/ in" % FLEET_DIR if ours else "outside"
    raise Failed(
        "%s is a symlink leading %s the deployment directory %s (to %s): a converge never "
        "reads or replaces a file there; make it a regular file (or a link to one inside %s)"
        % (shown(path), outside, shown(box.deploy), where, shown(box.deploy))
    )


# -- lock ----------------------------------------------------------------------------------------
LOCK_WAIT_S = 1.0  # how long acquire() retries a lock held for a moment


class Lock:
    """`~/.lobes/.fleet/lock`: an flock held while this process lives, plus who and since when."""

    def __init__(self, box):
        self.fleet = box.fleet  # made (0700) only when the lock is used: a refusal makes nothing
        self.path = os.path.join(box.fleet, "lock")
        self.fd = None

    def holder(self):
        try:
            data, _ = read_regular(self.path, HOLDER_LIMIT)
            found = json.loads(data.decode("utf-8") or "{}")
        except (OSError, ValueError, Failed):
            return {}
        return found if isinstance(found, dict) else {}

    def open_fd(self, flags):
        """The lock file's fd, refused unless it is a regular file: O_NONBLOCK, so a FIFO in
        its place does not block this open (nor, refused, anything after it); lstat before
        (anything else is not even opened) and fstat after (what was opened)."""
        with contextlib.suppress(FileNotFoundError):
            check_regular(self.path, os.lstat(self.path))
        fd = os.open(self.path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, 0o600)
        try:
            check_regular(self.path, os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def acquire(self, holder):
        private_dir(self.fleet)
        fd = self.open_fd(os.O_RDWR | os.O_CREAT)
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            # A listing holds the lock for a moment (is_held): a converge waits that out; one
            # still held after LOCK_WAIT_S is another run's.
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                busy = exc.errno in (errno.EAGAIN, errno.EACCES)
                if busy and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                os.close(fd)
                if not busy:
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
        # Asked by the listing, which creates nothing: no lock file, no holder.
        if not os.path.lexists(self.fleet) or not os.path.lexists(self.path):
            return False
        own_dir(self.fleet)
        fd = self.open_fd(os.O_RDWR)
        try:
            # Shared: two listings never see each other as a converge.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except OSError:
            return True
        finally:
            os.close(fd)


# -- containers ----------------------------------------------------------------------------------
SERVICE_LABEL = "com.docker.compose.service"
ONEOFF_LABEL = "com.docker.compose.oneoff"  # "True" on a `docker compose run` container


def project_containers(box):
    """[inspect] of every container of the compose project, `docker compose run` ones too, in
    the order `docker ps` lists them (newest first)."""
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
        return []
    found = json.loads(box.must(["docker", "inspect"] + ids, "docker inspect"))
    return [c for c in found if isinstance(c, dict)]


def labels_of(inspect):
    return (inspect.get("Config") or {}).get("Labels") or {}


def name_of(inspect):
    return str(inspect.get("Name") or "").lstrip("/")


def containers(box):
    """{service: inspect} of the compose project: each service's own container, the one every
    step of a converge and a rollback watches, recreates, records and compares.

    Never a `docker compose run` container (label oneoff=True, `lobes-<service>-run-<hex>`):
    an operator's one-off left behind, exited, keeps the service's labels; taken for the lane,
    its state failed a healthy lane's boot ("stopped while booting") and the rollback after.
    Of several others (a `--scale` replica, a copy made by hand), the one the drift comparison
    reads as the service's (reconciler/compare/containers.py service_containers, _rank):
    compose's numbered replica, lowest number, else the first by name; whatever order `docker
    ps` lists them in (newest first: the oldest came last and was kept). Its `container_name`
    rank is not needed here: such a service has one container of its own (compose refuses to
    scale it)."""
    groups = {}  # type: dict
    for c in project_containers(box):
        labels = labels_of(c)
        service = labels.get(SERVICE_LABEL)
        if service and str(labels.get(ONEOFF_LABEL, "")).lower() != "true":
            groups.setdefault(service, []).append(c)
    found = {}
    for service, group in groups.items():
        ranked = sorted((service_rank(name_of(c), service), i) for i, c in enumerate(group))
        found[service] = group[ranked[0][1]]  # equal ranks: the first `docker ps` listed
    return found


def service_rank(name, service):
    """compare/containers.py `_rank` without the render's container_name: (1, n, name) for
    compose's replica n (`<project>-<service>-<n>`, v1 `_`), else (2, 0, name)."""
    for sep in "-_":
        mark = sep + service + sep
        at = name.rfind(mark)
        number = name[at + len(mark) :] if at > 0 else ""
        if number.isascii() and number.isdigit() and len(number) <= 6:
            return (1, int(number), name)
    return (2, 0, name)


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
def env_lines(text, keepends=False):
    """`.env` text in lines as compose's dotenv reads it (`_dotenv_lines`): at LF only, a quoted
    value spanning lines kept in one; without keepends, a CR before the LF is part of the line
    ending. The lines parse_env's indexes count."""
    lines = _dotenv_lines(text)
    if keepends:
        ended = [line + "\n" for line in lines]
        if ended and not text.endswith("\n"):
            ended[-1] = lines[-1]
        return ended
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def parse_env(text, name=".env", assigned=None):
    """{key: (value, index in env_lines)} for each key `[A-Za-z_][A-Za-z0-9_]*` compose reads
    from `text`; the last assignment wins, as in compose. A key whose value compose computes
    from what the box cannot know here (`_dotenv_read`) is left out: it differs from every
    desired value, so a converge writes it plainly. `assigned`, a set, gets every key a
    statement assigns, such a key too: compose reads it as present, so a key wanted absent
    is removed while one does (`differs`). A text compose refuses fails, naming the line
    (never its value): a converge must not write into a file compose cannot read."""
    statements, problem = _dotenv_read(text)
    if problem is not None:
        raise Failed("%s line %d: docker compose refuses this file: %s" % ((name,) + problem))
    joins = _dotenv_joins(text, statements)
    found = {}  # type: dict
    for key, value, line, _, _, _, _ in statements:
        if not (key.isidentifier() and key.isascii()):
            continue
        if assigned is not None:
            assigned.add(key)
        if value is None:
            found.pop(key, None)
        else:
            found[key] = (value, _dotenv_line_index(joins, line - 1))
    return found


def quote(value, bare=True):
    """A value compose's dotenv reads back unchanged: bare where it can be (and `bare`), else
    in single quotes (literal: no interpolation, no escapes), else in double quotes.
    The collector renders the desired `.env` in the same form (collector.py `_quoted`): a value
    ending in an odd run of backslashes (`abc\\`, which compose reads as an unterminated
    `'abc\\'`) is written so and refused by `reads_back` before anything is stopped, as the
    collector's render of it fails the plan (the loader refuses such a value in group_vars)."""
    if "\n" in value or "\r" in value or "\0" in value:
        raise Failed("a managed .env value spans lines or holds a NUL; lobes' .env cannot hold it")
    if bare and (value == "" or re.match(r"^[A-Za-z0-9_./:,@+=%-]+$", value)):
        return value
    if "'" not in value:
        return "'%s'" % value  # single quotes: literal, no interpolation, no escapes
    if "$" in value:
        raise Failed("a managed .env value holds both ' and $; write it by hand")
    return '"%s"' % value.replace("\\", "\\\\").replace('"', '\\"')


def replace_value(raw, key, value):
    """`KEY=old   # why` -> `KEY=new   # why`: what comes before the value and after it (an
    inline comment; after a closing quote, another statement) stays. `raw` is one of
    env_lines' lines; where it assigns `key` more than once, the last assignment (the one
    compose keeps) is replaced. The new value is quoted where, bare, it would run into what
    follows it (`A=new W=3` is one value; `A= # why` reads `# why`)."""
    spans = [s for s in _dotenv_read(raw, False)[0] if s[0] == key and s[4] >= 0]
    assert spans  # only called for lines parse_env matched
    _, _, _, _, start, end, _ = spans[-1]
    tail = raw[end:]
    new = quote(value)
    if new[:1] not in ("'", '"') and not _bare_fits(new, tail):
        new = quote(value, bare=False)
    return raw[:start] + new + tail


def _bare_fits(new, tail):
    """Whether compose reads a bare `new` followed by `tail` on its line as `new`: the value
    runs to the line's end, cut at the first ` #`, and is trimmed."""
    if "\n" in tail:
        return False
    if not tail.strip(_SPACE):
        return True
    cut = tail.find(" #")
    return new != "" and cut >= 0 and not tail[:cut].strip(_SPACE)


def secret_values(box):
    """Every box_file secret the payload names, read here; values never leave this process."""
    values, cache = {}, {}  # type: dict, dict
    for name, src in sorted((box.p.get("box_secrets") or {}).items()):
        path = os.path.expanduser(src["path"])
        if path not in cache:
            data = read_managed(path)  # a FIFO or a device here is refused, never read
            text = None if data is None else data.decode("utf-8")
            cache[path] = None if text is None else _secret_file_values(text)
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
    for key, spec in box.p["managed_env"].items():
        if isinstance(spec, dict) or (spec is not None and floor_secret(key)):
            box.secrets.append(out[key])  # a floor name's value is a secret too
    for key in box.p.get("env_keys") or []:
        if out[key] is None:
            continue
        try:
            quote(out[key])
        except Failed as exc:
            raise Failed("%s: %s" % (key, exc)) from None
    return out


def differs(key, want, current, assigned=()):
    # An absent key is appended even when empty: `KEY=` is what the drift engine renders
    # from, and lanes read `.env` whole through env_file, so absent and empty differ there.
    # A key wanted absent (None, `env: {KEY: null}`) differs while any statement assigns it
    # (`assigned`, parse_env's): one whose value compose computes (`${HAND_PIN:-...}`, not in
    # `current`) too, which compose reads as present.
    if want is None:
        return key in current or key in assigned
    return key not in current or current[key][0] != want


def without_keys(text, keys):
    """`text` without any statement assigning one of `keys` (compose keeps the last; removing a
    key must remove them all, or an earlier one would become the value). Statements, not
    lines: on `V="a" W=3` removing V keeps W, as the collector's render of this converge
    (`desired_envfile`) does; a line left with nothing but a comment goes whole."""
    statements, problem = _dotenv_read(text)
    if problem is not None:  # never: parse_env read this text before any edit
        raise Failed(".env: docker compose refuses the file this converge wrote into")
    out, done = [], 0
    for start, end, _ in sorted(_removal(text, s[3], s[6]) for s in statements if s[0] in keys):
        out += [text[done:start]]
        done = max(done, end)
    out.append(text[done:])
    return "".join(out)


def write_env(box, keys, desired):
    """Write the managed `keys` whose value differs; every other line stays byte for byte."""
    path = box.path(".env")
    try:
        data, mode = read_regular(path, follow=True)
    except FileNotFoundError:
        data, mode = b"", None
    text = data.decode("utf-8")
    assigned = set()  # type: set
    current = parse_env(text, assigned=assigned)
    lines = env_lines(text, keepends=True)  # the indexes parse_env gave
    changed, removed = [], set()  # type: list, set
    for key in keys:
        want = desired[key]
        if not differs(key, want, current, assigned):
            continue
        changed.append(key)
        if want is None:
            removed.add(key)
        elif key in current:
            index = current[key][1]
            raw = lines[index]
            ending = raw[len(raw.rstrip("\r\n")) :]
            lines[index] = replace_value(raw.rstrip("\r\n"), key, want) + ending
        else:
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n"
            lines.append("%s=%s\n" % (key, quote(want)))
    written = "".join(lines)
    if removed:
        written = without_keys(written, removed)
    if changed:
        reads_back(written, keys, desired, text)
    if changed or mode != 0o600:
        write_managed(box, ".env", written.encode("utf-8"), 0o600)
    return changed


def reads_back(text, keys, desired, before="", name=".env"):
    """Refuse, naming the line (never a value), a `.env` text about to be written that compose
    would refuse, or in which a managed key would not read as desired: read here with the same
    reader as compose's (_dotenv_read), before the write and so before any service is stopped.
    What this catches is a text that only the edit made unreadable (`before`, the file as it
    was, compose reads): a key appended after a last line with no `=` and no line end (`see
    docs`: ignored at the end of the file, refused once a line follows it), or a value whose
    quoting compose would read otherwise."""
    statements, problem = _dotenv_read(text)
    if problem is not None:
        line, why = problem
        hint = ""
        if before and not before.endswith("\n") and line == before.count("\n") + 1:
            hint = (
                ": it was the last line, with no `=` and no line end, which compose ignores "
                "only while nothing follows it; make it a comment or remove it by hand"
            )
        raise Failed(
            "%s line %d: docker compose would refuse the file this converge writes (%s); "
            "nothing was written%s" % (name, line, why, hint)
        )
    found = {}  # type: dict # key -> (value, line) of the assignment compose keeps
    for key, value, line, _, _, _, _ in statements:
        found[key] = (value, line)
    env = _compose_env()
    for key in keys:
        if key in env:
            continue  # compose takes the environment's value whatever the file says
        want = desired[key]
        have = found.get(key)
        if (have is None) if want is None else (have is not None and have[0] == want):
            continue
        where = "line %d" % have[1] if have is not None else "no line"
        raise Failed(
            "%s: %s would not read back as the value this converge writes (%s); nothing was "
            "written" % (name, key, where)
        )


def write_managed(box, name, data, mode):
    """Write a managed file of the deployment, with the owner and group the file had
    (atomic_write).

    A managed path that is a symlink is REPLACED by a regular file with the new bytes; its
    target is left exactly as it was. Apply writes only inside the deployment directory, never
    through a link to wherever it points (a shared file, another tool's, one outside the home);
    the snapshot recorded the link's text, so a rollback puts the link itself back, pointing at
    that untouched target: the state before, exactly."""
    path = box.path(name)
    if os.path.islink(path):
        emit(
            "note",
            message="%s was a symlink: now a regular file, its target left as it was (a "
            "rollback restores the link)" % shown(path),
        )
    if box.snapshot is not None:
        record_write(box, box.snapshot, name, data)
    atomic_write(path, data, mode)


def record_write(box, sid, name, data):
    """Before a managed file is written: the digest of the bytes about to be written, added to
    the snapshot's `wrote` record ({name: [sha256, ...]}).

    Written ahead, not after: a converge killed between the two leaves a record of bytes that
    may never have been written, which only lets a rollback remove those exact bytes; a record
    written after would leave a file the converge made that no rollback could tell from an
    operator's (so it would be kept for ever). When the record cannot be written, neither is
    the file: the error fails the converge, which rolls back."""
    meta = read_meta(box, sid)
    wrote = meta.get("wrote")
    wrote = dict(wrote) if isinstance(wrote, dict) else {}
    digests = [d for d in wrote.get(name) or [] if isinstance(d, str)]
    sha = hashlib.sha256(data).hexdigest()
    if sha not in digests:
        wrote[name] = digests + [sha]
        meta["wrote"] = wrote
        write_meta(snapshot_path(box, sid), meta)


def record_made(box, sid, service, before, created):
    """The id of the container this converge just made for `service` (recreated or created:
    one that is not the container `before` had), added to its snapshot's `made` record
    ({service: [id, ...]}): the only containers a later rollback may remove as a converge's
    (remove_containers). A service's name proves nothing: an operator may have started its
    container by hand since. A service of `created` (no container before) is also listed in the
    snapshot's `created`.

    Written after, not before (like record_write): the id exists only once compose made the
    container. A converge killed in between leaves a container no record names, which a later
    rollback keeps (and counts unequal): never one removed that no record proves ours."""
    cid = (containers(box).get(service) or {}).get("Id")
    if not (isinstance(cid, str) and cid) or cid == (before.get(service) or {}).get("Id"):
        return  # compose made nothing (it failed before creating): the old one, or none
    meta = read_meta(box, sid)
    made = meta.get("made")
    made = dict(made) if isinstance(made, dict) else {}
    ids = [i for i in made.get(service) or [] if isinstance(i, str)]
    if cid not in ids:
        made[service] = ids + [cid]
    meta["made"] = made
    if service in created:
        meta["created"] = list(dict.fromkeys(service_names(meta.get("created")) + [service]))
    write_meta(snapshot_path(box, sid), meta)


# -- snapshots -----------------------------------------------------------------------------------
META_LIMIT = 4 << 20


def snapshots_dir(box, create=True):
    """`.fleet/snapshots`, made 0700 when `create`; else None when there is none yet (the
    listing and a rollback's lookup create nothing)."""
    path = os.path.join(box.fleet, "snapshots")
    if create:
        return private_dir(os.path.join(private_dir(box.fleet), "snapshots"))
    for directory in (box.fleet, path):
        if not os.path.lexists(directory):
            return None
        own_dir(directory)
    return path


def snapshot_order(sid):
    """The order of snapshot ids, oldest first: by time, then by the -N taken within it (the
    plain id is the first, -2 the second, -10 after -9). As text, -10 sorted before -2."""
    base, _, n = sid.partition("-")
    return base, int(n) if n else 1


def snapshot_ids(root):
    """The snapshot ids in `root` (a snapshots dir), oldest first."""
    return sorted((n for n in os.listdir(root) if SNAPSHOT_ID.match(n)), key=snapshot_order)


def new_snapshot_id(root):
    """An id after every existing one, so the newest snapshot is always the last listed (the
    one a rollback without --to takes, the last one pruned): the clock's second, or, when the
    clock is at or behind the newest id (stepped back, or the same second), that id's -N+1."""
    base, n = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), 1
    existing = snapshot_ids(root)
    if existing:
        newest = snapshot_order(existing[-1])
        if newest[0] >= base:
            base, n = newest[0], newest[1] + 1
    while True:
        sid = base if n == 1 else "%s-%d" % (base, n)
        if n > 9999:
            raise Failed("no snapshot id left after %s; prune the snapshots" % base)
        if not os.path.lexists(os.path.join(root, sid)) and not os.path.lexists(
            os.path.join(root, "." + sid + ".partial")
        ):
            return sid
        n += 1


def take_snapshot(box, meta):
    """Copies of the managed files, written like any file of ours (0600, fsync, rename), in a
    `.partial` directory renamed into place: a snapshot is complete or absent."""
    root = snapshots_dir(box)
    sid = new_snapshot_id(root)
    tmp = os.path.join(root, "." + sid + ".partial")
    os.mkdir(tmp, 0o700)
    try:
        files, owners = {}, {}  # type: dict, dict
        for name in box.managed_files():
            entry = snapshot_file(box.path(name), os.path.join(tmp, name))
            if entry is not None and "owner" in entry:
                owners[name] = entry.pop("owner")
            files[name] = entry
        found = containers(box)
        # The running config of every service: a rollback proves it restored these exactly.
        atomic_write(os.path.join(tmp, "containers.json"), json.dumps(found).encode(), 0o600)
        meta = dict(
            meta,
            id=sid,
            taken_at=now_iso(),
            files=files,
            # {name: [uid, gid]} of each regular file: a rollback gives them back (keep_owner)
            owners=owners,
            containers={s: container_record(c) for s, c in found.items()},
            status="running",
        )
        write_meta(tmp, meta)
        os.rename(tmp, os.path.join(root, sid))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(root)
    return sid, meta


SNAPSHOT_TRIES = 3


def link_text(path):
    """The text of the symlink at `path`; None when it is not one, or nothing is there."""
    try:
        return os.readlink(path)
    except OSError:  # EINVAL: not a symlink; ENOENT: gone
        return None


def snapshot_file(src, copy):
    """One managed file into a snapshot, read as check_managed_files allowed it (the same
    reader and limit a restore uses, so every copy taken can be restored). A regular file:
    {sha256, mode} and its copy. A symlink: {symlink: its text, sha256 and mode of its
    target, for the record} and no copy: apply never writes the target (write_managed), so a
    rollback restores the link itself. None when absent: a rollback removes it again.

    What is at the path may change between the look and the read (an editor saving by rename
    replaces a link by a regular file): a path that was no link is read without following
    (O_NOFOLLOW: a link swapped in is refused, never read as the file), and a link is looked
    at again after its target was read, still the same link or the bytes are not what the path
    holds. Either change: look again, SNAPSHOT_TRIES times at most, then refuse."""
    for _ in range(SNAPSHOT_TRIES):
        state = managed_state(src)
        if state is None:
            return None
        link = state[0]
        try:
            # One read gives the copy and its digest, so the digest is of what was copied.
            owner = []  # type: list
            data, mode = read_regular(src, follow=link is not None, owner=owner)
        except (OSError, Failed):
            if link_text(src) == link and os.path.lexists(src):
                raise  # still what it looked like: the reader's refusal stands
            continue  # replaced or removed meanwhile: look again
        if link is None or link_text(src) == link:
            break
    else:
        raise Failed("%s kept changing while it was snapshotted; run again" % shown(src))
    entry = {"sha256": hashlib.sha256(data).hexdigest(), "mode": mode}
    if link is None:
        entry["owner"] = list(owner[0])  # take_snapshot moves it to the snapshot's `owners`
        atomic_write(copy, data, 0o600)
    else:
        entry["symlink"] = link
    return entry


def write_meta(directory, meta):
    atomic_write(
        os.path.join(directory, "meta.json"),
        json.dumps(meta, indent=1, sort_keys=True).encode(),
        0o600,
    )


def snapshot_path(box, sid):
    """The directory of snapshot `sid`, only if it is one of this box's own snapshots: a plain
    id, a real directory (not a symlink) of this user, directly inside the snapshots dir."""
    check_snapshot_id("snapshot", sid)
    root = snapshots_dir(box, create=False)
    path = os.path.join(root or box.fleet, sid)
    try:
        if root is None:
            raise FileNotFoundError(path)
        st = os.lstat(path)
    except FileNotFoundError:
        raise Failed(
            "no snapshot %s on this box (`reconcile snapshots` lists them)" % sid
        ) from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise Failed("snapshot %s is not a directory of this user (a symlink?); refused" % sid)
    if os.path.realpath(path) != os.path.join(os.path.realpath(root), sid):
        raise Failed("snapshot %s lies outside the snapshots directory; refused" % sid)
    return path


def read_meta(box, sid):
    """The snapshot's meta.json; its status the one of a mark it holds (MARKED)."""
    directory = snapshot_path(box, sid)
    data, _ = read_regular(os.path.join(directory, "meta.json"), META_LIMIT)
    meta = json.loads(data.decode("utf-8"))
    if not isinstance(meta, dict):
        raise Failed("snapshot %s: meta.json is not a mapping" % sid)
    for status in MARKED:
        if meta.get("status") != status and has_mark(directory, status):
            more = {"undone_from": status_before(meta)} if status in UNDONE else {}
            meta = dict(meta, status=status, **more)
    return meta


# `<status>.mark`, an empty file in a snapshot: the run that ended with that status (a
# converge applied, a rollback that undid it) completed, and the status could not be written
# (a full disk: rewriting meta.json needs room, an empty file only an inode). Left `running`,
# the next converge refused the box as half converged once the disk had room again, and its
# remedy (a rollback) would undo a converge that was done, or had nothing left to undo. Every
# status written (set_status) drops them first: only the newest event can leave one, and only
# once it completed. In the order a run can leave them: a later one wins (read_meta).
MARKED = ("applied", "rolled-back")
ROLLED_BACK_MARK = "rolled-back.mark"  # mark_name("rolled-back"), for the tests


def mark_name(status):
    return status + ".mark"


def has_mark(directory, status):
    try:
        st = os.lstat(os.path.join(directory, mark_name(status)))
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()


def mark_status(box, sid, status):
    """`<status>.mark` made in snapshot `sid`, empty (no data block to find room for); False
    when even that cannot be done."""
    try:
        atomic_write(os.path.join(snapshot_path(box, sid), mark_name(status)), b"", 0o600)
    except (OSError, Failed):
        return False
    return True


def mark_applied(box, sid):
    return mark_status(box, sid, "applied")


def mark_rolled_back(box, sid):
    return mark_status(box, sid, "rolled-back")


def set_status(box, sid, status, **more):
    """Record what happened to a snapshot in its meta.json; when that cannot be read (damaged,
    replaced), in a status.json beside it, so `reconcile snapshots` still shows it.

    Every mark (MARKED) goes first: a status that then cannot be written leaves the one
    before (`running`: refused as interrupted, the safe side), never a mark over a later run's
    status (a rollback run again and killed would read as completed)."""
    directory = snapshot_path(box, sid)
    for marked in MARKED:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, mark_name(marked)))
    stamp = dict(more, status=status, updated_at=now_iso())
    try:
        meta = read_meta(box, sid)
    except (OSError, ValueError, Failed):
        atomic_write(
            os.path.join(directory, "status.json"),
            json.dumps(stamp, sort_keys=True).encode(),
            0o600,
        )
        return
    meta.update(stamp)
    write_meta(directory, meta)


def record_status(box, sid, status, **more):
    """set_status, when a status can be recorded at all (`sid` names a snapshot of ours)."""
    try:
        set_status(box, sid, status, **more)
        return True
    except (OSError, ValueError, Failed):
        return False


def record_final(box, sid, status, mark, remedy, **more):
    """record_status for the status a completed run ends with (applied, rolled-back): the work
    is done, so one that cannot be written is a warning, never a failure. `mark` (mark_applied,
    mark_rolled_back) then leaves its mark, read as that status; without even that, the next
    converge refuses the box as interrupted, and the note says what to run (`remedy`)."""
    if record_status(box, sid, status, **more):
        return
    if mark(box, sid):
        emit(
            "note",
            message="snapshot %s: could not record its status %s (a full disk?); marked it "
            "so (%s): the next converge goes on" % (sid, status, mark_name(status)),
        )
    else:
        emit(
            "note",
            message="snapshot %s: could not record its status %s: the next converge refuses "
            "the box as interrupted until it is; once the disk has room, %s"
            % (sid, status, remedy),
        )


def list_snapshots(box):
    """This box's snapshot ids, oldest first (snapshot_order)."""
    root = snapshots_dir(box, create=False)
    return snapshot_ids(root) if root else []


APPLIED = ("applied", "verified")  # a snapshot whose converge changed the box and stayed


def newest_applied(box, ids):
    """The newest of `ids` whose converge was applied (and perhaps verified): the snapshot
    that undoes the last real apply. None when there is none, or none can be read."""
    for sid in reversed(ids):
        try:
            if read_meta(box, sid).get("status") in APPLIED:
                return sid
        except (OSError, ValueError, Failed):
            continue
    return None


def prune(box, keep, protect=()):
    """All but the newest `keep` snapshots removed, never one of `protect` (the snapshot of
    this run, the one holding a copy this run's restore list names), nor the newest applied
    one (newest_applied: failed, rolled-back retries must not push out the only snapshot that
    undoes the last real apply), nor one that a kept snapshot's rollback needs (chain_needs).

    A snapshot goes whole, with the files a rollback to it moved into its `removed/`
    (remove_created: what a converge wrote, proved by digest; edited_since: the copy of an edit
    the rollback restored over), kept for the operator to look at, and no rollback reads them
    (a rollback reads its own snapshot's copies and the later snapshots' records only). Kept
    for ever they piled up, `.env` copies with secrets among them; they go with their
    snapshot, said in a note."""
    root = snapshots_dir(box)
    ids = list_snapshots(box)
    old = ids[:-keep] if keep > 0 else []
    applied = newest_applied(box, ids)
    kept = [s for s in ids if s not in old or s in protect or s == applied]
    for sid in old:
        if sid in protect:
            continue
        if sid == applied:
            emit(
                "note",
                message="snapshot %s not pruned: it is the newest applied one (a rollback to "
                "it undoes the last converge that stayed)" % sid,
            )
            continue
        needed = chain_needs(box, sid, kept)
        if needed:
            emit("note", message="snapshot %s not pruned: %s" % (sid, needed))
            kept.append(sid)
            continue
        path = os.path.join(root, sid)
        removed = removed_copies(path)
        shutil.rmtree(path, ignore_errors=True)
        if removed:
            emit(
                "note",
                message="pruned snapshot %s with the files a rollback had removed to its %s/ "
                "(%s)" % (sid, REMOVED_DIR, ", ".join(removed)),
            )
    for name in os.listdir(root):
        if name.startswith(".") and name.endswith(".partial"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)  # a killed snapshot


UNDONE = ("rolled-back",)  # a snapshot whose converge's changes a rollback took back
ROLLING_BACK = "rolling-back"  # a rollback to the snapshot began and has not ended (yet)
ROLLBACK_FAILED = "rollback-failed"  # a rollback to the snapshot stopped on a failure


def chain_needs(box, sid, kept):
    """Why a rollback to a kept snapshot older than `sid` needs `sid`'s record, or "": a
    rollback undoes every later converge by their records (snapshot_chain: what each wrote,
    made, stopped), so the record of a converge that was not undone (killed, its rollback
    failed, or applied since that older snapshot) must stay as long as that snapshot does.
    Without it the rollback would keep that converge's files and containers as an operator's.
    One that cannot be read gives the chain nothing (snapshot_chain leaves it out): pruned."""
    older = [k for k in kept if snapshot_order(k) < snapshot_order(sid)]
    if not older:
        return ""
    try:
        meta = read_meta(box, sid)
    except (OSError, ValueError, Failed):
        return ""
    status = meta.get("status")
    if status in UNDONE:
        # Undone, but a rollback to a kept snapshot taken before it was undone puts it back
        # (redo_by_rollback), and a rollback to the older one must then undo it again.
        at = meta.get("undone_at")
        if not isinstance(at, str) or not SNAPSHOT_ID.match(at):
            return ""
        order = snapshot_order(sid)
        redoers = [k for k in kept if order < snapshot_order(k) <= snapshot_order(at)]
        if not redoers:
            return ""
        return (
            "its converge was undone, but a rollback to %s, which is kept, puts it back, and a "
            "rollback to %s must then know what it changed" % (redoers[0], older[0])
        )
    return (
        "its converge was not undone (%s) and a rollback to %s, which is kept, must know what "
        "it changed" % (status if isinstance(status, str) else "no status", older[0])
    )


def removed_copies(path):
    """The names in snapshot directory `path`'s `removed/` (what rollbacks to it removed)."""
    try:
        return sorted(os.listdir(os.path.join(path, REMOVED_DIR)))
    except OSError:
        return []


def snapshot_files(meta, sid):
    """The snapshot's {name: {sha256, mode} | None}, every name checked before any is used:
    a plain name of a managed file (no `/`, no `..`), a sha256, a mode (permission bits, and
    setuid, setgid or sticky as the file had them: put back as they were, as read_regular
    reads them, never refused at rollback time, which would leave the new files in place).

    A snapshot taken before managed_files() kept to plain names may list a stray compose file
    of the listing (`docker-compose copy.yml`): no converge ever wrote it, so there is nothing
    to put back; it is left as it is, not a reason to refuse the whole rollback."""
    files = meta.get("files")
    if not isinstance(files, dict):
        raise Failed("snapshot %s: its metadata lists no files" % sid)
    strays = [
        n
        for n in files
        if isinstance(n, str) and LISTED_COMPOSE.match(n) and not SNAPSHOT_FILE.match(n)
    ]
    for name in strays:
        emit("note", message="%s: never written by a converge, left as it is" % name)
    files = {n: info for n, info in files.items() if n not in strays}
    for name, info in files.items():
        if not isinstance(name, str) or not SNAPSHOT_FILE.match(name):
            shown = repr(name)[:80] if isinstance(name, str) and not _CONTROL.search(name) else ""
            raise Failed(
                "snapshot %s: file name %s in its metadata is not a plain name inside the "
                "deployment directory; nothing was restored" % (sid, shown or "(unprintable)")
            )
        if info is None:
            continue
        if (
            not isinstance(info, dict)
            or not (isinstance(info.get("sha256"), str) and SHA256.match(info["sha256"]))
            or not (_is_int(info.get("mode")) and 0 <= info["mode"] <= 0o7777)
            or not _link_text(info.get("symlink", ""))
        ):
            raise Failed(
                "snapshot %s: the metadata of %s is damaged; nothing was restored" % (sid, name)
            )
    return files


def _is_id(value):
    return _is_int(value) and 0 <= value < 0xFFFFFFFF


def owners_of(meta):
    """{name: (uid, gid)} a snapshot recorded for its regular files (take_snapshot); an entry
    that is not two ids, or a snapshot that recorded none (an older converge's), gives none:
    that file comes back as this user's, as every rollback made it before."""
    owners = meta.get("owners")
    return {
        name: (pair[0], pair[1])
        for name, pair in (owners.items() if isinstance(owners, dict) else ())
        if isinstance(pair, list) and len(pair) == 2 and all(_is_id(n) for n in pair)
    }


def _link_text(link):
    """A symlink's text as a snapshot records it ("" when the file was no symlink)."""
    return isinstance(link, str) and len(link) <= 4096 and "\0" not in link


# -- files ---------------------------------------------------------------------------------------
def known_good_dir(box):
    return os.path.join(box.fleet, "known-good")


def verified_copy(path, sha, dir_fd=None):
    """The bytes of a stored copy if they are the ones recorded (sha256), else None."""
    try:
        data, _ = read_regular(path, dir_fd=dir_fd)
    except (OSError, Failed):
        return None
    return data if hashlib.sha256(data).hexdigest() == sha else None


def find_copy(box, name, sha):
    """The bytes of a stored copy of compose file `name`: by its pinned digest (known-good, any
    snapshot), or the known-good copy when the desired state pins none; always the bytes whose
    sha256 was checked, never a file read a second time.

    Unpinned, known-good's own meta.json vouches for the copy: `.fleet` and `known-good` are
    opened once without following (a symlinked one would vouch for bytes from elsewhere) and
    both files read relative to that fd, never by a path resolved again after the check. A
    pinned copy is read by its path, wherever it is: its sha256 is the desired state's own."""
    good = known_good_dir(box)
    if sha is None:
        dfd = open_known_good(box)
        if dfd is None:
            return None
        try:
            data, _ = read_regular("meta.json", META_LIMIT, dir_fd=dfd)
            sha = (json.loads(data.decode("utf-8")).get("files") or {}).get(name)
            if not (isinstance(sha, str) and SHA256.match(sha)):
                return None
            return verified_copy(name, sha, dir_fd=dfd)
        except (OSError, ValueError, AttributeError, Failed):
            return None
        finally:
            os.close(dfd)
    candidates = [os.path.join(good, name)]
    root = snapshots_dir(box)
    candidates += [os.path.join(root, s, name) for s in reversed(list_snapshots(box))]
    for path in candidates:
        data = verified_copy(path, sha)
        if data is not None:
            return data
    return None


def restore_files(box, files):
    copies = {}
    for item in files:  # every copy found and verified before the first file changes
        name, sha = item["name"], item.get("sha256")
        data = find_copy(box, name, sha)
        if data is None:
            want = "sha256 %s" % sha[:12] if sha else "a known-good copy"
            raise Failed(
                "cannot restore %s: no stored copy with %s (a verified converge "
                "keeps one)" % (name, want)
            )
        copies[name] = data
    restored = []
    for name, data in copies.items():
        target = box.path(name)
        try:
            current, mode = read_regular(target, follow=True)
        except FileNotFoundError:
            current, mode = None, 0o644
        if current == data:
            continue
        write_managed(box, name, data, mode)
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


# How a rollback brings a service back (restore_mode): booted and waited for healthy, booted
# and not waited for, or created and not started.
WAIT, START, CREATE = "wait", "start", "create"


def recreate(box, service, lane, announced=False, restore=None):
    """One service: stop it (its memory comes back first), gate, recreate scrubbed, wait.
    `announced`: its start event was emitted already (recreate_recorded). `restore`: a
    rollback's (restore_mode), None for a converge's.

    A rollback's memory gate never refuses: the payload's util is the desired state's (the
    failed converge's new one, the controller's now), not the one of the files the rollback
    restored, which the lane ran with at the snapshot. Refused on it, a converge that failed
    the gate for a larger util failed its rollback the same way, left the lane stopped, and
    every rollback after it too. The page cache is still dropped when short (memory_gate)."""
    if not announced:
        emit("step", step="recreate", subject=service, status="start")
    start = restore != CREATE
    if lane is not None:
        # `docker stop` of this one container, not `compose stop`, which would also stop the
        # services that depend on it (the gateway, the worker) and leave them down.
        running = containers(box).get(service)
        if running is not None and (running.get("State") or {}).get("Running"):
            box.run(["docker", "stop", running["Id"]], timeout=300)
        if start:
            try:
                memory_gate(box, service, float(lane["util"]))  # drops the cache when short
            except Failed as exc:
                if restore is None:
                    raise
                emit(
                    "note",
                    message="%s; the rollback boots it all the same: that util is the "
                    "desired state's, not the one of the files it restored, which the lane ran "
                    "with at the snapshot" % reason_of(exc, box.secrets),
                )
    # Not running at the snapshot: created from the restored files, not started (compose's
    # `up --no-start` recreates a running container and leaves the new one created).
    how = ["-d"] if start else ["--no-start"]
    box.must(
        ["docker", "compose", "up"] + how + ["--no-deps", "--force-recreate", service],
        "docker compose up %s" % service,
        timeout=600,
    )
    if restore in (None, WAIT):
        wait_healthy(box, service, int((lane or box.p["gateway"])["timeout_s"]))
    emit("step", step="recreate", subject=service, status="done")


def container_record(inspect):
    """What a snapshot keeps of a service's container: its id and config hash (a rollback
    proves it restored the config), and its state (restore_mode)."""
    state = inspect.get("State") or {}
    return {
        "id": str(inspect.get("Id", ""))[:12],
        "config_hash": label_hash(inspect),
        "running": runs(inspect),
        "status": state.get("Status"),
        "health": (state.get("Health") or {}).get("Status"),
        "restarts": inspect.get("RestartCount", 0),
    }


def restore_mode(record):
    """How a rollback brings back a service as the snapshot had it, by its container's state
    then: WAIT (up and healthy, or booting: booted and waited for healthy, as a converge
    does); START (running but unhealthy, or crash-looping: restarting, or more than 2
    restarts and not healthy; paused: booted, not waited for, as it was); CREATE (not
    running: exited, created, dead: created from the restored files, not started). A
    snapshot that recorded no state (an older converge's): WAIT, as every rollback did.

    Why: a lane the operator had stopped was left running by the rollback, and one that was
    crashing failed the rollback (the box then refused every converge as half restored)."""
    if not isinstance(record, dict) or "status" not in record:
        return WAIT
    if not was_running(record):
        return CREATE
    health = record.get("health")
    crashing = _is_int(record.get("restarts")) and record["restarts"] > 2 and health != "healthy"
    if record.get("status") != "running" or health == "unhealthy" or crashing:
        return START  # restarting (a crash loop seen between two runs), paused, unhealthy
    return WAIT


# Docker's own `State.Running` is true while a container restarts or is paused: a lane in a
# crash loop (`restart: unless-stopped`) is `restarting` most of the time, `running` between.
_RUNNING_STATES = ("running", "restarting", "paused")


def runs(inspect):
    """Whether a container runs as Docker says it (State.Running: restarting and paused too)."""
    state = inspect.get("State") or {}
    running = state.get("Running")
    return running if isinstance(running, bool) else state.get("Status") in _RUNNING_STATES


def was_running(record):
    """Whether the snapshot's container ran (`running`; a record without it, by its status)."""
    running = record.get("running")
    return running if isinstance(running, bool) else record.get("status") in _RUNNING_STATES


REQUEST_S = 3.0  # one gateway request, start to end
BODY_LIMIT = 262144


class DeadlineSocket:
    """A connected socket whose every send and receive gets only what is left of ONE deadline.
    A socket timeout bounds each receive, never the request: a gateway that drips a byte a
    second would keep a request alive for as long as it liked."""

    def __init__(self, sock, deadline):
        self.sock, self.deadline = sock, deadline

    def arm(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no whole answer before the deadline")
        self.sock.settimeout(left)

    def sendall(self, data):
        self.arm()
        self.sock.sendall(data)

    def recv_into(self, buffer):
        self.arm()
        return self.sock.recv_into(buffer)

    def makefile(self, mode="rb"):
        # What http.client.HTTPResponse reads the status line, the headers and the body from.
        return io.BufferedReader(DeadlineReader(self))


class DeadlineReader(io.RawIOBase):
    """The raw stream under the buffered reader: each read is one receive under the deadline."""

    def __init__(self, conn):
        super().__init__()
        self.conn = conn

    def readable(self):
        return True

    def readinto(self, buffer):
        return self.conn.recv_into(buffer)


REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5


def http_get(url, deadline):
    """(status, at most BODY_LIMIT bytes of the body) of `GET url`, all of it by `deadline`
    (connect, request, status line, headers, body; every redirect followed too), or
    TimeoutError. Plain HTTP to the loopback, no proxy; http.client reads the answer
    (Content-Length, chunked, or to close).

    A redirect is followed, as urllib did and the collector does (a `/health` answering 307
    to `/health/`), MAX_REDIRECTS times at most, and only to the same host and port: one
    elsewhere (or one too many) is the answer, its status."""
    for _ in range(MAX_REDIRECTS + 1):
        status, body, location = http_get_once(url, deadline)
        after = same_origin(url, location) if status in REDIRECTS and location else None
        if after is None:
            return status, body
        url = after
    return status, body


def same_origin(url, location):
    """Where the redirect `location` leads from `url` when that is the same host and port over
    plain HTTP (a relative Location, or the same http://host:port), as `url`'s own scheme and
    host:port with the new path and query; else None (a path that is no plain ASCII too)."""
    try:
        here = urllib.parse.urlsplit(url)
        there = urllib.parse.urlsplit(urllib.parse.urljoin(url, location))
        same = (there.scheme, there.hostname, there.port or 80) == (
            "http",
            here.hostname,
            here.port or 80,
        )
    except ValueError:  # a port that is not one
        return None
    if not same or re.search(r"[^\x21-\x7e]", there.path + there.query):
        return None
    return urllib.parse.urlunsplit(("http", here.netloc, there.path, there.query, ""))


def http_get_once(url, deadline):
    """(status, body, Location) of one `GET url` by `deadline`: see http_get."""
    parts = urllib.parse.urlsplit(url)
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("no time left for the request")
    with socket.create_connection((parts.hostname, parts.port or 80), timeout=left) as raw:
        conn = DeadlineSocket(raw, deadline)
        target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
        request = (
            "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: application/json\r\n"
            "Accept-Encoding: identity\r\nConnection: close\r\n\r\n" % (target, parts.netloc)
        )
        conn.sendall(request.encode("ascii"))
        resp = http.client.HTTPResponse(conn, method="GET")  # type: ignore[arg-type]
        try:
            resp.begin()
            if not 200 <= resp.status < 300:
                # The status is the answer (401: keyed), or where a redirect leads; no body read.
                return resp.status, b"", resp.getheader("Location")
            return resp.status, resp.read(BODY_LIMIT), None
        finally:
            resp.close()


def http_status(url, timeout=REQUEST_S):
    """(status, JSON body) of a GET on the gateway; (None, None) when it gave no whole answer
    within `timeout` seconds in all, and for an error status (status, None)."""
    try:
        status, body = http_get(url, time.monotonic() + timeout)
    except Stopped:
        # A SIGTERM/SIGINT while the request waited (on_stop): the converge's stop, never "no
        # answer yet". Swallowed, it was lost for good (on_stop disarms itself before raising)
        # and the converge went on to end applied.
        raise
    except Exception:  # a gateway still booting, or too slow: not an answer yet
        return None, None
    if not 200 <= status < 300:
        return status, None
    try:
        return status, json.loads(body.decode() or "null")
    except ValueError:
        return None, None


def gateway_host(bind):
    """(host, None) where the box asks its own gateway, or (None, why) when it must not ask.
    At the desired `gateway.bind` (verify.bind): Docker publishes the port on that address
    only, so a gateway published on 10.77.0.12 or 127.0.0.2 answers nothing on 127.0.0.1;
    127.0.0.1 for every interface (0.0.0.0) and for an older payload that sends none. Never an
    address that is not this box's own.
    The twin of collector.py `_gateway_host` (this program cannot import it: one file, run
    alone), so a drift and a converge ask the same gateway; test_lobes_review8.py keeps the two
    in step."""
    if bind is None or bind == "0.0.0.0":
        return "127.0.0.1", None
    try:
        socket.inet_pton(socket.AF_INET, bind)  # one dotted IPv4 address, nothing else
    except (OSError, TypeError, ValueError):
        return None, "gateway.bind is not an IPv4 address: not asked"
    if bind.split(".", 1)[0] == "127":
        return bind, None  # the whole 127.0.0.0/8 is the box's own loopback
    probe = None
    try:
        # Binding succeeds only to an address of one of the box's own interfaces.
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.bind((bind, 0))
    except OSError as exc:
        return None, "gateway.bind %s is not an address of this box (%s): not asked" % (
            bind,
            exc.strerror or "error",
        )
    finally:
        if probe is not None:
            probe.close()
    return bind, None


def gateway_problems(box, deadline=None):
    """/health version, /capabilities against the lanes, auth posture: what is still wrong.
    Each request gets REQUEST_S, and never more than is left until `deadline`. Asked at the
    desired bind (gateway_host)."""
    v = box.p["verify"]
    host, why = gateway_host(v.get("bind"))
    if host is None:
        return [why]
    base = "http://%s:%d" % (host, v["port"])

    def ask(path):
        left = REQUEST_S if deadline is None else min(REQUEST_S, deadline - time.monotonic())
        return http_status(base + path, left)

    problems = []
    status, health = ask("/health")
    if status != 200 or not isinstance(health, dict) or health.get("version") != v["version"]:
        problems.append(
            "/health version %r, want %s"
            % ((health or {}).get("version") if isinstance(health, dict) else status, v["version"])
        )
    status, caps = ask("/capabilities")
    caps = caps if isinstance(caps, dict) else {}
    for role, window in sorted(v["windows"].items()):
        got = (caps.get(role) or {}).get("context")
        if got != window:
            problems.append("/capabilities %s.context %s, want %s" % (role, got, window))
    for role in v.get("infeasible", []):
        if (caps.get(role) or {}).get("feasible"):
            problems.append("/capabilities %s is feasible, want infeasible" % role)
    want = 401 if v["auth"] == "keyed" else 200
    status, _ = ask("/v1/models")
    if status != want:
        problems.append("GET /v1/models without a key gave %s, want %s" % (status, want))
    return problems


def verify_gateway(box, timeout):
    """The gateway's answers as the desired state says, within `timeout` seconds in all: every
    request gets only what is left of it, so a gateway that drips its answers cannot keep a
    converge (and its lock) past it."""
    deadline = time.monotonic() + timeout
    _, why = gateway_host(box.p["verify"].get("bind"))
    if why is not None:
        # An address the box does not have: no wait makes it one (Docker could not publish
        # the port there either), so said now, not after the whole health timeout.
        raise Failed("gateway verification failed: " + why)
    while True:
        problems = gateway_problems(box, deadline)
        if not problems:
            emit("step", step="verify-gateway", subject=GATEWAY, status="done")
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise Failed("gateway verification failed: " + "; ".join(problems))
        time.sleep(min(1.0, left))


# -- converge ------------------------------------------------------------------------------------
def check_fingerprint(box):
    """The plan was made from an observation; refuse if the box changed since then."""
    fp = box.p.get("fingerprint") or {}
    moved = [
        n for n, sha in sorted((fp.get("files") or {}).items()) if sha256_file(box.path(n)) != sha
    ]
    if fp.get("containers") is not None:
        # Every container of each service, one-offs and replicas too, as a set: the
        # observation lists them all (keyed as the collector's Container.key: the service,
        # else the container's name), and one picked per service on each side was another
        # container whenever a `docker compose run` copy sorted after the lane there.
        now = {}  # type: dict
        for c in project_containers(box):
            key = labels_of(c).get(SERVICE_LABEL) or name_of(c)
            now.setdefault(key, set()).add(str(c.get("Id", ""))[:12])
        seen = {s: set(ids) for s, ids in fp["containers"].items()}
        moved += [
            "container " + s
            for s in sorted(set(now) | set(seen))
            if now.get(s, set()) != seen.get(s, set())
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
    # Every value resolved and checked before the lock: a missing secret, or one .env cannot
    # hold, stops here with nothing touched.
    desired = desired_values(box)
    stale = lock.acquire(p["holder"])
    announce_start("converge")  # the controller's proof that we run; gone: nothing is done
    # Under the lock, before the sweep, the snapshot or any write: a managed file that is not
    # a regular file within READ_LIMIT is this box's named refusal, with nothing changed.
    check_managed_files(box)
    # Under the lock, a snapshot still `running` is a converge that was killed (SIGKILL, a
    # power cut: its flock went with it) after its first change: the box may be half
    # converged. Said before anything changes; gone on from only when the operator says so.
    left = interrupted_converges(box)
    if left and not p.get("accept_interrupted"):
        return refuse_interrupted(left[-1])
    sweep_temp_files(box)
    if stale.get("pid"):
        emit(
            "note",
            message="took over the lock left by %s (pid %s, since %s)"
            % (stale.get("holder"), stale.get("pid"), stale.get("since")),
        )
    # The fingerprint and the snapshot before the --accept-interrupted is recorded: a converge
    # refused here (a stale plan) or that cannot take its snapshot changed nothing, and the
    # next one must still refuse the interrupted snapshot, not find it accepted.
    check_fingerprint(box)
    # `wrote`: what this converge writes, by digest (record_write). Present, even empty, in
    # the snapshot of every converge that keeps the record; a snapshot without it was taken by
    # one that did not (an older converge), and a rollback to it removes what it recorded
    # absent whatever that holds, as it always did.
    sid, _ = take_snapshot(
        box,
        {
            "holder": p["holder"],
            "plan": p.get("titles", []),
            "services": p["services"],
            "wrote": {},
        },
    )
    box.snapshot = sid  # from here every managed write is recorded in it first (write_managed)
    emit("snapshot", id=sid)
    touched = []  # type: list # services recreated, in order: what a rollback must put back
    created = []  # type: list # services that had no container before
    strays = {}  # type: dict # {service: id} of `removes`: stopped, removed at mark-good
    hashes = None  # the render before any change: what this converge's rollback compares with
    try:
        # In the try: a status that cannot be written is rolled back as any failure (nothing
        # was changed yet), never a `running` snapshot left behind for the next converge.
        accept_interrupted(box, left)
        hashes = hashes_or_empty(box)
        if p.get("env_keys"):
            emit("step", step="write-env", subject=".env", status="start")
            go_on("writing .env")
            changed = write_env(box, p["env_keys"], desired)
            emit("step", step="write-env", subject=".env", status="done", keys=changed)
        if p.get("restore"):
            emit("step", step="restore-files", subject="files", status="start")
            go_on("restoring files")
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
            recreate_recorded(box, sid, service, lanes.get(service), before, touched, created)
        found = containers(box)
        for service in p.get("removes", []):
            # By container: a stray is often a service no active profile renders any more.
            if service in found:
                strays[service] = stop_stray(box, sid, service, found[service])
        if GATEWAY in todo:
            recreate_recorded(box, sid, GATEWAY, None, before, touched, created)
            verify_gateway(box, int(p["gateway"]["timeout_s"]))
        # The strays stay, stopped, until the controller verified this converge and marks it
        # good (remove_strays): a rollback before that, this converge's own or the
        # controller's after a failed verification, starts them again (start_stopped).
        if strays:
            emit(
                "note",
                message="kept the stopped containers of %s until the converge is marked good "
                "(a rollback starts them again)" % ", ".join(sorted(strays)),
            )
    except Exception as exc:  # anything after the snapshot is rolled back, not left half done
        message = reason_of(exc, box.secrets)
        emit("failed", message=message)
        rolled = rollback(box, sid, touched, created, reason=message, original=hashes)
        prune_after(box, sid)
        return {"ok": False, "snapshot": sid, "failed": message, "rollback": rolled}
    disarm_stop()  # applied: a stop now would roll back nothing (see on_stop)
    # The work is done: a status that cannot be written (a full disk) is a warning, never a
    # failure that would lose the snapshot id the controller needs. A rollback would undo
    # what completed: the remedy is to go on from it.
    record_final(
        box, sid, "applied", mark_applied,
        "converge with --accept-interrupted (this converge completed)", touched=touched,
    )  # fmt: skip
    prune_after(box, sid)
    return {"ok": True, "snapshot": sid, "touched": touched, "strays": sorted(strays)}


def accept_interrupted(box, left):
    """The snapshots `left` (interrupted_converges) accepted by --accept-interrupted: converged
    over. Each stays (a rollback to it undoes both), its status `interrupted`."""
    for old, meta in left:
        what = "rollback to it" if half_restored(meta) else "converge"
        set_status(box, old, "interrupted", reason="converged over (--accept-interrupted)")
        emit(
            "note",
            message="snapshot %s: its %s did not finish; converging from the state it "
            "left (--accept-interrupted), a rollback to it undoes both" % (old, what),
        )


def interrupted_converges(box):
    """[(id, meta)] of the snapshots whose converge or rollback never finished, oldest first:
    status `running` or ROLLING_BACK seen under the lock, where no other converge can run and
    this one has taken no snapshot yet. take_snapshot writes `running`, a rollback ROLLING_BACK;
    every end of either (applied, rolled back, failed) replaces it; only a kill leaves it (or a
    converge or rollback that completed on a full disk, which marks it instead: read_meta reads
    it applied or rolled back). A `running` one only after the newest applied one: a converge
    applied since (an older program went on over a killed one) left the box in a state it
    verified. A rollback wherever it is: one to an older snapshot had begun undoing the applied
    ones after it, and marks them only once it is done. So is a rollback that failed after its
    first change (`half_restored`): the box is as half restored as after a kill. One that
    failed before it changed anything (a damaged copy, a crafted name) left the box as it was:
    nothing to refuse for. One that cannot be read is left to the listing."""
    out = []  # type: list
    past_applied = False
    for sid in reversed(list_snapshots(box)):
        try:
            meta = read_meta(box, sid)
        except (OSError, ValueError, Failed):
            continue
        status = meta.get("status")
        if status in APPLIED:
            past_applied = True
        elif half_restored(meta) or (status_before(meta) == "running" and not past_applied):
            # `status_before`: a killed converge whose rollback then failed before its first
            # change (a damaged copy) is still a half converged box.
            out.insert(0, (sid, meta))
    return out


def half_restored(meta):
    """True when a rollback to this snapshot began changing the box and did not complete:
    killed (ROLLING_BACK) or failed after its first change."""
    status = meta.get("status")
    return status == ROLLING_BACK or (
        status == ROLLBACK_FAILED and meta.get("half_restored") is True
    )


def refuse_interrupted(found):
    """The result of a converge refused because the previous one did not finish (dpkg's "was
    interrupted"), with nothing changed. Refused rather than rolled back by itself: the box
    may have been repaired by hand since, and a rollback the operator did not ask for would
    undo that; the operator chooses (reconcile rollback --to it, or --accept-interrupted)."""
    sid, meta = found

    def text(key):
        return meta.get(key) if isinstance(meta.get(key), str) else "?"

    if half_restored(meta):
        taken, who = text("rollback_started_at"), text("rollback_holder")
        what, left, remedy = "rollback (to snapshot", "restored", "Run that rollback again"
        kind, ended = "rollback", "did not finish"
        if meta.get("status") == ROLLBACK_FAILED:
            kind, ended = "failed-rollback", "failed"
    else:
        taken, who = text("taken_at"), text("holder")
        what, left, remedy = "converge (snapshot", "converged", "Roll it back to that snapshot"
        kind, ended = "converge", "did not finish"
    message = (
        "the previous %s %s, started at %s by %s) %s: the box may be half %s; nothing was "
        "changed. %s, or converge from the state it left with --accept-interrupted"
        % (what, sid, scrub(taken), scrub(who), ended, left, remedy)
    )
    # `kind`: which run it was, for the controller's own words (an older program sends none).
    found = {"snapshot": sid, "taken_at": scrub(taken), "holder": scrub(who), "kind": kind}
    return {"ok": False, "failed": message, "interrupted": found}


def recreate_recorded(box, sid, service, lane, before, touched, created):
    """recreate(), with the container it made recorded in the snapshot (record_made) as soon as
    it exists, healthy or not: every rollback of the snapshot, this converge's own or a later
    one (the controller's after a failed verification runs in another process), then knows it
    a converge's. `touched`: the services recreated, this one added once it is announced and
    the controller still reads us (go_on): a converge stopped before it leaves it running and
    its rollback does not recreate it. `created`: those that had no container `before`."""
    emit("step", step="recreate", subject=service, status="start")
    go_on("recreating " + service)
    touched.append(service)
    if service not in before and service not in created:
        created.append(service)
    try:
        recreate(box, service, lane, True)  # announced above
    except Exception:
        # The step's own failure is the one reported. A record that cannot be made now leaves
        # the container to this converge's rollback, which knows it from `created`/`touched`.
        with contextlib.suppress(Exception):
            record_made(box, sid, service, before, created)
        raise
    record_made(box, sid, service, before, created)


def stop_stray(box, sid, service, found):
    """A stray container of the plan's `removes`, stopped and kept: its memory and ports come
    back before the gateway is recreated, but a converge that fails later (or that the
    controller rolls back) has not lost it. Recorded in the snapshot's `stopped` before the
    stop (as record_write: a killed converge's rollback may start a container that was never
    stopped, which changes nothing); one that was not running is neither stopped nor recorded,
    so no rollback ever starts it. Every stray, running or not, is recorded in the snapshot's
    `strays`: removed by mark-good (remove_strays), once the controller verified the converge,
    never before, so the controller's rollback after a failed verification still finds it."""
    cid = found["Id"]
    emit("step", step="remove", subject=service, status="start")
    go_on("stopping " + service)
    running = (found.get("State") or {}).get("Running")
    meta = read_meta(box, sid)
    for record in ("strays", "stopped") if running else ("strays",):
        entries = meta.get(record)
        entries = dict(entries) if isinstance(entries, dict) else {}
        entries[service] = cid
        meta[record] = entries
    write_meta(snapshot_path(box, sid), meta)
    if running:
        box.must(["docker", "stop", cid], "stop " + service)
    emit("step", step="remove", subject=service, status="stopped")
    return cid


def prune_after(box, sid):
    """Old snapshots pruned once this run's work (or its rollback) is over, never before: not
    this run's snapshot, nor the newest holding a copy the restore list names (the only stored
    copy a later restore of the same pin can find). Best effort: a warning, never a failure."""
    try:
        protect = {sid}
        root = snapshots_dir(box)
        ids = list_snapshots(box)
        for item in box.p.get("restore") or []:
            sha = item.get("sha256")
            for other in reversed(ids) if sha else []:
                if verified_copy(os.path.join(root, other, item["name"]), sha) is not None:
                    protect.add(other)
                    break
        prune(box, int(box.p.get("keep", 10)), protect)
    except (OSError, ValueError, Failed) as exc:
        emit("note", message="old snapshots not pruned: %s" % reason_of(exc, box.secrets))


# -- rollback ------------------------------------------------------------------------------------
def restore_snapshot_files(box, sid, chain=None, first_change=None):
    """The snapshot's files back as they were, all or nothing: every name and every copy is
    checked (plain name, regular file, recorded sha256) before the first file is replaced. A
    path that was a symlink comes back as that symlink (apply replaced it, see write_managed).

    A path the snapshot recorded absent, and one that a later converge created, is removed only
    as created_since() decides, also before the first change. Returns (meta, the names changed,
    the names removed, [{name, why}] of the files kept). `first_change`: called once every
    check passed, just before the first file is replaced or removed."""
    chain = chain if chain is not None else snapshot_chain(box, sid)
    meta = chain[0][1]
    src = snapshot_path(box, sid)
    files = snapshot_files(meta, sid)
    owners = owners_of(meta)
    copies = {}
    for name, info in sorted(files.items()):
        target = box.path(name)
        if os.path.isdir(target) and not os.path.islink(target):
            raise Failed("cannot restore %s: it is a directory now; nothing was restored" % name)
        if info is None or info.get("symlink"):
            continue  # removed, or a link put back: no copy to check
        try:
            data, _ = read_regular(os.path.join(src, name))
        except (OSError, Failed):
            data = None
        if data is None or hashlib.sha256(data).hexdigest() != info["sha256"]:
            raise Failed(
                "snapshot %s: its copy of %s is missing or does not match its recorded sha256 "
                "(truncated or altered); nothing was restored" % (sid, name)
            )
        mode = 0o600 if name == ".env" else info["mode"]  # a rollback never widens .env
        copies[name] = (data, mode, owners.get(name))
    created = created_since(files, chain)
    for name in created:
        target = box.path(name)
        if os.path.isdir(target) and not os.path.islink(target):
            raise Failed("cannot remove %s: it is a directory now; nothing was restored" % name)
    edited = edited_since(box, files, created, chain)
    # Where each file this rollback may remove goes, prepared and checked here, before the first
    # change: a `removed` that is no directory of ours (damaged, a symlink) fails the rollback
    # with nothing restored, never half way, after files were already put back.
    keep = ""
    dest = {}  # type: dict
    present = [n for n in sorted(created) if os.path.lexists(box.path(n))]
    if present or edited:
        keep = os.path.join(src, REMOVED_DIR)
        try:
            private_dir(keep)
        except (OSError, Failed) as exc:
            raise Failed(
                "snapshot %s: its %s/ cannot hold the files a rollback removes (%s); nothing "
                "was restored" % (sid, REMOVED_DIR, reason_of(exc, box.secrets))
            ) from None
        for name in present:
            dest[name] = fresh_name(keep, name, set(dest.values()))
    # An edit since (bytes neither the snapshot's nor any a converge since wrote: a key rotated
    # by hand) is copied aside before the snapshot's copy replaces it, as a removal is: the
    # rollback restores, and the edit can be taken back by hand. Copied here, before the first
    # change: a copy that cannot be made fails the rollback with nothing restored.
    set_aside = []  # type: list
    for name, data in edited:
        aside = os.path.join(keep, fresh_name(keep, name, set(dest.values())))
        try:
            atomic_write(aside, data, 0o600, owner=None)
        except OSError as exc:
            raise Failed(
                "cannot keep a copy of %s, edited since snapshot %s, before restoring it (%s); "
                "nothing was restored" % (name, sid, reason_of(exc, box.secrets))
            ) from None
        why = (
            "edited since snapshot %s (not what it held, nor what a converge since wrote): "
            "restored, the edited file kept as %s" % (sid, shown(aside))
        )
        emit("note", message="%s %s" % (name, why))
        set_aside.append({"name": name, "why": why})
    if first_change is not None:
        first_change()
    changed = [
        name
        for name, info in sorted(files.items())
        if name not in created and restore_file(box.path(name), info, copies.get(name))
    ]
    removed, kept = [], []
    for name in sorted(created):
        if name not in dest:
            continue  # nothing there: as the snapshot recorded it
        why = remove_created(box, sid, name, created[name], os.path.join(keep, dest[name]))
        if why is None:
            continue  # nothing there: as the snapshot recorded it
        if why:
            kept.append({"name": name, "why": why})
            emit("note", message="kept %s: %s" % (name, why))
        else:
            removed.append(name)
    return meta, sorted(changed + removed), removed, kept, set_aside


def edited_since(box, files, created, chain):
    """[(name, bytes)] of the files a rollback to chain[0] replaces (there at the snapshot, not
    `created`) that are regular files now holding bytes no one can get back once replaced:
    neither the snapshot's copy (its sha256) nor any a converge of the chain recorded writing
    (`wrote`). An operator's edit since: restore_snapshot_files keeps a copy. A symlink is
    replaced, its target never touched: nothing is lost. A regular file that cannot be read to
    compare (over READ_LIMIT, unreadable) fails the rollback here, before any change: replaced,
    it might be an operator's only copy."""
    wrote = {}  # type: dict
    for _, later in chain:
        for name, digests in (wrote_record(later) or {}).items():
            wrote.setdefault(name, set()).update(digests)
    out = []
    for name, info in sorted(files.items()):
        if info is None or name in created:
            continue
        target = box.path(name)
        try:
            if not stat.S_ISREG(os.lstat(target).st_mode):
                continue
            data, _ = read_regular(target)
        except FileNotFoundError:
            continue
        except (OSError, Failed) as exc:
            raise Failed(
                "cannot restore %s: it cannot be read to tell whether it holds edits since "
                "snapshot %s (%s); nothing was restored"
                % (name, chain[0][0], reason_of(exc, box.secrets))
            ) from None
        sha = hashlib.sha256(data).hexdigest()
        if sha != info["sha256"] and sha not in wrote.get(name, ()):
            out.append((name, data))
    return out


# In the snapshot rolled back to: the files its rollback removed (remove_created), and copies
# of the files it restored over an edit since (edited_since).
REMOVED_DIR = "removed"


def snapshot_chain(box, sid):
    """[(id, meta)] of snapshot `sid` and of every later one (the converges a rollback to
    `sid` undoes), oldest first. `sid`'s own meta must be read; a later one that cannot be is
    left out with a note: what its converge created is then kept, never removed unknowingly."""
    chain = [(sid, read_meta(box, sid))]
    order = snapshot_order(sid)
    for other in list_snapshots(box):
        if snapshot_order(other) <= order:
            continue
        try:
            chain.append((other, read_meta(box, other)))
        except (OSError, ValueError, Failed) as exc:
            emit(
                "note",
                message="snapshot %s cannot be read (%s): files its converge created are kept"
                % (other, reason_of(exc, box.secrets)),
            )
    return chain


def wrote_record(meta):
    """A snapshot's `wrote` record ({name: [sha256, ...]}, record_write) with only well-formed
    entries (a damaged one grants no removal); None when the snapshot predates the record (no
    `wrote` key at all). A key that is there but no mapping (null, a list) is a damaged record,
    not an old one: {} (it proves no write), and wrote_damaged() says so."""
    if "wrote" not in meta:
        return None
    wrote = meta.get("wrote")
    out = {}
    for name, digests in wrote.items() if isinstance(wrote, dict) else ():
        if isinstance(name, str) and SNAPSHOT_FILE.match(name) and isinstance(digests, list):
            out[name] = [d for d in digests if isinstance(d, str) and SHA256.match(d)]
    return out


def wrote_damaged(meta):
    """The snapshot's `wrote` key is there but is no mapping: what its converge wrote is not
    known, so nothing can be proved a converge's by it (the file is kept, and that is why)."""
    return "wrote" in meta and not isinstance(meta.get("wrote"), dict)


def created_since(files, chain):
    """{name: (writers, digests, legacy, damaged)} of the paths a rollback to chain[0] decides
    on by removal (remove_created): each path absent then (recorded None; or not recorded, when
    the first later snapshot that lists it recorded it absent) and written by a converge since,
    or recorded absent by the snapshot itself. `writers`: the snapshots whose converge wrote it,
    `digests`: every sha256 they wrote to it; `legacy`: recorded absent by a snapshot that
    predates the `wrote` record, and written by no converge that keeps one; `damaged`: the
    snapshots of the chain whose `wrote` record is damaged (wrote_damaged).

    Why every later converge and not only the snapshot's own: a rollback to an older snapshot
    undoes all of them, so a file created by one in between is no more the snapshot's state
    than one created by its own converge. A digest written by any of them counts: a later
    converge may rewrite the file, or its failed rollback put an earlier converge's bytes back."""
    meta = chain[0][1]
    legacy = wrote_record(meta) is None
    damaged = [other for other, later in chain if wrote_damaged(later)]
    out = {}
    names = set(files)
    for _, later in chain:
        names.update(wrote_record(later) or {})
    for name in sorted(names):
        if name in files:
            if files[name] is not None:
                continue  # there at the snapshot: its copy is put back (restore_file)
        else:
            listed = [m.get("files") for _, m in chain[1:]]
            first = [f for f in listed if isinstance(f, dict) and name in f]
            if not first or first[0][name] is not None:
                continue  # nothing says it was absent at the snapshot: left as it is
        writers, digests = [], []  # type: list, list
        for other, later in chain:
            found = (wrote_record(later) or {}).get(name) or []
            if found:
                writers.append(other)
                digests += found
        if writers or name in files:
            out[name] = (writers, digests, legacy and name in files and not writers, damaged)
    return out


def fresh_name(directory, name, taken=()):
    """A name in `directory` that nothing holds: `name`, else `name.2`, `name.3`... Never an
    existing one: a copy an earlier rollback put there may be an operator's only bytes (a second
    rollback to the same snapshot removes the file again). `directory` is ours (0700) and the
    lock is held: nothing else makes a name there between this look and the rename."""
    for n in range(1, 10000):
        candidate = name if n == 1 else "%s.%d" % (name, n)
        if candidate not in taken and not os.path.lexists(os.path.join(directory, candidate)):
            return candidate
    raise Failed("%s holds too many copies of %s; nothing was restored" % (shown(directory), name))


def remove_created(box, sid, name, decided, dest):
    """Remove `name`, absent at snapshot `sid`, when it is still exactly what a converge since
    wrote: "" when removed, None when nothing is there, else why it is kept (for the operator).

    Never an operator's file: bytes no converge wrote (an edit since, a file made by hand), a
    symlink, or anything but a regular file stays, and the rollback says which and why. A file
    recorded absent by a snapshot older than the `wrote` record (`legacy`) is removed whatever
    it holds, as such a rollback always did. Removed by a rename to `dest` (a free name in the
    snapshot's `removed` directory, fresh_name), never unlinked and never over another copy:
    the file is kept there (pruning keeps such a snapshot) and can be moved back by hand.

    The file is compared through one open descriptor (O_NOFOLLOW), and after the rename the
    file moved is checked to be that same file (device and inode): an editor that saved by
    rename between the compare and the rename put an operator's file there, which is moved
    back (never over anything) and kept."""
    writers, digests, legacy, damaged = decided
    target = box.path(name)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return None
    wrote = "converge %s" % writers[-1] if writers else ""
    seen = None  # (st_dev, st_ino) of the file compared
    if not legacy:
        if not writers and damaged:
            return (
                "the record of what a converge wrote is damaged in snapshot %s (its `wrote` is "
                "not a mapping), so nothing proves this file a converge's; remove it by hand if "
                "it should go" % ", ".join(damaged)
            )
        if not writers:
            return "absent at snapshot %s and written by no converge since (made by hand?)" % sid
        if not stat.S_ISREG(st.st_mode):
            kind = next((n for test, n in _KINDS if test(st.st_mode)), "unknown type")
            return "a %s now, not the file %s wrote" % (kind, wrote)
        ident = []  # type: list
        try:
            data, _ = read_regular(target, ident=ident)
        except (OSError, Failed) as exc:
            return "cannot be read to compare (%s)" % reason_of(exc, box.secrets)
        if hashlib.sha256(data).hexdigest() not in digests:
            return (
                "changed since %s wrote it (an operator's edit?); remove it by hand if it "
                "should go" % wrote
            )
        seen = ident[0]
    if os.path.lexists(dest):  # fresh_name chose it free; still never renamed over
        raise Failed("%s appeared meanwhile; %s not removed" % (shown(dest), name))
    os.rename(target, dest)
    fsync_dir(box.deploy)
    fsync_dir(os.path.dirname(dest))
    moved = os.lstat(dest)
    if seen is not None and (moved.st_dev, moved.st_ino) != seen:
        return put_back(box, name, dest, wrote)
    emit(
        "note",
        message="removed %s (absent at snapshot %s%s); kept as %s"
        % (name, sid, ", written by " + wrote if wrote else "", shown(dest)),
    )
    return ""


def put_back(box, name, dest, wrote):
    """The file renamed to `dest` is not the one compared: it replaced that one meanwhile (an
    editor saving by rename), so it is an operator's. Back at its name by a hard link, which
    never replaces what may be there again, then the copy at `dest` unlinked; why it is kept."""
    target = box.path(name)
    try:
        os.link(dest, target, follow_symlinks=False)
    except OSError as exc:
        return (
            "replaced while the rollback removed it (an operator's save?) and cannot be put "
            "back (%s): it is at %s, move it back by hand" % (reason_of(exc), shown(dest))
        )
    os.unlink(dest)
    fsync_dir(box.deploy)
    fsync_dir(os.path.dirname(dest))
    return (
        "replaced while the rollback removed it (an operator's save?), not the file %s "
        "wrote: left as it is" % wrote
    )


def restore_file(target, info, copy):
    """Put one path back as the snapshot recorded it; True when that changed anything."""
    if info is None:  # did not exist
        if not os.path.lexists(target):
            return False
        os.unlink(target)
        return True
    link = info.get("symlink")
    if link:
        if os.path.islink(target) and os.readlink(target) == link:
            return False
        atomic_symlink(target, link)
        return True
    data, mode, owner = copy
    if holds(target, data, mode, owner):
        return False
    atomic_write(target, data, mode, owner)
    return True


def holds(path, data, mode, owner=None):
    """True when `path` is a regular file (not a symlink) with these bytes and this mode (and
    `owner`, when given); anything the reader refuses (a FIFO, a device, a file over the
    limit) does not, and is replaced: read through the one reader, a rollback never hangs on
    what is there now."""
    have_owner = []  # type: list
    try:
        have, have_mode = read_regular(path, owner=have_owner)
    except (OSError, Failed):
        return False
    return have_mode == mode and have == data and owner in (None, have_owner[0])


def service_names(value):
    """Service names recorded in a snapshot; anything else in that list is ignored."""
    if not isinstance(value, list):
        return []
    return [s for s in value if isinstance(s, str) and SERVICE.match(s)]


def rollback(box, sid, touched=None, created=None, reason="requested", original=None):
    """Files back byte for byte, then every service whose config differs recreated from them.

    Differs from what: a converge's own rollback passes `original`, the render taken before
    its first change, and recreates only what it touched plus what the restored files render
    differently from that: a converge that failed before recreating anything leaves every
    healthy lane running (the render now, with the converge's files, differs from the
    restored one for every service a changed variable reaches, but their containers were made
    from the files before). An operator's rollback (no `original`) compares with the render
    at its start: the containers running were made from the files it replaces. In an
    operator's, a service touched that the files leave as it is is not recreated when its
    container already is as the snapshot recorded (as_recorded): run again, it restarts
    nothing.

    Whatever stops it is recorded in the snapshot's status (a scrubbed reason: names, never
    file contents or values), so `reconcile snapshots` shows a rollback that did not finish."""
    disarm_stop()  # a stop now (SIGTERM, SIGINT) must not cut the rollback short
    emit("step", step="rollback", subject=sid, status="start", reason=scrub(reason, box.secrets))
    # Whether the box is half restored if this rollback fails: it began changing the box, or an
    # earlier rollback to this snapshot did and did not complete (killed, or failed so), or it
    # is a converge's own (`created` given: that converge changed the box already). A rollback
    # run again that fails before its first change leaves that as it was.
    try:
        found = read_meta(box, sid)
    except (OSError, ValueError, Failed):
        found = {}
    changing = [half_restored(found) or created is not None]
    was = status_before(found)
    try:
        hashes = original if original is not None else hashes_or_empty(box)
        chain = snapshot_chain(box, sid)
        # Said before the first file is restored: a rollback killed halfway (SIGKILL, a power
        # cut) leaves this status, and the next converge refuses the half restored box
        # (interrupted_converges) until the rollback is run again or the operator accepts it.
        # `rollback_from`: the status it replaces (kept by a rollback run again after a kill).
        record_status(
            box, sid, ROLLING_BACK, reason=reason, rollback_started_at=now_iso(),
            rollback_holder=box.p.get("holder"), rollback_from=status_before(chain[0][1]),
        )  # fmt: skip
        meta, restored, removed, kept, set_aside = restore_snapshot_files(
            box, sid, chain, first_change=lambda: changing.append(True)
        )
        lanes = {lane["service"]: lane for lane in box.p["lane_specs"]}
        before = meta.get("containers")
        damaged = not isinstance(before, dict)
        if damaged:
            # Which containers were there at the snapshot is not known: every container would
            # look new. Only the ones this converge created go (remove_containers); said.
            emit(
                "note",
                message="snapshot %s is damaged: its record of the containers is not a "
                "mapping; only containers this converge created are removed" % sid,
            )
            before = {}
        # `touched` proves containers ours only in a converge's own rollback (`created` given:
        # recreated moments ago under this lock); an operator's rollback gets the snapshot's
        # recorded names, which an operator may since have started by hand: ids only then.
        ours = (touched or []) if created is not None else []
        kept_names = [k["name"] for k in kept]
        gone = remove_containers(box, before, created or [], chain, ours, damaged, kept_names)
        differ = changed_by_files(box, hashes, [*lanes, GATEWAY])
        order = [s for s in list(lanes) + [GATEWAY] if s in set(differ) | set(touched or [])]
        recreated = [s for s in order if s in before]  # one with no container before: none now
        # A rollback after the converge ended (the operator's, the controller's: `touched` is
        # the converge's record, which an earlier rollback may have undone already): a service
        # whose config the restored files leave as it is, and whose container is already as
        # the snapshot recorded (a rollback run again, or run after the box's own), is not
        # recreated: that would only reload a model or restart the gateway again. One the
        # converge recreated from its new files has another config hash, one whose boot failed
        # does not run as recorded: both are recreated. A converge's own rollback (`created`
        # given) recreates every service it touched moments ago, as it always did.
        unchanged = [s for s in recreated if s not in differ] if created is None else []
        now = containers(box) if unchanged else {}
        same = [s for s in unchanged if s in now and as_recorded(before[s], now[s])]
        if same:
            emit(
                "note",
                message="%s: not recreated: the restored files leave its config as it is and "
                "its container already has the config hash and state snapshot %s recorded"
                % (", ".join(same), sid),
            )
            recreated = [s for s in recreated if s not in same]
        # Each as the snapshot had it (restore_mode): a lane stopped then is created, not
        # started; one crashing then is started, not waited for.
        modes = {s: restore_mode(before[s]) for s in recreated}
        for service in recreated:
            if modes[service] != WAIT:
                emit(
                    "note",
                    message="%s: %s, as at snapshot %s (%s)"
                    % (
                        service,
                        "created, not started" if modes[service] == CREATE else "not waited for",
                        sid,
                        state_text(before[service]),
                    ),
                )
            recreate(box, service, lanes.get(service), False, modes[service])
        started = start_stopped(box, before, chain)
        now = containers(box)
        # Unequal: a container whose config differs from the snapshot's, one running now that
        # was not then or the other way round (a snapshot that recorded the state), and one
        # that is there now but was not then, or was then but is not now (removed by the
        # converge).
        unequal = sorted(
            {
                s
                for s, c in before.items()
                if s in now
                and (
                    label_hash(now[s]) != (c or {}).get("config_hash")
                    or not same_running(c, now[s])
                )
            }
            | (set(before) ^ set(now))
        )
        result = {
            "ok": True,
            "snapshot": sid,
            "files": restored,
            "removed": removed,
            "kept": kept,
            # Restored over an edit since, the edited file copied aside first (edited_since):
            # [{name, why}], `why` naming where the copy is.
            "set_aside": set_aside,
            "removed_containers": gone,
            "recreated": recreated,
            "not_started": [s for s in recreated if modes[s] == CREATE],
            "not_waited": [s for s in recreated if modes[s] == START],
            "started": started,
            "config_equal": not unequal,
            "unequal": unequal,
        }
    except Exception as exc:  # any failure, ours or not: recorded, then reported
        result = {"ok": False, "snapshot": sid, "failed": reason_of(exc, box.secrets)}
        # Half restored: the next converge refuses the box (interrupted_converges), as after a
        # killed rollback, until this rollback is run again or the operator accepts the state.
        half = any(changing)
        if half:
            result["half_restored"] = True
            emit(
                "note",
                message="snapshot %s: the box may be half restored; the next converge is "
                "refused until this rollback is run again and completes, or is given "
                "--accept-interrupted" % sid,
            )
        # A converge's own (`created` given): what it recreated, so that the rollback run
        # again recreates that and what the files change, never every planned lane.
        mine = {"touched": list(touched or [])} if created is not None else {}
        record_status(
            box, sid, ROLLBACK_FAILED, reason=reason, rollback=result, half_restored=half,
            rollback_from=was, **mine
        )  # fmt: skip
    else:
        # The rollback is done: a status that cannot be written is a warning, not a failure.
        # `undone_at`: the newest snapshot when it was undone (redone_by_rollback reads it),
        # `undone_from`: the status it had.
        newest = (list_snapshots(box) or [sid])[-1]
        undone = {"undone_at": newest, "undone_from": status_before(chain[0][1])}
        record_final(
            box, sid, "rolled-back", mark_rolled_back,
            "run this rollback again, or converge with --accept-interrupted",
            reason=reason, rollback=result, **undone,
        )  # fmt: skip
        # Every later converge is undone with the chain, and says so: one left `applied` was
        # still listed as the box's state. A killed one (`running`, interrupted_converges) no
        # longer stops the next converge. A rollback's record of its own is not this one's.
        for other, later in chain[1:]:
            if later.get("status") not in UNDONE and not record_status(
                box, other, "rolled-back", reason="undone by the rollback to " + sid,
                rollback=None, undone_at=newest, undone_from=status_before(later),
            ):  # fmt: skip
                mark_rolled_back(box, other)  # as this one's: a killed one refuses no more
        redo_by_rollback(box, sid)
    emit("step", step="rollback", subject=sid, status="done" if result["ok"] else "failed")
    return result


def state_text(record):
    """A snapshot's record of a container's state, for a note: `exited`, `running/unhealthy`."""
    record = record if isinstance(record, dict) else {}
    text = "%s/%s" % (record.get("status"), record.get("health") or "-")
    restarts = record.get("restarts")
    return scrub(text + (", %d restarts" % restarts if _is_int(restarts) and restarts else ""))


def same_running(record, inspect):
    """The container `inspect` runs, or not, as the snapshot's `record` says its container
    did; True when the snapshot recorded no state (an older converge's)."""
    if not isinstance(record, dict) or "status" not in record:
        return True
    return was_running(record) == runs(inspect)


def as_recorded(record, inspect):
    """True when the container `inspect` is already what recreating its service from the
    snapshot's files would make: the config hash the snapshot's `record` holds, running or
    not as then (the rollback's own `unequal` check), and, for one that was up (restore_mode
    WAIT), up and healthy as wait_healthy would accept it: one left booting or unhealthy (a
    rollback that failed waiting for it) is recreated and waited for again. False when the
    snapshot recorded no config hash or no state (an older converge's): recreated, as ever."""
    if not isinstance(record, dict) or "status" not in record:
        return False
    want = record.get("config_hash")
    if not isinstance(want, str) or not want or label_hash(inspect) != want:
        return False
    if not same_running(record, inspect):
        return False
    if restore_mode(record) != WAIT:
        return True
    state = inspect.get("State") or {}
    return state.get("Status") == "running" and (state.get("Health") or {}).get("Status") in (
        None,
        "healthy",
    )


# What a converge undone and then redone is again (`undone_from`); anything else: applied.
REDONE = ("applied", "verified", "interrupted", "running")


def status_before(meta):
    """A snapshot's status, or the one a rollback to it that did not finish replaced."""
    status = meta.get("status")
    return meta.get("rollback_from") if status in (ROLLING_BACK, ROLLBACK_FAILED) else status


def redo_by_rollback(box, sid):
    """The box is back as it was when `sid` was taken: every older converge that a rollback
    undid after that (its `undone_at` is `sid` or newer) is on the box again. Its status says
    so (as it was before it was undone), so that pruning keeps what a rollback to an older
    snapshot needs (newest_applied, chain_needs) and the listing shows the box's state. One
    undone before `sid` was taken stays undone: `sid` was taken without it."""
    order = snapshot_order(sid)
    for older in list_snapshots(box):
        if snapshot_order(older) >= order:
            break
        try:
            meta = read_meta(box, older)
        except (OSError, ValueError, Failed):
            continue
        at = meta.get("undone_at")
        if meta.get("status") not in UNDONE or not isinstance(at, str):
            continue
        if not SNAPSHOT_ID.match(at) or snapshot_order(at) < order:
            continue
        was = meta.get("undone_from")
        record_status(
            box, older, was if was in REDONE else "applied",
            reason="redone by the rollback to " + sid, undone_at=None, undone_from=None,
        )  # fmt: skip


def remove_containers(box, before, created, chain, touched, damaged=False, kept=()):
    """Containers that were not there at the snapshot and go with the rollback, by container
    id (`docker rm -f`), never by compose service name: once the rollback removed the compose
    file that defined a service, compose no longer knows it (`compose rm` of it did nothing and
    left the lane running).

    Which ones: (1) a service this very converge created (`created`, in memory); (2) a
    container whose id a converge since the snapshot recorded making (record_made: the
    snapshot's `made`, written as each container is made, the gateway's too) and that the
    snapshot did not have, whether compose still renders it or not: a rollback after the
    converge's process ended (the controller's, after a failed verification) removes what
    the converge created as its own rollback would; except, when the rollback `kept` a file
    (an operator's edit, remove_created), one compose still renders: that file may define
    it, and is the operator's (the container is left, unequal); (3) a container no compose
    file renders any more after the files came back that this converge recreated (`touched`,
    this run's) and the snapshot did not have: compose can neither see nor manage it. Never by
    a planned or recorded service name alone: an operator may have started that service's
    container by hand since (it is left, and counts as unequal). `damaged`: the snapshot's own
    record of its containers is damaged, so which were there then is not known: only (1), and
    a container its own converge recorded both creating (`created`) and making (its id)."""
    now = containers(box)
    made = set()  # type: set
    for _, later in chain:
        record = later.get("made")
        for ids in record.values() if isinstance(record, dict) else ():
            if isinstance(ids, list):  # a damaged entry proves no container a converge's
                made.update(i for i in ids if isinstance(i, str) and i)
    then = {(c or {}).get("id") for c in before.values() if isinstance(c, dict)}
    own_created = set(service_names(chain[0][1].get("created")))
    gone = [s for s in created if s not in before and s in now]
    proved = [
        s
        for s in sorted(now)
        if s not in before
        and s not in gone
        and now[s].get("Id") in made
        and (
            (not damaged and str(now[s].get("Id", ""))[:12] not in then)
            or (damaged and s in own_created)
        )
    ]
    if proved and kept:
        rendered = rendered_or_all(box, proved)
        left = [s for s in proved if s in rendered]
        if left:
            emit(
                "note",
                message="kept %s: compose still renders it from the files kept (%s)"
                % (", ".join(left), ", ".join(kept)),
            )
        proved = [s for s in proved if s not in rendered]
    gone += proved
    extra = [
        s
        for s in sorted(now)
        if not damaged
        and s not in before
        and s not in gone
        and s in touched
        and str(now[s].get("Id", ""))[:12] not in then
    ]
    if extra:
        rendered = rendered_or_all(box, extra)
        gone += [s for s in extra if s not in rendered]
    for service in gone:
        emit("step", step="remove", subject=service, status="start")
        box.must(["docker", "rm", "-f", now[service]["Id"]], "remove " + service)
        emit("step", step="remove", subject=service, status="done")
    return gone


def rendered_or_all(box, services):
    """The services compose renders now; when that cannot be known, all of `services` (so
    nothing more is removed: they count as unequal), said in a note."""
    try:
        return config_hashes(box)
    except Failed as exc:
        emit("note", message="kept %s: %s" % (", ".join(services), reason_of(exc, box.secrets)))
        return dict.fromkeys(services, "")


def start_stopped(box, before, chain):
    """The strays a converge since the snapshot stopped (stop_stray's `stopped` record) and
    that are still there, stopped: started again, as they ran at the snapshot. Only the very
    container the snapshot had (its recorded id) and the record names, never another of that
    service. Returns the services started."""
    now = containers(box)
    then = {s: (c or {}).get("id") for s, c in before.items() if isinstance(c, dict)}
    started = []
    for _, later in chain:
        record = later.get("stopped")
        for service, cid in sorted(record.items()) if isinstance(record, dict) else ():
            found = now.get(service) or {}
            if not isinstance(cid, str) or not cid or found.get("Id") != cid:
                continue  # removed since, or another container now: nothing of ours to start
            if then.get(service) != cid[:12] or (found.get("State") or {}).get("Running"):
                continue
            emit("step", step="start", subject=service, status="start")
            box.must(["docker", "start", cid], "start " + service)
            emit("step", step="start", subject=service, status="done")
            started.append(service)
    return started


def mark_good(box, sid):
    """After the controller verified zero drift: keep this chain as the known-good copy.

    Only for the box's newest snapshot (`sid`, or the newest when none is named) while it is
    `applied`, checked under the lock before anything is written: between the converge and
    its mark-good the lock is free, and another run may have rolled the converge back (then
    its files are the old ones again and known-good would vouch for them as verified) or
    converged over it. Refused, nothing changed, the controller keeps the converge verified
    but not marked good (engine.py _mark_good says so)."""
    ids = list_snapshots(box)
    newest = ids[-1] if ids else None
    sid = sid or newest
    if sid is None:
        raise Failed("no snapshot on this box: nothing to mark good")
    try:
        status = read_meta(box, sid).get("status")
    except (OSError, ValueError) as exc:
        raise Failed(
            "snapshot %s cannot be read (%s); nothing was changed"
            % (sid, reason_of(exc, box.secrets))
        ) from None
    if sid != newest:
        raise Failed(
            "snapshot %s is not the newest (%s was taken after it); nothing was changed"
            % (sid, newest)
        )
    if status != "applied":
        shown_status = scrub(status) if isinstance(status, str) else "unknown"
        raise Failed("snapshot %s is %s, not applied; nothing was changed" % (sid, shown_status))
    root = private_dir(known_good_dir(box))
    manifest = {}
    for name in box.p["compose_files"]:
        check_managed(box, name)  # a link out of the deployment is not read into known-good
        data = read_managed(box.path(name))
        if data is not None:
            atomic_write(os.path.join(root, name), data, 0o600)
            manifest[name] = hashlib.sha256(data).hexdigest()
    write_meta(root, {"snapshot": sid, "files": manifest, "at": now_iso()})
    set_status(box, sid, "verified")
    removed, kept = remove_strays(box, sid)
    return {"ok": True, "known_good": manifest, "strays_removed": removed, "strays_kept": kept}


def remove_strays(box, sid):
    """The strays the converge of `sid` stopped and kept (its `strays` record, stop_stray),
    removed now that the controller verified that converge: each by the very id recorded, and
    only while it is still stopped (`docker rm` without -f, which refuses a running one): one
    an operator started again since is kept, as is another container of that service. Best
    effort: the converge is verified whatever happens here; what stays is said, and the next
    observation shows it as a stray again. Returns (services removed, services kept)."""
    removed, kept = [], []  # type: list, list
    try:
        record = read_meta(box, sid).get("strays")
        record = record if isinstance(record, dict) else {}
        now = containers(box) if record else {}
    except (OSError, ValueError, Failed) as exc:
        emit("note", message="stopped strays not removed: %s" % reason_of(exc, box.secrets))
        return removed, kept
    for service, cid in sorted(record.items()):
        found = now.get(service) or {}
        if not (isinstance(cid, str) and CONTAINER_ID.match(cid)) or found.get("Id") != cid:
            continue  # gone already, or another container now: not the one this converge kept
        why = None
        if (found.get("State") or {}).get("Running"):
            why = "running again (started since the converge stopped it)"
        else:
            emit("step", step="remove", subject=service, status="start")
            try:
                box.must(["docker", "rm", cid], "remove " + service)
            except Failed as exc:
                why = reason_of(exc, box.secrets)
        if why:
            emit("note", message="kept the stray container of %s: %s" % (service, why))
            kept.append(service)
        else:
            emit("step", step="remove", subject=service, status="done")
            removed.append(service)
    return removed, kept


def snapshots(box, lock):
    """Every snapshot, newest last, with its status: a damaged one is listed too, never hidden."""
    out = []
    for sid in list_snapshots(box):
        try:
            meta = read_meta(box, sid)
        except (OSError, ValueError, Failed) as exc:
            meta = {"status": "unreadable", "failed": reason_of(exc)}
        entry = {
            k: meta.get(k)
            for k in ("taken_at", "holder", "status", "services", "plan", "reason", "failed")
        }
        entry["id"] = sid
        rolled = meta.get("rollback")
        if isinstance(rolled, dict) and rolled.get("failed"):
            entry["failed"] = rolled["failed"]
        try:
            data, _ = read_regular(os.path.join(snapshot_path(box, sid), "status.json"), META_LIMIT)
            stamp = json.loads(data.decode("utf-8"))
            if isinstance(stamp, dict):
                entry["status"] = stamp.get("status")
                entry["failed"] = (stamp.get("rollback") or {}).get("failed")
        except (OSError, ValueError, AttributeError, Failed):
            pass
        out.append(entry)
    held = lock.is_held()
    return {"ok": True, "snapshots": out, "lock": lock.holder() if held else None}


def run_action(box, payload):
    """One action under the lock (the listing takes none); returns the result event's fields."""
    action = payload["action"]
    lock = Lock(box)
    if action == "snapshots":
        return snapshots(box, lock)
    try:
        if action == "converge":
            return converge(box, lock)
        lock.acquire(payload["holder"])
        announce_start(action)  # as a converge: nothing is done for a controller gone
        sweep_temp_files(box)
        if action == "mark-good":
            return mark_good(box, payload.get("snapshot"))
        sid = payload.get("snapshot") or (list_snapshots(box) or [None])[-1]
        if sid is None:
            raise Failed("no snapshot on this box")
        snapshot_path(box, sid)  # one of ours, or refused before anything
        try:
            meta = read_meta(box, sid)
        except (OSError, ValueError, Failed):
            meta = {}  # rollback() records why it cannot use this snapshot
        # What the converge recreated, recorded when it ended (applied, or its own rollback
        # failed), even none: the rollback recreates that and what the restored files render
        # differently. Not recorded (killed, an older converge): every service it planned.
        touched = meta.get("touched")
        services = touched if isinstance(touched, list) else meta.get("services")
        return rollback(
            box, sid, service_names(services), reason=payload.get("reason") or "operator rollback"
        )
    finally:
        lock.release()


_STOP = {"armed": False}


def on_stop(signum, frame):
    """The first SIGTERM/SIGINT stops the run as a failure (a converge's except rolls back);
    once a rollback runs, or the work is applied, a stop is ignored so that it completes."""
    if _STOP["armed"]:
        _STOP["armed"] = False
        raise Stopped("stopped by %s" % signal.Signals(signum).name)


def disarm_stop():
    _STOP["armed"] = False


def main():
    # A dropped connection must not stop a step halfway (SIGPIPE is already ignored by Python;
    # emit() swallows the write errors).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # A stop (systemd, an operator's kill or Ctrl-C) fails the run where it is: a converge
    # rolls back as for any failure, under its lock, before it exits.
    stops = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, on_stop) for sig in stops}
    _STOP["armed"] = True
    _STDOUT_OK[0] = True  # this run's output (a loaded program runs main() more than once)
    try:
        return run_main()
    finally:
        disarm_stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_main():
    secrets = []  # type: list
    try:
        try:
            payload = json.loads(sys.stdin.read())
        except ValueError:
            raise Failed("the payload is not JSON") from None
        # The whole payload first: a bad value is refused before the lock, a snapshot or a
        # container is touched.
        validate_payload(payload, os.path.expanduser("~"))
        box = Box(payload)
        secrets = box.secrets
        if not os.path.isdir(box.deploy):
            raise Failed("deployment directory %s does not exist" % box.deploy)
        if payload["action"] == "rollback" and payload.get("snapshot") is not None:
            # An id this box does not hold is refused before the lock is taken (which would
            # create .fleet/lock on a box that never had one); checked again under the lock.
            snapshot_path(box, payload["snapshot"])
        result = run_action(box, payload)
    except Exception as exc:  # still one result line, never a traceback with values in it
        result = {"ok": False, "failed": reason_of(exc, secrets)}
    disarm_stop()  # the result line is written whole
    emit("result", **result)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
